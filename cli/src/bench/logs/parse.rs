//! Reading one vLLM log: its periodic stats lines, the lines that look like them but
//! were cut, and the restarts. What the lines look like is
//! [`sous_engine::dialect::log::vllm`]'s; here is how a log is searched for them.
//!
//! `LoggingStatLogger.log` in vLLM 0.33's `vllm/v1/metrics/loggers.py` logs one line per engine
//! every `VLLM_LOG_STATS_INTERVAL` seconds (10 by default), at INFO only while the engine
//! is not idle (at DEBUG otherwise, so the lines simply stop). Three shapes are accepted,
//! matched on the message, wherever it starts in the line, so that `docker logs -t`,
//! `kubectl logs --prefix` and similar prefixes do not matter (ANSI colour codes are
//! removed first):
//!
//! - the list-based form (0.22 to 0.33; parts joined by `", "`, optional ones only when
//!   non-zero):
//!   `Engine 000: Avg prompt throughput: 79.4 tokens/s, Avg generation throughput: 1.4
//!   tokens/s, Running: 1 reqs, Waiting: 0 reqs[, Deferred: N reqs][, KV fetch: ...]
//!   [, Preemptions: N], GPU KV cache usage: 1.9%[, Prefix cache hit rate: 0.0%]
//!   [, Corrupted: N reqs][, External prefix cache hit rate: ...][, MM cache hit rate: ...]`
//!   (the device word is `GPU`, `CPU`, `XPU`...);
//! - 0.10.2, the same as one format string that always ends with the prefix hit rate;
//! - the V0 engine (`vllm/engine/metrics.py`): `Avg prompt throughput: ..., Avg generation
//!   throughput: ..., Running: N reqs, Swapped: N reqs, Pending: N reqs, GPU KV cache
//!   usage: ...%, CPU KV cache usage: ...%.`
//!
//! The time is taken from vLLM's log prefix, `LEVEL MM-DD HH:MM:SS [file.py:line]`, which
//! has no year: the year comes from [`super::LogsOptions::year`], and within one file a jump
//! backwards by more than four weeks is read as the turn of a year. Times are naive (the
//! server's local clock, counted as if it were UTC); only differences and minutes matter.
//! A line that looks like a stats line but does not parse completely (truncated by a
//! crash or a log rotation, or without a timestamp) is counted as malformed and skipped.

use std::borrow::Cow;

use regex::Regex;
use sous_engine::dialect::log::vllm::{self, part};

use super::report::Restart;
use super::spec::{self, SpecSample};
use super::time::{LogTime, Timeline};
use super::{parse_percent, parse_rate};

/// The compiled patterns; built once per [`super::analyze`].
pub(super) struct Patterns {
    ansi: Regex,
    header: Regex,
    /// The same, anchored: tried first where the level word is, which is several times
    /// faster than searching the whole line for the leftmost match.
    header_at: Regex,
    stats: Regex,
    kv_fetch: Regex,
}

impl Patterns {
    pub(super) fn new() -> Result<Patterns, regex::Error> {
        Ok(Patterns {
            // CSI sequences (colours, cursor moves): ESC [ parameters intermediates final.
            ansi: Regex::new(r"\x1b\[[0-?]*[ -/]*[@-~]")?,
            header: Regex::new(without_rest(vllm::LINE_PATTERN, "msg"))?,
            header_at: Regex::new(&format!("^(?:{})", without_rest(vllm::LINE_PATTERN, "msg")))?,
            stats: Regex::new(without_rest(vllm::STATS_PATTERN, "tail"))?,
            kv_fetch: Regex::new(vllm::KV_FETCH_PATTERN)?,
        })
    }
}

/// A pattern without its last group, `(?P<name>.*)$`: the rest of the line, which the
/// readers take as the text after the match instead of capturing it (capturing it is
/// most of the cost of a match).
fn without_rest<'p>(pattern: &'p str, name: &str) -> &'p str {
    let tail = format!("(?P<{name}>.*)$");
    pattern.strip_suffix(tail.as_str()).unwrap_or(pattern)
}

