//! `sous bench`: measure a server. Active workloads (`probe`, `sweep`, `prefix`,
//! `agent`) run against `--url`, or against `--recipe R`, which is served first and
//! stopped after; `compare` puts two reports side by side; `logs` and `scrape` read
//! what a production server leaves behind, without sending it a request.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use crate::bench::client::{self, Endpoint, Job, Target};
use crate::bench::prom::Scrape;
use crate::bench::report::{self, Level};
use crate::bench::scrape::{self, Instance, Taken};
use crate::bench::server::ServerFigures;
use crate::bench::stats::{RequestRecord, RunMetrics, Slo};
use crate::bench::workload::{self, PromptMaker};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// One stream, a cold ~500-token prompt, 256 tokens at temperature 0 with ignore_eos,
    /// repeated: TTFT and decode tok/s, median and spread (the Titan report's probe).
    Probe(ProbeArgs),
    /// Concurrency levels, a number of requests at each: throughput, per-request speed,
    /// TTFT/TPOT/ITL/E2E percentiles, errors, goodput.
    Sweep(SweepArgs),
    /// Requests sharing long prefixes: the engine's prefix-cache hit rate.
    Prefix(PrefixArgs),
    /// Coding-agent sessions resending a growing context with short answers.
    Agent(AgentArgs),
    /// Rebuild production figures from vLLM's periodic stats lines (one file per
    /// instance): throughput per number of running requests, peaks, and the cluster
    /// sum aligned per minute with its percentiles.
    Logs(LogsArgs),
    /// Watch production servers' Prometheus /metrics for a while: latency percentiles
    /// from the histograms (bucket-interpolated), token and request rates, prefix-cache
    /// and speculative-decoding figures, running requests and KV usage.
    Scrape(ScrapeArgs),
    /// Two reports side by side, matched by concurrency, with ratios.
    Compare(CompareArgs),
}

