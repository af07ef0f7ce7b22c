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
    (!sorted.is_empty()).then(|| crate::stats::percentile(sorted, p))
}

#[cfg(test)]
mod tests;
