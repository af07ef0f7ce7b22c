//! `sous serve` running engines for real, against the fake engine (tests/fake-engine):
//! the argv it receives equals `--dry-run`'s, readiness and KV capacity are reported,
//! the DGX Spark OOM fallback, restarts with backoff, signals, no process left, and
//! `--replace` (unchanged: nothing; changed: a swap with no gap in `/health`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::snapshot::sous_snapshot;
use crate::util::{Poller, Running, alive, cpu_exclusive, fake_engine, free_port, health, run, sous};

struct Setup {
    dir: tempfile::TempDir,
    recipe: PathBuf,
    record: PathBuf,
    port: u16,
}

/// A recipe running `kind` through the fake engine, with `extra` TOML appended.
fn setup(kind: &str, extra: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("model");
    std::fs::create_dir_all(&model).expect("model dir");
    let port = free_port();
    let recipe = dir.path().join("fake.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"fake-{kind}\"\n[model]\npath = \"{}\"\nserved_name = \"fake-model\"\n\n[engine]\nkind = \"{kind}\"\nexecutable = \"{}\"\n\n[server]\nport = {port}\nstop_grace = \"5s\"\n\n{extra}\n",
            model.display(),
            fake_engine().display()
        ),
    )
    .expect("recipe");
    Setup {
        record: dir.path().join("record.json"),
        recipe,
        dir,
        port,
    }
}

fn state_env(setup: &Setup) -> (String, String) {
    (
        "SOUS_STATE_DIR".into(),
        setup.dir.path().join("state").display().to_string(),
    )
}

fn start(setup: &Setup, envs: &[(&str, &str)]) -> Running {
    start_with(setup, &[], envs)
}

/// `sous serve [FLAGS] --recipe` on the setup's recipe, recording the fake engine's argv.
fn start_with(setup: &Setup, flags: &[&str], envs: &[(&str, &str)]) -> Running {
    let (k, v) = state_env(setup);
    let mut all: Vec<(&str, &str)> = vec![
        (k.as_str(), v.as_str()),
        ("FAKE_RECORD", setup.record.to_str().expect("utf-8")),
    ];
    all.extend_from_slice(envs);
    let mut args = vec!["serve"];
    args.extend_from_slice(flags);
    args.extend(["--recipe", setup.recipe.to_str().expect("utf-8")]);
    Running::start(&args, &all)
}

fn dry_run_argv(setup: &Setup) -> Vec<String> {
    let (k, v) = state_env(setup);
    let (code, stdout, stderr) = run(sous()
        .env(k, v)
        .args(["serve", "--dry-run", "--json", "--recipe"])
        .arg(&setup.recipe));
    assert_eq!(code, 0, "{stderr}");
    let launch: Value = serde_json::from_str(&stdout).expect("json");
    launch["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(|a| a.as_str().expect("str").to_owned())
        .collect()
}

fn record(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("the engine recorded its argv")).expect("json")
}

const READY: Duration = Duration::from_secs(30);

