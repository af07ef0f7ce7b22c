//! `sous recipe check`, `sous recipe schema`, `--version`, completions, usage errors.

use crate::util::{root, run, sous};

const SHIPPED: &[&str] = &[
    "recipes/dgx-spark/qwen3.8-27b-nvfp4-baseline.toml",
    "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
    "recipes/titan/qwen3.8-flash-next.toml",
    "recipes/local/smollm2-135m.toml",
    "recipes/local/smollm2-135m-nvfp4.toml",
    "recipes/local/smollm2-135m-ngram.toml",
];

#[test]
fn every_shipped_recipe_checks() {
    let (code, stdout, stderr) = run(sous().args(["recipe", "check"]).args(SHIPPED));
    assert_eq!(code, 0, "{stderr}");
    for file in SHIPPED {
        assert!(stdout.contains(&format!("# {file}\n")), "{stdout}");
        assert!(stderr.contains(&format!("ok {file}")), "{stderr}");
    }
}

#[test]
fn resolved_toml_is_itself_a_recipe_that_resolves_the_same() {
    let tuned = "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml";
    let (code, resolved, _) = run(sous().args(["recipe", "check", tuned]));
    assert_eq!(code, 0);
    insta::assert_snapshot!(resolved);
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("resolved.toml");
    std::fs::write(&copy, &resolved).expect("write");
    let (code, again, stderr) = run(sous().args(["recipe", "check"]).arg(&copy));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(again, resolved);
    // The chain was merged: the tuned file's values and the baseline's are both there.
    assert!(resolved.contains("gpu_utilization = 0.9\n") && resolved.contains("max_model_len = 262144\n"));
    assert!(!resolved.contains("extends"));
}

#[test]
fn json_reports_every_file() {
    let (code, stdout, _) = run(sous().args([
        "recipe",
        "check",
        "--json",
        "recipes/titan/qwen3.8-flash-next.toml",
        "tests/recipes/broken/typo-key.toml",
    ]));
    assert_eq!(code, 1);
    let reports: serde_json::Value = serde_json::from_str(&stdout).expect("json array");
    assert_eq!(reports[0]["ok"], true);
    assert_eq!(
        reports[0]["recipe"]["memory"]["kv_cache_bytes"],
        15_569_256_448u64
    );
    assert!(
        reports[0]["warnings"][0]
            .as_str()
            .unwrap_or_default()
            .contains("ignores")
    );
    assert_eq!(reports[1]["ok"], false);
    assert_eq!(reports[1]["error"]["hint"], "did you mean `max_model_len`?");
}

#[test]
fn warnings_can_be_denied() {
    let (code, _, stderr) = run(sous().args([
        "recipe",
        "check",
        "--deny-warnings",
        "recipes/titan/qwen3.8-flash-next.toml",
    ]));
    assert_eq!(code, 1);
    assert!(stderr.contains("warnings are denied"), "{stderr}");
    let (code, _, _) = run(sous().args([
        "recipe",
        "check",
        "--deny-warnings",
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
    ]));
    assert_eq!(code, 0);
}

/// A host-memory floor is checked against this machine: one above its memory is
/// refused naming the field and the numbers; one it can keep passes.
#[test]
fn a_host_floor_this_machine_cannot_keep_is_refused() {
    let recipe = "recipes/local/smollm2-135m.toml";
    let (code, _, stderr) =
        run(sous().args(["recipe", "check", recipe, "--set", "memory.host_floor=1000TiB"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: recipe {recipe}: `memory.host_floor` is 1024000.00 GiB, and this machine has "
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: `memory.host_floor` is memory to keep free, not the machine's size"),
        "{stderr}"
    );
    let (code, stdout, stderr) =
        run(sous().args(["recipe", "check", recipe, "--set", "memory.host_floor=1MiB"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("host_floor = 1048576"), "{stdout}");
}

#[test]
fn schema_command_prints_the_committed_schema_and_reference() {
    let (code, stdout, _) = run(sous().args(["recipe", "schema"]));
    assert_eq!(code, 0);
    let committed = std::fs::read_to_string(root().join("recipes/recipe.schema.json")).expect("schema file");
    assert_eq!(stdout, committed);
    let (code, stdout, _) = run(sous().args(["recipe", "schema", "--markdown"]));
    assert_eq!(code, 0);
    let committed = std::fs::read_to_string(root().join("docs/recipe.md")).expect("reference");
    assert_eq!(stdout, committed);
}

#[test]
fn version_completions_and_usage_errors() {
    let (code, stdout, _) = run(sous().arg("--version"));
    assert_eq!(code, 0);
    assert_eq!(stdout.trim(), format!("sous {}", env!("CARGO_PKG_VERSION")));

    let (code, stdout, _) = run(sous().args(["completions", "bash"]));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("_sous()") && stdout.contains("--dry-run"),
        "bash completion"
    );

    let (code, _, stderr) = run(sous().args(["serve", "--recipe", "x.toml", "--frobnicate"]));
    assert_eq!(code, 1, "usage errors are the user's: {stderr}");
    assert!(stderr.contains("unexpected argument '--frobnicate'"));
}