#[derive(Debug, Args)]
pub struct ScrapeArgs {
    /// Server base URLs (`/metrics` is appended), or full metrics URLs ending in
    /// `/metrics` (TensorRT-LLM: http://HOST:PORT/prometheus/metrics).
    #[arg(required = true, value_name = "URL")]
    urls: Vec<String>,
    /// How long to watch: `30s`, `10m`, `1h`, `1h30m`.
    #[arg(long = "for", value_name = "DURATION", value_parser = scrape::parse_duration)]
    window: Duration,
    /// Time between scrapes.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = scrape::parse_duration)]
    interval: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// vLLM log files, one per instance.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Names for the instances, in the order of the files (default: file stems).
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
    /// The year of the logs' first lines (vLLM's timestamps have none; default: this year).
    #[arg(long)]
    year: Option<i32>,
    /// Count the cluster minutes above this many generated tokens/s.
    #[arg(long, default_value_t = 1000.0)]
    threshold: f64,
    /// List this many of the largest cluster minutes.
    #[arg(long, default_value_t = 8)]
    top: usize,
    /// Samples further apart than this many seconds bound an idle gap.
    #[arg(long, default_value_t = 15)]
    idle_gap: u32,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// What every active workload takes.
#[derive(Debug, Args)]
pub struct Common {
    /// The server's base URL, e.g. http://127.0.0.1:8000.
    #[arg(long, required_unless_present = "recipe", conflicts_with = "recipe")]
    url: Option<String>,
    /// Serve this recipe first (`sous serve --recipe`), and stop it afterwards.
    #[arg(long, short = 'r', value_name = "FILE")]
    recipe: Option<PathBuf>,
    #[command(flatten)]
    overrides: super::OverrideArgs,
    /// The model name to send (default: the first one in /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// The endpoint.
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    endpoint: Endpoint,
    /// The tokenizer (a tokenizer.json or a model directory) that prompts are measured
    /// with (default: the served model's, from its directory or the Hugging Face cache).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Seed of the prompt text and lengths.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Salt of the first words of cold prompts (default: from the clock; recorded in
    /// the report, pass it back to repeat a run exactly).
    #[arg(long)]
    salt: Option<u64>,
    /// Environment variable holding the API key.
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// Percentiles to report.
    #[arg(long, value_delimiter = ',', default_value = "50,90,95,99")]
    percentiles: Vec<f64>,
    /// SLOs for goodput, in ms: `ttft:500,tpot:50,e2el:10000`.
    #[arg(long)]
    slo: Option<String>,
    /// A name for this run in reports and comparisons.
    #[arg(long)]
    label: Option<String>,
    /// Write <workload>.json, <workload>.csv and SVG charts into this directory.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print the JSON report on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    common: Common,
    /// Repetitions.
    #[arg(long, short = 'n', default_value_t = 5)]
    repeat: usize,
    /// Prompt tokens.
    #[arg(long, default_value_t = 500)]
    input_len: usize,
    /// Output tokens.
    #[arg(long, default_value_t = 256)]
    output_len: usize,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    common: Common,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    concurrency: Vec<usize>,
    /// Requests per level (default: 4 x the level, at least 8).
    #[arg(long)]
    requests: Option<usize>,
    /// Prompt tokens.
    #[arg(long, default_value_t = 512)]
    input_len: usize,
    /// Output tokens.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Draw lengths uniformly within ±RATIO of the given ones (vLLM's --random-range-ratio).
    #[arg(long, default_value_t = 0.0)]
    range_ratio: f64,
    /// Stop at the end-of-sequence token instead of generating --output-len tokens.
    #[arg(long)]
    eos: bool,
}

#[derive(Debug, Args)]
pub struct PrefixArgs {
    #[command(flatten)]
    common: Common,
    /// Distinct shared prefixes.
    #[arg(long, default_value_t = 4)]
    prefixes: usize,
    /// Tokens of each prefix.
    #[arg(long, default_value_t = 1024)]
    prefix_len: usize,
    /// Unique tokens after the prefix.
    #[arg(long, default_value_t = 64)]
    suffix_len: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Output tokens.
    #[arg(long, default_value_t = 32)]
    output_len: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    common: Common,
    /// Sessions, all at once.
    #[arg(long, default_value_t = 4)]
    sessions: usize,
    /// Requests per session.
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Output tokens per step.
    #[arg(long, default_value_t = 32)]
    output_len: usize,
    /// Prompt tokens per generated token, on average.
    #[arg(long, default_value_t = 53.0)]
    ratio: f64,
    /// The longest context to send (default: the server's max_model_len).
    #[arg(long)]
    max_context: Option<usize>,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The baseline report (JSON from `sous bench ... --out` or `--json`).
    a: PathBuf,
    /// The report to compare with it.
    b: PathBuf,
}

pub fn exec(cmd: BenchCommand, shell: &Shell) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Compare(args) => compare(&args, shell),
        BenchCommand::Logs(args) => logs(&args, shell),
        BenchCommand::Scrape(args) => watch(&args, shell),
        BenchCommand::Probe(args) => active(&args.common, Workload::Probe(&args), shell),
        BenchCommand::Sweep(args) => active(&args.common, Workload::Sweep(&args), shell),
        BenchCommand::Prefix(args) => active(&args.common, Workload::Prefix(&args), shell),
        BenchCommand::Agent(args) => active(&args.common, Workload::Agent(&args), shell),
    }
}