#[test]
fn vllm_gets_the_dry_run_argv_is_reported_ready_and_stops_on_sigterm() {
    let s = setup(
        "vllm",
        "[memory]\ngpu_utilization = 0.9\nkv_cache_dtype = \"fp8\"\n[serving]\nmax_model_len = 8192\nprefix_caching = true\nspeculative = { method = \"mtp\", tokens = 2 }\n[env]\nVLLM_PLE_CPU_OFFLOAD = \"1\"\n",
    );
    let mut sous = start(&s, &[("FAKE_FORK", "1")]);
    assert!(
        sous.wait_for("ready http://127.0.0.1:", READY),
        "{}",
        sous.stderr()
    );
    let stderr = sous.stderr();
    assert!(
        stderr.contains(&format!("ready http://127.0.0.1:{}", s.port)),
        "{stderr}"
    );
    assert!(
        stderr.contains("KV cache 450000 tokens, max concurrency 54.93x"),
        "{stderr}"
    );
    assert!(
        stderr.contains("vllm | (EngineCore"),
        "engine output is streamed with a prefix: {stderr}"
    );
    let rec = record(&s.record);
    let argv: Vec<String> = rec["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(|a| a.as_str().expect("str").to_owned())
        .collect();
    assert_eq!(argv, dry_run_argv(&s));
    assert_eq!(rec["env"]["VLLM_PLE_CPU_OFFLOAD"], "1");
    let log = std::fs::read_to_string(s.dir.path().join("state/fake-vllm/engine.log")).expect("engine log");
    assert!(log.contains("GPU KV cache size: 450000 tokens"), "{log}");
    let state: Value = serde_json::from_slice(
        &std::fs::read(s.dir.path().join("state/fake-vllm/instance.json")).expect("state"),
    )
    .expect("json");
    assert_eq!(state["url"], format!("http://127.0.0.1:{}", s.port));
    // The phases of the start, as the engine logged them.
    assert!(
        stderr.contains("(weights 0.3 s, engine init 0.1 s), memory fraction 0.9"),
        "{stderr}"
    );
    assert_eq!(
        state["phases"],
        serde_json::json!([
            {"phase": "weights", "seconds": 0.3},
            {"phase": "engine_init", "seconds": 0.12},
        ])
    );

    sous.signal("TERM");
    assert_eq!(sous.wait(Duration::from_secs(10)), Some(0), "{}", sous.stderr());
    let engine = rec["pid"].as_u64().expect("pid");
    let worker = rec["worker_pid"].as_u64().expect("worker pid");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !alive(engine) && !alive(worker),
        "no engine process survives sous"
    );
}

#[test]
fn dgx_spark_scenario_falls_back_from_0_90_to_0_85() {
    let s = setup(
        "vllm",
        "[memory]\ngpu_utilization = 0.90\noom_fallback = [0.85]\n",
    );
    let mut sous = start(&s, &[("FAKE_OOM_ABOVE", "0.87")]);
    assert!(sous.wait_for("ready http://", READY), "{}", sous.stderr());
    let stderr = sous.stderr();
    assert!(stderr.contains("CUDA out of memory"), "{stderr}");
    assert!(
        stderr.contains("retrying with `memory.gpu_utilization = 0.85`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("memory fraction 0.85, KV cache 425000 tokens"),
        "{stderr}"
    );
    let argv = record(&s.record)["argv"].to_string();
    assert!(argv.contains("\"--gpu-memory-utilization\",\"0.85\""), "{argv}");
    sous.signal("INT");
    assert_eq!(sous.wait(Duration::from_secs(10)), Some(0));
}

#[test]
fn oom_at_every_fraction_exits_1_with_the_engines_message() {
    let s = setup("vllm", "[memory]\ngpu_utilization = 0.95\noom_fallback = [0.9]\n");
    let mut sous = start(&s, &[("FAKE_OOM_ABOVE", "0.87")]);
    assert_eq!(sous.wait(READY), Some(1), "{}", sous.stderr());
    let stderr = sous.stderr();
    assert!(
        stderr.contains("ran out of memory at start-up with every memory fraction tried (0.95, 0.9)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("torch.OutOfMemoryError: CUDA out of memory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: lower `memory.gpu_utilization`"),
        "{stderr}"
    );
}

/// `MemAvailable` of this machine, in bytes.
fn available_memory() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let line = text
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .expect("MemAvailable");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .expect("value")
        .parse()
        .expect("number");
    kib * 1024
}

/// The pids of the fake engine's launches, in order.
fn launch_pids(log: &Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .expect("launch log")
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("json")["pid"]
                .as_u64()
                .expect("pid")
        })
        .collect()
}

/// `sous serve` on a recipe falling back from 0.9 to 0.85 with a floor 2 GiB under what
/// is available, its engine taking the host's memory at fractions above `hog_above`
/// until half a GiB under the floor (at most 8 GiB, whatever other tests free or take
/// meanwhile); and the log of the engine's launches.
fn start_over_the_floor(hog_above: &str) -> (Setup, PathBuf, Running) {
    let floor = available_memory() - (2 << 30);
    let until = (floor - (512 << 20)).to_string();
    let s = setup(
        "vllm",
        &format!("[memory]\ngpu_utilization = 0.90\noom_fallback = [0.85]\nhost_floor = {floor}\n"),
    );
    let launches = s.dir.path().join("launches.jsonl");
    let hog = (8u64 << 30).to_string();
    let sous = start(
        &s,
        &[
            ("FAKE_HOG_ABOVE", hog_above),
            ("FAKE_HOG_BYTES", &hog),
            ("FAKE_HOG_UNTIL", &until),
            ("FAKE_LAUNCH_LOG", launches.to_str().expect("utf-8")),
        ],
    );
    (s, launches, sous)
}

