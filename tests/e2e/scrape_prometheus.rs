//! `sous bench scrape --prometheus` against a real Prometheus server (Debian's
//! `prometheus`, 2.42; `scripts/debian-deps.sh` installs it) that scrapes the native
//! engine every second, beside the live `sous bench scrape` of the same engine over the
//! same load: the token counters against the engine's own, the percentiles against
//! the live scrape's, the window, the per-instance figures and their sum, `--selector`,
//! `--svg`, and every error a user can meet (unreachable, not Prometheus, refused
//! query, no series, a window beyond the retention or before the data).
//!
//! Prometheus scrapes the one engine as two jobs (`a` and `b`, instances `engine-a`
//! and `engine-b`), so that "per instance" and "all instances" differ without a
//! second engine on a 2-core machine.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::util::{Running, cpu_exclusive, free_port, run, smollm2, sous};

/// Debian's `prometheus` on `PATH`, or `None` (loudly) outside CI when it is missing.
fn prometheus_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("prometheus"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "prometheus is missing in CI: scripts/test.sh must run scripts/debian-deps.sh"
        );
        eprintln!("SKIPPED: prometheus is not installed (scripts/debian-deps.sh installs Debian's)");
    }
    found
}

/// `GET path` on loopback over HTTP/1.0 (no chunked answer): the status and the body.
fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {response:?}"))?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}

