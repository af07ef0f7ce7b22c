//! What a benchmark run measured, defined exactly as `vllm bench serve` defines it
//! (`vllm/benchmarks/serve.py` `calculate_metrics`, `vllm/benchmarks/lib/endpoint_request_func.py`),
//! so that figures are comparable with it:
//!
//! - **TTFT**: from sending the request to the first streamed chunk that carries a
//!   choice (for chat, vLLM's role chunk counts, as in vLLM's client).
//! - **ITL**: the gaps between consecutive such chunks, pooled over all requests (a
//!   chunk holding several tokens is one gap, as in vLLM).
//! - **E2E latency**: from sending the request to its last chunk with a choice.
//! - **TPOT** per request: `(E2E - TTFT) / (output_tokens - 1)` when more than one token
//!   came back; requests of one token count as 0 for goodput and are left out of the
//!   TPOT statistics.
//! - **output tokens**: the server's `usage.completion_tokens` (sous asks for
//!   `stream_options.include_usage`, as vLLM does).
//! - **throughputs**: totals divided by the run's wall time (first request sent to last
//!   response finished); **goodput**: requests meeting every SLO given, per second.
//! - **percentiles**: numpy's default (linear interpolation between closest ranks);
//!   **std**: the population standard deviation (numpy's `np.std`).
//!
//! Where other tools differ: genai-perf and LLMPerf count ITL per token (a chunk of k
//! tokens gives k equal gaps) and some tools measure TPOT including the first token;
//! the engines' own `/metrics` histograms are server-side and leave out the network and
//! the HTTP front end.

use serde::Serialize;

use crate::stats::Summary;

/// What one request saw. Times are seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestRecord {
    /// When it was sent, from the start of the run.
    pub start: f64,
    /// Whether it completed.
    pub success: bool,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Time to the first chunk.
    pub ttft: f64,
    /// Gaps between the following chunks.
    pub itl: Vec<f64>,
    /// Time to the last chunk.
    pub latency: f64,
    /// Prompt tokens as sous built them.
    pub prompt_len: usize,
    /// Prompt tokens as the server counted them.
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens the server found in its prefix cache.
    pub cached_tokens: Option<u64>,
    /// Generated tokens as the server counted them.
    pub output_tokens: u64,
}

impl RequestRecord {
    /// `(E2E - TTFT) / (output_tokens - 1)`, or `None` for fewer than two tokens.
    pub fn tpot(&self) -> Option<f64> {
        (self.output_tokens > 1).then(|| (self.latency - self.ttft) / (self.output_tokens - 1) as f64)
    }
}

/// Latency targets for goodput, in milliseconds (`--slo ttft:500,tpot:50,e2el:10000`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Slo {
    /// Time to first token.
    pub ttft_ms: Option<f64>,
    /// Time per output token.
    pub tpot_ms: Option<f64>,
    /// End-to-end latency.
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// Parses `ttft:500,tpot:50,e2el:10000` (vLLM's `--goodput ttft:500 tpot:50` keys).
    pub fn parse(text: &str) -> Result<Slo, String> {
        let mut slo = Slo::default();
        for part in text.split([',', ' ']).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once(':')
                .ok_or_else(|| format!("`{part}` is not KEY:MILLISECONDS"))?;
            let value: f64 = value
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("`{value}` in `{part}` is not a positive number of milliseconds"))?;
            match key {
                "ttft" => slo.ttft_ms = Some(value),
                "tpot" => slo.tpot_ms = Some(value),
                "e2el" => slo.e2el_ms = Some(value),
                _ => return Err(format!("unknown SLO `{key}`: use ttft, tpot or e2el")),
            }
        }
        Ok(slo)
    }

    fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2el_ms.is_some()
    }

    /// Whether a completed request met every target.
    fn met(&self, r: &RequestRecord) -> bool {
        let ok = |target: Option<f64>, value: f64| target.is_none_or(|t| value * 1000.0 <= t);
        ok(self.ttft_ms, r.ttft) && ok(self.tpot_ms, r.tpot().unwrap_or(0.0)) && ok(self.e2el_ms, r.latency)
    }
}

