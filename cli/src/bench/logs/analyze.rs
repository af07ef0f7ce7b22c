//! The figures of `sous bench logs` from the parsed logs: per instance, then the
//! cluster. Not here: reading the lines ([`super::parse`]) or rendering.
//!
//! Each input is one instance. A restart (the `(APIServer pid=N)` changing between stats
//! lines, or vLLM's start-up lines appearing after a stats line) is recorded, and the
//! instance goes on. Per instance: the samples, their span, the idle gaps (consecutive
//! samples more than [`LogsOptions::idle_gap_s`] apart; each counts as idle for its length
//! minus one logging interval, since the later sample still covers the interval before
//! it), the curve of mean and maximum generation throughput per `Running` value (and that
//! mean divided by `Running`: the throughput one request saw), the peak sample, the mean
//! throughputs over active samples (any request running or any token processed) and the
//! prompt:generation ratio (the sum of prompt throughput over the sum of generation
//! throughput, over all samples: a ratio of token counts, since every sample covers the
//! same interval).
//!
//! The cluster aligns instances per wall-clock minute (the timestamp truncated to the
//! minute): an instance's value for a minute is the maximum of its samples in it (0 when
//! it has none), and the cluster's value is the sum over instances. The minutes are
//! summarised twice, over the minutes in which every instance logged at least one sample
//! ("simultaneous activity on all GPUs") and over those in which any did: count, mean,
//! P50/P95/P99, maximum, the minutes above a threshold and the largest minutes.
//! Percentiles interpolate linearly between closest ranks, as numpy's default: for `n`
//! sorted values the rank of `p` is `p / 100 × (n − 1)`.
//!

use std::collections::{BTreeMap, BTreeSet};

use super::parse::{ParsedLog, Patterns, Sample, parse_log};
use super::report::{
    ClusterMinute, ClusterReport, ClusterSummary, CurvePoint, Distribution, IdleGaps, InstanceReport,
    InstanceWindow, LoggedRate, LogsReport, Peak, SpecDecode, Spread, WindowReport, window_text,
};
use super::spec::SpecSample;
use super::time::LogTime;
use super::{AfterRestart, LogInput, LogsError, LogsOptions};
use crate::bench::window::Bounds;

/// How many malformed line numbers an instance report lists.
const MALFORMED_EXAMPLES: usize = 10;

/// Reads every log and computes the report.
pub fn analyze(inputs: &[LogInput], options: &LogsOptions) -> Result<LogsReport, LogsError> {
    if inputs.is_empty() {
        return Err(LogsError::NoInputs);
    }
    let mut names = BTreeSet::new();
    for input in inputs {
        if !names.insert(input.name.as_str()) {
            return Err(LogsError::DuplicateName {
                name: input.name.clone(),
            });
        }
    }
    let patterns = Patterns::new()?;
    let parsed: Vec<ParsedLog> = inputs
        .iter()
        .map(|input| parse_log(&input.text, options.year, &patterns))
        .collect();
    for (input, log) in inputs.iter().zip(&parsed) {
        if log.samples.is_empty() {
            return Err(LogsError::NoSamples {
                name: input.name.clone(),
                lines: log.lines,
                malformed: log.malformed.len(),
            });
        }
    }
    // Relative times count back from the latest sample of all the logs.
    let end = parsed
        .iter()
        .flat_map(|l| l.samples.iter().map(|s| s.at))
        .max()
        .unwrap_or(0);
    let bounds = options.window.place(end).map_err(LogsError::Window)?;
    let mut instances = Vec::with_capacity(inputs.len());
    let mut minute_maps = Vec::with_capacity(inputs.len());
    for (input, log) in inputs.iter().zip(&parsed) {
        let window = instance_window(&input.name, log, bounds, options.after_restart)?;
        let (report, minutes) = summarise(&input.name, log, window, options)?;
        instances.push(report);
        minute_maps.push(minutes);
    }
    let cluster = (inputs.len() > 1).then(|| {
        cluster(
            instances.iter().map(|i| i.name.clone()).collect(),
            &minute_maps,
            options,
        )
    });
    Ok(LogsReport {
        year: options.year,
        idle_gap_s: options.idle_gap_s,
        log_interval_s: options.log_interval_s,
        window: WindowReport {
            since: bounds.since.map(LogTime),
            until: bounds.until.map(LogTime),
            end_of_logs: LogTime(end),
            after_restart: options.after_restart.map(|a| a.to_string()),
        },
        instances,
        cluster,
    })
}

