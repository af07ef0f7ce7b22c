//! A run's CSV: a header and one row per level, numbers only (so no quoting is needed).
//! An open-loop sweep's rows begin with `request_rate` and `burstiness` (`inf` where
//! infinite) and leave `max_concurrency` empty where there was no cap; a closed loop's
//! CSV has neither column. Not here: the JSON ([`super::Level`]).

use super::level::key_percentile;
use crate::bench::report::Level;

/// The CSV header and one row per level (numbers only, so no quoting is needed).
pub fn csv(levels: &[Level], percentiles: &[f64]) -> String {
    let open = levels.iter().any(|l| !l.traffic.is_closed());
    let mut header = if open {
        vec!["request_rate", "burstiness"]
    } else {
        Vec::new()
    };
    header.extend([
        "max_concurrency",
        "num_prompts",
        "completed",
        "failed",
        "duration_s",
        "output_throughput",
        "total_token_throughput",
        "request_throughput",
        "request_goodput",
        "mean_request_output_tokens_per_s",
    ]);
    let mut header = header.into_iter().map(str::to_owned).collect::<Vec<_>>();
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        header.push(format!("mean_{metric}_ms"));
        for p in percentiles {
            header.push(format!("{}_{metric}_ms", key_percentile(*p)));
        }
    }
    header.extend(
        [
            "prefix_cache_hit_rate",
            "spec_decode_acceptance_rate",
            "kv_cache_usage_max",
            "preemptions",
        ]
        .map(str::to_owned),
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.6}"));
    let mut out = header.join(",");
    out.push('\n');
    for level in levels {
        let m = &level.metrics;
        let t = &level.traffic;
        let number_or_inf = |v: f64| {
            if v.is_finite() {
                format!("{v}")
            } else {
                "inf".to_owned()
            }
        };
        let mut row = if open {
            vec![number_or_inf(t.request_rate), number_or_inf(t.burstiness)]
        } else {
            Vec::new()
        };
        row.extend([
            t.max_concurrency.map_or(String::new(), |c| c.to_string()),
            m.num_prompts.to_string(),
            m.completed.to_string(),
            m.failed.to_string(),
            format!("{:.6}", m.duration),
            format!("{:.6}", m.output_throughput),
            format!("{:.6}", m.total_token_throughput),
            format!("{:.6}", m.request_throughput),
            opt(m.request_goodput),
            format!("{:.6}", m.mean_request_output_tokens_per_s),
        ]);
        for s in [&m.ttft, &m.tpot, &m.itl, &m.e2el] {
            row.push(format!("{:.6}", s.mean));
            for p in percentiles {
                row.push(opt(s.at(*p)));
            }
        }
        let s = &level.server;
        row.extend([
            opt(s.prefix_cache_hit_rate),
            opt(s.spec_decode_acceptance_rate),
            opt(s.kv_cache_usage_max),
            opt(s.preemptions),
        ]);
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}