/// One stats line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sample {
    /// When, in seconds of the log's timeline.
    pub(super) at: i64,
    /// The API server's pid, when the line names it.
    pub(super) pid: Option<u32>,
    /// Prompt throughput, tokens/s.
    pub(super) prompt: f64,
    /// Generation throughput, tokens/s.
    pub(super) generation: f64,
    /// Requests running.
    pub(super) running: u32,
    /// Requests waiting.
    pub(super) waiting: u32,
    /// KV-cache usage of the first device named, percent.
    pub(super) kv_usage: f64,
    /// Preemptions in the line (0 when not logged).
    pub(super) preemptions: u64,
    /// The prefix-cache hit rate, percent, when logged.
    pub(super) prefix_hit: Option<f64>,
    /// The external (KV connector) prefix-cache hit rate, percent, when logged.
    pub(super) external_prefix_hit: Option<f64>,
}

/// What a stats message holds besides its time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stats {
    prompt: f64,
    generation: f64,
    running: u32,
    waiting: u32,
    kv_usage: f64,
    preemptions: u64,
    prefix_hit: Option<f64>,
    external_prefix_hit: Option<f64>,
}

/// One log, read.
#[derive(Debug, Default)]
pub(super) struct ParsedLog {
    /// Lines in the log.
    pub(super) lines: usize,
    /// Its stats lines, in order.
    pub(super) samples: Vec<Sample>,
    /// The line numbers (from 1) of stats lines that did not parse.
    pub(super) malformed: Vec<usize>,
    /// Where the server started again.
    pub(super) restarts: Vec<Restart>,
    /// Its speculative-decoding lines, in order.
    pub(super) spec: Vec<SpecSample>,
}

/// Reads one log's lines: stats samples, malformed stats lines, restarts.
pub(super) fn parse_log(text: &str, year: i32, patterns: &Patterns) -> ParsedLog {
    let mut log = ParsedLog::default();
    let mut timeline = Timeline {
        year: i64::from(year),
        latest: None,
    };
    // A start-up line seen after a sample: the time of the first one, until the next
    // sample confirms the restart.
    let mut pending_restart: Option<i64> = None;
    // The API server's pid on the latest stats line that named one.
    let mut last_pid: Option<u32> = None;
    for (index, raw) in text.lines().enumerate() {
        log.lines += 1;
        let line: Cow<'_, str> = if raw.contains('\x1b') {
            patterns.ansi.replace_all(raw, "")
        } else {
            Cow::Borrowed(raw)
        };
        let line = line.trim_end();
        let header = header(line, patterns);
        let at = header.as_ref().map(|h| &h.0).and_then(|h| {
            let num = |name: &str| h.name(name).and_then(|m| m.as_str().parse::<u32>().ok());
            let (mo, d, hh, mi, s) = (num("mo")?, num("d")?, num("h")?, num("mi")?, num("s")?);
            if hh > 23 || mi > 59 || s > 60 {
                return None;
            }
            timeline.place(mo, d, i64::from(hh) * 3600 + i64::from(mi) * 60 + i64::from(s))
        });
        let (header, message) = match header {
            Some((caps, rest)) => (Some(caps), rest),
            None => (None, line),
        };
        let source = header
            .as_ref()
            .and_then(|h| h.name("src"))
            .map_or("", |m| m.as_str());
        let pid = header
            .as_ref()
            .and_then(|h| h.name("pid"))
            .and_then(|m| m.as_str().parse::<u32>().ok());

        if is_stats_message(message, source) {
            match (at, parse_stats(message, patterns)) {
                (Some(at), Some(stats)) => {
                    let previous_pid = last_pid;
                    if let Some(started) = pending_restart.take() {
                        log.restarts.push(Restart {
                            at: LogTime(started),
                            pid_before: previous_pid,
                            pid_after: pid,
                        });
                    } else if let (Some(before), Some(after)) = (previous_pid, pid)
                        && before != after
                    {
                        log.restarts.push(Restart {
                            at: LogTime(at),
                            pid_before: Some(before),
                            pid_after: Some(after),
                        });
                    }
                    last_pid = pid.or(last_pid);
                    log.samples.push(Sample {
                        at,
                        pid,
                        prompt: stats.prompt,
                        generation: stats.generation,
                        running: stats.running,
                        waiting: stats.waiting,
                        kv_usage: stats.kv_usage,
                        preemptions: stats.preemptions,
                        prefix_hit: stats.prefix_hit,
                        external_prefix_hit: stats.external_prefix_hit,
                    });
                }
                _ => log.malformed.push(index + 1),
            }
        } else if let Some(kind) = spec::kind_of(message) {
            match (at, spec::parse(kind, message)) {
                (Some(at), Some(mut sample)) => {
                    sample.at = at;
                    log.spec.push(sample);
                }
                _ => log.malformed.push(index + 1),
            }
        } else if let Some(at) = at
            && is_startup_message(message)
            && !log.samples.is_empty()
            && pending_restart.is_none()
        {
            pending_restart = Some(at);
        }
    }
    spec::increments(&mut log.spec);
    if let Some(started) = pending_restart {
        // It started again but logged nothing before the file ends.
        log.restarts.push(Restart {
            at: LogTime(started),
            pid_before: last_pid,
            pid_after: None,
        });
    }
    log
}