/// A Prometheus server scraping the engine at `target` every second, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(binary: &Path, dir: &Path, target: u16) -> Prometheus {
        let config = dir.join("prometheus.yml");
        let mut yaml = String::from("global:\n  scrape_interval: 1s\nscrape_configs:\n");
        for job in ["a", "b"] {
            yaml.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n        labels: {{instance: engine-{job}}}\n"
            ));
        }
        std::fs::write(&config, yaml).expect("prometheus.yml");
        let port = free_port();
        let log = dir.join("prometheus.log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("prometheus starts");
        Prometheus { child, port, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until both jobs have been scraped successfully.
    fn wait_for_targets(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let up = http_get(self.port, "/api/v1/query?query=sum(up)")
                .ok()
                .filter(|(status, _)| *status == 200)
                .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
                .and_then(|v| v["data"]["result"][0]["value"][1].as_str().map(str::to_owned));
            if up.as_deref() == Some("2") {
                return;
            }
            assert!(
                self.child.try_wait().ok().flatten().is_none(),
                "Prometheus exited:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "Prometheus did not scrape the engine within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A native-engine recipe for the test model with ngram speculation (so that the
/// spec-decode counters move too).
fn recipe(dir: &Path, port: u16, model: &Path) -> PathBuf {
    let path = dir.join("scrape-prometheus.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"scrape-prometheus\"\n[model]\npath = \"{}\"\nserved_name = \"smollm2\"\n\n[engine]\nkind = \"native\"\n\n\
             [memory]\nkv_cache_bytes = \"128MiB\"\n\n[serving]\nmax_model_len = 2048\nmax_num_seqs = 8\nprefix_caching = true\n\
             speculative = {{ method = \"ngram\", tokens = 3, prompt_lookup_min = 2, prompt_lookup_max = 4 }}\n\n\
             [server]\nhost = \"127.0.0.1\"\nport = {port}\nstop_grace = \"3s\"\n",
            model.display()
        ),
    )
    .expect("recipe");
    path
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .expect("clock after 1970")
}

/// `date -u +%Y-%m-%dT%H:%M:%SZ` of a Unix time.
fn rfc3339(t: i64) -> String {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The sum of every series of `name` in an exposition.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number, not {v}"))
}

fn latency<'a>(rows: &'a Value, name: &str) -> &'a Value {
    rows.as_array()
        .expect("latency rows")
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {rows}"))
}

fn scrape_json(args: &[&str]) -> Value {
    let (code, stdout, stderr) = run(sous().args(["bench", "scrape"]).args(args).arg("--json"));
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn prometheus_figures_agree_with_the_engine_and_the_live_scrape() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let began = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let state = state.to_str().expect("utf-8");
    let engine_port = free_port();
    let path = recipe(dir.path(), engine_port, &model);
    let engine = Running::start(
        &["serve", "--recipe", path.to_str().expect("utf-8")],
        &[("SOUS_STATE_DIR", state)],
    );
    assert!(
        engine.wait_for("ready http://", Duration::from_secs(120)),
        "{}",
        engine.stderr()
    );
    let mut prometheus = Prometheus::start(&binary, dir.path(), engine_port);
    prometheus.wait_for_targets(Duration::from_secs(30));
    // The window starts on a whole second after Prometheus's first scrape of both
    // jobs, so that it holds a sample at its start (sous checks), all of them zero:
    // nothing was sent yet.
    std::thread::sleep(Duration::from_millis(2100));
    let since = now_s();
    let engine_url = format!("http://127.0.0.1:{engine_port}");
    let live_svg = dir.path().join("live.svg");
    let mut live = Command::new(assert_cmd::cargo::cargo_bin("sous"));
    for (name, _) in std::env::vars() {
        if name.starts_with("SOUS_") {
            live.env_remove(name);
        }
    }
    let live = live
        .env("NO_COLOR", "1")
        .args([
            "bench",
            "scrape",
            &engine_url,
            "--for",
            "10s",
            "--interval",
            "1s",
            "--json",
            "--svg",
        ])
        .arg(&live_svg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("live scrape");
    // The load falls inside both windows, with idle seconds at each edge: 9 requests
    // (an odd count: no percentile's rank q x count lands on a bucket's edge, where one
    // ulp could move Prometheus's estimate to the next non-empty bucket), 3 at a time,
    // prompts salted alike in every run.
    std::thread::sleep(Duration::from_secs(2));
    let tokenizer = model.join("tokenizer.json");
    let load_began = Instant::now();
    let (code, _, stderr) = run(sous().args([
        "bench",
        "sweep",
        "--url",
        &engine_url,
        "--tokenizer",
        tokenizer.to_str().expect("utf-8"),
        "--concurrency",
        "3",
        "--requests",
        "9",
        "--input-len",
        "48",
        "--output-len",
        "16",
        "--salt",
        "1",
        "--json",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let load_s = load_began.elapsed().as_secs_f64();
    let live = live.wait_with_output().expect("live scrape ends");
    assert!(live.status.success(), "{}", String::from_utf8_lossy(&live.stderr));
    let live: Value = serde_json::from_slice(&live.stdout).expect("live JSON");
    // The window ends two seconds after the live scrape's (a sample of every series
    // after the load), and is asked once Prometheus holds its last second.
    let until = now_s() + 2;
    while now_s() < until + 2 {
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, exposition) = http_get(engine_port, "/metrics").expect("engine metrics");
    assert_eq!(status, 200);

    let (start, end) = (rfc3339(since), rfc3339(until));
    let prom_svg = dir.path().join("prometheus.svg");
    let url = prometheus.url();
    let p = scrape_json(&[
        "--prometheus",
        &url,
        "--since",
        &start,
        "--until",
        &end,
        "--svg",
        prom_svg.to_str().expect("utf-8"),
    ]);
    assert_eq!(p["source"], "prometheus");
    assert_eq!(p["prometheus"], url);
    assert_eq!(
        (p["start"].as_str(), p["end"].as_str()),
        (Some(start.as_str()), Some(end.as_str()))
    );
    let window_s = num(&p["window_s"]);
    assert_eq!(window_s, (until - since) as f64);
    assert!(
        p["percentile_method"]
            .as_str()
            .is_some_and(|m| m.contains("histogram_quantile") && m.contains("Prometheus server")),
        "{p}"
    );
    assert_eq!(p["families"], serde_json::json!(["vllm"]));
    let instances: Vec<&str> = p["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|f| f["instance"].as_str().expect("instance"))
        .collect();
    assert_eq!(instances, ["engine-a", "engine-b"]);

    // Counters. The engine started with every counter at zero and nothing else was
    // sent, so its own counters are the window's increase; the live scrape's deltas
    // equal them exactly (it spans the load).
    let lc = &live["counters"];
    let engine_counter = |name: &str| metric_sum(&exposition, name);
    let truth = [
        (
            "generation_tokens",
            engine_counter("vllm:generation_tokens_total"),
        ),
        ("prompt_tokens", engine_counter("vllm:prompt_tokens_total")),
        ("requests_completed", engine_counter("vllm:request_success_total")),
        (
            "prefix_cache_queries",
            engine_counter("vllm:prefix_cache_queries_total"),
        ),
        (
            "spec_decode_drafts",
            engine_counter("vllm:spec_decode_num_drafts_total"),
        ),
        (
            "spec_decode_draft_tokens",
            engine_counter("vllm:spec_decode_num_draft_tokens_total"),
        ),
        (
            "spec_decode_accepted_tokens",
            engine_counter("vllm:spec_decode_num_accepted_tokens_total"),
        ),
    ];
    assert_eq!(truth[0].1, 9.0 * 16.0, "{exposition}");
    assert_eq!(truth[2].1, 9.0);
    assert!(truth[4].1 > 0.0, "ngram drafted nothing: {exposition}");
    for (key, exact) in truth {
        assert_eq!(num(&lc[key]), exact, "live {key} (load took {load_s:.1} s)");
    }
    // Prometheus's increase() extrapolates (promql/functions.go extrapolatedRate): the
    // first sample in the window is 0, so nothing is added before it (a counter's zero
    // point bounds the extrapolation), and the last is at most one scrape interval
    // (1 s; Prometheus extrapolates up to 1.1 average intervals) before the window's
    // end, to which the increase is scaled: truth <= figure <= truth x (1 + 1.1 s /
    // sampled span), the span being at least the window less 2.2 s. That is, at most
    // 1.1 scrapes' worth of the window's mean rate more than the truth.
    let factor_max = 1.0 + 1.1 / (window_s - 2.2);
    let mut report = format!(
        "window {start} to {end} ({window_s} s), load {load_s:.1} s; extrapolation bound x{factor_max:.4}\n"
    );
    // And the scale is one per instance: its series share their sample times.
    let mut factors: Vec<f64> = Vec::new();
    for (key, exact) in truth {
        let all = num(&p["total"]["counters"][key]);
        let mut sum = 0.0;
        for (i, f) in p["instances"].as_array().expect("instances").iter().enumerate() {
            let v = num(&f["counters"][key]);
            match factors.get(i) {
                Some(factor) => assert!(
                    (v / exact - factor).abs() < 1e-9,
                    "{key} of {}: scaled x{} where the others are x{factor}",
                    f["instance"],
                    v / exact
                ),
                None => factors.push(v / exact),
            }
            sum += v;
            assert!(
                v >= exact * (1.0 - 1e-9) && v <= exact * factor_max + 1e-9,
                "{key} of {}: {v} against the engine's {exact} (at most x{factor_max:.4})",
                f["instance"]
            );
            report.push_str(&format!(
                "  {key} {}: Prometheus {v:.3}, engine {exact} (x{:.4})\n",
                f["instance"],
                v / exact.max(f64::MIN_POSITIVE)
            ));
        }
        assert!(
            (all - sum).abs() <= 1e-9 * all.max(1.0),
            "{key}: all {all} != {sum}"
        );
    }
    let rate = num(&p["total"]["counters"]["generation_tokens_per_s"]);
    assert!((rate - num(&p["total"]["counters"]["generation_tokens"]) / window_s).abs() < 1e-9);
    let per_position = p["total"]["counters"]["spec_decode_per_position_acceptance_rates"]
        .as_array()
        .expect("per position");
    assert_eq!(per_position.len(), 3, "{p}");

    // Percentiles: the same bucket increases in both windows (the load lies inside
    // each), Prometheus's scaled by one factor per instance (every bucket of an
    // instance shares its sample times; the first sample is 0 for all), which
    // histogram_quantile's rank and interpolation cancel. So they agree to rounding.
    let mut worst: f64 = 0.0;
    for name in ["ttft", "itl", "tpot", "e2e", "queue"] {
        let l = latency(&live["latency"], name);
        let n = num(&l["count"]);
        for (q, key) in [
            (0.5, "p50_ms"),
            (0.9, "p90_ms"),
            (0.95, "p95_ms"),
            (0.99, "p99_ms"),
        ] {
            let rank = q * n;
            if (rank - rank.round()).abs() < 1e-6 {
                // A rank on a bucket's edge: one ulp decides between this bucket's
                // bound and the next non-empty one's (ITL's count follows the drafts).
                eprintln!("{name} {key}: rank {rank} on a bucket edge, not compared");
                continue;
            }
            let live_ms = num(&l[key]);
            let mut row = format!("  {name} {key}: live {live_ms:.4}");
            let figures = std::iter::once(&p["total"]).chain(p["instances"].as_array().expect("instances"));
            for f in figures {
                let prom_ms = num(&latency(&f["latency"], name)[key]);
                let off = (prom_ms - live_ms).abs() / live_ms.max(1e-9);
                worst = worst.max(off);
                assert!(
                    off < 1e-9,
                    "{name} {key} of {}: Prometheus {prom_ms} ms, live {live_ms} ms",
                    f["instance"]
                );
                row.push_str(&format!(
                    ", {} {prom_ms:.4}",
                    f["instance"].as_str().unwrap_or("all")
                ));
            }
            report.push_str(&row);
            report.push('\n');
        }
    }
    report.push_str(&format!(
        "largest relative difference of a percentile: {worst:.2e}\n"
    ));

    // --selector narrows every query: job a alone is engine-a.
    let a = scrape_json(&[
        "--prometheus",
        &url,
        "--since",
        &start,
        "--until",
        &end,
        "--selector",
        r#"{job="a"}"#,
    ]);
    assert_eq!(a["selector"], r#"{job="a"}"#);
    assert_eq!(a["instances"].as_array().map(Vec::len), Some(1));
    assert_eq!(a["instances"][0]["instance"], "engine-a");
    assert_eq!(a["total"]["counters"], p["instances"][0]["counters"]);
    // The table names the window and where the percentiles come from.
    let (code, table, stderr) = run(sous().args([
        "bench",
        "scrape",
        "--prometheus",
        &url,
        "--since",
        &start,
        "--until",
        &end,
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        table.contains(&format!("{start} to {end} ({window_s:.0} s), 2 instances (vllm)")),
        "{table}"
    );
    assert!(table.contains("computed by the Prometheus server"), "{table}");
    assert!(table.contains("TTFT   all"), "{table}");

    // Both charts are written and name their series.
    let svg = std::fs::read_to_string(&prom_svg).expect("prometheus chart");
    for text in [
        "all instances",
        "engine-a",
        "engine-b",
        "TTFT percentiles",
        "E2E percentiles",
        "p99",
    ] {
        assert!(svg.contains(text), "{text} not in the Prometheus chart");
    }
    let svg = std::fs::read_to_string(&live_svg).expect("live chart");
    let metrics_url = format!("{engine_url}/metrics");
    for text in [metrics_url.as_str(), "ITL percentiles", "TPOT percentiles", "p50"] {
        assert!(svg.contains(text), "{text} not in the live chart");
    }

    // Errors, each naming what it asked where.
    let fails = |args: &[&str]| {
        let (code, _, stderr) = run(sous().args(["bench", "scrape"]).args(args));
        assert_eq!(code, 1, "{args:?}: {stderr}");
        stderr
    };
    let e = fails(&[
        "--prometheus",
        &url,
        "--since",
        &start,
        "--until",
        &end,
        "--selector",
        r#"{job="nope"}"#,
    ]);
    assert!(
        e.contains(r#"no series matched `/api/v1/label/__name__/values?match[]={job="nope"}`"#)
            && e.contains(&url)
            && e.contains(r#"hint: check --selector {job="nope"}"#),
        "{e}"
    );
    let e = fails(&["--prometheus", &url, "--since", &start, "--selector", "job=\"a\""]);
    assert!(
        e.contains("is not a PromQL label matcher set: it is not enclosed in braces"),
        "{e}"
    );
    let e = fails(&[
        "--prometheus",
        &url,
        "--since",
        &start,
        "--selector",
        r#"{job=~"("}"#,
    ]);
    assert!(
        e.contains(&format!(
            "Prometheus at {url}/api/v1/label/__name__/values refused"
        )) && e.contains("bad_data")
            && e.contains("parse error"),
        "{e}"
    );
    let e = fails(&["--prometheus", &url, "--since", "30d"]);
    assert!(
        e.contains(&format!(
            "before what Prometheus at {url} retains: its storage retention is 15d"
        )),
        "{e}"
    );
    let e = fails(&["--prometheus", &url, "--since", "1h"]);
    assert!(
        e.contains("the window is longer than the data")
            && e.contains("count(vllm:generation_tokens_total)")
            && e.contains("its samples begin at about"),
        "{e}"
    );
    let closed = format!("http://127.0.0.1:{}", free_port());
    let e = fails(&["--prometheus", &closed, "--since", "1h"]);
    assert!(
        e.contains(&format!("cannot reach Prometheus at {closed}/api/v1/")),
        "{e}"
    );
    let e = fails(&["--prometheus", &engine_url, "--since", "1h"]);
    assert!(
        e.contains(&format!("{engine_url}/api/v1/label/__name__/values answered 404")),
        "{e}"
    );
    let e = fails(&["--prometheus", &url, "--since", &start, "--for", "1s"]);
    assert!(e.contains("cannot be used with"), "{e}");

    report.push_str(&format!("test took {:.1} s\n", began.elapsed().as_secs_f64()));
    eprintln!("{report}");
    drop(prometheus);
}
