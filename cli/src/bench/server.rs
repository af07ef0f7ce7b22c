//! What the engine itself counted during an active run (prefix-cache hits,
//! speculative-decoding acceptance, preemptions, the KV-usage peak), from its `/metrics`
//! scraped before, during and after the run, in whichever engine's names it exposes
//! ([`sous_engine::dialect::metrics`]). Not here: taking the scrapes (the runner) or
//! reading the exposition ([`super::prom`]).

use serde::Serialize;
use sous_engine::dialect::Family;
use sous_engine::dialect::metrics::{sglang, trtllm, vllm};

use super::prom::Scrape;
use super::ratio::{WhenEmpty, ratio};

/// What the engine counted during a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerFigures {
    /// Which metric family was found: `vllm`, `sglang` or `trtllm`.
    pub family: Option<String>,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: Option<f64>,
    /// Of those, found.
    pub prefix_cache_hits: Option<f64>,
    /// hits / queries over the run (SGLang: cached / prompt tokens; TensorRT-LLM:
    /// reused / (reused + missed) blocks).
    pub prefix_cache_hit_rate: Option<f64>,
    /// Accepted / drafted tokens.
    pub spec_decode_acceptance_rate: Option<f64>,
    /// 1 + accepted / drafts.
    pub spec_decode_acceptance_length: Option<f64>,
    /// Acceptance per draft position, accepted at position / drafts.
    pub spec_decode_per_position_acceptance_rates: Vec<f64>,
    /// Drafts proposed.
    pub spec_decode_num_drafts: Option<f64>,
    /// Requests preempted.
    pub preemptions: Option<f64>,
    /// The highest KV-cache usage seen (0..1), from the scrapes during the run.
    pub kv_cache_usage_max: Option<f64>,
    /// The native engine's decode roofline over the run (its `sous:decode_*` series):
    /// what its decode steps had to read and how close that came to the read bandwidth
    /// it measured at load. Absent for other engines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeRoofline>,
}

/// What the native engine's decode steps read during a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DecodeRoofline {
    /// Decode steps (one token for each running sequence, no prompt tokens).
    pub steps: f64,
    /// Sequences per step, on average.
    pub sequences_per_step: f64,
    /// Bytes a step had to read (weights touched and KV cache), on average, GB.
    pub gb_per_step: f64,
    /// Those bytes over the steps' time, GB/s.
    pub gb_per_s: f64,
    /// The read bandwidth the engine measured at load (median of its passes), GB/s.
    pub read_bandwidth_gb_per_s: Option<f64>,
    /// `gb_per_s` / `read_bandwidth_gb_per_s`.
    pub bandwidth_fraction: Option<f64>,
}

fn delta(before: &Scrape, after: &Scrape, name: &str) -> Option<f64> {
    Some(after.sum(name)? - before.sum(name).unwrap_or(0.0))
}

/// Ratios over a run that sous sent the traffic of: 0 when the engine counted nothing
/// ([`WhenEmpty::Zero`]).
fn run_ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    ratio(num, den, WhenEmpty::Zero)
}

