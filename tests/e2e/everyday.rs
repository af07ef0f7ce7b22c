//! The everyday commands against a real instance: `sous serve` of SmolLM2 (pulled from
//! the local mirror, quantized, served by the native engine), then `ps`, `logs -f`,
//! `list`, `rm` (refused while served), `run`, `stop`, and `rm` after; and `rm` of one
//! revision checked with huggingface_hub's own cache scanner.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::snapshot::sous_snapshot;
use crate::util::{Mirror, Running, cpu_exclusive, free_port, generated_repo, root, run, smollm2, sous};

const NAME: &str = "everyday-smollm2";
const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// The directories a test's commands share.
struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            tmp: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, sub: &str) -> String {
        self.tmp.path().join(sub).display().to_string()
    }

    fn envs(&self, endpoint: &str) -> Vec<(String, String)> {
        vec![
            ("SOUS_STATE_DIR".into(), self.path("state")),
            ("SOUS_CACHE_DIR".into(), self.path("cache")),
            ("HF_HUB_CACHE".into(), self.path("hf")),
            ("HF_ENDPOINT".into(), endpoint.to_owned()),
        ]
    }

    /// `sous ARGS` with the test's directories and hub.
    fn cmd(&self, endpoint: &str, args: &[&str]) -> assert_cmd::Command {
        let mut cmd = sous();
        cmd.envs(self.envs(endpoint)).args(args);
        cmd
    }

    fn sous(&self, endpoint: &str, args: &[&str]) -> (i32, String, String) {
        run(&mut self.cmd(endpoint, args))
    }
}