/// An engine taking the host's memory at 0.9: stopped at the floor, then started again
/// at 0.85.
#[test]
fn an_engine_eating_the_hosts_memory_is_stopped_at_the_floor_and_falls_back() {
    // Alone: another test's gigabytes would move the floor's margin.
    let _alone = cpu_exclusive();
    let (_s, launches, mut sous) = start_over_the_floor("0.87");
    assert!(sous.wait_for("ready http://", READY), "{}", sous.stderr());
    let stderr = sous.stderr();
    assert!(
        stderr.contains("below `memory.host_floor`")
            && stderr.contains("stopped the engine; starting it again with `memory.gpu_utilization = 0.85`"),
        "{stderr}"
    );
    assert!(stderr.contains("memory fraction 0.85"), "{stderr}");
    let pids = launch_pids(&launches);
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(!alive(pids[0]), "the engine stopped at the floor is gone");
    sous.signal("INT");
    assert_eq!(sous.wait(Duration::from_secs(10)), Some(0), "{}", sous.stderr());
    assert!(!alive(pids[1]), "no engine survives sous");
}

/// The floor crossed at every fraction: exit 1 naming the numbers, no engine left.
#[test]
fn a_floor_crossed_at_every_fraction_exits_1() {
    let _alone = cpu_exclusive();
    let (_s, launches, mut sous) = start_over_the_floor("0.5");
    assert_eq!(sous.wait(READY), Some(1), "{}", sous.stderr());
    let stderr = sous.stderr();
    assert!(
        stderr.contains("stopped the engine at every memory fraction tried (0.9, 0.85): the host's available memory fell to"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: lower `memory.gpu_utilization`"),
        "{stderr}"
    );
    let pids = launch_pids(&launches);
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.iter().all(|&p| !alive(p)), "{pids:?} still running");
}

#[test]
fn crashes_restart_with_backoff_then_give_up_with_the_engines_code() {
    let s = setup("vllm", "[engine.restarts]\n");
    // `engine.restarts` lives in [engine]; rewrite the recipe with it.
    let text = std::fs::read_to_string(&s.recipe)
        .expect("recipe")
        .replace("[engine.restarts]\n", "");
    std::fs::write(
        &s.recipe,
        text.replace("kind = \"vllm\"", "kind = \"vllm\"\nrestarts = 2"),
    )
    .expect("recipe");
    let mut sous = start(&s, &[("FAKE_CRASH_AFTER", "1.5"), ("FAKE_CRASH_CODE", "7")]);
    assert_eq!(sous.wait(Duration::from_secs(40)), Some(7), "{}", sous.stderr());
    let stderr = sous.stderr();
    assert!(
        stderr.contains("exited with code 7; restarting in 1 s (1 restarts left)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("exited with code 7; restarting in 2 s (0 restarts left)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("crashed more than 2 times in 10 minutes; giving up with its exit code 7"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("ready http://").count(), 3, "{stderr}");
}

#[test]
fn a_crash_is_restarted_and_serving_goes_on() {
    let s = setup("vllm", "");
    let counter = s.dir.path().join("launches");
    let counter = counter.to_str().expect("utf-8");
    let mut sous = start(
        &s,
        &[
            ("FAKE_CRASH_AFTER", "1.5"),
            ("FAKE_CRASH_TIMES", "1"),
            ("FAKE_COUNTER", counter),
        ],
    );
    assert!(sous.wait_for("restarting in 1 s", READY), "{}", sous.stderr());
    let deadline = std::time::Instant::now() + READY;
    while sous.stderr().matches("ready http://").count() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        sous.stderr().matches("ready http://").count(),
        2,
        "{}",
        sous.stderr()
    );
    sous.signal("TERM");
    assert_eq!(sous.wait(Duration::from_secs(10)), Some(0));
}

#[test]
fn an_engine_ignoring_sigterm_is_killed_after_the_grace_period() {
    let s = setup("vllm", "");
    let text = std::fs::read_to_string(&s.recipe)
        .expect("recipe")
        .replace("stop_grace = \"5s\"", "stop_grace = \"1s\"");
    std::fs::write(&s.recipe, text).expect("recipe");
    let mut sous = start(&s, &[("FAKE_IGNORE_SIGTERM", "1")]);
    assert!(sous.wait_for("ready http://", READY), "{}", sous.stderr());
    let started = std::time::Instant::now();
    sous.signal("TERM");
    assert_eq!(sous.wait(Duration::from_secs(10)), Some(0), "{}", sous.stderr());
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the grace period was honoured"
    );
    assert!(
        sous.stderr().contains("received SIGTERM; ignoring it"),
        "{}",
        sous.stderr()
    );
    let engine = record(&s.record)["pid"].as_u64().expect("pid");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!alive(engine));
}

