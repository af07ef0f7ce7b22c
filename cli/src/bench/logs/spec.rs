//! vLLM's speculative-decoding log lines, read into counts that add up over a window.
//!
//! Three forms are accepted:
//!
//! - V1 from 0.10 to 0.33 (`SpecDecodingLogging.log`, `vllm/v1/spec_decode/metrics.py`),
//!   one line per logging interval, about that interval only: `SpecDecoding metrics: Mean
//!   acceptance length: 2.41, Accepted throughput: 56.48 tokens/s, Drafted throughput:
//!   80.00 tokens/s, Accepted: 565 tokens, Drafted: 800 tokens, Per-position acceptance
//!   rate: 0.812, 0.601, Avg Draft acceptance rate: 70.6%`, where the mean acceptance
//!   length is `1 + accepted / drafts` (the bonus token counted) and each per-position
//!   rate is the tokens accepted at that position over the drafts;
//! - V1 0.8 (`vllm/v1/spec_decode/metrics.py` of 0.8.5): `SpecDecoding metrics: Draft
//!   acceptance rate: 70.6%, Mean acceptance length: 1.41, Accepted: 565 tokens, Drafted:
//!   800 tokens, Per-position acceptance rate: 0.812, 0.601`, the same interval counts but
//!   a mean acceptance length of `accepted / drafts` (no bonus token);
//! - V0 (`vllm/engine/metrics.py` of 0.8.5): `Speculative metrics: Draft acceptance rate:
//!   0.706, System efficiency: 0.520, Number of speculative tokens: 2, Number of accepted
//!   tokens: 565, Number of draft tokens: 800, Number of emitted tokens: 1165.`, whose
//!   counts run from the engine's start (turned into per-line increments by
//!   [`increments`]).
//!
//! The logs give the tokens accepted and drafted, not the number of drafts. It is
//! `drafted / k` for a drafter that always proposes `k` tokens (MTP, EAGLE, a draft
//! model; `k` is the number of per-position rates, or V0's number of speculative tokens),
//! and `accepted / Σ per-position rates` in general (n-gram drafts can be cut short at
//! the end of a context); the first is taken when the two agree within the rounding of
//! the printed rates, the second otherwise. Over a window, vLLM's own definitions are
//! applied to the summed counts: acceptance rate `Σ accepted / Σ drafted`, mean
//! acceptance length `1 + Σ accepted / Σ drafts`, per-position rates `Σ (rate × drafts)
//! / Σ drafts`.

use std::collections::BTreeMap;

use super::{parse_percent, parse_rate};

/// How a speculative-decoding message starts in V1.
pub(super) const V1_MARKER: &str = "SpecDecoding metrics: ";
/// How it starts in V0.
pub(super) const V0_MARKER: &str = "Speculative metrics: ";

/// Which form a message has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// V1: counts over the logging interval.
    Interval,
    /// V0: counts since the engine started.
    Cumulative,
}

/// One speculative-decoding line, as counts over the interval it covers (once
/// [`increments`] has turned V0's running totals into increments).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SpecSample {
    /// When, in seconds of the log's timeline.
    pub(super) at: i64,
    /// Which form it was read from.
    pub(super) kind: Kind,
    /// Draft tokens accepted.
    pub(super) accepted: u64,
    /// Draft tokens proposed.
    pub(super) drafted: u64,
    /// Drafts (verification steps of a request), derived as the module says.
    pub(super) drafts: f64,
    /// Tokens accepted at each draft position per draft (V1 only).
    pub(super) per_position: Vec<f64>,
}

/// The form of a message, if it is a speculative-decoding one.
pub(super) fn kind_of(message: &str) -> Option<Kind> {
    if message.contains(V1_MARKER) {
        Some(Kind::Interval)
    } else if message.contains(V0_MARKER) {
        Some(Kind::Cumulative)
    } else {
        None
    }
}

