//! `sous bench logs`'s report for a terminal: per instance its counts and curve, then the
//! cluster. Not here: the JSON (the report's own serialization).

use super::report::{ClusterReport, ClusterSummary, InstanceReport, LogsReport, window_text};
use crate::bench::table::{self, First};

impl LogsReport {
    /// The report as plain text: per instance its counts and curve, then the cluster.
    pub fn to_table(&self) -> String {
        let mut sections: Vec<String> = Vec::with_capacity(self.instances.len() + 1);
        for instance in &self.instances {
            let mut out = String::new();
            render_instance(&mut out, instance, self.idle_gap_s);
            sections.push(out);
        }
        if let Some(cluster) = &self.cluster {
            let mut out = String::new();
            render_cluster(&mut out, cluster);
            sections.push(out);
        }
        // A blank line between sections.
        sections.join("\n")
    }
}

fn render_instance(out: &mut String, i: &InstanceReport, idle_gap_s: u32) {
    out.push_str(&format!(
        "{}: {} samples from {} to {} ({})\n",
        i.name,
        i.samples,
        i.first,
        i.last,
        duration(i.span_s)
    ));
    let w = &i.window;
    let mut window = window_text(w.since, w.until);
    if let Some(r) = w.after_restart {
        window.push_str(&format!(" (after the restart at {r})"));
    }
    out.push_str(&format!(
        "  window: {window}; {} stats and spec decoding lines outside it\n",
        w.lines_outside
    ));
    out.push_str(&format!(
        "  lines: {} read, {} stats, {} spec decoding, {} malformed{}, {} other\n",
        i.lines,
        i.samples,
        i.spec_lines,
        i.malformed_lines,
        if i.malformed_examples.is_empty() {
            String::new()
        } else {
            let lines: Vec<String> = i.malformed_examples.iter().map(ToString::to_string).collect();
            format!(" (line {})", lines.join(", "))
        },
        i.other_lines
    ));
    out.push_str(&format!(
        "  idle: {} gaps over {idle_gap_s}s, {} idle in all, longest gap {}\n",
        i.idle.gaps,
        duration(i.idle.idle_s),
        duration(i.idle.longest_gap_s)
    ));
    if i.restarts.is_empty() {
        out.push_str("  restarts: none\n");
    } else {
        let list: Vec<String> = i
            .restarts
            .iter()
            .map(|r| match (r.pid_before, r.pid_after) {
                (Some(a), Some(b)) if a != b => format!("at {}, pid {a} -> {b}", r.at),
                _ => format!("at {}", r.at),
            })
            .collect();
        out.push_str(&format!("  restarts: {} ({})\n", list.len(), list.join("; ")));
    }
    out.push_str("  generation tok/s by requests running:\n");
    let rows: Vec<Vec<String>> = i
        .curve
        .iter()
        .map(|p| {
            let g = &p.generation_tok_s;
            let mut row = vec![p.running.to_string(), p.samples.to_string()];
            row.extend([g.min, g.p5, g.p50, g.p95, g.mean, g.max].map(|v| format!("{v:.1}")));
            row.push(
                p.per_request_tok_s
                    .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
            );
            row
        })
        .collect();
    table(
        out,
        "  ",
        &[
            "running",
            "samples",
            "min",
            "p5",
            "median",
            "p95",
            "mean",
            "max",
            "per request",
        ],
        &rows,
        First::Right,
    );
    out.push_str(&format!(
        "  peak: {:.1} tok/s generation at {} with {} running\n",
        i.peak.generation_tok_s, i.peak.at, i.peak.running
    ));
    out.push_str(&format!(
        "  active samples: {}, mean prompt {:.1} tok/s, mean generation {:.1} tok/s, prompt:generation {}\n",
        i.active_samples,
        i.mean_prompt_tok_s,
        i.mean_generation_tok_s,
        i.prompt_generation_ratio
            .map_or_else(|| "-".into(), |r| format!("{r:.1}:1")),
    ));
    out.push_str(&format!(
        "  KV cache usage: mean {:.1}%, p95 {:.1}%, max {:.1}%; waiting: mean {:.1}, max {}; preemptions {}\n",
        i.kv_cache_usage_pct.mean,
        i.kv_cache_usage_pct.p95,
        i.max_kv_cache_usage_pct,
        i.mean_waiting,
        i.max_waiting,
        i.preemptions
    ));
    for (label, rate) in [
        ("prefix cache hit rate", &i.prefix_cache_hit_rate_pct),
        (
            "external prefix cache hit rate",
            &i.external_prefix_cache_hit_rate_pct,
        ),
    ] {
        if let Some(r) = rate {
            out.push_str(&format!(
                "  {label}: {:.1}% at the end; over active lines median {:.1}%, {:.1}-{:.1}%\n",
                r.last, r.active.p50, r.active.min, r.active.max
            ));
        }
    }
    if let Some(s) = &i.spec_decode {
        let pct = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}%"));
        let positions: Vec<String> = s
            .per_position_acceptance
            .iter()
            .map(|p| format!("{p:.3}"))
            .collect();
        out.push_str(&format!(
            "  spec decoding: {} lines, acceptance {} ({} of {} drafted tokens), mean acceptance length {}{}\n",
            s.lines,
            pct(s.acceptance_rate_pct),
            s.accepted_tokens,
            s.drafted_tokens,
            s.mean_acceptance_length
                .map_or_else(|| "-".into(), |v| format!("{v:.2}")),
            if positions.is_empty() {
                String::new()
            } else {
                format!(", per position {}", positions.join(", "))
            }
        ));
        let (r, l) = (
            &s.per_line_acceptance_rate_pct,
            &s.per_line_mean_acceptance_length,
        );
        if r.samples > 0 {
            out.push_str(&format!(
                "    per line: acceptance {:.1}-{:.1}% (median {:.1}%), length {:.2}-{:.2}\n",
                r.min, r.max, r.p50, l.min, l.max
            ));
        }
    }
}