/// The figures of one run (one concurrency level), `vllm bench serve`'s where the
/// concept is the same.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunMetrics {
    /// Requests sent.
    pub num_prompts: usize,
    /// Most requests in flight at once (the limit given).
    pub max_concurrency: usize,
    /// Wall time of the run, seconds.
    pub duration: f64,
    /// Completed requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// Prompt tokens of the completed requests (sous's count).
    pub total_input_tokens: u64,
    /// Generated tokens of the completed requests (the server's count).
    pub total_output_tokens: u64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Requests meeting every SLO, per second (`None` without SLOs).
    pub request_goodput: Option<f64>,
    /// Output tokens per second, all requests together.
    pub output_throughput: f64,
    /// Prompt and output tokens per second.
    pub total_token_throughput: f64,
    /// The most output tokens in one second of the run.
    pub max_output_tokens_per_s: f64,
    /// vLLM's figure of the same name: the most requests active during one whole second
    /// of the run (seconds counted from the first request's start; a request counts in
    /// every second it overlaps), so requests that follow each other within a second all
    /// count.
    pub max_concurrent_requests: usize,
    /// The most requests in flight at the same instant (sous's own figure).
    pub peak_in_flight: usize,
    /// Mean of each request's own decode speed, `1 / TPOT` (tokens/s per request).
    pub mean_request_output_tokens_per_s: f64,
    /// Time to first token.
    pub ttft: Summary,
    /// Time per output token.
    pub tpot: Summary,
    /// Inter-token latency.
    pub itl: Summary,
    /// End-to-end latency.
    pub e2el: Summary,
    /// Prompt tokens the server served from its prefix cache, over all prompt tokens it
    /// counted (from `usage.prompt_tokens_details.cached_tokens`, when it reports it).
    pub usage_cached_fraction: Option<f64>,
}

impl RunMetrics {
    /// Computes the run's figures from its requests.
    pub fn compute(
        records: &[RequestRecord],
        duration: f64,
        concurrency: usize,
        percentiles: &[f64],
        slo: &Slo,
    ) -> RunMetrics {
        let done: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
        let completed = done.len();
        let total_input: u64 = done.iter().map(|r| r.prompt_len as u64).sum();
        let total_output: u64 = done.iter().map(|r| r.output_tokens).sum();
        let ttfts: Vec<f64> = done.iter().map(|r| r.ttft).collect();
        let tpots: Vec<f64> = done.iter().filter_map(|r| r.tpot()).collect();
        let itls: Vec<f64> = done.iter().flat_map(|r| r.itl.iter().copied()).collect();
        let e2els: Vec<f64> = done.iter().map(|r| r.latency).collect();
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let speeds: Vec<f64> = tpots.iter().filter(|t| **t > 0.0).map(|t| 1.0 / t).collect();
        let (served, cached) = done.iter().fold((0u64, 0u64), |(s, c), r| {
            (s + r.prompt_tokens.unwrap_or(0), c + r.cached_tokens.unwrap_or(0))
        });
        let reports_cache = done.iter().any(|r| r.cached_tokens.is_some());
        RunMetrics {
            num_prompts: records.len(),
            max_concurrency: concurrency,
            duration,
            completed,
            failed: records.len() - completed,
            total_input_tokens: total_input,
            total_output_tokens: total_output,
            request_throughput: per_s(completed as f64),
            request_goodput: slo
                .is_set()
                .then(|| per_s(done.iter().filter(|r| slo.met(r)).count() as f64)),
            output_throughput: per_s(total_output as f64),
            total_token_throughput: per_s((total_input + total_output) as f64),
            max_output_tokens_per_s: peak_tokens_per_second(&done),
            max_concurrent_requests: busiest_second(&done),
            peak_in_flight: peak_in_flight(&done),
            mean_request_output_tokens_per_s: if speeds.is_empty() {
                0.0
            } else {
                speeds.iter().sum::<f64>() / speeds.len() as f64
            },
            ttft: Summary::of(&ttfts, percentiles),
            tpot: Summary::of(&tpots, percentiles),
            itl: Summary::of(&itls, percentiles),
            e2el: Summary::of(&e2els, percentiles),
            usage_cached_fraction: (reports_cache && served > 0).then(|| cached as f64 / served as f64),
        }
    }
}

/// Where vLLM's one-second bins start: the first successful request's start
/// (`vllm/benchmarks/serve.py` `calculate_metrics`, `min_start_time`).
fn first_start(done: &[&RequestRecord]) -> f64 {
    done.iter().map(|r| r.start).fold(f64::INFINITY, f64::min)
}

/// The most chunks that arrived within one whole second of the run, counting each
/// request's output tokens spread over its chunks (vLLM bins token arrival times by
/// second the same way, from the first request's start).
fn peak_tokens_per_second(done: &[&RequestRecord]) -> f64 {
    let origin = first_start(done);
    let mut bins: Vec<f64> = Vec::new();
    for r in done {
        let chunks = 1 + r.itl.len();
        let per_chunk = r.output_tokens as f64 / chunks as f64;
        let mut t = r.start - origin + r.ttft;
        for i in 0..chunks {
            if i > 0 {
                t += r.itl[i - 1];
            }
            let bin = t.max(0.0) as usize;
            if bins.len() <= bin {
                bins.resize(bin + 1, 0.0);
            }
            bins[bin] += per_chunk;
        }
    }
    bins.into_iter().fold(0.0, f64::max)
}

