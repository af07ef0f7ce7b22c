//! Unit tests of `bench::logs::analyze`: percentiles, then the line counts, curves,
//! peaks, idle gaps, restarts and cluster minutes of the vLLM log fixtures.

use super::super::testing::*;
use super::*;

/// (running, samples, mean, max, per request) for each curve point.
fn curve(i: &InstanceReport) -> Vec<(u32, usize, f64, f64, Option<f64>)> {
    i.curve
        .iter()
        .map(|p| {
            (
                p.running,
                p.samples,
                p.mean_generation_tok_s,
                p.max_generation_tok_s,
                p.per_request_tok_s,
            )
        })
        .collect()
}

fn check_curve(i: &InstanceReport, expected: &[(u32, usize, f64, f64, Option<f64>)]) {
    let actual = curve(i);
    assert_eq!(actual.len(), expected.len(), "{}: {actual:?}", i.name);
    for (a, e) in actual.iter().zip(expected) {
        assert_eq!((a.0, a.1), (e.0, e.1), "{}: {actual:?}", i.name);
        close(a.2, e.2);
        close(a.3, e.3);
        match (a.4, e.4) {
            (Some(a), Some(e)) => close(a, e),
            (a, e) => assert_eq!(a, e),
        }
    }
}

#[test]
fn percentiles_interpolate_like_numpy() {
    // numpy.percentile([1, 2, 3, 4], [50, 95, 99]) = [2.5, 3.85, 3.97].
    let v = [1.0, 2.0, 3.0, 4.0];
    close(percentile(&v, 50.0).expect("p"), 2.5);
    close(percentile(&v, 95.0).expect("p"), 3.85);
    close(percentile(&v, 99.0).expect("p"), 3.97);
    // numpy.percentile([15, 20, 35, 40, 50], 40) = 29.0 (rank 1.6).
    close(
        percentile(&[15.0, 20.0, 35.0, 40.0, 50.0], 40.0).expect("p"),
        29.0,
    );
    close(percentile(&[7.0], 99.0).expect("p"), 7.0);
    assert_eq!(percentile(&[], 50.0), None);
    assert!(distribution(&[]).is_none());
}