fn render_cluster(out: &mut String, c: &ClusterReport) {
    out.push_str(&format!(
        "cluster: {} instances, per minute the highest sample of each, summed (tok/s)\n",
        c.instances.len()
    ));
    let threshold = format!("> {}", c.threshold_tok_s);
    let summary_row = |label: &str, s: &ClusterSummary| {
        let mut row = vec![label.to_owned(), s.minutes.to_string()];
        match &s.distribution {
            Some(d) => row.extend([d.mean, d.p50, d.p95, d.p99, d.max].map(|v| format!("{v:.1}"))),
            None => row.extend(std::iter::repeat_n("-".to_owned(), 5)),
        }
        row.push(s.above_threshold.to_string());
        row
    };
    table(
        out,
        "  ",
        &[
            "minutes with",
            "count",
            "mean",
            "P50",
            "P95",
            "P99",
            "max",
            &threshold,
        ],
        &[
            summary_row("all active", &c.all_active),
            summary_row("any active", &c.any_active),
        ],
        First::Left,
    );
    for (label, summary) in [("all instances", &c.all_active), ("any instance", &c.any_active)] {
        if summary.top.is_empty() {
            continue;
        }
        out.push_str(&format!("  largest minutes with {label} active:\n"));
        let mut header = vec!["minute", "total"];
        header.extend(c.instances.iter().map(String::as_str));
        let rows: Vec<Vec<String>> = summary
            .top
            .iter()
            .map(|m| {
                let mut row = vec![m.minute.minute_text(), format!("{:.1}", m.total_tok_s)];
                row.extend(m.contributions.iter().map(|v| format!("{v:.1}")));
                row
            })
            .collect();
        table(out, "    ", &header, &rows, First::Left);
    }
}

/// Appends a table with `header` above `rows`.
fn table(out: &mut String, indent: &str, header: &[&str], rows: &[Vec<String>], first: First) {
    let mut all = vec![table::header(header)];
    all.extend_from_slice(rows);
    out.push_str(&table::layout(&all, indent, first));
}