/// vLLM's prefix and message in a line. The leftmost match of the pattern is wanted;
/// searching for it costs most of the time of reading a long log, so it is first tried
/// anchored where it must start: at the first level word followed by a digit, or at the
/// `(Process pid=N) ` just before it. That is the leftmost match when the text before it
/// holds no `(` and no level word (every match holds one or the other at its start), as
/// the prefixes of docker, kubectl and journald do not; otherwise the whole line is
/// searched.
fn header<'a>(line: &'a str, patterns: &Patterns) -> Option<(regex::Captures<'a>, &'a str)> {
    let with_rest = |haystack: &'a str, caps: regex::Captures<'a>| {
        let end = caps.get(0).map_or(haystack.len(), |m| m.end());
        (caps, &haystack[end..])
    };
    const LEVELS: [&str; 5] = ["INFO", "WARNING", "ERROR", "DEBUG", "CRITICAL"];
    let level = LEVELS
        .iter()
        .filter_map(|l| {
            let at = line.find(l)?;
            let rest = line[at + l.len()..].strip_prefix(' ')?;
            rest.starts_with(|c: char| c.is_ascii_digit()).then_some(at)
        })
        .min();
    if let Some(at) = level {
        let start = line[..at]
            .strip_suffix(' ')
            .filter(|b| b.ends_with(')'))
            .and_then(|b| b.rfind('('))
            .unwrap_or(at);
        let before = &line[..start];
        if !before.contains('(')
            && !LEVELS.iter().any(|l| before.contains(l))
            && let Some(caps) = patterns.header_at.captures(&line[start..])
        {
            return Some(with_rest(&line[start..], caps));
        }
    }
    patterns.header.captures(line).map(|caps| with_rest(line, caps))
}

/// Whether a message is (or was meant to be) a periodic stats line: it names the prompt
/// throughput, or it is `loggers.py` starting `Engine NNN:` and was cut before that.
fn is_stats_message(message: &str, source: &str) -> bool {
    message.contains(vllm::STATS_MARKER)
        || (source.starts_with(vllm::STATS_SOURCE)
            && (message.starts_with(vllm::ENGINE_PREFIX) || message.contains(vllm::AGGREGATED)))
}

/// Lines vLLM's API server logs once per start ([`vllm::STARTUP_MESSAGES`]).
fn is_startup_message(message: &str) -> bool {
    vllm::STARTUP_MESSAGES.iter().any(|m| message.starts_with(m))
}

