//! Compatibility both ways with Python's huggingface_hub (pinned in
//! scripts/requirements-test.txt, installed into target/py by scripts/test.sh):
//! it downloads from `sous hub serve` correctly, and it finds, offline, what
//! `sous pull` put in the cache.

use std::path::PathBuf;
use std::process::Command as Process;

use serde_json::Value;

use crate::util::{Mirror, generated_repo, run, sha256, sous};

/// The test environment's Python, or `None` (with a loud message) outside CI.
fn python() -> Option<PathBuf> {
    crate::util::python("huggingface_hub compatibility")
}

pub(crate) fn py(python: &PathBuf, script: &str, envs: &[(&str, &str)]) -> Value {
    let out = Process::new(python)
        .arg("-c")
        .arg(script)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_TOKEN")
        .envs(envs.iter().copied())
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "python printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn huggingface_hub_downloads_from_the_mirror() {
    let Some(python) = python() else { return };
    let root = generated_repo("shards", 210);
    let mirror = Mirror::start(
        &root,
        &["--gated", "acme/gatedcopy"],
        &[("SOUS_HUB_TOKEN", "hf_ok")],
    );
    let cache = tempfile::tempdir().expect("tempdir");
    let cache_str = cache.path().to_str().expect("utf-8");
    let script = r#"
import json
from huggingface_hub import snapshot_download, hf_hub_download, HfApi
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError
path = snapshot_download("acme/shards", ignore_patterns=["original/*", "*.bin"])
errors = {}
for name, call in [
    ("repo", lambda: hf_hub_download("acme/missing", "config.json")),
    ("revision", lambda: hf_hub_download("acme/shards", "config.json", revision="v9")),
    ("entry", lambda: hf_hub_download("acme/shards", "nope.json")),
    ("gated", lambda: hf_hub_download("acme/gatedcopy", "config.json")),
]:
    try:
        call()
        errors[name] = None
    except (GatedRepoError, RevisionNotFoundError, RemoteEntryNotFoundError, RepositoryNotFoundError) as e:
        errors[name] = type(e).__name__
info = HfApi().model_info("acme/shards", files_metadata=True)
print(json.dumps({"path": path, "errors": errors, "sha": info.sha,
                  "lfs": {s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs}}))
"#;
    let out = py(
        &python,
        script,
        &[("HF_ENDPOINT", &mirror.url), ("HF_HUB_CACHE", cache_str)],
    );
    let path = PathBuf::from(out["path"].as_str().expect("path"));
    for shard in 1..=3 {
        let name = format!("model-{shard:05}-of-00003.safetensors");
        let expected = sha256(&root.join("acme/shards").join(&name));
        assert_eq!(sha256(&path.join(&name)), expected);
        assert_eq!(out["lfs"][&name], expected, "siblings carry the LFS sha256");
    }
    assert_eq!(out["errors"]["repo"], "RepositoryNotFoundError");
    assert_eq!(out["errors"]["revision"], "RevisionNotFoundError");
    assert_eq!(out["errors"]["entry"], "RemoteEntryNotFoundError");
    assert_eq!(out["errors"]["gated"], "GatedRepoError");

    // The same cache, used by sous: nothing to download.
    let mut cmd = sous();
    cmd.env("HF_ENDPOINT", &mirror.url)
        .env("HF_HUB_CACHE", cache.path());
    let (code, stdout, stderr) = run(cmd.args(["pull", "acme/shards", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        report["downloaded_bytes"], 0,
        "sous reuses the blobs huggingface_hub wrote"
    );
    assert_eq!(report["commit"], out["sha"]);
}

#[test]
fn huggingface_hub_finds_offline_what_sous_pulled() {
    let Some(python) = python() else { return };
    let root = generated_repo("shards", 210);
    let mirror = Mirror::start(&root, &[], &[]);
    let cache = tempfile::tempdir().expect("tempdir");
    let mut cmd = sous();
    cmd.env("HF_ENDPOINT", &mirror.url)
        .env("HF_HUB_CACHE", cache.path());
    let (code, stdout, stderr) = run(cmd.args(["pull", "acme/shards", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("json");
    drop(mirror);

    let script = r#"
import json
from huggingface_hub import snapshot_download, hf_hub_download, scan_cache_dir
path = snapshot_download("acme/shards", local_files_only=True)
config = hf_hub_download("acme/shards", "config.json")
info = scan_cache_dir()
repos = [{"id": r.repo_id, "refs": sorted(r.refs), "files": r.nb_files} for r in info.repos]
print(json.dumps({"path": path, "config": open(config).read(), "repos": repos,
                  "warnings": [str(w) for w in info.warnings]}))
"#;
    let cache_str = cache.path().to_str().expect("utf-8");
    let out = py(
        &python,
        script,
        &[("HF_HUB_OFFLINE", "1"), ("HF_HUB_CACHE", cache_str)],
    );
    assert_eq!(out["path"], report["path"]);
    assert!(
        out["config"]
            .as_str()
            .expect("config")
            .contains("LlamaForCausalLM")
    );
    assert_eq!(
        out["warnings"],
        serde_json::json!([]),
        "scan_cache_dir accepts the layout"
    );
    assert_eq!(out["repos"][0]["id"], "acme/shards");
    assert_eq!(out["repos"][0]["refs"], serde_json::json!(["main"]));
    assert_eq!(out["repos"][0]["files"], report["files"]);
}