/// `45s`, `4m40s`, `1h02m`, `5d03h`.
fn duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::super::analyze;
    use super::super::testing::*;

    #[test]
    fn json_and_table() {
        let report = analyze(&fixtures(), &options()).expect("analyze");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["instances"][0]["first"], "2026-09-06T10:00:05");
        assert_eq!(
            json["instances"][0]["curve"][0]["per_request_tok_s"],
            serde_json::Value::Null
        );
        assert_eq!(
            json["cluster"]["any_active"]["top"][0]["minute"],
            "2026-09-06T10:01:00"
        );
        assert_eq!(json["cluster"]["all_active"]["distribution"]["p95"], 869.75);
        insta::assert_snapshot!(report.to_table(), @r"
        instance-0: 11 samples from 2026-09-06 10:00:05 to 2026-09-06 10:04:45 (4m40s)
          window: the whole log; 0 stats and spec decoding lines outside it
          lines: 32 read, 11 stats, 2 spec decoding, 0 malformed, 19 other
          idle: 2 gaps over 15s, 3m00s idle in all, longest gap 2m10s
          restarts: none
          generation tok/s by requests running:
          running  samples    min     p5  median    p95   mean    max  per request
                0        1   18.0   18.0    18.0   18.0   18.0   18.0            -
                1        4   80.0   80.0    82.0   87.4   83.0   88.0         83.0
                2        3  150.0  151.0   160.0  169.0  160.0  170.0         80.0
                3        2  230.0  230.5   235.0  239.5  235.0  240.0         78.3
                4        1  300.0  300.0   300.0  300.0  300.0  300.0         75.0
          peak: 300.0 tok/s generation at 2026-09-06 10:01:05 with 4 running
          active samples: 11, mean prompt 727.3 tok/s, mean generation 145.5 tok/s, prompt:generation 5.0:1
          KV cache usage: mean 4.4%, p95 9.4%, max 11.8%; waiting: mean 0.1, max 1; preemptions 0
          prefix cache hit rate: 81.3% at the end; over active lines median 62.5%, 0.0-81.3%
          spec decoding: 2 lines, acceptance 70.6% (2683 of 3800 drafted tokens), mean acceptance length 2.41, per position 0.812, 0.601
            per line: acceptance 70.6-70.6% (median 70.6%), length 2.41-2.41

        instance-1: 9 samples from 2026-09-06 10:00:08 to 2026-09-06 10:04:28 (4m20s)
          window: the whole log; 0 stats and spec decoding lines outside it
          lines: 21 read, 9 stats, 0 spec decoding, 1 malformed (line 15), 11 other
          idle: 3 gaps over 15s, 3m00s idle in all, longest gap 2m10s
          restarts: none
          generation tok/s by requests running:
          running  samples    min     p5  median    p95   mean    max  per request
                1        2   85.0   85.2    87.5   89.8   87.5   90.0         87.5
                2        1  170.0  170.0   170.0  170.0  170.0  170.0         85.0
                4        2  330.0  330.5   335.0  339.5  335.0  340.0         83.8
                6        2  470.0  470.5   475.0  479.5  475.0  480.0         79.2
                8        2  580.0  581.0   590.0  599.0  590.0  600.0         73.8
          peak: 600.0 tok/s generation at 2026-09-06 10:01:08 with 8 running
          active samples: 9, mean prompt 1048.3 tok/s, mean generation 349.4 tok/s, prompt:generation 3.0:1
          KV cache usage: mean 15.0%, p95 31.4%, max 31.6%; waiting: mean 0.3, max 2; preemptions 0
          prefix cache hit rate: 71.4% at the end; over active lines median 66.7%, 0.0-71.4%

        instance-2: 8 samples from 2026-09-06 10:00:02 to 2026-09-06 10:04:40 (4m38s)
          window: the whole log; 0 stats and spec decoding lines outside it
          lines: 23 read, 8 stats, 0 spec decoding, 1 malformed (line 7), 14 other
          idle: 3 gaps over 15s, 3m28s idle in all, longest gap 1m58s
          restarts: 1 (at 2026-09-06 10:01:40, pid 2000 -> 2100)
          generation tok/s by requests running:
          running  samples    min     p5  median    p95   mean    max  per request
                1        2   80.0   80.2    82.5   84.8   82.5   85.0         82.5
                2        2  160.0  160.2   162.5  164.8  162.5  165.0         81.2
                3        2  245.0  245.2   247.5  249.8  247.5  250.0         82.5
                4        2  320.0  320.5   325.0  329.5  325.0  330.0         81.2
          peak: 330.0 tok/s generation at 2026-09-06 10:03:20 with 4 running
          active samples: 8, mean prompt 817.5 tok/s, mean generation 204.4 tok/s, prompt:generation 4.0:1
          KV cache usage: mean 19.6%, p95 35.5%, max 35.6%; waiting: mean 0.2, max 2; preemptions 1
          prefix cache hit rate: 50.0% at the end; over active lines median 12.5%, 0.0-50.0%
          external prefix cache hit rate: 12.0% at the end; over active lines median 12.0%, 12.0-12.0%

        cluster: 3 instances, per minute the highest sample of each, summed (tok/s)
          minutes with  count   mean    P50    P95    P99    max  > 1000
          all active        2  732.5  732.5  869.8  882.0  885.0       0
          any active        5  636.0  580.0  897.0  899.4  900.0       0
          largest minutes with all instances active:
            minute            total  instance-0  instance-1  instance-2
            2026-09-06 10:00  885.0       240.0       480.0       165.0
            2026-09-06 10:04  580.0        80.0       340.0       160.0
          largest minutes with any instance active:
            minute            total  instance-0  instance-1  instance-2
            2026-09-06 10:01  900.0       300.0       600.0         0.0
            2026-09-06 10:00  885.0       240.0       480.0       165.0
            2026-09-06 10:04  580.0        80.0       340.0       160.0
            2026-09-06 10:03  480.0       150.0         0.0       330.0
            2026-09-06 10:02  335.0         0.0        85.0       250.0
        ");
    }
}