impl ServerFigures {
    /// The figures between two scrapes; `during` are the scrapes taken while it ran (for
    /// the KV-usage peak).
    pub fn between(before: &Scrape, after: &Scrape, during: &[Scrape]) -> ServerFigures {
        let all = || during.iter().chain([before, after]);
        let peak = |name: &str| all().filter_map(|s| s.max(name)).reduce(f64::max);
        let mut f = ServerFigures::default();
        if after.sum(vllm::PREFIX_CACHE_QUERIES).is_some() || after.sum(vllm::NUM_REQUESTS_RUNNING).is_some()
        {
            f.family = Some(Family::Vllm.name().into());
            f.prefix_cache_queries = delta(before, after, vllm::PREFIX_CACHE_QUERIES);
            f.prefix_cache_hits = delta(before, after, vllm::PREFIX_CACHE_HITS);
            f.prefix_cache_hit_rate = run_ratio(f.prefix_cache_hits, f.prefix_cache_queries);
            let drafts = delta(before, after, vllm::SPEC_DECODE_NUM_DRAFTS);
            let drafted = delta(before, after, vllm::SPEC_DECODE_NUM_DRAFT_TOKENS);
            let accepted = delta(before, after, vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS);
            f.spec_decode_num_drafts = drafts;
            f.spec_decode_acceptance_rate = run_ratio(accepted, drafted);
            f.spec_decode_acceptance_length = run_ratio(accepted, drafts).map(|r| 1.0 + r);
            let name = vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS;
            let before_pos = before.by_label(name, vllm::POSITION);
            let mut positions: Vec<(usize, f64)> = after
                .by_label(name, vllm::POSITION)
                .into_iter()
                .filter_map(|(p, v)| {
                    let was = before_pos.iter().find(|(q, _)| *q == p).map_or(0.0, |(_, v)| *v);
                    Some((p.parse().ok()?, v - was))
                })
                .collect();
            positions.sort_by_key(|(p, _)| *p);
            f.spec_decode_per_position_acceptance_rates = positions
                .into_iter()
                .filter_map(|(_, v)| run_ratio(Some(v), drafts))
                .collect();
            f.preemptions = delta(before, after, vllm::NUM_PREEMPTIONS);
            f.kv_cache_usage_max = peak(vllm::KV_CACHE_USAGE_PERC);
        } else if after.sum(sglang::NUM_RUNNING_REQS).is_some() || after.sum(sglang::PROMPT_TOKENS).is_some()
        {
            f.family = Some(Family::Sglang.name().into());
            f.prefix_cache_queries = delta(before, after, sglang::PROMPT_TOKENS);
            f.prefix_cache_hits = delta(before, after, sglang::CACHED_TOKENS);
            f.prefix_cache_hit_rate = run_ratio(f.prefix_cache_hits, f.prefix_cache_queries);
            // SGLang's speculative figures are gauges over its last log interval.
            f.spec_decode_acceptance_rate = after.max(sglang::SPEC_ACCEPT_RATE);
            f.spec_decode_acceptance_length = after.max(sglang::SPEC_ACCEPT_LENGTH);
            f.preemptions = after.sum(sglang::NUM_RETRACTED_REQS);
            f.kv_cache_usage_max = peak(sglang::TOKEN_USAGE);
        } else if after
            .samples
            .iter()
            .any(|s| Family::of_metric(&s.name) == Some(Family::Trtllm))
        {
            f.family = Some(Family::Trtllm.name().into());
            let reused = delta(before, after, trtllm::KV_CACHE_REUSED_BLOCKS);
            let missed = delta(before, after, trtllm::KV_CACHE_MISSED_BLOCKS);
            f.prefix_cache_hit_rate = match (reused, missed) {
                (Some(r), Some(m)) => run_ratio(Some(r), Some(r + m)),
                _ => after.max(trtllm::KV_CACHE_HIT_RATE),
            };
            let accepted = delta(before, after, trtllm::SPEC_DECODE_ACCEPTED_TOKENS);
            let drafted = delta(before, after, trtllm::SPEC_DECODE_DRAFTED_TOKENS);
            f.spec_decode_acceptance_rate = run_ratio(accepted, drafted);
            f.spec_decode_acceptance_length = after.max(trtllm::SPEC_DECODE_ACCEPTANCE_LENGTH);
            f.kv_cache_usage_max = peak(trtllm::KV_CACHE_UTILIZATION);
        }
        f.decode = decode_roofline(before, after);
        f
    }
}

