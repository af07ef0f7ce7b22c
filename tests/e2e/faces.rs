//! The faces of the CLI as snapshots (`sous_snapshot!`): every command's `--help`, found
//! by walking `sous --help` so that a new command is covered without a line here, and
//! the human and `--json` output of the commands that run without a server: `recipe
//! check`, `serve --dry-run`, and `pull` → `list` → `rm` of the test model through the
//! local Hub mirror, with their errors.
//!
//! Faces that need a running server or a GPU are snapshotted where those tests run:
//! `ps`, `run`, `stop`, `rm --json` in everyday.rs, `plan` in plan.rs, `doctor --json` in
//! doctor.rs, `deploy render` in deploy.rs, the broken recipes in broken.rs.

use crate::snapshot::sous_snapshot;
use crate::util::{Mirror, root, smollm2, sous};

const SMOLLM2: &str = "recipes/local/smollm2-135m.toml";
const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// The subcommands a `--help` text lists under "Commands:" (but `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim_end() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        // A command's name starts at column 2; wrapped descriptions are indented further.
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path under `sous`, depth first: `[]`, `["bench"]`, `["bench", "probe"]`, …
fn command_paths() -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut stack = vec![Vec::<String>::new()];
    while let Some(path) = stack.pop() {
        let output = sous().args(&path).arg("--help").output().expect("sous runs");
        let help = String::from_utf8_lossy(&output.stdout).into_owned();
        for sub in subcommands(&help).into_iter().rev() {
            let mut child = path.clone();
            child.push(sub);
            stack.push(child);
        }
        paths.push(path);
    }
    paths
}

#[test]
fn every_command_answers_help() {
    let paths = command_paths();
    // The walk found the nested commands, not only the top level.
    assert!(
        paths.iter().any(|p| p == &["bench", "probe"]) && paths.iter().any(|p| p == &["deploy", "render"]),
        "{paths:?}"
    );
    for path in paths {
        let name = if path.is_empty() {
            "help-sous".to_owned()
        } else {
            format!("help-sous-{}", path.join("-"))
        };
        sous_snapshot!(name, sous().args(&path).arg("--help"));
    }
}

#[test]
fn recipe_check_faces() {
    sous_snapshot!("recipe-check", sous().args(["recipe", "check", SMOLLM2]));
    sous_snapshot!(
        "recipe-check-json",
        sous().args(["recipe", "check", "--json", SMOLLM2])
    );
    sous_snapshot!(
        "recipe-check-set-unknown",
        sous().args(["recipe", "check", SMOLLM2, "--set", "serving.max_model_lenn=4096"])
    );
    sous_snapshot!(
        "recipe-check-missing",
        sous().args(["recipe", "check", "recipes/local/no-such-recipe.toml"])
    );
}

#[test]
fn serve_dry_run_faces() {
    // A fixed cache directory: a dry run creates nothing, and its path is in the output.
    // The GPU part of the compile cache's key is this machine's.
    let gpu = [(r"(/cache/engines/[^/]+)/[^/ ]+/", "$1/[GPU]/")];
    for (name, recipe) in [
        ("native", SMOLLM2),
        ("vllm", "recipes/titan/qwen3.8-flash-next.toml"),
    ] {
        sous_snapshot!(
            format!("serve-dry-run-{name}"),
            sous()
                .env("SOUS_CACHE_DIR", "/cache")
                .args(["serve", "--dry-run", "--recipe", recipe]),
            &gpu
        );
        sous_snapshot!(
            format!("serve-dry-run-{name}-json"),
            sous()
                .env("SOUS_CACHE_DIR", "/cache")
                .args(["serve", "--dry-run", "--json", "--recipe", recipe]),
            &gpu
        );
    }
    // --json describes a dry run; without one it is refused, not ignored.
    sous_snapshot!(
        "serve-json-without-dry-run",
        sous().args(["serve", "--json", "--recipe", SMOLLM2])
    );
}

#[test]
fn pull_list_and_rm_faces_on_the_test_model() {
    if smollm2().is_none() {
        return;
    }
    let mirror = Mirror::start(&root().join("target/models"), &[], &[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let hub = tmp.path().join("hub");
    let cache = tmp.path().join("cache");
    let with_env = |mut cmd: assert_cmd::Command| {
        cmd.env("HF_ENDPOINT", &mirror.url)
            .env("HF_HUB_CACHE", &hub)
            .env("SOUS_CACHE_DIR", &cache)
            .env_remove("HF_HUB_OFFLINE");
        cmd
    };
    // The commit the mirror serves is the test model's, fixed by its fetch script. What
    // the machine decides: the SHA-256 implementation (SHA-NI or not) and what bound the
    // pull; and the order of a directory's entries.
    let machine = [
        (r"\b[0-9a-f]{40}\b", "[COMMIT]"),
        (
            r"with sha256 \((?:[^()]|\([^()]*\))*\), bound by [a-z ]+\)",
            "with sha256 ([SHA-256]), bound by [BOUND])",
        ),
        (r#""sha256": "[^"]*""#, r#""sha256": "[SHA-256]""#),
        (r#""seconds": [0-9.e-]+"#, r#""seconds": "[SECONDS]""#),
        (r#"(?s)"paths": \[\n.*?\n *\]"#, r#""paths": "[PATHS]""#),
    ];

    sous_snapshot!("list-empty", with_env(sous()).arg("list"));
    sous_snapshot!("list-empty-json", with_env(sous()).args(["list", "--json"]));
    // Files are said as they arrive, in no fixed order: each line is kept, not its file.
    let arrivals = [
        machine.as_slice(),
        &[(r"pull: fetched [^\n]+", "pull: fetched [FILE]")],
    ]
    .concat();
    sous_snapshot!("pull", with_env(sous()).args(["pull", REPO]), &arrivals);
    sous_snapshot!(
        "pull-again-json",
        with_env(sous()).args(["pull", "--json", REPO]),
        &machine
    );
    sous_snapshot!(
        "pull-missing-repo",
        with_env(sous()).args(["pull", "HuggingFaceTB/no-such-model"])
    );
    sous_snapshot!("list", with_env(sous()).arg("list"), &machine);
    sous_snapshot!("list-json", with_env(sous()).args(["list", "--json"]), &machine);
    sous_snapshot!(
        "rm-json",
        with_env(sous()).args(["rm", "--yes", "--json", REPO]),
        &machine
    );
    sous_snapshot!("rm-again", with_env(sous()).args(["rm", "--yes", REPO]));
}