#[test]
fn fixture_lines_are_counted() {
    let report = analyze(&fixtures(), &options()).expect("analyze");
    let counts: Vec<_> = report
        .instances
        .iter()
        .map(|i| {
            (
                i.name.as_str(),
                i.lines,
                i.samples,
                i.malformed_lines,
                i.other_lines,
                i.spec_lines,
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            ("instance-0", 32, 11, 0, 19, 2),
            ("instance-1", 21, 9, 1, 11, 0),
            ("instance-2", 23, 8, 1, 14, 0),
        ]
    );
    // The 10:01:28 line cut after "Prefix cache hit ra", and the 10:00:22 one cut in
    // the generation throughput.
    assert_eq!(report.instances[1].malformed_examples, [15]);
    assert_eq!(report.instances[2].malformed_examples, [7]);
    // The malformed line's 31.9 % is not a sample.
    close(report.instances[1].max_kv_cache_usage_pct, 31.6);
}

#[test]
fn fixture_curves_peaks_and_ratios() {
    let report = analyze(&fixtures(), &options()).expect("analyze");
    let [i0, i1, i2] = &report.instances[..] else {
        panic!("three instances");
    };
    // instance-0: N=0 {18}; N=1 {80, 84, 88, 80} = 332/4; N=2 {160, 170, 150} = 480/3;
    // N=3 {240, 230} = 470/2; N=4 {300}.
    check_curve(
        i0,
        &[
            (0, 1, 18.0, 18.0, None),
            (1, 4, 83.0, 88.0, Some(83.0)),
            (2, 3, 160.0, 170.0, Some(80.0)),
            (3, 2, 235.0, 240.0, Some(235.0 / 3.0)),
            (4, 1, 300.0, 300.0, Some(75.0)),
        ],
    );
    // instance-1: N=1 {90, 85}; N=2 {170}; N=4 {330, 340}; N=6 {480, 470}; N=8 {600, 580}.
    check_curve(
        i1,
        &[
            (1, 2, 87.5, 90.0, Some(87.5)),
            (2, 1, 170.0, 170.0, Some(85.0)),
            (4, 2, 335.0, 340.0, Some(83.75)),
            (6, 2, 475.0, 480.0, Some(475.0 / 6.0)),
            (8, 2, 590.0, 600.0, Some(73.75)),
        ],
    );
    // instance-2: N=1 {85, 80}; N=2 {165, 160}; N=3 {250, 245}; N=4 {330, 320}.
    check_curve(
        i2,
        &[
            (1, 2, 82.5, 85.0, Some(82.5)),
            (2, 2, 162.5, 165.0, Some(81.25)),
            (3, 2, 247.5, 250.0, Some(82.5)),
            (4, 2, 325.0, 330.0, Some(81.25)),
        ],
    );

    let peaks: Vec<_> = [i0, i1, i2]
        .iter()
        .map(|i| {
            (
                i.peak.at,
                i.peak.generation_tok_s,
                i.peak.running,
                i.peak.prompt_tok_s,
            )
        })
        .collect();
    assert_eq!(
        peaks,
        [
            (sep6(10, 1, 5), 300.0, 4, 3000.0),
            (sep6(10, 1, 8), 600.0, 8, 1935.0),
            (sep6(10, 3, 20), 330.0, 4, 1000.0),
        ]
    );

    // Prompt sums 8000, 9435, 6540 over generation sums 1600, 3145, 1635.
    close(i0.prompt_generation_ratio.expect("ratio"), 5.0);
    close(i1.prompt_generation_ratio.expect("ratio"), 3.0);
    close(i2.prompt_generation_ratio.expect("ratio"), 4.0);
    // Every fixture sample is active.
    assert_eq!(
        [i0.active_samples, i1.active_samples, i2.active_samples],
        [11, 9, 8]
    );
    close(i0.mean_prompt_tok_s, 8000.0 / 11.0);
    close(i0.mean_generation_tok_s, 1600.0 / 11.0);
    close(i1.mean_prompt_tok_s, 9435.0 / 9.0);
    close(i1.mean_generation_tok_s, 3145.0 / 9.0);
    close(i2.mean_prompt_tok_s, 817.5);
    close(i2.mean_generation_tok_s, 204.375);
    assert_eq!([i0.max_waiting, i1.max_waiting, i2.max_waiting], [1, 2, 2]);
    assert_eq!([i0.preemptions, i1.preemptions, i2.preemptions], [0, 0, 1]);
}

#[test]
fn fixture_spans_idle_gaps_and_restarts() {
    let report = analyze(&fixtures(), &options()).expect("analyze");
    let [i0, i1, i2] = &report.instances[..] else {
        panic!("three instances");
    };
    assert_eq!(
        (i0.first, i0.last, i0.span_s),
        (sep6(10, 0, 5), sep6(10, 4, 45), 280)
    );
    assert_eq!(
        (i1.first, i1.last, i1.span_s),
        (sep6(10, 0, 8), sep6(10, 4, 28), 260)
    );
    assert_eq!(
        (i2.first, i2.last, i2.span_s),
        (sep6(10, 0, 2), sep6(10, 4, 40), 278)
    );
    // instance-0: gaps of 130 s and 70 s, idle 120 + 60.
    assert_eq!(
        (i0.idle.gaps, i0.idle.idle_s, i0.idle.longest_gap_s),
        (2, 180, 130)
    );
    // instance-1: 30, 50 and 130 s, idle 20 + 40 + 120.
    assert_eq!(
        (i1.idle.gaps, i1.idle.idle_s, i1.idle.longest_gap_s),
        (3, 180, 130)
    );
    // instance-2: 118 s across the crash, then 50 and 70 s: idle 108 + 40 + 60.
    assert_eq!(
        (i2.idle.gaps, i2.idle.idle_s, i2.idle.longest_gap_s),
        (3, 208, 118)
    );

    // Start-up lines before the first sample are not restarts.
    assert!(i0.restarts.is_empty());
    assert!(i1.restarts.is_empty());
    // instance-2 crashed; the new API server logged its arguments at 10:01:40.
    assert_eq!(i2.restarts.len(), 1);
    let r = i2.restarts[0];
    assert_eq!(
        (r.at, r.pid_before, r.pid_after),
        (sep6(10, 1, 40), Some(2000), Some(2100))
    );

    // A longer idle threshold leaves only the gaps above it.
    let long = LogsOptions {
        idle_gap_s: 60,
        ..options()
    };
    let report = analyze(&fixtures(), &long).expect("analyze");
    let idle: Vec<_> = report
        .instances
        .iter()
        .map(|i| (i.idle.gaps, i.idle.idle_s))
        .collect();
    assert_eq!(idle, [(2, 180), (1, 120), (2, 168)]);
}

#[test]
fn fixture_cluster_per_minute() {
    // Per-minute maxima (instance-0, instance-1, instance-2) and sums:
    //   10:00  240  480  165  885  all three
    //   10:01  300  600    0  900
    //   10:02    0   85  250  335
    //   10:03  150    0  330  480
    //   10:04   80  340  160  580  all three
    let report = analyze(&fixtures(), &options()).expect("analyze");
    let c = report.cluster.expect("cluster");
    assert_eq!(c.instances, ["instance-0", "instance-1", "instance-2"]);

    // All active: [580, 885]. Mean 732.5; P50 rank 0.5 → 732.5; P95 rank 0.95 →
    // 580 + 0.95 × 305 = 869.75; P99 rank 0.99 → 580 + 0.99 × 305 = 881.95.
    assert_eq!(c.all_active.minutes, 2);
    let d = c.all_active.distribution.expect("distribution");
    close(d.mean, 732.5);
    close(d.p50, 732.5);
    close(d.p95, 869.75);
    close(d.p99, 881.95);
    close(d.max, 885.0);
    // Any active: [335, 480, 580, 885, 900]. Mean 3180 / 5 = 636; P50 rank 2 → 580;
    // P95 rank 3.8 → 885 + 0.8 × 15 = 897; P99 rank 3.96 → 885 + 0.96 × 15 = 899.4.
    assert_eq!(c.any_active.minutes, 5);
    let d = c.any_active.distribution.expect("distribution");
    close(d.mean, 636.0);
    close(d.p50, 580.0);
    close(d.p95, 897.0);
    close(d.p99, 899.4);
    close(d.max, 900.0);
    // Nothing reaches the default 1000 tok/s.
    assert_eq!(
        (c.all_active.above_threshold, c.any_active.above_threshold),
        (0, 0)
    );

    let top: Vec<_> = c
        .any_active
        .top
        .iter()
        .map(|m| (m.minute, m.total_tok_s, m.contributions.clone()))
        .collect();
    assert_eq!(
        top,
        [
            (sep6(10, 1, 0), 900.0, vec![300.0, 600.0, 0.0]),
            (sep6(10, 0, 0), 885.0, vec![240.0, 480.0, 165.0]),
            (sep6(10, 4, 0), 580.0, vec![80.0, 340.0, 160.0]),
            (sep6(10, 3, 0), 480.0, vec![150.0, 0.0, 330.0]),
            (sep6(10, 2, 0), 335.0, vec![0.0, 85.0, 250.0]),
        ]
    );
    let all: Vec<_> = c
        .all_active
        .top
        .iter()
        .map(|m| (m.minute, m.total_tok_s))
        .collect();
    assert_eq!(all, [(sep6(10, 0, 0), 885.0), (sep6(10, 4, 0), 580.0)]);
}

#[test]
fn threshold_and_top_k_are_options() {
    let options = LogsOptions {
        threshold_tok_s: 600.0,
        top_k: 2,
        ..options()
    };
    let c = analyze(&fixtures(), &options)
        .expect("analyze")
        .cluster
        .expect("cluster");
    // Above 600: 885 of the all-active minutes; 885 and 900 of all.
    assert_eq!(
        (c.all_active.above_threshold, c.any_active.above_threshold),
        (1, 2)
    );
    let top: Vec<_> = c.any_active.top.iter().map(|m| m.total_tok_s).collect();
    assert_eq!(top, [900.0, 885.0]);
    // Two instances: instance-0 and instance-2 share 10:00, 10:03 and 10:04.
    let two = [fixture("instance-0.log"), fixture("instance-2.log")];
    let c = analyze(&two, &options)
        .expect("analyze")
        .cluster
        .expect("cluster");
    let all: Vec<_> = c
        .all_active
        .top
        .iter()
        .map(|m| (m.minute, m.total_tok_s))
        .collect();
    assert_eq!(c.all_active.minutes, 3);
    // 240 + 165 = 405 at 10:00, 150 + 330 = 480 at 10:03, 80 + 160 = 240 at 10:04.
    assert_eq!(all, [(sep6(10, 3, 0), 480.0), (sep6(10, 0, 0), 405.0)]);
    // One input: no cluster.
    let one = analyze(&[fixture("instance-0.log")], &options).expect("analyze");
    assert!(one.cluster.is_none());
}