/// The native engine's decode roofline between two scrapes, where it decoded.
fn decode_roofline(before: &Scrape, after: &Scrape) -> Option<DecodeRoofline> {
    use sous_engine::native::metrics as native;
    let steps = delta(before, after, native::DECODE_STEPS).filter(|&s| s > 0.0)?;
    let sequences = delta(before, after, native::DECODE_SEQUENCES)?;
    let bytes = delta(before, after, native::DECODE_READ_BYTES)?;
    let seconds = delta(before, after, native::DECODE_SECONDS).filter(|&s| s > 0.0)?;
    let gb_per_s = bytes / seconds / 1e9;
    let bandwidth = after
        .max(native::READ_BANDWIDTH)
        .map(|b| b / 1e9)
        .filter(|&b| b > 0.0);
    Some(DecodeRoofline {
        steps,
        sequences_per_step: sequences / steps,
        gb_per_step: bytes / steps / 1e9,
        gb_per_s,
        read_bandwidth_gb_per_s: bandwidth,
        bandwidth_fraction: bandwidth.map(|b| gb_per_s / b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_deltas_give_hit_rate_and_acceptance() {
        let before = Scrape::parse(
            "vllm:prefix_cache_queries_total{engine=\"0\"} 100\nvllm:prefix_cache_hits_total{engine=\"0\"} 10\n\
             vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n\
             vllm:spec_decode_num_accepted_tokens_total 12\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 8\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 4\n\
             vllm:num_preemptions_total 1\nvllm:kv_cache_usage_perc 0.1\n",
        );
        let after = Scrape::parse(
            "vllm:prefix_cache_queries_total{engine=\"0\"} 300\nvllm:prefix_cache_hits_total{engine=\"0\"} 160\n\
             vllm:spec_decode_num_drafts_total 30\nvllm:spec_decode_num_draft_tokens_total 90\n\
             vllm:spec_decode_num_accepted_tokens_total 42\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 24\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 14\n\
             vllm:num_preemptions_total 1\nvllm:kv_cache_usage_perc 0.05\n",
        );
        let during = [Scrape::parse("vllm:kv_cache_usage_perc 0.7\n")];
        let f = ServerFigures::between(&before, &after, &during);
        assert_eq!(f.family.as_deref(), Some("vllm"));
        assert_eq!(f.prefix_cache_hit_rate, Some(0.75));
        assert_eq!(f.spec_decode_acceptance_rate, Some(0.5));
        assert_eq!(f.spec_decode_acceptance_length, Some(2.5));
        assert_eq!(f.spec_decode_per_position_acceptance_rates, vec![0.8, 0.5]);
        assert_eq!(f.preemptions, Some(0.0));
        assert_eq!(f.kv_cache_usage_max, Some(0.7));
    }

    #[test]
    fn the_native_engines_decode_series_give_its_roofline() {
        let before = Scrape::parse(
            "vllm:num_requests_running 0\nsous:decode_steps_total 10\nsous:decode_sequences_total 10\n\
             sous:decode_read_bytes_total 7.5e9\nsous:decode_seconds_total 0.5\n\
             sous:read_bandwidth_bytes_per_second 3.2e10\n",
        );
        let after = Scrape::parse(
            "vllm:num_requests_running 0\nsous:decode_steps_total 110\nsous:decode_sequences_total 210\n\
             sous:decode_read_bytes_total 8.75e10\nsous:decode_seconds_total 3.0\n\
             sous:read_bandwidth_bytes_per_second 3.2e10\n",
        );
        let d = ServerFigures::between(&before, &after, &[])
            .decode
            .expect("decode figures");
        assert_eq!(d.steps, 100.0);
        assert_eq!(d.sequences_per_step, 2.0);
        assert!((d.gb_per_step - 0.8).abs() < 1e-12, "{d:?}");
        assert!((d.gb_per_s - 32.0).abs() < 1e-9, "{d:?}");
        assert_eq!(d.read_bandwidth_gb_per_s, Some(32.0));
        assert!((d.bandwidth_fraction.expect("fraction") - 1.0).abs() < 1e-9);
        // No decode step between the scrapes, or another engine: no figures.
        assert_eq!(ServerFigures::between(&after, &after, &[]).decode, None);
        let vllm = Scrape::parse("vllm:num_requests_running 0\n");
        assert_eq!(ServerFigures::between(&vllm, &vllm, &[]).decode, None);
    }

    #[test]
    fn sglang_and_trtllm_names_are_known() {
        let before = Scrape::parse(
            "sglang:prompt_tokens_total 100\nsglang:cached_tokens_total{cache_source=\"device\"} 0\n",
        );
        let after = Scrape::parse(
            "sglang:prompt_tokens_total 300\nsglang:cached_tokens_total{cache_source=\"device\"} 50\n\
             sglang:spec_accept_length 2.2\nsglang:token_usage 0.4\nsglang:num_running_reqs 0\n",
        );
        let f = ServerFigures::between(&before, &after, &[]);
        assert_eq!(f.family.as_deref(), Some("sglang"));
        assert_eq!(f.prefix_cache_hit_rate, Some(0.25));
        assert_eq!(f.spec_decode_acceptance_length, Some(2.2));
        let t = ServerFigures::between(
            &Scrape::parse("trtllm_kv_cache_reused_blocks_total 0\ntrtllm_kv_cache_missed_blocks_total 0\n"),
            &Scrape::parse("trtllm_kv_cache_reused_blocks_total 3\ntrtllm_kv_cache_missed_blocks_total 1\n"),
            &[],
        );
        assert_eq!(t.prefix_cache_hit_rate, Some(0.75));
    }
}