/// One log's window: the asked-for bounds, started later at a restart with
/// `--after-restart`; the restart is returned too.
fn instance_window(
    name: &str,
    log: &ParsedLog,
    bounds: Bounds,
    after: Option<AfterRestart>,
) -> Result<(Bounds, Option<i64>), LogsError> {
    let restart = match after {
        None => None,
        Some(AfterRestart::Last) => log.restarts.last(),
        // A log that never restarted is read whole.
        Some(AfterRestart::Nth(_)) if log.restarts.is_empty() => None,
        Some(AfterRestart::Nth(n)) => {
            Some(
                log.restarts
                    .get(n.wrapping_sub(1))
                    .ok_or_else(|| LogsError::NoSuchRestart {
                        name: name.to_owned(),
                        wanted: n,
                        found: log.restarts.len(),
                    })?,
            )
        }
    }
    .map(|r| r.at.0);
    let since = match (bounds.since, restart) {
        (Some(s), Some(r)) => Some(s.max(r)),
        (s, r) => s.or(r),
    };
    Ok((
        Bounds {
            since,
            until: bounds.until,
        },
        restart,
    ))
}

/// One instance's report and its per-minute maxima (minute index → tokens/s).
fn summarise(
    name: &str,
    log: &ParsedLog,
    (window, restart): (Bounds, Option<i64>),
    options: &LogsOptions,
) -> Result<(InstanceReport, BTreeMap<i64, f64>), LogsError> {
    let samples: Vec<&Sample> = log.samples.iter().filter(|s| window.contains(s.at)).collect();
    let spec: Vec<&SpecSample> = log.spec.iter().filter(|s| window.contains(s.at)).collect();
    let lines_outside = log.samples.len() - samples.len() + log.spec.len() - spec.len();
    let (Some(&first_sample), Some(_)) = (samples.first(), samples.last()) else {
        let at = |s: Option<&Sample>| LogTime(s.map_or(0, |s| s.at));
        return Err(LogsError::EmptyWindow {
            name: name.to_owned(),
            samples: log.samples.len(),
            window: window_text(window.since.map(LogTime), window.until.map(LogTime)),
            span: (at(log.samples.first()), at(log.samples.last())),
        });
    };
    let first = samples.iter().map(|s| s.at).min().unwrap_or(first_sample.at);
    let last = samples.iter().map(|s| s.at).max().unwrap_or(first_sample.at);

    let gap_limit = i64::from(options.idle_gap_s);
    let interval = i64::from(options.log_interval_s);
    let mut idle = IdleGaps {
        gaps: 0,
        idle_s: 0,
        longest_gap_s: 0,
    };
    for pair in samples.windows(2) {
        let gap = (pair[1].at - pair[0].at).max(0);
        idle.longest_gap_s = idle.longest_gap_s.max(gap);
        if gap > gap_limit {
            idle.gaps += 1;
            idle.idle_s += (gap - interval).max(0);
        }
    }

    // running → (generation values, prompt sum)
    let mut by_running: BTreeMap<u32, (Vec<f64>, f64)> = BTreeMap::new();
    let mut peak = first_sample;
    let mut minutes: BTreeMap<i64, f64> = BTreeMap::new();
    let (mut sum_prompt, mut sum_gen) = (0.0, 0.0);
    let (mut active, mut active_prompt, mut active_gen) = (0usize, 0.0, 0.0);
    let (mut prefix, mut external) = (Vec::new(), Vec::new());
    for &s in &samples {
        let entry = by_running.entry(s.running).or_default();
        entry.0.push(s.generation);
        entry.1 += s.prompt;
        if s.generation > peak.generation {
            peak = s;
        }
        let minute = minutes.entry(s.at.div_euclid(60)).or_insert(s.generation);
        *minute = minute.max(s.generation);
        sum_prompt += s.prompt;
        sum_gen += s.generation;
        if s.running > 0 || s.prompt > 0.0 || s.generation > 0.0 {
            active += 1;
            active_prompt += s.prompt;
            active_gen += s.generation;
            prefix.extend(s.prefix_hit);
            external.extend(s.external_prefix_hit);
        }
    }
    let curve = by_running
        .into_iter()
        .map(|(running, (values, prompt))| {
            let spread = spread(&values);
            CurvePoint {
                running,
                samples: values.len(),
                mean_generation_tok_s: spread.mean,
                max_generation_tok_s: spread.max,
                generation_tok_s: spread,
                mean_prompt_tok_s: prompt / values.len() as f64,
                per_request_tok_s: (running > 0).then(|| spread.mean / f64::from(running)),
            }
        })
        .collect();
    let mean_over_active = |sum: f64| if active == 0 { 0.0 } else { sum / active as f64 };
    let logged = |values: Vec<f64>, last: Option<f64>| {
        last.map(|last| LoggedRate {
            last,
            active: spread(&values),
        })
    };
    let kv: Vec<f64> = samples.iter().map(|s| s.kv_usage).collect();

    let report = InstanceReport {
        name: name.to_owned(),
        lines: log.lines,
        samples: samples.len(),
        malformed_lines: log.malformed.len(),
        malformed_examples: log.malformed.iter().take(MALFORMED_EXAMPLES).copied().collect(),
        other_lines: log.lines - log.samples.len() - log.spec.len() - log.malformed.len(),
        spec_lines: spec.len(),
        window: InstanceWindow {
            since: window.since.map(LogTime),
            until: window.until.map(LogTime),
            after_restart: restart.map(LogTime),
            lines_outside,
        },
        first: LogTime(first),
        last: LogTime(last),
        span_s: last - first,
        idle,
        restarts: log.restarts.clone(),
        curve,
        peak: Peak {
            at: LogTime(peak.at),
            generation_tok_s: peak.generation,
            prompt_tok_s: peak.prompt,
            running: peak.running,
        },
        active_samples: active,
        mean_prompt_tok_s: mean_over_active(active_prompt),
        mean_generation_tok_s: mean_over_active(active_gen),
        prompt_generation_ratio: (sum_gen > 0.0).then(|| sum_prompt / sum_gen),
        max_kv_cache_usage_pct: kv.iter().copied().fold(0.0, f64::max),
        kv_cache_usage_pct: spread(&kv),
        max_waiting: samples.iter().map(|s| s.waiting).max().unwrap_or(0),
        mean_waiting: samples.iter().map(|s| f64::from(s.waiting)).sum::<f64>() / samples.len() as f64,
        preemptions: samples.iter().map(|s| s.preemptions).sum(),
        prefix_cache_hit_rate_pct: logged(prefix, samples.iter().rev().find_map(|s| s.prefix_hit)),
        external_prefix_cache_hit_rate_pct: logged(
            external,
            samples.iter().rev().find_map(|s| s.external_prefix_hit),
        ),
        spec_decode: spec_decode(&spec),
    };
    Ok((report, minutes))
}