enum Workload<'a> {
    Probe(&'a ProbeArgs),
    Sweep(&'a SweepArgs),
    Prefix(&'a PrefixArgs),
    Agent(&'a AgentArgs),
}

impl Workload<'_> {
    fn name(&self) -> &'static str {
        match self {
            Workload::Probe(_) => "probe",
            Workload::Sweep(_) => "sweep",
            Workload::Prefix(_) => "prefix",
            Workload::Agent(_) => "agent",
        }
    }
}

fn logs(args: &LogsArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    use crate::bench::logs::{LogInput, LogsOptions, analyze};
    if !args.names.is_empty() && args.names.len() != args.files.len() {
        return Err(UserError::new(
            format!(
                "{} --name values for {} files",
                args.names.len(),
                args.files.len()
            ),
            Some("give one --name per file, in order, or none"),
        )
        .into());
    }
    let inputs = args
        .files
        .iter()
        .enumerate()
        .map(|(i, path)| LogInput::read(path, args.names.get(i).map(String::as_str)))
        .collect::<Result<Vec<_>, _>>()?;
    let defaults = LogsOptions::default();
    let options = LogsOptions {
        year: args.year.unwrap_or(defaults.year),
        idle_gap_s: args.idle_gap,
        threshold_tok_s: args.threshold,
        top_k: args.top,
        ..defaults
    };
    let report = analyze(&inputs, &options)?;
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&report.to_table())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `sous bench scrape`: every URL now, then on the schedule; the first round must
/// reach them all, later failures are skipped.
fn watch(args: &ScrapeArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let targets: Vec<String> = args.urls.iter().map(|u| scrape::metrics_url(u)).collect();
    let times = scrape::schedule(args.window, args.interval);
    let runtime = super::runtime()?;
    let instances = runtime.block_on(async {
        let client = reqwest::Client::new();
        let timeout = args.interval.clamp(Duration::from_secs(1), Duration::from_secs(10));
        let mut instances: Vec<Instance> = targets
            .iter()
            .map(|url| Instance {
                url: url.clone(),
                taken: Vec::new(),
            })
            .collect();
        let start = tokio::time::Instant::now();
        for (round, at) in times.iter().enumerate() {
            tokio::time::sleep_until(start + *at).await;
            let at_s = start.elapsed().as_secs_f64();
            shell.status(
                "scrape",
                &format!("{}/{} of {} URL{}", round + 1, times.len(), targets.len(), if targets.len() == 1 { "" } else { "s" }),
            );
            let results = futures_util::future::join_all(targets.iter().map(|url| fetch(&client, url, timeout))).await;
            for (instance, result) in instances.iter_mut().zip(results) {
                match result {
                    Ok(scrape) => {
                        if round == 0 && scrape::families(&scrape).is_empty() {
                            return Err(UserError::new(
                                format!("{} has no vLLM, SGLang or TensorRT-LLM metrics", instance.url),
                                Some("SGLang needs --enable-metrics; TensorRT-LLM serves Prometheus text at /prometheus/metrics"),
                            ));
                        }
                        instance.taken.push(Taken { round, at_s, scrape });
                    }
                    Err(e) if round == 0 => {
                        return Err(UserError::new(
                            format!("cannot scrape {}: {e}", instance.url),
                            Some("check the URL, and that the server is up and exposes /metrics"),
                        ));
                    }
                    Err(e) => shell.warn(&format!(
                        "scrape {}/{}: skipped {}: {e}",
                        round + 1,
                        times.len(),
                        instance.url
                    )),
                }
            }
        }
        Ok(instances)
    })?;
    let report = scrape::analyze(&instances, times.len()).map_err(|e| UserError::new(e.to_string(), None))?;
    for r in &report.counter_resets {
        shell.warn(&format!(
            "{} restarted before scrape {} (a counter went down); its figures span the restart",
            r.url, r.scrape
        ));
    }
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&report.to_table())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One scrape of a metrics URL.
async fn fetch(client: &reqwest::Client, url: &str, timeout: Duration) -> Result<Scrape, String> {
    let response = client
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| causes(&e.without_url()))?;
    if !response.status().is_success() {
        return Err(format!("it answered {}", response.status()));
    }
    let text = response.text().await.map_err(|e| causes(&e.without_url()))?;
    Ok(Scrape::parse(&text))
}

