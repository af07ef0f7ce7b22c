//! The active benchmark runner behind `sous bench probe|sweep|prefix|agent`: given a
//! server's URL, a workload and options, it finds the model and the tokenizer, builds
//! the levels, sends each level's requests (progress through a
//! [`Reporter`]), scrapes the server's `/metrics` before, during (once a second, for the
//! KV-usage peak) and after each level, and returns the typed [`Report`]. Not here:
//! command-line flags, starting a server, printing or writing the report.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sous_engine::reporter::{Progress, Reporter, Task};

use super::BenchError;
use super::arrivals;
use super::client::{self, Endpoint};
use super::prom::Scrape;
use super::prompts::PromptMaker;
use super::report::{AgentSummary, ErrorCount, InstanceFigures, Level, ProbeSummary, Report};
use super::server::ServerFigures;
use super::stats::{RequestRecord, RunMetrics, Slo};
use super::workload::{Planned, Workload};
use crate::served;

/// The server under test.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its base URL, without a trailing `/`.
    pub url: String,
    /// The model name to send (default: the first one in `/v1/models`).
    pub model: Option<String>,
    /// The bearer token, when the server needs one.
    pub api_key: Option<String>,
    /// The endpoint to call.
    pub endpoint: Endpoint,
    /// The tokenizer (a `tokenizer.json` or a model directory); default: the served
    /// model's.
    pub tokenizer: Option<PathBuf>,
    /// The instances behind `url` when it is a router: their base URLs, whose
    /// `/metrics` are scraped (each reported, and summed for the level) instead of the
    /// router's.
    pub instances: Vec<String>,
}

/// How to run and report.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Seed of the prompt text and lengths.
    pub seed: u64,
    /// Salt of the cold prompts' first words (default: from the clock).
    pub salt: Option<u64>,
    /// Percentiles to report, each within 0..=100.
    pub percentiles: Vec<f64>,
    /// SLOs for goodput.
    pub slo: Slo,
    /// The run's name in reports.
    pub label: Option<String>,
}

/// Runs `workload` against `target`.
pub async fn run(
    target: &Target,
    workload: &Workload,
    options: &Options,
    reporter: &dyn Reporter,
) -> Result<Report, BenchError> {
    let url = &target.url;
    let probe_client = reqwest::Client::new();
    let served = served::models(&probe_client, url, target.api_key.as_deref()).await?;
    let model = target.model.clone().unwrap_or(served.id.clone());
    let (tok, tok_path) = served::tokenizer(target.tokenizer.as_deref(), served.root.as_deref(), &served.id)?;
    let maker = PromptMaker::new(tok).map_err(BenchError::Prompts)?;
    let salt = options.salt.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let client_target = client::Target {
        base: url.clone(),
        model: model.clone(),
        endpoint: target.endpoint,
        api_key: target.api_key.clone(),
    };
    let levels = workload.levels(&maker, options.seed, salt, served.max_model_len)?;
    reporter.status(
        "bench",
        &format!(
            "{} against {url} (model `{model}`, tokenizer {}, seed {}, salt {salt})",
            workload.name(),
            tok_path.display(),
            options.seed
        ),
    );
    let mut results = Vec::new();
    for planned in levels {
        let run = LevelRun {
            probe_client: &probe_client,
            scraped: if target.instances.is_empty() {
                std::slice::from_ref(url)
            } else {
                &target.instances
            },
            target: &client_target,
            workload,
            options,
            reporter,
        };
        results.push(run.level(planned).await);
    }
    Ok(Report {
        backend: "openai",
        base_url: url.clone(),
        date: date(),
        endpoint_type: target.endpoint,
        label: options.label.clone(),
        levels: results,
        model_id: model,
        salt,
        seed: options.seed,
        sous_version: env!("CARGO_PKG_VERSION"),
        tokenizer_id: tok_path.display().to_string(),
        workload: workload.name(),
    })
}

/// What every level of a run shares.
struct LevelRun<'a> {
    probe_client: &'a reqwest::Client,
    /// The servers whose `/metrics` count: the URL, or the instances behind it.
    scraped: &'a [String],
    target: &'a client::Target,
    workload: &'a Workload,
    options: &'a Options,
    reporter: &'a dyn Reporter,
}