#[test]
fn an_engine_rejecting_its_flags_exits_with_its_own_code() {
    let s = setup("vllm", "");
    let text = std::fs::read_to_string(&s.recipe).expect("recipe");
    std::fs::write(
        &s.recipe,
        text.replace(
            "kind = \"vllm\"",
            "kind = \"vllm\"\nextra_args = [\"--frobnicate\"]",
        ),
    )
    .expect("recipe");
    let mut sous = start(&s, &[]);
    assert_eq!(
        sous.wait(READY),
        Some(2),
        "argparse's exit code: {}",
        sous.stderr()
    );
    assert!(
        sous.stderr().contains("unrecognized arguments: --frobnicate"),
        "{}",
        sous.stderr()
    );
}

#[test]
fn killing_sous_takes_the_engine_down_too() {
    let s = setup("vllm", "");
    let mut sous = start(&s, &[]);
    assert!(sous.wait_for("ready http://", READY), "{}", sous.stderr());
    let engine = record(&s.record)["pid"].as_u64().expect("pid");
    sous.signal("KILL");
    let _ = sous.wait(Duration::from_secs(5));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while alive(engine) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(engine), "the engine died with sous");
}

/// `sous bench coldstart`: three starts of the fake vLLM, each phase it logs with its
/// median and spread, the engine gone after each.
#[test]
fn bench_coldstart_reports_each_phase_over_the_starts() {
    let s = setup("vllm", "");
    let launches = s.dir.path().join("launches.jsonl");
    let (k, v) = state_env(&s);
    let (code, stdout, stderr) = run(sous()
        .env(k, v)
        .env("FAKE_LOAD_SECS", "0.2")
        .env("FAKE_LAUNCH_LOG", &launches)
        .args(["bench", "coldstart", "--starts", "3", "--json", "--recipe"])
        .arg(&s.recipe));
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(report["starts"].as_array().map(Vec::len), Some(3), "{report}");
    let spreads = report["spreads"].as_array().expect("spreads");
    let names: Vec<&str> = spreads
        .iter()
        .map(|s| s["what"].as_str().expect("what"))
        .collect();
    assert_eq!(names, ["ready", "weights", "engine init"]);
    assert_eq!(spreads[1]["median"], 0.2);
    assert_eq!(spreads[2]["count"], 3);
    assert!(spreads[0]["min"].as_f64().expect("min") >= 0.2, "{report}");
    let pids = launch_pids(&launches);
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&p| !alive(p)), "{pids:?} still running");
    assert_eq!(stderr.matches("ready after").count(), 3, "{stderr}");
}