/// Speculative decoding over the window's lines, as the spec module defines it.
fn spec_decode(lines: &[&SpecSample]) -> Option<SpecDecode> {
    if lines.is_empty() {
        return None;
    }
    let accepted: u64 = lines.iter().map(|s| s.accepted).sum();
    let drafted: u64 = lines.iter().map(|s| s.drafted).sum();
    let drafts: f64 = lines.iter().map(|s| s.drafts).sum();
    let positions = lines.iter().map(|s| s.per_position.len()).max().unwrap_or(0);
    let with_positions: f64 = lines
        .iter()
        .filter(|s| !s.per_position.is_empty())
        .map(|s| s.drafts)
        .sum();
    let per_position = (0..positions)
        .map(|i| {
            let sum: f64 = lines
                .iter()
                .map(|s| s.per_position.get(i).copied().unwrap_or(0.0) * s.drafts)
                .sum();
            if with_positions > 0.0 {
                sum / with_positions
            } else {
                0.0
            }
        })
        .collect();
    let drafting: Vec<&&SpecSample> = lines.iter().filter(|s| s.drafted > 0 && s.drafts > 0.0).collect();
    let rates: Vec<f64> = drafting
        .iter()
        .map(|s| s.accepted as f64 / s.drafted as f64 * 100.0)
        .collect();
    let lengths: Vec<f64> = drafting
        .iter()
        .map(|s| 1.0 + s.accepted as f64 / s.drafts)
        .collect();
    Some(SpecDecode {
        lines: lines.len(),
        accepted_tokens: accepted,
        drafted_tokens: drafted,
        drafts,
        acceptance_rate_pct: (drafted > 0).then(|| accepted as f64 / drafted as f64 * 100.0),
        mean_acceptance_length: (drafts > 0.0).then(|| 1.0 + accepted as f64 / drafts),
        per_position_acceptance: per_position,
        per_line_acceptance_rate_pct: spread(&rates),
        per_line_mean_acceptance_length: spread(&lengths),
    })
}