/// Reads a speculative-decoding message completely, or not at all (a line cut anywhere
/// is refused). The time is left at 0 for the caller.
pub(super) fn parse(kind: Kind, message: &str) -> Option<SpecSample> {
    let marker = match kind {
        Kind::Interval => V1_MARKER,
        Kind::Cumulative => V0_MARKER,
    };
    let body = &message[message.find(marker)? + marker.len()..];
    let body = body.strip_suffix('.').unwrap_or(body);
    // `Key: value` parts; a part without a key continues the one before it (the
    // per-position list is itself joined by ", ").
    let mut parts: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut last: Option<&str> = None;
    for piece in body.split(", ") {
        match piece.split_once(": ") {
            Some((key, value)) => {
                parts.insert(key, vec![value]);
                last = Some(key);
            }
            None => parts.get_mut(last?)?.push(piece),
        }
    }
    let one = |key: &str| -> Option<&str> {
        match parts.get(key)?.as_slice() {
            [value] => Some(*value),
            _ => None,
        }
    };
    let tokens = |key: &str| one(key)?.strip_suffix(" tokens")?.parse::<u64>().ok();
    match kind {
        Kind::Interval => {
            let accepted = tokens("Accepted")?;
            let drafted = tokens("Drafted")?;
            let per_position = parts
                .get("Per-position acceptance rate")?
                .iter()
                .map(|v| parse_rate(v))
                .collect::<Option<Vec<f64>>>()?;
            // 0.10 and later: `Avg Draft acceptance rate` last; 0.8: `Draft acceptance
            // rate` first, and no bonus token in the mean acceptance length.
            let (rate_key, bonus) = if parts.contains_key("Avg Draft acceptance rate") {
                ("Avg Draft acceptance rate", 1.0)
            } else {
                ("Draft acceptance rate", 0.0)
            };
            let rate = one(rate_key)?;
            if rate != "nan%" {
                parse_percent(rate)?;
            }
            let length = parse_rate(one("Mean acceptance length")?)?;
            if bonus > 0.0 {
                parse_rate(one("Accepted throughput")?.strip_suffix(" tokens/s")?)?;
                parse_rate(one("Drafted throughput")?.strip_suffix(" tokens/s")?)?;
            }
            let drafts = drafts(
                accepted,
                drafted,
                per_position.len(),
                &per_position,
                length - bonus,
            );
            Some(SpecSample {
                at: 0,
                kind,
                accepted,
                drafted,
                drafts,
                per_position,
            })
        }
        Kind::Cumulative => {
            let number = |key: &str| one(key)?.parse::<u64>().ok();
            let k = number("Number of speculative tokens")?;
            let accepted = number("Number of accepted tokens")?;
            let drafted = number("Number of draft tokens")?;
            number("Number of emitted tokens")?;
            for key in ["Draft acceptance rate", "System efficiency"] {
                let v = one(key)?;
                if v != "nan" {
                    parse_rate(v)?;
                }
            }
            Some(SpecSample {
                at: 0,
                kind,
                accepted,
                drafted,
                // V0 always drafts `k` tokens.
                drafts: if k > 0 { drafted as f64 / k as f64 } else { 0.0 },
                per_position: Vec::new(),
            })
        }
    }
}

/// The number of drafts behind a V1 line (the module says how): `accepted_per_draft` is
/// the printed mean acceptance length without the bonus token.
fn drafts(accepted: u64, drafted: u64, k: usize, per_position: &[f64], accepted_per_draft: f64) -> f64 {
    let fixed = if k > 0 { drafted as f64 / k as f64 } else { 0.0 };
    let sum: f64 = per_position.iter().sum();
    if accepted == 0 || sum <= 0.0 {
        return fixed;
    }
    let general = accepted as f64 / sum;
    // The rates are printed to 3 decimals and the length to 2: a fixed-length drafter's
    // count agrees with both within that rounding.
    let agrees = |per_draft: f64, tolerance: f64| (accepted as f64 / fixed - per_draft).abs() <= tolerance;
    if fixed > 0.0 && agrees(sum, 0.0005 * k as f64 + 1e-9) && agrees(accepted_per_draft, 0.005 + 1e-9) {
        fixed
    } else {
        general
    }
}