/// The kept compile caches: the fake vLLM compiles for 1.5 s when its
/// `VLLM_CACHE_ROOT` is empty and reads the graphs back in a tenth of that. The first
/// start of `bench coldstart` is cold and fills sous's keyed directory, the next ones
/// are warm and compile faster; with `--cold-cache` every start is cold again.
#[test]
fn a_start_reads_back_the_compile_cache_an_earlier_start_filled() {
    let s = setup("vllm", "");
    let cache = s.dir.path().join("cache");
    let (k, v) = state_env(&s);
    let coldstart = |extra: &[&str]| {
        let (code, stdout, stderr) = run(sous()
            .env(&k, &v)
            .env("SOUS_CACHE_DIR", &cache)
            .env("FAKE_LOAD_SECS", "0.1")
            .env("FAKE_COMPILE_SECS", "1.5")
            .env("FAKE_RECORD", &s.record)
            .args(["bench", "coldstart", "--starts", "2", "--json"])
            .args(extra)
            .arg("--recipe")
            .arg(&s.recipe));
        assert_eq!(code, 0, "{stderr}");
        let report: Value = serde_json::from_str(&stdout).expect("json");
        (report, stderr)
    };
    let compile = |start: &Value| {
        start["phases"]
            .as_array()
            .expect("phases")
            .iter()
            .find(|p| p["phase"] == "compile")
            .and_then(|p| p["seconds"].as_f64())
            .unwrap_or_else(|| panic!("no compile phase in {start}"))
    };

    let (kept, stderr) = coldstart(&[]);
    let starts = kept["starts"].as_array().expect("starts");
    assert_eq!(starts[0]["compile_cache"]["files"], 0, "{kept}");
    assert!(starts[1]["compile_cache"]["files"].as_u64() > Some(0), "{kept}");
    assert_eq!((compile(&starts[0]), compile(&starts[1])), (1.5, 0.15), "{kept}");
    assert_eq!(stderr.matches("ready after").count(), 2, "{stderr}");

    // The engine was pointed into sous's cache, under the release and the device.
    let env = &record(&s.record)["env"];
    let root = env["VLLM_CACHE_ROOT"].as_str().expect("VLLM_CACHE_ROOT set");
    let keyed = std::path::Path::new(root).parent().expect("keyed directory");
    assert!(keyed.starts_with(cache.join("engines")), "{root}");
    assert_eq!(keyed.file_name().and_then(|n| n.to_str()), Some("cpu"), "{root}");
    assert!(keyed.join("key.json").is_file() && keyed.join("vllm/torch_compile_cache").is_dir());
    for name in [
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "FLASHINFER_WORKSPACE_BASE",
    ] {
        let dir = env[name].as_str().unwrap_or_else(|| panic!("{name} set"));
        assert!(std::path::Path::new(dir).starts_with(keyed), "{name}={dir}");
    }
    // `serve --dry-run` shows the same directory.
    let (code, stdout, stderr) = run(sous()
        .env(&k, &v)
        .env("SOUS_CACHE_DIR", &cache)
        .args(["serve", "--dry-run", "--json", "--recipe"])
        .arg(&s.recipe));
    assert_eq!(code, 0, "{stderr}");
    let launch: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(launch["env"]["VLLM_CACHE_ROOT"], root);

    let (cold, stderr) = coldstart(&["--cold-cache"]);
    for start in cold["starts"].as_array().expect("starts") {
        assert_eq!(start["compile_cache"]["files"], 0, "{cold}");
        assert_eq!(compile(start), 1.5, "{cold}");
    }
    assert_eq!(stderr.matches("emptied").count(), 2, "{stderr}");

    // `sous serve` says which directory it gives the engine and that it is warm.
    let cache_dir = cache.display().to_string();
    let mut sous = start(
        &s,
        &[("SOUS_CACHE_DIR", &cache_dir), ("FAKE_COMPILE_SECS", "0.5")],
    );
    assert!(sous.wait_for("ready http://", READY), "{}", sous.stderr());
    let said = sous.stderr();
    assert!(
        said.contains(&format!("cache {} (warm: 1 files", keyed.display())),
        "{said}"
    );
    sous.signal("TERM");
    assert_eq!(sous.wait(Duration::from_secs(10)), Some(0), "{said}");
}