/// `value` with the test's temporary directory spelled `[tmp]` and the values that
/// differ between runs (pids, ports, times, sampled text) replaced by their kind.
fn redact(value: &Value, tmp: &Path) -> Value {
    let tmp = tmp.display().to_string();
    match value {
        Value::String(s) => Value::String(s.replace(&tmp, "[tmp]")),
        Value::Array(items) => Value::Array(items.iter().map(|v| redact(v, Path::new(&tmp))).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        "sous_pid" | "engine_pid" | "port" | "started_unix" | "uptime_seconds"
                        | "seconds" | "ttft_seconds" => json!(format!("[{k}]")),
                        "url" => json!("[url]"),
                        "content" => json!(if v.as_str().is_some_and(|s| !s.is_empty()) {
                            "[text]"
                        } else {
                            "[empty]"
                        }),
                        "commit" => json!(if v.as_str().is_some_and(|s| s.len() == 40) {
                            "[commit]"
                        } else {
                            "[not a commit]"
                        }),
                        "path" | "paths" if v.is_array() => json!(v.as_array().map_or(0, Vec::len)),
                        _ => redact(v, Path::new(&tmp)),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn json_of(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// `sous logs -f`, its stdout collected as it comes.
struct Follower {
    child: std::process::Child,
    out: Arc<Mutex<String>>,
}

impl Follower {
    fn start(envs: &[(String, String)]) -> Follower {
        let mut cmd = Process::new(assert_cmd::cargo::cargo_bin("sous"));
        cmd.current_dir(root())
            .env("NO_COLOR", "1")
            .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .args(["logs", "-f", NAME, "--tail", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("sous logs starts");
        let stdout = child.stdout.take().expect("stdout");
        let out = Arc::new(Mutex::new(String::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(mut o) = sink.lock() {
                    o.push_str(&line);
                    o.push('\n');
                }
            }
        });
        Follower { child, out }
    }

    fn text(&self) -> String {
        self.out.lock().map(|o| o.clone()).unwrap_or_default()
    }

    fn exited_within(&mut self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn ps_logs_list_rm_run_and_stop_manage_a_served_recipe() {
    if smollm2().is_none() {
        return;
    }
    let _cpu = cpu_exclusive();
    let mirror = Mirror::start(&root().join("target/models"), &[], &[]);
    let dirs = Dirs::new();
    let port = free_port();
    let recipe = dirs.tmp.path().join("recipe.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"{NAME}\"\n[model]\nrepo = \"{REPO}\"\nserved_name = \"smollm2\"\n[quantize]\nscheme = \"nvfp4a16\"\n\
             [engine]\nkind = \"native\"\n[memory]\nkv_cache_bytes = \"128MiB\"\n[serving]\nmax_model_len = 2048\n\
             [server]\nhost = \"127.0.0.1\"\nport = {port}\nstop_grace = \"10s\"\n"
        ),
    )
    .expect("recipe");
    let recipe = recipe.display().to_string();
    let envs = dirs.envs(&mirror.url);
    let env_refs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut serve = Running::start(&["serve", "--recipe", &recipe], &env_refs);
    assert!(
        serve.wait_for("ready", Duration::from_secs(300)),
        "{}",
        serve.stderr()
    );

    // ps: the instance, healthy, with its load from /metrics.
    let (code, stdout, stderr) = dirs.sous(&mirror.url, &["ps", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let ps = json_of(&stdout);
    assert_eq!(ps[0]["health"], "ok", "{ps}");
    assert!(ps[0]["kv_cache_usage"].is_number(), "{ps}");
    insta::assert_json_snapshot!("ps", redact(&ps, dirs.tmp.path()));
    let (_, table, _) = dirs.sous(&mirror.url, &["ps"]);
    assert!(
        table.starts_with("NAME") && table.contains(NAME) && table.contains(" ok "),
        "{table}"
    );

    // logs -f follows from here on.
    let mut follower = Follower::start(&envs);
    std::thread::sleep(Duration::from_millis(500));

    // list: the pulled model and its quantized variant, with provenance and its user.
    let (code, stdout, stderr) = dirs.sous(&mirror.url, &["list", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let mut list = json_of(&stdout);
    // The variant's size includes its completion marker, whose timings differ per run.
    let size = list["variants"][0]["size_on_disk"].as_u64().unwrap_or(0);
    assert!((100_000_000..140_000_000).contains(&size), "{list}");
    list["variants"][0]["size_on_disk"] = json!("[about 120 MB]");
    insta::assert_json_snapshot!("list-serving", redact(&list, dirs.tmp.path()));
    assert_eq!(list["variants"][0]["served_by"], json!([NAME]));
    assert_eq!(list["variants"][0]["repo"], REPO);
    assert_eq!(list["models"][0]["revisions"][0]["status"], "complete");

    // rm refuses what is served, and names the closest name for a typo.
    sous_snapshot!("rm-served", dirs.cmd(&mirror.url, &["rm", NAME, "--yes"]));
    sous_snapshot!(
        "rm-typo",
        dirs.cmd(&mirror.url, &["rm", "everyday-smollm", "--yes"])
    );
    sous_snapshot!("stop-typo", dirs.cmd(&mirror.url, &["stop", "everyday-smolm2"]));

    // run: a one-shot prompt through the running instance, streamed and as JSON.
    let (code, stdout, stderr) = ask(&dirs, &mirror.url, &recipe, false);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("using the running instance"), "{stderr}");
    assert!(
        !stdout.trim().is_empty() && stderr.contains("done 8 tokens"),
        "{stdout}\n{stderr}"
    );
    let streamed = stdout;
    let (code, stdout, stderr) = ask(&dirs, &mirror.url, &recipe, true);
    assert_eq!(code, 0, "{stderr}");
    let answer = json_of(&stdout);
    assert_eq!(answer["content"].as_str().map(str::trim), Some(streamed.trim()));
    insta::assert_json_snapshot!("run", redact(&answer, dirs.tmp.path()));

    // stop: the instance ends cleanly, `logs -f` saw its last lines and ends with it.
    let (code, stdout, stderr) = dirs.sous(&mirror.url, &["stop", NAME, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    insta::assert_json_snapshot!("stop", redact(&json_of(&stdout), dirs.tmp.path()));
    assert_eq!(serve.wait(Duration::from_secs(20)), Some(0), "{}", serve.stderr());
    assert!(
        follower.exited_within(Duration::from_secs(10)),
        "logs -f still follows a stopped instance"
    );
    let followed = follower.text();
    assert!(
        followed.contains("Shutting down"),
        "logs -f did not stream the shutdown lines:\n{followed}"
    );
    let (_, stdout, _) = dirs.sous(&mirror.url, &["ps", "--json"]);
    assert_eq!(json_of(&stdout), json!([]));

    // rm: a dry run off a terminal, then the variant and the model for real.
    let (code, stdout, stderr) = dirs.sous(&mirror.url, &["rm", NAME, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let mut dry = json_of(&stdout);
    assert_eq!(dry["removed"], false);
    assert!(
        (100_000_000..140_000_000).contains(&dry["bytes"].as_u64().unwrap_or(0)),
        "{dry}"
    );
    dry["bytes"] = json!("[about 120 MB]");
    assert!(
        Path::new(&dirs.path("cache"))
            .join("quantized")
            .join(NAME)
            .exists()
    );
    insta::assert_json_snapshot!("rm-dry-run", redact(&dry, dirs.tmp.path()));
    let (code, _, stderr) = dirs.sous(&mirror.url, &["rm", NAME, "--yes"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !Path::new(&dirs.path("cache"))
            .join("quantized")
            .join(NAME)
            .exists()
    );
    let (code, _, stderr) = dirs.sous(&mirror.url, &["rm", REPO, "--yes"]);
    assert_eq!(code, 0, "{stderr}");
    let (_, stdout, _) = dirs.sous(&mirror.url, &["list", "--json"]);
    let after = json_of(&stdout);
    assert_eq!(
        (after["models"].clone(), after["variants"].clone()),
        (json!([]), json!([]))
    );
}

/// `sous run` of one greedy, 8-token question to the recipe's instance.
fn ask(dirs: &Dirs, endpoint: &str, recipe: &str, json: bool) -> (i32, String, String) {
    let mut args = vec![
        "run",
        "--recipe",
        recipe,
        "Name a color.",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ];
    if json {
        args.push("--json");
    }
    dirs.sous(endpoint, &args)
}

#[test]
fn ps_shows_a_stale_record_and_prune_removes_it() {
    let dirs = Dirs::new();
    let dir = Path::new(&dirs.path("state")).join("gone");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // A record whose `sous serve` no longer exists (the highest pid Linux never gives).
    std::fs::write(
        dir.join("instance.json"),
        r#"{"name":"gone","sous_pid":4194304,"engine_pid":4194305,"url":"http://127.0.0.1:9","recipe_hash":"h","utilization":null}"#,
    )
    .expect("record");
    sous_snapshot!("ps-stale-table", dirs.cmd("http://127.0.0.1:9", &["ps"]));
    let (_, stdout, _) = dirs.sous("http://127.0.0.1:9", &["ps", "--json"]);
    insta::assert_json_snapshot!("ps-stale", redact(&json_of(&stdout), dirs.tmp.path()));
    sous_snapshot!("ps-prune", dirs.cmd("http://127.0.0.1:9", &["ps", "--prune"]));
    assert!(!dir.join("instance.json").exists());
    let (_, stdout, _) = dirs.sous("http://127.0.0.1:9", &["ps", "--json"]);
    assert_eq!(json_of(&stdout), json!([]));
    sous_snapshot!("logs-typo", dirs.cmd("http://127.0.0.1:9", &["logs", "gonne"]));
}

#[test]
fn rm_of_one_revision_leaves_a_cache_huggingface_hub_reads_without_warnings() {
    let Some(python) = crate::util::python("huggingface_hub's cache scan") else {
        return;
    };
    let mirror = Mirror::start(&generated_repo("shards", 210), &[], &[]);
    let dirs = Dirs::new();
    let (code, stdout, stderr) = dirs.sous(&mirror.url, &["pull", "acme/shards", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let pulled = json_of(&stdout);
    // A second revision as huggingface_hub lays one out: its own snapshot and ref, one
    // blob shared with main and one of its own.
    let repo = Path::new(&dirs.path("hf")).join("models--acme--shards");
    let v2 = "0123456789abcdef0123456789abcdef01234567";
    let snap = repo.join("snapshots").join(v2);
    std::fs::create_dir_all(&snap).expect("mkdir");
    let main_config =
        std::fs::read_link(Path::new(pulled["path"].as_str().expect("path")).join("config.json"))
            .expect("link");
    std::os::unix::fs::symlink(&main_config, snap.join("config.json")).expect("link");
    std::fs::write(repo.join("blobs").join("v2only"), "v2").expect("blob");
    std::os::unix::fs::symlink("../../blobs/v2only", snap.join("extra.txt")).expect("link");
    std::fs::write(repo.join("refs").join("v2"), v2).expect("ref");

    let scan = r#"
import json
from huggingface_hub import scan_cache_dir
info = scan_cache_dir()
print(json.dumps({"repos": [{"id": r.repo_id, "refs": sorted(r.refs), "revisions": len(r.revisions)} for r in info.repos],
                  "warnings": [str(w) for w in info.warnings]}))
"#;
    let hf = dirs.path("hf");
    let scanned = || {
        crate::hub_python::py(
            &python,
            scan,
            &[("HF_HUB_OFFLINE", "1"), ("HF_HUB_CACHE", hf.as_str())],
        )
    };
    assert_eq!(scanned()["repos"][0]["revisions"], 2);
    let (code, stdout, stderr) = dirs.sous(&mirror.url, &["rm", "acme/shards@v2", "--yes", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let removal = json_of(&stdout);
    assert_eq!(
        (removal["kind"].clone(), removal["bytes"].clone()),
        (json!("revision"), json!(2))
    );
    assert!(
        repo.join("blobs")
            .join(main_config.file_name().expect("blob"))
            .exists(),
        "the shared blob stays"
    );
    assert!(!repo.join("blobs/v2only").exists() && !repo.join("refs/v2").exists());
    let after = scanned();
    assert_eq!(after["warnings"], json!([]), "{after}");
    assert_eq!(
        after["repos"],
        json!([{"id": "acme/shards", "refs": ["main"], "revisions": 1}])
    );
    let (code, _, stderr) = dirs.sous(&mirror.url, &["rm", "acme/shards", "--yes"]);
    assert_eq!(code, 0, "{stderr}");
    let after = scanned();
    assert_eq!(after, json!({"repos": [], "warnings": []}));
}