/// The spread of some values (all 0 without values).
fn spread(values: &[f64]) -> Spread {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |p: f64| percentile(&sorted, p).unwrap_or(0.0);
    Spread {
        samples: sorted.len(),
        min: sorted.first().copied().unwrap_or(0.0),
        p5: at(5.0),
        p50: at(50.0),
        p95: at(95.0),
        mean: if sorted.is_empty() {
            0.0
        } else {
            sorted.iter().sum::<f64>() / sorted.len() as f64
        },
        max: sorted.last().copied().unwrap_or(0.0),
    }
}

fn cluster(names: Vec<String>, maps: &[BTreeMap<i64, f64>], options: &LogsOptions) -> ClusterReport {
    let all_minutes: BTreeSet<i64> = maps.iter().flat_map(|m| m.keys().copied()).collect();
    let mut any = Vec::with_capacity(all_minutes.len());
    let mut all = Vec::new();
    for minute in all_minutes {
        let contributions: Vec<f64> = maps
            .iter()
            .map(|m| m.get(&minute).copied().unwrap_or(0.0))
            .collect();
        let row = ClusterMinute {
            minute: LogTime(minute * 60),
            total_tok_s: contributions.iter().sum(),
            contributions,
        };
        if maps.iter().all(|m| m.contains_key(&minute)) {
            all.push(row.clone());
        }
        any.push(row);
    }
    ClusterReport {
        instances: names,
        threshold_tok_s: options.threshold_tok_s,
        all_active: summarise_minutes(all, options),
        any_active: summarise_minutes(any, options),
    }
}

fn summarise_minutes(mut minutes: Vec<ClusterMinute>, options: &LogsOptions) -> ClusterSummary {
    let totals: Vec<f64> = minutes.iter().map(|m| m.total_tok_s).collect();
    let count = minutes.len();
    // Largest first; `minutes` is in time order and the sort is stable, so ties keep it.
    minutes.sort_by(|a, b| b.total_tok_s.total_cmp(&a.total_tok_s));
    minutes.truncate(options.top_k);
    ClusterSummary {
        minutes: count,
        distribution: distribution(&totals),
        above_threshold: totals.iter().filter(|&&t| t > options.threshold_tok_s).count(),
        top: minutes,
        totals,
    }
}

fn distribution(values: &[f64]) -> Option<Distribution> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(Distribution {
        mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        p50: percentile(&sorted, 50.0)?,
        p95: percentile(&sorted, 95.0)?,
        p99: percentile(&sorted, 99.0)?,
        max: *sorted.last()?,
    })
}

/// numpy's default (`method="linear"`): rank `p / 100 × (n − 1)` in the sorted values,
/// interpolated between its floor and ceiling.
/// numpy's linear percentile of sorted values (the one `sous bench` uses everywhere);
/// none for no values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| crate::bench::stats::percentile(sorted, p))
}

#[cfg(test)]
mod tests {
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
}
