//! Tests of the engine's metrics: the exposition, the histograms and counters, and
//! the stats line, against vLLM's names and shape.

use super::*;

#[test]
fn histograms_are_cumulative_and_counters_carry_total() {
    let m = Metrics::new("m", vec![("block_size".into(), "16".into())], None);
    m.token(Some(Duration::from_millis(30)), None);
    m.token(None, Some(Duration::from_millis(60)));
    m.finished(&FinishedRequest {
        reason: FinishReason::Length,
        prompt_tokens: 5,
        generation_tokens: 2,
        queue: Some(Duration::ZERO),
        prefill: Some(Duration::from_millis(30)),
        decode: Some(Duration::from_millis(60)),
        inference: Some(Duration::from_millis(90)),
        e2e: Duration::from_millis(90),
        max_tokens: 2,
    });
    let text = m.render();
    for line in [
        "vllm:time_to_first_token_seconds_bucket{le=\"0.02\",engine=\"0\",model_name=\"m\"} 0.0",
        "vllm:time_to_first_token_seconds_bucket{le=\"0.04\",engine=\"0\",model_name=\"m\"} 1.0",
        "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",engine=\"0\",model_name=\"m\"} 1.0",
        "vllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} 2.0",
        "vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 5.0",
        "vllm:request_success_total{finished_reason=\"length\",engine=\"0\",model_name=\"m\"} 1.0",
        "vllm:cache_config_info{block_size=\"16\",engine=\"0\",model_name=\"m\"} 1.0",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[test]
fn an_interval_with_work_is_told_once_idle() {
    let m = Metrics::new("m", Vec::new(), None);
    let interval = Duration::from_secs(10);
    assert_eq!(m.untold(interval), None, "nothing happened");
    m.computed_prompt(100);
    let due = m.untold(interval).expect("prompt tokens to tell");
    assert!(due <= interval && due > Duration::from_secs(9), "{due:?}");
    assert_eq!(m.stats_lines(Duration::ZERO, "CPU").len(), 1);
    assert_eq!(m.untold(interval), None, "told");
    // Preempted requests alone are told with the next work, as vLLM's idle lines are
    // logged at DEBUG.
    m.preempted();
    assert_eq!(m.untold(interval), None);
}

#[test]
fn stats_line_has_vllms_shape() {
    let m = Metrics::new("m", Vec::new(), None);
    m.computed_prompt(100);
    m.gauges(2, 1, 0.25);
    m.admitted(32, 16, true);
    let lines = m.stats_lines(Duration::ZERO, "CPU");
    assert_eq!(lines.len(), 1, "no spec line without speculation: {lines:?}");
    let line = &lines[0];
    assert!(line.starts_with("Engine 000: Avg prompt throughput: "), "{line}");
    assert!(
        line.contains(
            "Running: 2 reqs, Waiting: 1 reqs, CPU KV cache usage: 25.0%, Prefix cache hit rate: 50.0%"
        ),
        "{line}"
    );
}

#[test]
fn spec_decode_counters_and_line_have_vllms_names_and_shape() {
    let m = Metrics::new("m", Vec::new(), Some(3));
    m.speculated(3, 2);
    m.speculated(3, 0);
    m.speculated(2, 2);
    let text = m.render();
    for line in [
        "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 3.0",
        "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 8.0",
        "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 4.0",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\",engine=\"0\",model_name=\"m\"} 2.0",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\",engine=\"0\",model_name=\"m\"} 2.0",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\",engine=\"0\",model_name=\"m\"} 0.0",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    let lines = m.stats_lines(Duration::ZERO, "CPU");
    let spec = lines.last().expect("a spec line");
    assert!(
        spec.starts_with("SpecDecoding metrics: Mean acceptance length: 2.33, Accepted throughput: "),
        "{spec}"
    );
    assert!(
        spec.ends_with(
            "Accepted: 4 tokens, Drafted: 8 tokens, Per-position acceptance rate: 0.667, 0.667, 0.000, \
             Avg Draft acceptance rate: 50.0%"
        ),
        "{spec}"
    );
    // The next interval drafted nothing: no spec line.
    assert!(
        m.stats_lines(Duration::ZERO, "CPU")
            .iter()
            .all(|l| !l.starts_with("SpecDecoding"))
    );
    assert!(
        Metrics::new("m", Vec::new(), None)
            .render()
            .find("spec_decode")
            .is_none()
    );
}

#[test]
fn decode_steps_give_the_roofline_line_and_series() {
    let m = Metrics::new("m", Vec::new(), None);
    m.set_bandwidth(ReadBandwidth {
        median_gb_per_s: 40.0,
        best_gb_per_s: 50.0,
        threads: 2,
    });
    m.token(None, None);
    // Two steps: one sequence reading 1 GB in 50 ms, two reading 1.2 GB in 30 ms.
    m.decode_step(1, 1_000_000_000, 0.05);
    m.decode_step(2, 1_200_000_000, 0.03);
    let lines = m.stats_lines(Duration::ZERO, "CPU");
    let roofline = lines.last().expect("lines");
    assert_eq!(
        roofline,
        "Decode roofline: 2 steps of 1.5 sequences on average, 1.100 GB read per step in 40.00 ms, \
         27.5 GB/s, 69 % of the read bandwidth (40.0 GB/s measured at load, median of the passes; \
         50.0 GB/s the best)"
    );
    // The next interval decoded nothing: no roofline line; the series keep the totals.
    m.token(None, None);
    assert!(
        m.stats_lines(Duration::ZERO, "CPU")
            .iter()
            .all(|l| !l.starts_with("Decode roofline"))
    );
    let text = m.render();
    for line in [
        "sous:decode_steps_total{engine=\"0\",model_name=\"m\"} 2.0",
        "sous:decode_sequences_total{engine=\"0\",model_name=\"m\"} 3.0",
        "sous:decode_read_bytes_total{engine=\"0\",model_name=\"m\"} 2200000000.0",
        "sous:read_bandwidth_bytes_per_second{engine=\"0\",model_name=\"m\"} 40000000000.0",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(
        text.contains("sous:decode_seconds_total{engine=\"0\",model_name=\"m\"} 0.08"),
        "{text}"
    );
    // Not measured: said so.
    let off = Metrics::new("m", Vec::new(), None);
    off.decode_step(1, 1_000_000_000, 0.1);
    let lines = off.stats_lines(Duration::ZERO, "CPU");
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("10.0 GB/s (read bandwidth not measured: SOUS_READ_BANDWIDTH=off)")),
        "{lines:?}"
    );
    assert!(!off.render().contains("sous:read_bandwidth"));
}
