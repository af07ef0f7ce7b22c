//! The fake engine refuses what the real parsers refuse, the way they do: argparse's
//! "unrecognized arguments" and click's "No such option", both with exit code 2.
//! (Having an integration test also makes `cargo test` build the `fake-engine`
//! binary that the end-to-end tests of `sous serve` start.)

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fake-engine"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unknown_flags_exit_2_like_the_real_parsers() {
    let (code, stderr) = run(&["serve", "/model", "--kv-cache-memory-bytez", "1"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("vllm serve: error: unrecognized arguments: --kv-cache-memory-bytez"),
        "{stderr}"
    );
    let (code, stderr) = run(&[
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m",
        "--enable-auto-tool-choice",
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("unrecognized arguments: --enable-auto-tool-choice"),
        "{stderr}"
    );
    let (code, stderr) = run(&["/model", "--max-batch-size", "4"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("Error: No such option: --max-batch-size"),
        "{stderr}"
    );
    let (code, stderr) = run(&["serve", "/model", "--speculative-config", "{not json"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("invalid loads value"), "{stderr}");
}
