//! `sous bench`: measure a server. Active workloads (`probe`, `sweep`, `prefix`,
//! `agent`) run against `--url`, or against `--recipe R`, which is served first and
//! stopped after; `compare` puts two reports side by side; `logs` and `scrape` read
//! what a production server leaves behind, without sending it a request.
//!
//! Here: the flags of every subcommand and the workloads they make. The active
//! workloads run in `active.rs`, `logs` and `scrape` in `passive.rs`; the comparison
//! itself is the library's (`sous::compare`).

mod active;
mod passive;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

use crate::failure::UserError;
use crate::shell::Shell;
use sous::bench::arrivals;
use sous::bench::client::Endpoint;
use sous::bench::logs::AfterRestart;
use sous::bench::scrape;
use sous::bench::window::{self, TimeArg};
use sous::bench::workload::{self, Workload};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// One stream, a cold ~500-token prompt, 256 tokens at temperature 0 with ignore_eos,
    /// repeated: TTFT and decode tok/s, median and spread (the Titan report's probe).
    Probe(ProbeArgs),
    /// Concurrency levels (or, with --request-rate, open-loop request rates), a number
    /// of requests at each: throughput, per-request speed, TTFT/TPOT/ITL/E2E
    /// percentiles, errors, goodput.
    Sweep(SweepArgs),
    /// Requests sharing long prefixes: the engine's prefix-cache hit rate.
    Prefix(PrefixArgs),
    /// Coding-agent sessions resending a growing context with short answers.
    Agent(AgentArgs),
    /// Rebuild production figures from vLLM's periodic stats lines (one file per
    /// instance): throughput per number of running requests, peaks, and the cluster
    /// sum aligned per minute with its percentiles.
    Logs(LogsArgs),
    /// Watch production servers' Prometheus /metrics for a while, or ask a Prometheus
    /// server for a past window (--prometheus): latency percentiles from the histograms
    /// (bucket-interpolated), token and request rates, prefix-cache and
    /// speculative-decoding figures, running requests and KV usage.
    Scrape(ScrapeArgs),
    /// Two reports side by side, matched by concurrency, with ratios (or two `sous eval`
    /// reports: perplexity, KL divergence, agreement and task metrics).
    Compare(CompareArgs),
    /// Start a recipe's engine several times (build it first, as `sous serve` does) and
    /// stop it once ready: time to ready and each phase the engine logs (weights,
    /// torch.compile, graph capture, engine init), median and spread.
    Coldstart(ColdstartArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous bench coldstart --recipe recipes/local/smollm2-135m.toml\n  sous bench coldstart --recipe my.toml --starts 5 --json"
)]
pub struct ColdstartArgs {
    #[command(flatten)]
    recipe: super::RecipeArg,
    #[command(flatten)]
    overrides: super::OverrideArgs,
    /// How many starts.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    starts: u32,
    /// Empty the engine's kept compile caches (torch.compile, Triton, FlashInfer)
    /// before every start, so that each one compiles everything: with a run without
    /// it, what the kept caches save.
    #[arg(long)]
    cold_cache: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous bench scrape http://10.0.0.1:8000 http://10.0.0.2:8000 --for 10m --interval 10s\n  sous bench scrape --prometheus http://prometheus:9090 --since 5d --selector '{job=\"vllm\"}' --svg latency.svg"
)]
pub struct ScrapeArgs {
    /// Server base URLs (`/metrics` is appended), or full metrics URLs ending in
    /// `/metrics` (TensorRT-LLM: http://HOST:PORT/prometheus/metrics).
    #[arg(
        required_unless_present = "prometheus",
        conflicts_with = "prometheus",
        value_name = "URL"
    )]
    urls: Vec<String>,
    /// How long to watch: `30s`, `10m`, `1h`, `1h30m`.
    #[arg(
        long = "for",
        value_name = "DURATION",
        value_parser = scrape::parse_duration,
        required_unless_present = "prometheus",
        conflicts_with = "prometheus"
    )]
    window: Option<Duration>,
    /// Time between scrapes.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = scrape::parse_duration, conflicts_with = "prometheus")]
    interval: Duration,
    /// Instead of watching live servers, ask this Prometheus server (its base URL, e.g.
    /// http://prometheus:9090) for a past window's figures, computed by Prometheus:
    /// histogram_quantile over increase() of the buckets, increase() of the counters,
    /// per instance and summed. Needs --since.
    #[arg(long, value_name = "URL")]
    prometheus: Option<String>,
    /// With --prometheus: the window's start, RFC 3339 (2026-09-06T10:00:00Z), a naive
    /// UTC time (2026-09-06 10:00, 2026-09-06), or a duration before --until or now
    /// (5d, 12h, 1h30m).
    #[arg(long, value_name = "TIME", value_parser = sous::bench::window::parse_time, requires = "prometheus", conflicts_with_all = ["urls", "window"])]
    since: Option<sous::bench::window::TimeArg>,
    /// With --prometheus: the window's end (same forms as --since; default now).
    #[arg(long, value_name = "TIME", value_parser = sous::bench::window::parse_time, requires = "prometheus", conflicts_with_all = ["urls", "window"])]
    until: Option<sous::bench::window::TimeArg>,
    /// With --prometheus: PromQL label matchers merged into every series selector, in
    /// braces, e.g. '{job="vllm",namespace="prod"}'.
    #[arg(long, value_name = "MATCHERS", requires = "prometheus", conflicts_with_all = ["urls", "window"])]
    selector: Option<String>,
    /// Draw the latency percentiles (TTFT, ITL, TPOT, E2E at p50/p90/p95/p99; per
    /// instance and summed where there are several) into this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
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
    /// Count only lines from this time on: RFC 3339 (2026-09-06T00:00:00Z), a naive time
    /// in the log's own clock (2026-09-06 10:00, 2026-09-06), or a duration before
    /// --until or the latest line of the logs (5d, 12h).
    #[arg(long, value_name = "TIME", value_parser = window::parse_time)]
    since: Option<TimeArg>,
    /// Count only lines before this time (same forms as --since).
    #[arg(long, value_name = "TIME", value_parser = window::parse_time)]
    until: Option<TimeArg>,
    /// Read each log that restarted from its last restart on (or, as --after-restart=N,
    /// from its N-th, counted from 1); logs that never restarted are read whole.
    #[arg(long, value_name = "N", num_args = 0..=1, require_equals = true, default_missing_value = "last", value_parser = parse_after_restart)]
    after_restart: Option<AfterRestart>,
    /// Draw the throughput-per-running-requests curves (and, for several logs, the
    /// cluster's per-minute distribution) into this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// `--after-restart [N]`: `last` when given alone.