#[test]
fn sglang_and_trtllm_run_their_own_command_lines() {
    for (kind, extra) in [
        ("sglang", "[memory]\ngpu_utilization = 0.8\n"),
        (
            "trtllm",
            "[memory]\ngpu_utilization = 0.8\n[serving]\nprefix_caching = true\n",
        ),
    ] {
        let s = setup(kind, extra);
        let mut sous = start(&s, &[]);
        assert!(sous.wait_for("ready http://", READY), "{kind}: {}", sous.stderr());
        let stderr = sous.stderr();
        assert!(stderr.contains("KV cache 400000 tokens"), "{kind}: {stderr}");
        let argv: Vec<String> = record(&s.record)["argv"]
            .as_array()
            .expect("argv")
            .iter()
            .map(|a| a.as_str().expect("str").to_owned())
            .collect();
        assert_eq!(argv, dry_run_argv(&s), "{kind}");
        if kind == "trtllm" {
            let options = s.dir.path().join("state/fake-trtllm/trtllm-options.yaml");
            let yaml = std::fs::read_to_string(options).expect("options file written");
            assert!(yaml.contains("enable_block_reuse: true"), "{yaml}");
        }
        sous.signal("TERM");
        assert_eq!(sous.wait(Duration::from_secs(10)), Some(0), "{kind}");
    }
}

/// The shared compile cache of the e2e runs is cold or warm depending on which test
/// started an engine first.
const CACHE_STATE: (&str, &str) = (r"\((cold: this start fills it|warm: [^)]*)\)", "([CACHE STATE])");

#[test]
fn a_missing_engine_or_model_is_a_clear_error() {
    let s = setup("vllm", "");
    let text = std::fs::read_to_string(&s.recipe).expect("recipe");
    let broken = text.replace(&fake_engine().display().to_string(), "/nonexistent/vllm");
    std::fs::write(&s.recipe, broken).expect("recipe");
    let (k, v) = state_env(&s);
    sous_snapshot!(
        "serve-engine-missing",
        sous().env(k, v).args(["serve", "--recipe"]).arg(&s.recipe),
        &[CACHE_STATE]
    );

    std::fs::remove_dir_all(s.dir.path().join("model")).expect("remove model");
    std::fs::write(&s.recipe, text).expect("recipe");
    sous_snapshot!(
        "serve-model-missing",
        sous().args(["serve", "--recipe"]).arg(&s.recipe)
    );
}

/// Starts `sous serve --replace` for the setup's recipe.
fn start_replace(setup: &Setup, envs: &[(&str, &str)]) -> Running {
    start_with(setup, &["--replace"], envs)
}

fn instance_state(setup: &Setup, name: &str) -> Value {
    let path = setup.dir.path().join("state").join(name).join("instance.json");
    serde_json::from_slice(&std::fs::read(&path).expect("instance.json")).expect("json")
}

#[test]
fn replace_with_an_unchanged_recipe_does_nothing_and_a_second_serve_is_refused() {
    let s = setup("vllm", "[memory]\ngpu_utilization = 0.4\n");
    let mut first = start(&s, &[]);
    assert!(first.wait_for("ready http://", READY), "{}", first.stderr());
    let engine = record(&s.record)["pid"].as_u64().expect("pid");

    let (k, v) = state_env(&s);
    sous_snapshot!(
        "serve-already-served",
        sous().env(&k, &v).args(["serve", "--recipe"]).arg(&s.recipe),
        &[CACHE_STATE]
    );
    sous_snapshot!(
        "serve-replace-unchanged",
        sous()
            .env(&k, &v)
            .args(["serve", "--replace", "--recipe"])
            .arg(&s.recipe),
        &[CACHE_STATE]
    );
    assert!(alive(engine), "the running engine was left alone");
    assert_eq!(
        record(&s.record)["pid"].as_u64(),
        Some(engine),
        "no engine started"
    );
    assert_eq!(health(s.port).map(|(code, _)| code), Ok(200));
    first.signal("TERM");
    assert_eq!(first.wait(Duration::from_secs(10)), Some(0));
}