/// Parses a stats message completely, or not at all: every part after `Running` must be
/// a whole `Key: value`, a queue count and a KV cache usage must be among them, and a
/// known key must carry its known kind of value, so that a line cut anywhere is refused.
fn parse_stats(message: &str, patterns: &Patterns) -> Option<Stats> {
    let caps = patterns.stats.captures(message)?;
    let prompt = parse_rate(caps.name("prompt")?.as_str())?;
    let generation = parse_rate(caps.name("gen")?.as_str())?;
    let running = caps.name("running")?.as_str().parse::<u32>().ok()?;
    let tail = &message[caps.get(0)?.end()..];
    // V0 ends its message with a full stop.
    let mut rest = tail.strip_suffix('.').unwrap_or(tail);
    let mut waiting = None;
    let mut kv_usage = None;
    let mut preemptions = 0u64;
    let (mut prefix_hit, mut external_prefix_hit) = (None, None);
    while !rest.is_empty() {
        rest = rest.strip_prefix(", ")?;
        // The one part with commas inside (0.33 `KV fetch`).
        if let Some(m) = patterns.kv_fetch.find(rest) {
            rest = &rest[m.end()..];
            continue;
        }
        let (part, next) = match rest.find(", ") {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        rest = next;
        let (key, value) = part.split_once(": ")?;
        match key {
            part::WAITING | part::PENDING => waiting = Some(parse_reqs(value)?),
            part::SWAPPED | part::DEFERRED | part::CORRUPTED => {
                parse_reqs(value)?;
            }
            part::PREEMPTIONS => preemptions = value.parse::<u64>().ok()?,
            part::PREFIX_CACHE_HIT_RATE => prefix_hit = Some(parse_percent(value)?),
            part::EXTERNAL_PREFIX_CACHE_HIT_RATE => external_prefix_hit = Some(parse_percent(value)?),
            part::MM_CACHE_HIT_RATE => {
                parse_percent(value)?;
            }
            _ if key.ends_with(part::KV_CACHE_USAGE) => {
                let usage = parse_percent(value)?;
                // V0 names the GPU first and the CPU swap space second.
                kv_usage.get_or_insert(usage);
            }
            // A part a later vLLM added: accepted if whole.
            _ if key.starts_with(|c: char| c.is_ascii_uppercase()) && !value.trim().is_empty() => {}
            _ => return None,
        }
    }
    Some(Stats {
        prompt,
        generation,
        running,
        waiting: waiting?,
        kv_usage: kv_usage?,
        preemptions,
        prefix_hit,
        external_prefix_hit,
    })
}

fn parse_reqs(value: &str) -> Option<u32> {
    value.strip_suffix(" reqs")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn stats(message: &str) -> Option<Stats> {
        parse_stats(message, &Patterns::new().expect("patterns"))
    }

    #[test]
    fn prefixes_and_colours_are_stripped() {
        let text = [
            // `docker logs -t` with colours, including inside the message.
            "\x1b[36m2026-09-06T10:00:08.1Z\x1b[0m (APIServer pid=1) \x1b[32mINFO\x1b[0m 09-06 \
             10:00:08 [loggers.py:123] Engine 000: Avg prompt throughput: 5.0 tokens/s, Avg \
             generation throughput: 11.0 tokens/s, Running: \x1b[1m1\x1b[0m reqs, Waiting: 0 reqs, \
             GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%\x1b[0m\r"
                .to_owned(),
            // `kubectl logs --prefix`, no pid.
            format!(
                "[pod/titan-0/vllm] {}",
                line("09-06 10:00:18", 22.0, 2).replace("(APIServer pid=7) ", "")
            ),
            // `docker compose logs`.
            format!("vllm-1  | {}", line("09-06 10:00:28", 33.0, 3)),
            // journald.
            format!(
                "Sep 06 10:00:38 titan vllm[7]: {}",
                line("09-06 10:00:38", 44.0, 4)
            ),
        ]
        .join("\n");
        let i = one(&text, 2026);
        assert_eq!((i.samples, i.malformed_lines), (4, 0));
        let generation: Vec<_> = i
            .curve
            .iter()
            .map(|p| (p.running, p.max_generation_tok_s))
            .collect();
        assert_eq!(generation, [(1, 11.0), (2, 22.0), (3, 33.0), (4, 44.0)]);
        assert_eq!((i.first, i.last), (sep6(10, 0, 8), sep6(10, 0, 38)));
        // The pid went from 1 to none to 7: a restart, noticed when 7 shows (10:00:28).
        assert_eq!(i.restarts.len(), 1);
        assert_eq!(i.restarts[0].at, sep6(10, 0, 28));
    }

    #[test]
    fn every_version_of_the_line_parses() {
        // vLLM 0.32 on the CPU (the first stats line of `vllm-0.32-cpu-serve.log`).
        let message = "Engine 000: Avg prompt throughput: 79.4 tokens/s, Avg generation throughput: 1.4 \
                       tokens/s, Running: 1 reqs, Waiting: 0 reqs, CPU KV cache usage: 1.9%, Prefix \
                       cache hit rate: 0.0%";
        assert!(fixture("vllm-0.32-cpu-serve.log").text.contains(message));
        let s = stats(message).expect("0.32");
        assert_eq!(
            (s.prompt, s.generation, s.running, s.waiting, s.kv_usage),
            (79.4, 1.4, 1, 0, 1.9)
        );
        // 0.33 with every optional part, XPU, aggregated over engines.
        let s = stats(
            "2 Engines Aggregated: Avg prompt throughput: 12000.5 tokens/s, Avg generation \
             throughput: 950.0 tokens/s, Running: 14 reqs, Waiting: 3 reqs, Deferred: 1 reqs, \
             KV fetch: 2 waiting to start, 1 in progress, 0 completed waiting, Preemptions: 4, \
             XPU KV cache usage: 88.2%, Prefix cache hit rate: 81.9%, Corrupted: 1 reqs, \
             External prefix cache hit rate: 10.0%, MM cache hit rate: 0.0%",
        )
        .expect("0.33");
        assert_eq!(
            (s.running, s.waiting, s.preemptions, s.kv_usage),
            (14, 3, 4, 88.2)
        );
        // V0 (`vllm/engine/metrics.py`), with and without the bracket before the file name.
        for header in [
            "INFO 05-10 17:20:55 metrics.py:334]",
            "INFO 05-10 17:20:55 [metrics.py:334]",
        ] {
            let text = format!(
                "{header} Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 25.3 \
                 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: \
                 0.4%, CPU KV cache usage: 0.0%."
            );
            let i = one(&text, 2024);
            assert_eq!((i.samples, i.max_waiting, i.max_kv_cache_usage_pct), (1, 2, 0.4));
            assert_eq!(i.first.to_string(), "2024-05-10 17:20:55");
        }
        // A part a later vLLM may add is accepted when whole.
        assert!(
            stats(
                "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 \
                 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Spill: 3 \
                 blocks"
            )
            .is_some()
        );
    }

    #[test]
    fn a_cut_line_is_refused_or_read_right() {
        let full = "Engine 000: Avg prompt throughput: 179.4 tokens/s, Avg generation throughput: \
                    21.4 tokens/s, Running: 12 reqs, Waiting: 10 reqs, Deferred: 1 reqs, KV fetch: \
                    1 waiting to start, 0 in progress, 0 completed waiting, Preemptions: 13, GPU KV \
                    cache usage: 11.9%, Prefix cache hit rate: 30.5%";
        let whole = stats(full).expect("whole line");
        let mut accepted = Vec::new();
        for cut in 0..full.len() {
            if let Some(s) = stats(&full[..cut]) {
                // Only a cut between parts, after the KV cache usage, yields the same numbers
                // (less the optional part cut off).
                let without = Stats {
                    prefix_hit: None,
                    ..whole
                };
                assert_eq!(s, without, "cut at {cut}: {}", &full[..cut]);
                accepted.push(&full[cut - 5..cut]);
            }
        }
        assert_eq!(accepted, ["11.9%"]);
        // In a file, the cut lines are counted, not read.
        let text = [
            line("09-06 10:00:00", 50.0, 1),
            line("09-06 10:00:10", 60.0, 1)[..140].to_owned(),
            "(APIServer pid=7) INFO 09-06 10:00:20 [loggers.py:335] Engine 000: Avg".to_owned(),
            "(APIServer pid=7) INFO 09-06 10:00:30 [loggers.py:335] Engine 000: Avg prompt throughput: x tokens/s".to_owned(),
            // No timestamp to place it by.
            "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%".to_owned(),
            // A date that does not exist.
            line("02-30 10:00:40", 70.0, 1),
            String::new(),
            "garbage \u{fffd}".to_owned(),
        ]
        .join("\n");
        let i = one(&text, 2026);
        assert_eq!((i.samples, i.malformed_lines, i.other_lines), (1, 5, 2));
        assert_eq!(i.malformed_examples, [2, 3, 4, 5, 6]);
    }

    #[test]
    fn startup_lines_mark_a_restart_when_the_pid_stays() {
        // In a container the API server is often pid 1 on every start.
        let text = [
            line("09-06 10:00:00", 50.0, 1),
            "(APIServer pid=7) INFO 09-06 10:05:00 [api_server.py:1896] vLLM API server version 0.10.2".to_owned(),
            "(APIServer pid=7) INFO 09-06 10:05:00 [utils.py:328] non-default args: {}".to_owned(),
            "(APIServer pid=7) INFO 09-06 10:06:00 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000".to_owned(),
            line("09-06 10:06:30", 60.0, 1),
            "(APIServer pid=7) INFO 09-06 10:09:00 [utils.py:253] non-default args: {}".to_owned(),
        ]
        .join("\n");
        let i = one(&text, 2026);
        let restarts: Vec<_> = i
            .restarts
            .iter()
            .map(|r| (r.at, r.pid_before, r.pid_after))
            .collect();
        assert_eq!(
            restarts,
            [
                (sep6(10, 5, 0), Some(7), Some(7)),
                // Started again, and the file ends before it served.
                (sep6(10, 9, 0), Some(7), None),
            ]
        );
        // The 390 s without samples is idle all the same.
        assert_eq!((i.idle.gaps, i.idle.idle_s), (1, 380));
    }

    #[test]
    fn a_real_vllm_log_is_read_whole() {
        // `tests/fixtures/vllm-logs/README.md` says where it comes from.
        let i = one(&fixture("vllm-0.32-cpu-serve.log").text, 2025);
        assert_eq!((i.lines, i.samples, i.malformed_lines), (115, 3, 0));
        assert_eq!(i.first.to_string(), "2025-11-29 23:23:43");
        assert_eq!((i.span_s, i.restarts.len()), (20, 0));
        assert_eq!((i.peak.generation_tok_s, i.peak.running), (18.9, 1));
    }

    #[test]
    fn the_native_engines_line_reads_back() {
        let line = vllm::StatsLine {
            engine: 0,
            prompt_tok_s: 812.5,
            generation_tok_s: 96.3,
            running: 3,
            waiting: 2,
            preemptions: 4,
            device: "CPU",
            kv_usage: 0.125,
            prefix_hit_rate: Some(0.5),
        };
        let s = stats(&line.to_string()).expect("the native engine's line");
        assert_eq!(
            (
                s.prompt,
                s.generation,
                s.running,
                s.waiting,
                s.kv_usage,
                s.preemptions
            ),
            (812.5, 96.3, 3, 2, 12.5, 4)
        );
        let without = vllm::StatsLine {
            preemptions: 0,
            prefix_hit_rate: None,
            ..line
        };
        assert_eq!(stats(&without.to_string()).map(|s| s.preemptions), Some(0));
    }
}