/// Turns V0's running totals into increments per line; a total that went down is a
/// restart, after which the new total is the increment (as Prometheus' `increase`
/// treats a counter reset). V1 lines are left alone.
pub(super) fn increments(samples: &mut [SpecSample]) {
    let mut previous: Option<(u64, u64, f64)> = None;
    for s in samples.iter_mut().filter(|s| s.kind == Kind::Cumulative) {
        let now = (s.accepted, s.drafted, s.drafts);
        if let Some((a, d, n)) = previous
            && s.accepted >= a
            && s.drafted >= d
        {
            s.accepted -= a;
            s.drafted -= d;
            s.drafts -= n;
        }
        previous = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1(message: &str) -> Option<SpecSample> {
        parse(kind_of(message)?, message)
    }

    #[test]
    fn the_real_vllm_lines_parse() {
        // The three lines of `vllm-0.32-cpu-serve.log` (n-gram, 3 tokens).
        let log = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/vllm-logs/vllm-0.32-cpu-serve.log"
        ))
        .expect("fixture");
        let samples: Vec<SpecSample> = log.lines().filter_map(v1).collect();
        let counts: Vec<_> = samples
            .iter()
            .map(|s| (s.accepted, s.drafted, s.drafts))
            .collect();
        assert_eq!(counts, [(0, 15, 5.0), (15, 345, 115.0), (18, 72, 24.0)]);
        assert_eq!(samples[2].per_position, [0.458, 0.250, 0.042]);
    }

    #[test]
    fn every_form_parses_and_a_cut_line_does_not() {
        // 0.8.5: no bonus token in the length (565 / 400 = 1.41).
        let old = "SpecDecoding metrics: Draft acceptance rate: 70.6%, Mean acceptance length: 1.41, \
                   Accepted: 565 tokens, Drafted: 800 tokens, Per-position acceptance rate: 0.812, 0.601";
        let s = v1(old).expect("0.8.5");
        assert_eq!((s.accepted, s.drafted, s.drafts), (565, 800, 400.0));
        // A cut inside 0.8's per-position list, its last part, cannot be told from a
        // shorter list; anywhere before it the line is refused.
        let list = old.find("0.812").expect("list");
        for cut in 0..old.len() {
            let parsed = v1(&old[..cut]);
            assert!(parsed.is_none() || cut > list, "cut at {cut}");
        }
        // V0: running totals.
        let v0 = |a: u64, d: u64| {
            format!(
                "Speculative metrics: Draft acceptance rate: 0.706, System efficiency: 0.520, Number \
                 of speculative tokens: 2, Number of accepted tokens: {a}, Number of draft tokens: \
                 {d}, Number of emitted tokens: 1165."
            )
        };
        let mut samples: Vec<SpecSample> = [(100, 200), (300, 600), (50, 80)]
            .iter()
            .map(|&(a, d)| v1(&v0(a, d)).expect("V0"))
            .collect();
        increments(&mut samples);
        let counts: Vec<_> = samples
            .iter()
            .map(|s| (s.accepted, s.drafted, s.drafts))
            .collect();
        assert_eq!(counts, [(100, 200, 100.0), (200, 400, 200.0), (50, 80, 40.0)]);
        assert!(v1(&v0(1, 2).replace("tokens: 2,", "tokens: two,")).is_none());
        // n-gram drafts cut short: 10 drafts of 3 positions, 24 tokens drafted.
        let short = "SpecDecoding metrics: Mean acceptance length: 2.20, Accepted throughput: 1.20 \
                     tokens/s, Drafted throughput: 2.40 tokens/s, Accepted: 12 tokens, Drafted: 24 \
                     tokens, Per-position acceptance rate: 0.600, 0.400, 0.200, Avg Draft acceptance \
                     rate: 50.0%";
        let s = v1(short).expect("short drafts");
        assert!((s.drafts - 10.0).abs() < 1e-9, "{}", s.drafts);
    }
}