#[test]
fn replace_with_a_changed_recipe_swaps_instances_with_no_gap_in_health() {
    let s = setup("vllm", "[memory]\ngpu_utilization = 0.4\n");
    let slow = [("FAKE_LOAD_SECS", "1.5")];
    let mut old = start(&s, &slow);
    assert!(old.wait_for("ready http://", READY), "{}", old.stderr());
    let old_engine = record(&s.record)["pid"].as_u64().expect("pid");
    let poller = Poller::start(s.port);
    std::thread::sleep(Duration::from_millis(300));

    let text = std::fs::read_to_string(&s.recipe).expect("recipe");
    std::fs::write(
        &s.recipe,
        text.replace("gpu_utilization = 0.4", "gpu_utilization = 0.45"),
    )
    .expect("recipe");
    let mut new = start_replace(&s, &slow);
    assert!(new.wait_for("replaced", READY), "{}", new.stderr());
    let stderr = new.stderr();
    assert!(
        stderr.contains("the new instance starts beside it, the old one stops once the new one is ready"),
        "{stderr}"
    );
    assert_eq!(old.wait(Duration::from_secs(10)), Some(0), "{}", old.stderr());
    std::thread::sleep(Duration::from_millis(300));
    let seen = poller.finish();

    let new_engine = record(&s.record)["pid"].as_u64().expect("pid");
    assert_ne!(new_engine, old_engine);
    let failures: Vec<_> = seen.iter().filter(|r| !matches!(r, Ok((200, _)))).collect();
    assert!(
        failures.is_empty(),
        "/health failed during the swap: {failures:?}"
    );
    let pids: Vec<u64> = seen
        .iter()
        .filter_map(|r| r.as_ref().ok().and_then(|(_, p)| *p))
        .collect();
    assert_eq!(pids.first(), Some(&old_engine), "the old instance answered first");
    assert_eq!(pids.last(), Some(&new_engine), "the new instance answers last");
    assert!(!alive(old_engine), "the old engine is gone");
    let state = instance_state(&s, "fake-vllm");
    assert_eq!(state["sous_pid"].as_u64(), Some(u64::from(new.child.id())));
    assert_eq!(state["utilization"].as_f64(), Some(0.45));

    new.signal("TERM");
    assert_eq!(new.wait(Duration::from_secs(10)), Some(0));
    assert!(
        !s.dir.path().join("state/fake-vllm/instance.json").exists(),
        "a stopped instance leaves no record"
    );
}

#[test]
fn replace_stops_the_old_instance_first_when_both_cannot_run_and_says_why() {
    for (kind, memory, why) in [
        (
            "vllm",
            "gpu_utilization = 0.8",
            "the running instance holds 0.8 of the GPU memory and the new one asks for 0.85",
        ),
        (
            "sglang",
            "gpu_utilization = 0.3",
            "both instances need port {port}, and SGLang binds it without SO_REUSEPORT",
        ),
    ] {
        let s = setup(kind, &format!("[memory]\n{memory}\n"));
        let mut old = start(&s, &[]);
        assert!(old.wait_for("ready http://", READY), "{kind}: {}", old.stderr());
        let text = std::fs::read_to_string(&s.recipe).expect("recipe");
        std::fs::write(&s.recipe, text.replace("0.8", "0.85").replace("0.3", "0.35")).expect("recipe");
        let mut new = start_replace(&s, &[]);
        assert!(new.wait_for("ready http://", READY), "{kind}: {}", new.stderr());
        let stderr = new.stderr();
        let why = why.replace("{port}", &s.port.to_string());
        assert!(stderr.contains(&why), "{kind}: {stderr}");
        assert!(
            stderr.contains("stopping the running instance")
                && stderr.contains("does not answer until the new one is ready"),
            "{kind}: {stderr}"
        );
        assert_eq!(old.wait(Duration::from_secs(10)), Some(0), "{kind}");
        new.signal("TERM");
        assert_eq!(new.wait(Duration::from_secs(10)), Some(0), "{kind}");
    }
}

#[test]
fn a_replacement_that_fails_to_start_leaves_the_old_instance_serving() {
    let s = setup("vllm", "[memory]\ngpu_utilization = 0.4\n");
    let mut old = start(&s, &[]);
    assert!(old.wait_for("ready http://", READY), "{}", old.stderr());
    let old_engine = record(&s.record)["pid"].as_u64().expect("pid");
    let text = std::fs::read_to_string(&s.recipe).expect("recipe");
    std::fs::write(&s.recipe, text.replace("0.4", "0.5")).expect("recipe");
    let mut new = start_replace(&s, &[("FAKE_OOM_ABOVE", "0.45")]);
    assert_eq!(new.wait(READY), Some(1), "{}", new.stderr());
    assert!(new.stderr().contains("CUDA out of memory"), "{}", new.stderr());
    assert!(alive(old_engine));
    assert_eq!(health(s.port), Ok((200, Some(old_engine))));
    let state = instance_state(&s, "fake-vllm");
    assert_eq!(state["sous_pid"].as_u64(), Some(u64::from(old.child.id())));
    old.signal("TERM");
    assert_eq!(old.wait(Duration::from_secs(10)), Some(0));
}