fn parse_after_restart(text: &str) -> Result<AfterRestart, String> {
    match text {
        "last" => Ok(AfterRestart::Last),
        n => match n.parse::<usize>() {
            Ok(n) if n > 0 => Ok(AfterRestart::Nth(n)),
            _ => Err(format!(
                "`{n}` is not a restart number (1 for the first, or leave it out for the last)"
            )),
        },
    }
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
    /// Seed of the prompt text and lengths (and of a sweep's --request-rate arrivals).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Salt of the first words of cold prompts (default: from the clock; recorded in
    /// the report, pass it back to repeat a run exactly).
    #[arg(long)]
    salt: Option<u64>,
    /// The instances behind --url when it is a router (their base URLs): the server
    /// figures (prefix-cache hits, speculation, KV peak) are scraped from each and
    /// reported per instance and for all of them.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    instances: Vec<String>,
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
#[command(
    after_help = "Examples:\n  sous bench probe --recipe recipes/local/smollm2-135m.toml\n  sous bench probe --url http://127.0.0.1:8000 --prompt-file src/main.rs --json"
)]
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
    /// Send this file's text as the prompt instead of --input-len random words (e.g. code
    /// to edit, where speculative decoding by prompt lookup pays off); each repetition
    /// starts with a few salted words so that none hits the prefix cache.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous bench sweep --url http://127.0.0.1:8000 --concurrency 1,4,16 --out runs/a\n  sous bench sweep --recipe recipes/local/smollm2-135m.toml --request-rate 1,2,4,inf --burstiness 0.5\n  sous bench compare runs/a/sweep.json runs/b/sweep.json"
)]
pub struct SweepArgs {
    #[command(flatten)]
    common: Common,
    /// Concurrency levels (closed loop: this many requests in flight, the next sent as
    /// one ends).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16",
        conflicts_with = "request_rate"
    )]
    concurrency: Vec<usize>,
    /// Open-loop levels instead of --concurrency: requests per second, sent at
    /// gamma-distributed times seeded by --seed (as `vllm bench serve --request-rate`),
    /// `inf` for all at once; e.g. 1,2,4,8,inf.
    #[arg(long, value_name = "R", value_delimiter = ',', value_parser = arrivals::parse_rate, allow_negative_numbers = true)]
    request_rate: Vec<f64>,
    /// With --request-rate: the gamma shape of the gaps between requests; 1 is a
    /// Poisson process, below 1 burstier, above 1 more even, `inf` evenly spaced.
    #[arg(
        long,
        value_name = "B",
        default_value = "1",
        value_parser = arrivals::parse_burstiness,
        requires = "request_rate",
        allow_negative_numbers = true
    )]
    burstiness: f64,
    /// With --request-rate: the most requests in flight; more wait for a slot, so the
    /// rate achieved may fall below the rate offered (default: no cap).
    #[arg(
        long,
        value_name = "N",
        value_parser = arrivals::parse_max_concurrency,
        requires = "request_rate",
        allow_negative_numbers = true
    )]
    max_concurrency: Option<usize>,
    /// Requests per level (default: 4 x the level, at least 8; with --request-rate R,
    /// 10 x R, at least 8, and at rate inf 4 x --max-concurrency, or without it the
    /// largest count of the other levels).
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
    /// The baseline report (JSON from `sous bench ... --out` or `--json`, or from
    /// `sous bench logs --json`).
    a: PathBuf,
    /// The report to compare with it.
    b: PathBuf,
}

