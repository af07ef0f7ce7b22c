//! `sous_snapshot!`: a command's whole face (its exit code, stdout and stderr) as one
//! insta snapshot, after filters that replace what changes from run to run: temporary
//! and workspace paths, ports, durations, sizes per second, process ids and sous's own
//! version. Modelled on uv's `uv_snapshot!` (astral-sh/uv, `crates/uv/tests/it/common`).
//!
//! A snapshot that changes fails the test with the difference; `INSTA_UPDATE=always`
//! (or `cargo insta review`) accepts the new face after reading it.

use assert_cmd::Command;

use crate::util::root;

/// The filters every face goes through, most specific first: (regex, replacement).
pub fn filters() -> Vec<(String, String)> {
    let root = regex::escape(&root().display().to_string());
    let tmp = regex::escape(&std::env::temp_dir().display().to_string());
    vec![
        // Paths: temporary directories (tempfile's `.tmpXXXXXX`), then the workspace.
        (format!(r"{tmp}/\.tmp[A-Za-z0-9]+"), "[TEMP]".into()),
        (root, "[ROOT]".into()),
        // Addresses: the port is whatever was free.
        (
            r"(127\.0\.0\.1|localhost|0\.0\.0\.0):\d{2,5}".into(),
            "$1:[PORT]".into(),
        ),
        (r"(--port[ =])\d{2,5}".into(), "$1[PORT]".into()),
        // Process ids, as sous prints them.
        (r"\b(pid|PID|kill) \d+".into(), "$1 [PID]".into()),
        // Measured rates and durations ("3.2 MB/s", "1.04 s", "0.8 ms"), which sous
        // prints with decimals; a whole number of seconds ("10s") is a setting.
        (r"\d+(\.\d+)? ?[kMG]i?B/s".into(), "[RATE]".into()),
        (r"\b\d+\.\d+ ?(ns|µs|us|ms|s|min)\b".into(), "[TIME]".into()),
        // sous's own version, wherever it is printed.
        (
            format!(r"\b{}\b", regex::escape(env!("CARGO_PKG_VERSION"))),
            "[VERSION]".into(),
        ),
    ]
}

/// What a finished command showed: exit code, then both streams, in uv's layout.
pub fn face(cmd: &mut Command) -> String {
    // clap wraps help at the terminal's width, or COLUMNS', or 100 columns.
    let output = cmd.env("COLUMNS", "100").output().expect("sous runs");
    format!(
        "success: {}\nexit_code: {}\n----- stdout -----\n{}\n----- stderr -----\n{}",
        output.status.success(),
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    )
}

/// insta's settings with [`filters`] and any `extra` ones (applied first).
pub fn settings(extra: &[(&str, &str)]) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    for (regex, replacement) in extra {
        settings.add_filter(regex, *replacement);
    }
    for (regex, replacement) in filters() {
        settings.add_filter(&regex, replacement);
    }
    settings
}

/// `sous_snapshot!(name, cmd)` or `sous_snapshot!(name, cmd, &[(regex, replacement), ...])`:
/// runs `cmd` (an `assert_cmd::Command`, usually `util::sous()`), filters its face and
/// asserts it against `snapshots/e2e__<module>__<name>.snap`. Evaluates to the face
/// before filtering, for what a test asserts beyond it (a secret that never shows).
macro_rules! sous_snapshot {
    ($name:expr, $cmd:expr) => {
        sous_snapshot!($name, $cmd, &[])
    };
    ($name:expr, $cmd:expr, $extra:expr) => {{
        let face = $crate::snapshot::face(&mut $cmd);
        $crate::snapshot::settings($extra).bind(|| insta::assert_snapshot!($name, &face));
        face
    }};
}
pub(crate) use sous_snapshot;

/// The filters replace what varies and leave the rest alone.
#[test]
fn the_filters_replace_only_what_varies() {
    let tmp = std::env::temp_dir().join(".tmpAb12Cd");
    let text = format!(
        "wrote {}/x.json\nlistening on http://127.0.0.1:41234 (pid 9876); `kill 9876` stops it\n\
         6.2 MB/s, 812 ms, 1.04 s; 30 layers, 8 experts\nsous {}\n{}/recipes/a.toml",
        tmp.display(),
        env!("CARGO_PKG_VERSION"),
        root().display(),
    );
    settings(&[]).bind(|| insta::assert_snapshot!("filters", text));
}