#[test]
fn a_port_in_use_by_another_server_is_refused() {
    let s = setup("vllm", "");
    let squatter = std::net::TcpListener::bind(("127.0.0.1", s.port)).expect("bind");
    let (k, v) = state_env(&s);
    // The port is whatever was free, here also where sous names it alone.
    sous_snapshot!(
        "serve-port-in-use",
        sous().env(k, v).args(["serve", "--recipe"]).arg(&s.recipe),
        &[(r"port \d+", "port [PORT]"), CACHE_STATE]
    );
    drop(squatter);
}

/// A start `sous serve` saw become ready is recorded (`starts.jsonl`, kept after the
/// instance stops), and a Kubernetes render of the recipe sizes its start-up probe from
/// it, saying so in an annotation, instead of covering the whole start-up timeout.
#[test]
fn a_recorded_start_sizes_the_startup_probe_of_a_render() {
    use serde::Deserialize;
    let s = setup("vllm", "");
    let (k, v) = state_env(&s);
    let render = |state: &str| {
        let recipe = s.dir.path().join("deployed.toml");
        std::fs::write(
            &recipe,
            "name = \"fake-vllm\"\n[model]\nrepo = \"Qwen/Qwen3-0.6B\"\n[engine]\nkind = \"vllm\"\n[deploy.storage]\nsize = \"10Gi\"\n",
        )
        .expect("recipe");
        let (code, stdout, stderr) = run(sous()
            .env(&k, state)
            .env("HF_HUB_OFFLINE", "1")
            .args(["deploy", "render", "--target", "k8s", "--recipe"])
            .arg(&recipe));
        assert_eq!(code, 0, "{stderr}");
        let workload = serde_yaml_ng::Deserializer::from_str(&stdout)
            .map(|d| Value::deserialize(d).expect("a YAML document"))
            .find(|d| d["kind"] == "Deployment")
            .expect("a Deployment");
        let probe = workload["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshold"]
            .as_u64()
            .expect("failureThreshold");
        let note = workload["metadata"]["annotations"]["sous.dev/startup-probe"]
            .as_str()
            .expect("the annotation")
            .to_owned();
        (probe, note)
    };
    // Nothing recorded: the probe covers the 30-minute start-up timeout.
    let (probe, note) = render(&v);
    assert_eq!(probe, 180, "{note}");
    assert!(
        note.contains("no start of this engine and release was recorded here"),
        "{note}"
    );

    let mut sous = start(&s, &[]);
    assert!(sous.wait_for("ready http://", READY), "{}", sous.stderr());
    sous.signal("TERM");
    assert_eq!(sous.wait(Duration::from_secs(10)), Some(0), "{}", sous.stderr());
    let starts =
        std::fs::read_to_string(s.dir.path().join("state/fake-vllm/starts.jsonl")).expect("starts.jsonl");
    let start: Value = serde_json::from_str(starts.lines().next().expect("a line")).expect("json");
    assert_eq!(
        (start["engine"].as_str(), start["version"].as_str()),
        (Some("vllm"), Some("0.33.0"))
    );
    let seconds = start["seconds"].as_f64().expect("seconds");
    assert!(seconds > 0.0, "{start}");
    assert!(!s.dir.path().join("state/fake-vllm/instance.json").exists());

    // Three times the start, at least a minute (the fake engine starts in well under
    // 20 s, unless the machine is very busy), in probes 10 s apart.
    let expected = ((seconds * 3.0).max(60.0) / 10.0).ceil() as u64;
    let (probe, note) = render(&v);
    assert_eq!(probe, expected, "{note}");
    assert!(
        note.starts_with(&format!(
            "{expected} x 10s = {}s: 3 times the slowest of 1 start(s) of vllm 0.33.0 that sous serve recorded",
            expected * 10
        )),
        "{note}"
    );
}
