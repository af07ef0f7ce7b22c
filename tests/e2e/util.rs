//! Running the real binary in a known environment: from the workspace root (so paths in
//! messages are the short relative ones users see), without any `SOUS_*` variable of the
//! developer's shell, with a fixed state directory and no colour.

use std::path::PathBuf;

use assert_cmd::Command;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// `sous` with a clean environment, run from the workspace root.
pub fn sous() -> Command {
    let mut cmd = Command::cargo_bin("sous").expect("the sous binary is built");
    for (name, _) in std::env::vars() {
        if name.starts_with("SOUS_") {
            cmd.env_remove(name);
        }
    }
    cmd.current_dir(root())
        .env("NO_COLOR", "1")
        .env("SOUS_STATE_DIR", "/state");
    cmd
}

/// Runs and returns (exit code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let output = cmd.output().expect("sous runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