/// An error and its sources on one line (reqwest's own message says little:
/// "error sending request").
fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn compare(args: &CompareArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let read = |path: &Path| -> anyhow::Result<Value> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| UserError::new(format!("cannot read {}: {e}", path.display()), None))?;
        serde_json::from_str(&text)
            .map_err(|e| UserError::new(format!("{} is not JSON: {e}", path.display()), None).into())
    };
    let (a, b) = (read(&args.a)?, read(&args.b)?);
    let table = report::compare(&a, &b)
        .map_err(|e| UserError::new(e, Some("compare two reports of `sous bench sweep --out DIR`")))?;
    shell.data(&table)?;
    Ok(ExitCode::SUCCESS)
}

/// A server `sous bench --recipe` started; stopped when dropped.
struct Served {
    child: std::process::Child,
}

impl Drop for Served {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves `recipe` with `sous serve`, logging to a file; returns its base URL and API
/// key (from the recipe's `server.api_key_env`) once /health answers.
async fn serve(
    recipe: &Path,
    overrides: &super::OverrideArgs,
    shell: &Shell,
) -> anyhow::Result<(Served, String, Option<String>)> {
    let loaded = super::load_recipe(recipe, overrides)?;
    let r = loaded.recipe;
    let key = r
        .server
        .api_key_env
        .as_deref()
        .and_then(|v| std::env::var(v).ok());
    let url = r.server.local_url();
    let dir = sous_engine::paths::instance_dir(&r.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log_path = dir.join("bench-serve.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the sous executable")?;
    let child = std::process::Command::new(exe)
        .args(["serve", "--recipe"])
        .arg(recipe)
        .args(overrides.set.iter().flat_map(|s| ["--set", s.as_str()]))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().context("the serve log")?)
        .stderr(log)
        .spawn()
        .context("starting `sous serve`")?;
    let served = Served { child };
    shell.status("serving", &format!("{} (log: {})", r.name, log_path.display()));
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut served = served;
    loop {
        if let Ok(Some(status)) = served.child.try_wait() {
            let mut text = String::new();
            let _ = std::fs::File::open(&log_path).and_then(|mut f| f.read_to_string(&mut text));
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(UserError::new(
                format!(
                    "`sous serve` exited ({status}) before the server was ready:\n{}",
                    tail.join("\n")
                ),
                Some(&format!("read {}", log_path.display())),
            )
            .into());
        }
        if client
            .get(format!("{url}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
            && let Ok(info) = models(&client, &url, key.as_deref()).await
            && !info.0.is_empty()
        {
            shell.status(
                "ready",
                &format!("{url} after {:.1} s", started.elapsed().as_secs_f64()),
            );
            return Ok((served, url, key));
        }
        if started.elapsed() > r.server.startup_timeout {
            return Err(UserError::new(
                format!(
                    "the recipe's server was not ready after {:?}",
                    r.server.startup_timeout
                ),
                Some(&format!("read {}", log_path.display())),
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The first model of /v1/models: its id, root and max_model_len.
async fn models(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> anyhow::Result<(String, Option<String>, Option<usize>)> {
    let mut request = client
        .get(format!("{url}/v1/models"))
        .timeout(Duration::from_secs(10));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| {
        UserError::new(
            format!("cannot reach {url}/v1/models: {e}"),
            Some("check --url, and that the server is up"),
        )
    })?;
    if !response.status().is_success() {
        return Err(UserError::new(
            format!("{url}/v1/models answered {}", response.status()),
            Some("pass --api-key-env if the server needs a key"),
        )
        .into());
    }
    let body: Value = response.json().await.context("reading /v1/models")?;
    let first = &body["data"][0];
    Ok((
        first["id"].as_str().unwrap_or_default().to_owned(),
        first["root"].as_str().map(str::to_owned),
        first["max_model_len"].as_u64().map(|n| n as usize),
    ))
}

/// The tokenizer: --tokenizer, else the model's root directory, else the Hugging Face
/// cache entry of the root or the served name.
fn tokenizer(
    given: Option<&Path>,
    root: Option<&str>,
    id: &str,
) -> anyhow::Result<(tokenizers::Tokenizer, PathBuf)> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = given {
        candidates.push(if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        });
    } else {
        let cache = crate::hub::config::HubConfig::from_env().cache_dir;
        for name in root.into_iter().chain([id]) {
            let path = Path::new(name);
            if path.is_dir() {
                candidates.push(path.join("tokenizer.json"));
            }
            if name.contains('/') && !name.starts_with('/') {
                let snapshots = cache
                    .join(format!("models--{}", name.replace('/', "--")))
                    .join("snapshots");
                if let Ok(entries) = std::fs::read_dir(&snapshots) {
                    candidates.extend(entries.flatten().map(|e| e.path().join("tokenizer.json")));
                }
            }
        }
    }
    for path in &candidates {
        if path.is_file() {
            let t = tokenizers::Tokenizer::from_file(path).map_err(|e| {
                UserError::new(format!("cannot read the tokenizer {}: {e}", path.display()), None)
            })?;
            return Ok((t, path.clone()));
        }
    }
    Err(UserError::new(
        format!(
            "no tokenizer found for model `{id}`{}",
            root.map_or(String::new(), |r| format!(" (root `{r}`)"))
        ),
        Some(
            "pass --tokenizer DIR_OR_FILE (a model directory with tokenizer.json), or `sous pull` the model",
        ),
    )
    .into())
}

async fn scrape(client: &reqwest::Client, url: &str) -> Option<Scrape> {
    let response = client
        .get(format!("{url}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    Some(Scrape::parse(&response.text().await.ok()?))
}

fn active(common: &Common, workload: Workload<'_>, shell: &Shell) -> anyhow::Result<ExitCode> {
    let slo = match &common.slo {
        Some(text) => Slo::parse(text)
            .map_err(|e| UserError::new(format!("--slo: {e}"), Some("e.g. --slo ttft:500,tpot:50")))?,
        None => Slo::default(),
    };
    if let Some(bad) = common.percentiles.iter().find(|p| !(0.0..=100.0).contains(*p)) {
        return Err(UserError::new(format!("--percentiles: {bad} is not between 0 and 100"), None).into());
    }
    let runtime = super::runtime()?;
    runtime.block_on(async {
        let (_served, url, recipe_key) = match (&common.recipe, &common.url) {
            (Some(recipe), _) => {
                let (served, url, key) = serve(recipe, &common.overrides, shell).await?;
                (Some(served), url, key)
            }
            (None, Some(url)) => (None, url.trim_end_matches('/').to_owned(), None),
            (None, None) => return Err(UserError::new("pass --url URL or --recipe FILE", None).into()),
        };
        let key = match &common.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                UserError::new(format!("--api-key-env: `{var}` is not set"), Some(&format!("export {var}=...")))
            })?),
            None => recipe_key,
        };
        let probe_client = reqwest::Client::new();
        let (id, root, max_len) = models(&probe_client, &url, key.as_deref()).await?;
        let model = common.model.clone().unwrap_or(id.clone());
        let (tok, tok_path) = tokenizer(common.tokenizer.as_deref(), root.as_deref(), &id)?;
        let maker = PromptMaker::new(tok).map_err(|e| UserError::new(e, Some("pass --tokenizer")))?;
        let salt = common.salt.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let target = Target {
            base: url.clone(),
            model: model.clone(),
            endpoint: common.endpoint,
            api_key: key,
        };
        // (concurrency, sessions) per level.
        let levels: Vec<(usize, Vec<Vec<Job>>)> = match &workload {
            Workload::Probe(a) => {
                let lengths = workload::Lengths {
                    input: a.input_len,
                    output: a.output_len,
                    range_ratio: 0.0,
                    ignore_eos: true,
                };
                vec![(1, workload::independent(&maker, common.seed, salt, a.repeat.max(1), &lengths))]
            }
            Workload::Sweep(a) => {
                if a.concurrency.is_empty() || a.concurrency.contains(&0) {
                    return Err(UserError::new("--concurrency needs levels of at least 1", None).into());
                }
                let lengths = workload::Lengths {
                    input: a.input_len,
                    output: a.output_len,
                    range_ratio: a.range_ratio,
                    ignore_eos: !a.eos,
                };
                a.concurrency
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let n = a.requests.unwrap_or((4 * c).max(8));
                        (*c, workload::independent(&maker, common.seed, salt.wrapping_add(i as u64), n, &lengths))
                    })
                    .collect()
            }
            Workload::Prefix(a) => {
                let p = workload::Prefixes {
                    prefixes: a.prefixes,
                    prefix_len: a.prefix_len,
                    suffix_len: a.suffix_len,
                    requests: a.requests,
                    output: a.output_len,
                };
                vec![(a.concurrency, workload::shared_prefixes(&maker, common.seed, salt, &p))]
            }
            Workload::Agent(a) => {
                let limit = a.max_context.or(max_len).unwrap_or(8192);
                let spec = workload::Agent {
                    sessions: a.sessions,
                    steps: a.steps,
                    output: a.output_len,
                    ratio: a.ratio,
                    max_prompt: limit.saturating_sub(a.output_len + 8).max(16),
                };
                vec![(a.sessions, workload::agent(&maker, common.seed, salt, &spec))]
            }
        };
        if let Some(limit) = max_len {
            let longest = levels
                .iter()
                .flat_map(|(_, s)| s.iter().flatten())
                .map(|j| j.prompt_len + j.max_tokens)
                .max()
                .unwrap_or(0);
            if longest > limit {
                return Err(UserError::new(
                    format!("a request of {longest} tokens (prompt + output) does not fit the server's max_model_len {limit}"),
                    Some("use shorter --input-len/--output-len (or --prefix-len, --max-context)"),
                )
                .into());
            }
        }
        shell.status(
            "bench",
            &format!("{} against {url} (model `{model}`, tokenizer {}, seed {}, salt {salt})", workload.name(), tok_path.display(), common.seed),
        );
        let mut results = Vec::new();
        for (concurrency, sessions) in levels {
            let total: usize = sessions.iter().map(Vec::len).sum();
            let client = client::http_client(concurrency);
            let bar = indicatif::ProgressBar::with_draw_target(Some(total as u64), indicatif::ProgressDrawTarget::stderr());
            bar.set_style(
                indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} requests, {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_prefix(format!("conc {concurrency}"));
            let tokens = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let (b, t) = (bar.clone(), tokens.clone());
            let on_done: Arc<dyn Fn(&RequestRecord) + Send + Sync> = Arc::new(move |r| {
                let n = t.fetch_add(r.output_tokens, std::sync::atomic::Ordering::Relaxed) + r.output_tokens;
                b.inc(1);
                b.set_message(format!("{n} tokens"));
            });
            let before = scrape(&probe_client, &url).await;
            // A scrape a second while it runs, for the KV-usage peak.
            let during = Arc::new(std::sync::Mutex::new(Vec::new()));
            let sampling = tokio::spawn({
                let (c, u, during) = (probe_client.clone(), url.clone(), during.clone());
                async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        if let Some(s) = scrape(&c, &u).await
                            && let Ok(mut d) = during.lock()
                        {
                            d.push(s);
                        }
                    }
                }
            });
            let (records, duration) = client::run(&client, &target, sessions, concurrency, on_done).await;
            sampling.abort();
            bar.finish_and_clear();
            let after = scrape(&probe_client, &url).await;
            let during = during.lock().map(|d| d.clone()).unwrap_or_default();
            let server = match (&before, &after) {
                (Some(b), Some(a)) => ServerFigures::between(b, a, &during),
                _ => ServerFigures::default(),
            };
            let flat: Vec<RequestRecord> = records.iter().map(|(_, _, r)| r.clone()).collect();
            let metrics = RunMetrics::compute(&flat, duration, concurrency, &common.percentiles, &slo);
            let mut extra = extras(&workload, &records);
            // Each distinct failure once, with how often it happened.
            let mut errors: Vec<(String, usize)> = Vec::new();
            for error in flat.iter().filter_map(|r| r.error.as_deref()) {
                match errors.iter_mut().find(|(e, _)| e == error) {
                    Some(slot) => slot.1 += 1,
                    None => errors.push((error.to_owned(), 1)),
                }
            }
            extra.insert(
                "errors".into(),
                errors
                    .iter()
                    .map(|(e, n)| json!({"message": e, "count": n}))
                    .collect::<Vec<_>>()
                    .into(),
            );
            if let Some(first) = flat.iter().find(|r| !r.success) {
                shell.warn(&format!(
                    "{} of {} requests failed at concurrency {concurrency}; the first: {}",
                    metrics.failed,
                    metrics.num_prompts,
                    first.error.as_deref().unwrap_or("?")
                ));
            }
            let ttfts_ms = flat.iter().filter(|r| r.success).map(|r| r.ttft * 1000.0).collect();
            results.push(Level {
                metrics,
                server,
                extra,
                ttfts_ms,
            });
        }
        let document = json!({
            "sous_version": env!("CARGO_PKG_VERSION"),
            "date": date(),
            "workload": workload.name(),
            "label": common.label,
            "backend": "openai",
            "endpoint_type": common.endpoint,
            "base_url": url,
            "model_id": model,
            "tokenizer_id": tok_path.display().to_string(),
            "seed": common.seed,
            "salt": salt,
            "levels": results.iter().map(Level::to_json).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&document)?;
        if let Some(dir) = &common.out {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let json_path = dir.join(format!("{}.json", workload.name()));
            let csv_path = dir.join(format!("{}.csv", workload.name()));
            crate::hub::cache::write_atomic(&json_path, text.as_bytes())
                .with_context(|| format!("writing {}", json_path.display()))?;
            crate::hub::cache::write_atomic(&csv_path, report::csv(&results, &common.percentiles).as_bytes())
                .with_context(|| format!("writing {}", csv_path.display()))?;
            let charts = crate::bench::charts::draw(dir, workload.name(), &results)
                .map_err(|e| anyhow::anyhow!("drawing the charts: {e}"))?;
            let names: Vec<String> = charts.iter().map(|p| p.display().to_string()).collect();
            shell.status(
                "wrote",
                &format!("{}, {} and {}", json_path.display(), csv_path.display(), names.join(", ")),
            );
        }
        if common.json {
            shell.data(&text)?;
        } else {
            shell.data(&summary(&workload, &results))?;
        }
        let failed: usize = results.iter().map(|l| l.metrics.failed).sum();
        Ok(if failed > 0 { ExitCode::from(crate::failure::USER) } else { ExitCode::SUCCESS })
    })
}

/// Workload-specific figures: the probe's repetitions, the agent's steps.
fn extras(workload: &Workload<'_>, records: &[(usize, usize, RequestRecord)]) -> Map<String, Value> {
    let mut extra = Map::new();
    match workload {
        Workload::Probe(_) => {
            let reps: Vec<(f64, f64)> = records
                .iter()
                .filter(|(_, _, r)| r.success)
                .map(|(_, _, r)| (r.ttft * 1000.0, decode_speed(r)))
                .collect();
            let ttft: Vec<f64> = reps.iter().map(|r| r.0).collect();
            let speed: Vec<f64> = reps.iter().map(|r| r.1).collect();
            extra.insert(
                "probe".into(),
                json!({
                    "repetitions": reps.iter().map(|(t, s)| json!({"ttft_ms": t, "decode_tok_s": s})).collect::<Vec<_>>(),
                    "ttft_ms": spread(&ttft),
                    "decode_tok_s": spread(&speed),
                }),
            );
        }
        Workload::Agent(_) => {
            let steps = records.iter().map(|(_, s, _)| *s).max().map_or(0, |s| s + 1);
            let per_step: Vec<Value> = (0..steps)
                .map(|step| {
                    let at: Vec<&RequestRecord> =
                        records.iter().filter(|(_, s, r)| *s == step && r.success).map(|(_, _, r)| r).collect();
                    let n = at.len().max(1) as f64;
                    json!({
                        "step": step + 1,
                        "mean_prompt_tokens": at.iter().map(|r| r.prompt_len as f64).sum::<f64>() / n,
                        "mean_ttft_ms": at.iter().map(|r| r.ttft * 1000.0).sum::<f64>() / n,
                        "mean_cached_tokens": at.iter().map(|r| r.cached_tokens.unwrap_or(0) as f64).sum::<f64>() / n,
                    })
                })
                .collect();
            let prompt: u64 = records
                .iter()
                .filter(|(_, _, r)| r.success)
                .map(|(_, _, r)| r.prompt_len as u64)
                .sum();
            let output: u64 = records
                .iter()
                .filter(|(_, _, r)| r.success)
                .map(|(_, _, r)| r.output_tokens)
                .sum();
            extra.insert(
                "agent".into(),
                json!({
                    "prompt_to_generation_ratio": if output > 0 { prompt as f64 / output as f64 } else { 0.0 },
                    "steps": per_step,
                }),
            );
        }
        Workload::Sweep(_) | Workload::Prefix(_) => {}
    }
    extra
}

/// A request's own decode speed, `(tokens - 1) / (E2E - TTFT)`.
fn decode_speed(r: &RequestRecord) -> f64 {
    match r.tpot() {
        Some(t) if t > 0.0 => 1.0 / t,
        _ => 0.0,
    }
}

/// Median, min, max and population std of `values`.
fn spread(values: &[f64]) -> Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len().max(1) as f64;
    let mean = sorted.iter().sum::<f64>() / n;
    json!({
        "median": crate::bench::stats::percentile(&sorted, 50.0),
        "min": sorted.first(),
        "max": sorted.last(),
        "std": (sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt(),
    })
}

fn summary(workload: &Workload<'_>, levels: &[Level]) -> String {
    let mut out = report::table(levels);
    for level in levels {
        if let Some(probe) = level.extra.get("probe") {
            out.push_str(&format!(
                "probe: TTFT median {:.1} ms (min {:.1}, max {:.1}); decode median {:.1} tok/s (min {:.1}, max {:.1}) over {} runs\n",
                probe["ttft_ms"]["median"].as_f64().unwrap_or(0.0),
                probe["ttft_ms"]["min"].as_f64().unwrap_or(0.0),
                probe["ttft_ms"]["max"].as_f64().unwrap_or(0.0),
                probe["decode_tok_s"]["median"].as_f64().unwrap_or(0.0),
                probe["decode_tok_s"]["min"].as_f64().unwrap_or(0.0),
                probe["decode_tok_s"]["max"].as_f64().unwrap_or(0.0),
                probe["repetitions"].as_array().map_or(0, Vec::len),
            ));
        }
        if let Some(agent) = level.extra.get("agent") {
            out.push_str(&format!(
                "agent: prompt:generation {:.1}:1\n",
                agent["prompt_to_generation_ratio"].as_f64().unwrap_or(0.0)
            ));
        }
        let s = &level.server;
        if let (Some(rate), Some(q)) = (s.prefix_cache_hit_rate, s.prefix_cache_queries) {
            out.push_str(&format!(
                "server: prefix-cache hit rate {:.1}% ({:.0} of {q:.0} prompt tokens)\n",
                rate * 100.0,
                s.prefix_cache_hits.unwrap_or(0.0)
            ));
        }
    }
    if matches!(workload, Workload::Sweep(_)) {
        out.push_str("(output tok/s: all requests' tokens over the level's wall time)\n");
    }
    out
}

/// The UTC date and time, `YYYYMMDD-HHMMSS`, as `vllm bench serve` writes `date`.
fn date() -> String {
    chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string()
}
