//! Server-side figures from `/metrics`, scraped before and after a run: what the
//! engine itself counted (prefix-cache hits, speculative-decoding acceptance,
//! preemptions, KV usage). Metric names per engine from shared/reference/engines.md
//! §3.1 (vLLM `vllm/v1/metrics/loggers.py`, `vllm/v1/spec_decode/metrics.py`), §7
//! (SGLang `sglang/srt/observability/metrics_collector.py`) and §8 (TensorRT-LLM
//! `tensorrt_llm/metrics/collector.py`); the native engine uses vLLM's.
//!
//! The exposition format is parsed here (a line is `name{labels} value`): the figures
//! need sums over label sets and one label's values, nothing a client library adds.

use serde::Serialize;

/// One sample of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, with its `_total`/`_bucket` suffix.
    pub name: String,
    /// Labels.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// A scrape of `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// Parses Prometheus text exposition; lines that are not samples are skipped.
    pub fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(parse_line)
            .collect();
        Scrape { samples }
    }

    /// The sum of every series of `name`, `None` when there is none.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut found = None;
        for s in self.samples.iter().filter(|s| s.name == name) {
            *found.get_or_insert(0.0) += s.value;
        }
        found
    }

    /// `name` summed per value of `label`.
    pub fn by_label(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = Vec::new();
        for s in self.samples.iter().filter(|s| s.name == name) {
            if let Some((_, v)) = s.labels.iter().find(|(k, _)| k == label) {
                match out.iter_mut().find(|(k, _)| k == v) {
                    Some(slot) => slot.1 += s.value,
                    None => out.push((v.clone(), s.value)),
                }
            }
        }
        out
    }

    /// The largest value of any series of `name`.
    pub fn max(&self, name: &str) -> Option<f64> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .reduce(f64::max)
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].find('}')?;
            (&line[..open], (Some(&line[open + 1..close]), &line[close + 1..]))
        }
        None => {
            let space = line.find([' ', '\t'])?;
            (&line[..space], (None, &line[space..]))
        }
    };
    let (labels, rest) = rest;
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.trim().to_owned(),
        labels: labels.map(parse_labels).unwrap_or_default(),
        value,
    })
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let after = &rest[eq + 1..];
        let Some(after) = after.strip_prefix('"') else {
            break;
        };
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key, value));
        rest = &after[end..];
    }
    labels
}

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
}

fn delta(before: &Scrape, after: &Scrape, name: &str) -> Option<f64> {
    Some(after.sum(name)? - before.sum(name).unwrap_or(0.0))
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        (Some(_), Some(_)) => Some(0.0),
        _ => None,
    }
}

impl ServerFigures {
    /// The figures between two scrapes; `during` are the scrapes taken while it ran (for
    /// the KV-usage peak).
    pub fn between(before: &Scrape, after: &Scrape, during: &[Scrape]) -> ServerFigures {
        let all = || during.iter().chain([before, after]);
        let peak = |name: &str| all().filter_map(|s| s.max(name)).reduce(f64::max);
        let mut f = ServerFigures::default();
        if after.sum("vllm:prefix_cache_queries_total").is_some()
            || after.sum("vllm:num_requests_running").is_some()
        {
            f.family = Some("vllm".into());
            f.prefix_cache_queries = delta(before, after, "vllm:prefix_cache_queries_total");
            f.prefix_cache_hits = delta(before, after, "vllm:prefix_cache_hits_total");
            f.prefix_cache_hit_rate = ratio(f.prefix_cache_hits, f.prefix_cache_queries);
            let drafts = delta(before, after, "vllm:spec_decode_num_drafts_total");
            let drafted = delta(before, after, "vllm:spec_decode_num_draft_tokens_total");
            let accepted = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total");
            f.spec_decode_num_drafts = drafts;
            f.spec_decode_acceptance_rate = ratio(accepted, drafted);
            f.spec_decode_acceptance_length = ratio(accepted, drafts).map(|r| 1.0 + r);
            let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
            let before_pos = before.by_label(name, "position");
            let mut positions: Vec<(usize, f64)> = after
                .by_label(name, "position")
                .into_iter()
                .filter_map(|(p, v)| {
                    let was = before_pos.iter().find(|(q, _)| *q == p).map_or(0.0, |(_, v)| *v);
                    Some((p.parse().ok()?, v - was))
                })
                .collect();
            positions.sort_by_key(|(p, _)| *p);
            f.spec_decode_per_position_acceptance_rates = positions
                .into_iter()
                .filter_map(|(_, v)| ratio(Some(v), drafts))
                .collect();
            f.preemptions = delta(before, after, "vllm:num_preemptions_total");
            f.kv_cache_usage_max = peak("vllm:kv_cache_usage_perc");
        } else if after.sum("sglang:num_running_reqs").is_some()
            || after.sum("sglang:prompt_tokens_total").is_some()
        {
            f.family = Some("sglang".into());
            f.prefix_cache_queries = delta(before, after, "sglang:prompt_tokens_total");
            f.prefix_cache_hits = delta(before, after, "sglang:cached_tokens_total");
            f.prefix_cache_hit_rate = ratio(f.prefix_cache_hits, f.prefix_cache_queries);
            // SGLang's speculative figures are gauges over its last log interval.
            f.spec_decode_acceptance_rate = after.max("sglang:spec_accept_rate");
            f.spec_decode_acceptance_length = after.max("sglang:spec_accept_length");
            f.preemptions = after.sum("sglang:num_retracted_reqs");
            f.kv_cache_usage_max = peak("sglang:token_usage");
        } else if after.samples.iter().any(|s| s.name.starts_with("trtllm_")) {
            f.family = Some("trtllm".into());
            let reused = delta(before, after, "trtllm_kv_cache_reused_blocks_total");
            let missed = delta(before, after, "trtllm_kv_cache_missed_blocks_total");
            f.prefix_cache_hit_rate = match (reused, missed) {
                (Some(r), Some(m)) => ratio(Some(r), Some(r + m)),
                _ => after.max("trtllm_kv_cache_hit_rate"),
            };
            let accepted = delta(before, after, "trtllm_spec_decode_accepted_tokens_total");
            let drafted = delta(before, after, "trtllm_spec_decode_drafted_tokens_total");
            f.spec_decode_acceptance_rate = ratio(accepted, drafted);
            f.spec_decode_acceptance_length = after.max("trtllm_spec_decode_acceptance_length");
            f.kv_cache_usage_max = peak("trtllm_kv_cache_utilization");
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lines_parse_with_labels_and_escapes() {
        let s = Scrape::parse(
            "# HELP x y\n# TYPE vllm:prefix_cache_hits_total counter\n\
             vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 96.0\n\
             vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 4\n\
             plain 3 1700000000\n\
             odd{a=\"x\\\"y,z\",b=\"\"} +Inf\n\
             garbage\n",
        );
        assert_eq!(s.sum("vllm:prefix_cache_hits_total"), Some(100.0));
        assert_eq!(s.sum("plain"), Some(3.0));
        assert_eq!(s.sum("missing"), None);
        let odd = s.samples.iter().find(|x| x.name == "odd").expect("odd");
        assert_eq!(
            odd.labels,
            vec![("a".into(), "x\"y,z".into()), ("b".into(), String::new())]
        );
        assert_eq!(odd.value, f64::INFINITY);
    }

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
