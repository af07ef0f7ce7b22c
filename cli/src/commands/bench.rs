//! `sous bench`: measure a server. Active workloads (`probe`, `sweep`, `prefix`,
//! `agent`) run against `--url`, or against `--recipe R`, which is served first and
//! stopped after; `compare` puts two reports side by side; `logs` and `scrape` read
//! what a production server leaves behind, without sending it a request.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

use crate::bench::client::Endpoint;
use crate::bench::plan::{self, Workload};
use crate::bench::report;
use crate::bench::run::{self, Target};
use crate::bench::scrape;
use crate::bench::stats::Slo;
use crate::bench::{BenchError, discover};
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
    #[arg(long, value_enum, default_value_t = EndpointArg::Completions)]
    endpoint: EndpointArg,
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

/// `--endpoint`: [`Endpoint`] for the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EndpointArg {
    /// `/v1/completions` with the prompt as text (what `vllm bench serve` uses by default).
    Completions,
    /// `/v1/chat/completions` with the prompt as one user message.
    Chat,
}

impl From<EndpointArg> for Endpoint {
    fn from(arg: EndpointArg) -> Endpoint {
        match arg {
            EndpointArg::Completions => Endpoint::Completions,
            EndpointArg::Chat => Endpoint::Chat,
        }
    }
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
        BenchCommand::Probe(a) => {
            let workload = Workload::Probe(plan::Probe {
                repeat: a.repeat,
                input_len: a.input_len,
                output_len: a.output_len,
            });
            active(&a.common, &workload, shell)
        }
        BenchCommand::Sweep(a) => {
            let workload = Workload::Sweep(plan::Sweep {
                concurrency: a.concurrency,
                requests: a.requests,
                input_len: a.input_len,
                output_len: a.output_len,
                range_ratio: a.range_ratio,
                eos: a.eos,
            });
            active(&a.common, &workload, shell)
        }
        BenchCommand::Prefix(a) => {
            let workload = Workload::Prefix(plan::Prefix {
                prefixes: a.prefixes,
                prefix_len: a.prefix_len,
                suffix_len: a.suffix_len,
                requests: a.requests,
                output_len: a.output_len,
                concurrency: a.concurrency,
            });
            active(&a.common, &workload, shell)
        }
        BenchCommand::Agent(a) => {
            let workload = Workload::Agent(plan::Agent {
                sessions: a.sessions,
                steps: a.steps,
                output_len: a.output_len,
                ratio: a.ratio,
                max_context: a.max_context,
            });
            active(&a.common, &workload, shell)
        }
    }
}

/// A benchmark's error as the command reports it: the user's (exit 1, with a hint) or
/// sous's (exit 2).
fn cli_error(err: BenchError) -> anyhow::Error {
    if err.is_internal() {
        err.into()
    } else {
        UserError::new(err.to_string(), err.hint()).into()
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
    let user = |e: scrape::ScrapeError| UserError::new(e.to_string(), e.hint());
    let runtime = super::runtime()?;
    let (instances, scheduled) = runtime
        .block_on(scrape::watch(&args.urls, args.window, args.interval, shell))
        .map_err(user)?;
    let report = scrape::analyze(&instances, scheduled).map_err(user)?;
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
            && let Ok(info) = discover::models(&client, &url, key.as_deref()).await
            && !info.id.is_empty()
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

fn active(common: &Common, workload: &Workload, shell: &Shell) -> anyhow::Result<ExitCode> {
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
                UserError::new(
                    format!("--api-key-env: `{var}` is not set"),
                    Some(&format!("export {var}=...")),
                )
            })?),
            None => recipe_key,
        };
        let target = Target {
            url,
            model: common.model.clone(),
            api_key: key,
            endpoint: common.endpoint.into(),
            tokenizer: common.tokenizer.clone(),
        };
        let options = run::Options {
            seed: common.seed,
            salt: common.salt,
            percentiles: common.percentiles.clone(),
            slo,
            label: common.label.clone(),
        };
        let report = run::run(&target, workload, &options, shell)
            .await
            .map_err(cli_error)?;
        let text = report.to_json()?;
        if let Some(dir) = &common.out {
            let written = report::write(dir, &report, &common.percentiles).map_err(cli_error)?;
            let charts: Vec<String> = written.charts.iter().map(|p| p.display().to_string()).collect();
            shell.status(
                "wrote",
                &format!(
                    "{}, {} and {}",
                    written.json.display(),
                    written.csv.display(),
                    charts.join(", ")
                ),
            );
        }
        if common.json {
            shell.data(&text)?;
        } else {
            shell.data(&report::summary(&report))?;
        }
        Ok(if report.failed() > 0 {
            ExitCode::from(sous::error::Class::User.exit_code())
        } else {
            ExitCode::SUCCESS
        })
    })
}