impl LevelRun<'_> {
    /// Sends one level's requests and measures them.
    async fn level(&self, planned: Planned) -> Level {
        let Planned {
            concurrency,
            sessions,
            arrivals,
            traffic,
        } = planned;
        let total: usize = sessions.iter().map(Vec::len).sum();
        let client = client::http_client(concurrency);
        let label = match traffic.max_concurrency {
            Some(c) if traffic.is_closed() => format!("conc {c}"),
            Some(c) => format!("rate {} max {c}", arrivals::rate_text(traffic.request_rate)),
            None => format!("rate {}", arrivals::rate_text(traffic.request_rate)),
        };
        let bar: Arc<dyn Progress> = Arc::from(self.reporter.progress(Task::count(
            label,
            "requests",
            total as u64,
        )));
        let tokens = Arc::new(AtomicU64::new(0));
        let on_done: Arc<dyn Fn(&RequestRecord) + Send + Sync> = Arc::new({
            let bar = bar.clone();
            move |r: &RequestRecord| {
                let n = tokens.fetch_add(r.output_tokens, Ordering::Relaxed) + r.output_tokens;
                bar.add(1);
                bar.note(&format!("{n} tokens"));
            }
        });
        let before = scrape_all(self.probe_client, self.scraped).await;
        // A scrape a second while it runs, for the KV-usage peak.
        let during = Arc::new(Mutex::new(Vec::new()));
        let sampling = tokio::spawn({
            let (c, urls, during) = (self.probe_client.clone(), self.scraped.to_vec(), during.clone());
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let scrapes = scrape_all(&c, &urls).await;
                    if let Ok(mut d) = during.lock() {
                        d.push(scrapes);
                    }
                }
            }
        });
        let (records, duration) = client::run(
            &client,
            self.target,
            sessions,
            concurrency,
            arrivals.as_deref(),
            on_done,
        )
        .await;
        sampling.abort();
        bar.finish(None);
        let after = scrape_all(self.probe_client, self.scraped).await;
        let during: Vec<Vec<Option<Scrape>>> = during.lock().map(|d| d.clone()).unwrap_or_default();
        // Each server's figures, then the fleet's: the servers' scrapes taken together
        // (counters add up; the KV peak is the fullest server's).
        let figures = |i: usize| match (&before[i], &after[i]) {
            (Some(b), Some(a)) => {
                let seen: Vec<Scrape> = during.iter().filter_map(|d| d[i].clone()).collect();
                Some(ServerFigures::between(b, a, &seen))
            }
            _ => None,
        };
        let server = if self.scraped.len() == 1 {
            figures(0).unwrap_or_default()
        } else {
            match (Scrape::merged(&before), Scrape::merged(&after)) {
                (Some(b), Some(a)) => {
                    let seen: Vec<Scrape> = during.iter().filter_map(|d| Scrape::merged(d)).collect();
                    ServerFigures::between(&b, &a, &seen)
                }
                _ => ServerFigures::default(),
            }
        };
        let instances = if self.scraped.len() == 1 {
            Vec::new()
        } else {
            self.scraped
                .iter()
                .enumerate()
                .map(|(i, url)| InstanceFigures {
                    url: url.clone(),
                    server: figures(i),
                })
                .collect()
        };
        let flat: Vec<RequestRecord> = records.iter().map(|(_, _, r)| r.clone()).collect();
        let options = self.options;
        let metrics = RunMetrics::compute(&flat, duration, concurrency, &options.percentiles, &options.slo);
        if let Some(first) = flat.iter().find(|r| !r.success) {
            self.reporter.warn(&format!(
                "{} of {} requests failed at {}; the first: {}",
                metrics.failed,
                metrics.num_prompts,
                traffic.name(),
                first.error.as_deref().unwrap_or("?")
            ));
        }
        Level {
            traffic,
            metrics,
            server,
            instances,
            probe: matches!(self.workload, Workload::Probe(_)).then(|| ProbeSummary::of(&flat)),
            agent: matches!(self.workload, Workload::Agent(_)).then(|| AgentSummary::of(&records)),
            errors: ErrorCount::tally(&flat),
            ttfts_ms: flat
                .iter()
                .filter(|r| r.success)
                .map(|r| r.ttft * 1000.0)
                .collect(),
        }
    }
}

/// Every server's `/metrics` at once, in order.
async fn scrape_all(client: &reqwest::Client, urls: &[String]) -> Vec<Option<Scrape>> {
    futures_util::future::join_all(urls.iter().map(|u| scrape(client, u))).await
}

/// The server's `/metrics`, or none when it has none or does not answer in 5 s.
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

/// The UTC date and time, `YYYYMMDD-HHMMSS`, as `vllm bench serve` writes `date`.
fn date() -> String {
    chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string()
}