/// vLLM's `max_concurrent_requests`: each request counts once in every whole second
/// (from the first request's start) from the one it starts in to the one it ends in;
/// the fullest second (`vllm/benchmarks/serve.py` `calculate_metrics`, vLLM 0.33).
fn busiest_second(done: &[&RequestRecord]) -> usize {
    let origin = first_start(done);
    let mut seconds: Vec<usize> = Vec::new();
    for r in done {
        let first = (r.start - origin).max(0.0) as usize;
        let last = (r.start - origin + r.latency).max(0.0) as usize;
        if seconds.len() <= last {
            seconds.resize(last + 1, 0);
        }
        for second in &mut seconds[first..=last] {
            *second += 1;
        }
    }
    seconds.into_iter().max().unwrap_or(0)
}

/// The most requests that were in flight at the same instant.
fn peak_in_flight(done: &[&RequestRecord]) -> usize {
    let mut events: Vec<(f64, i32)> = done
        .iter()
        .flat_map(|r| [(r.start, 1), (r.start + r.latency, -1)])
        .collect();
    // Ends before starts at the same instant.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        peak = peak.max(now);
    }
    peak.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(start: f64, ttft: f64, itl: &[f64], tokens: u64) -> RequestRecord {
        RequestRecord {
            start,
            success: true,
            ttft,
            latency: ttft + itl.iter().sum::<f64>(),
            itl: itl.to_vec(),
            prompt_len: 10,
            prompt_tokens: Some(10),
            cached_tokens: Some(5),
            output_tokens: tokens,
            ..Default::default()
        }
    }

    #[test]
    fn run_metrics_follow_vllm_bench_serve() {
        let records = vec![
            // TPOT (0.1 + 0.3) / 2 = 0.2
            request(0.0, 0.5, &[0.1, 0.3], 3),
            // one token: no TPOT, counts as 0 for goodput
            request(0.5, 1.0, &[], 1),
            RequestRecord {
                error: Some("HTTP 500".into()),
                ..Default::default()
            },
        ];
        let slo = Slo::parse("ttft:600").expect("slo");
        let m = RunMetrics::compute(&records, 2.0, 2, &[50.0, 99.0], &slo);
        assert_eq!((m.completed, m.failed, m.num_prompts), (2, 1, 3));
        assert_eq!(m.total_output_tokens, 4);
        assert_eq!(m.total_input_tokens, 20);
        assert_eq!(m.output_throughput, 2.0);
        assert_eq!(m.total_token_throughput, 12.0);
        assert_eq!(m.request_throughput, 1.0);
        assert_eq!(
            m.request_goodput,
            Some(0.5),
            "only the first meets TTFT <= 600 ms"
        );
        assert_eq!(m.tpot.count, 1);
        assert!((m.tpot.mean - 200.0).abs() < 1e-9);
        assert_eq!(m.itl.count, 2);
        assert!((m.itl.median - 200.0).abs() < 1e-9);
        assert!((m.ttft.mean - 750.0).abs() < 1e-9);
        assert!((m.e2el.mean - 950.0).abs() < 1e-9);
        assert_eq!(m.max_concurrent_requests, 2, "both are active in second 0");
        assert_eq!(m.peak_in_flight, 2, "0..0.9 and 0.5..1.5 overlap");
        assert_eq!(m.usage_cached_fraction, Some(0.5));
        assert!((m.mean_request_output_tokens_per_s - 5.0).abs() < 1e-9);
        // chunks at 0.5, 0.6, 0.9 (1 token each) and 1.5 (1 token): 3 in second 0
        assert_eq!(m.max_output_tokens_per_s, 3.0);
        // One after the other within a second: vLLM's figure counts both, in flight never.
        let apart = [request(0.7, 0.1, &[0.1], 2), request(1.1, 0.1, &[0.1], 2)];
        let m = RunMetrics::compute(&apart, 1.0, 1, &[50.0], &Slo::default());
        assert_eq!((m.max_concurrent_requests, m.peak_in_flight), (2, 1));
        // Bins start at the first request (0.7 s): all four chunks in its first second
        // (counted from 0 s, they would straddle seconds 0 and 1).
        assert_eq!(m.max_output_tokens_per_s, 4.0);
    }

    #[test]
    fn slo_parsing_names_what_is_wrong() {
        assert_eq!(
            Slo::parse("ttft:500,tpot:50 e2el:9000"),
            Ok(Slo {
                ttft_ms: Some(500.0),
                tpot_ms: Some(50.0),
                e2el_ms: Some(9000.0)
            })
        );
        assert!(
            Slo::parse("ttft=5")
                .expect_err("no colon")
                .contains("KEY:MILLISECONDS")
        );
        assert!(
            Slo::parse("itl:5")
                .expect_err("unknown")
                .contains("unknown SLO `itl`")
        );
        assert!(Slo::parse("ttft:-1").expect_err("negative").contains("positive"));
    }
}