pub fn exec(cmd: BenchCommand, shell: &Shell) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Compare(args) => compare(&args, shell),
        BenchCommand::Coldstart(args) => coldstart(&args, shell),
        BenchCommand::Logs(args) => passive::logs(&args, shell),
        BenchCommand::Scrape(args) => passive::watch(&args, shell),
        BenchCommand::Probe(a) => {
            let prompt = match &a.prompt_file {
                Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                    UserError::new(
                        format!("cannot read the prompt file {}: {e}", path.display()),
                        Some("--prompt-file takes a text file, sent as the prompt"),
                    )
                })?),
                None => None,
            };
            let workload = Workload::Probe(workload::Probe {
                repeat: a.repeat,
                input_len: a.input_len,
                output_len: a.output_len,
                prompt,
            });
            active::active(&a.common, &workload, shell)
        }
        BenchCommand::Sweep(a) => {
            let workload = Workload::Sweep(workload::Sweep {
                concurrency: a.concurrency,
                request_rates: a.request_rate,
                burstiness: a.burstiness,
                max_concurrency: a.max_concurrency,
                requests: a.requests,
                input_len: a.input_len,
                output_len: a.output_len,
                range_ratio: a.range_ratio,
                eos: a.eos,
            });
            active::active(&a.common, &workload, shell)
        }
        BenchCommand::Prefix(a) => {
            let workload = Workload::Prefix(workload::Prefix {
                prefixes: a.prefixes,
                prefix_len: a.prefix_len,
                suffix_len: a.suffix_len,
                requests: a.requests,
                output_len: a.output_len,
                concurrency: a.concurrency,
            });
            active::active(&a.common, &workload, shell)
        }
        BenchCommand::Agent(a) => {
            let workload = Workload::Agent(workload::Agent {
                sessions: a.sessions,
                steps: a.steps,
                output_len: a.output_len,
                ratio: a.ratio,
                max_context: a.max_context,
            });
            active::active(&a.common, &workload, shell)
        }
    }
}

/// `sous bench compare A B`: both files read as JSON, then their table on stdout.
fn compare(args: &CompareArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let read = |path: &Path| -> anyhow::Result<Value> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| UserError::new(format!("cannot read {}: {e}", path.display()), None))?;
        serde_json::from_str(&text)
            .map_err(|e| UserError::new(format!("{} is not JSON: {e}", path.display()), None).into())
    };
    let (a, b) = (read(&args.a)?, read(&args.b)?);
    let table = sous::compare::compare((&args.a, a), (&args.b, b))
        .map_err(|e| UserError::new(e.message, Some(e.hint)))?;
    shell.data(&table)?;
    Ok(ExitCode::SUCCESS)
}

/// `sous bench coldstart`: the recipe served and stopped `--starts` times, then the
/// report.
fn coldstart(args: &ColdstartArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    use sous::bench::coldstart::{Report, Start};
    let recipe = super::load_recipe(&args.recipe.recipe, &args.overrides)?.recipe;
    let runtime = super::runtime()?;
    let cache_dir = if args.cold_cache {
        let gpus: Vec<String> = sous::devices::for_recipe(&recipe)
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.name)
            .collect();
        let Some((_, dir)) = sous::pipeline::session::setup().compile_cache(&recipe, &gpus) else {
            return Err(UserError::new(
                "--cold-cache: the native engine keeps no compile caches",
                Some("leave it out: every start of the native engine is the same"),
            )
            .into());
        };
        Some(dir)
    } else {
        None
    };
    let mut starts = Vec::new();
    for n in 1..=args.starts {
        if let Some(dir) = &cache_dir
            && dir.exists()
        {
            anyhow::Context::with_context(std::fs::remove_dir_all(dir), || {
                format!("emptying {}", dir.display())
            })?;
            shell.status("emptied", &format!("the compile caches in {}", dir.display()));
        }
        shell.status("starting", &format!("{} ({n} of {})", recipe.name, args.starts));
        let start = runtime.block_on(async {
            let (mut instance, _) =
                sous::pipeline::session::session(&recipe, Arc::new(shell.clone()), false).await?;
            let ready = instance.ready().await?;
            let start = Start {
                ready_seconds: ready.seconds,
                phases: ready.phases.clone(),
                compile_cache: ready.compile_cache,
            };
            instance.stop().await?;
            anyhow::Ok(start)
        })?;
        shell.status("ready", &format!("after {:.1} s", start.ready_seconds));
        starts.push(start);
    }
    let report = Report::of(&recipe.name, starts);
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&report.render())?;
    }
    Ok(ExitCode::SUCCESS)
}
