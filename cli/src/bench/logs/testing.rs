//! Helpers shared by the tests of `sous bench logs`: the fixtures (in
//! `tests/fixtures/vllm-logs/`), the options they are read with, and stats lines made to
//! order. Only compiled for tests.

use std::path::Path;

use super::report::InstanceReport;
use super::{LogInput, LogTime, LogsOptions, analyze};

pub(super) const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vllm-logs/");
/// `date -u -d 2026-09-06 +%s`.
pub(super) const SEP_6_2026: i64 = 1_788_652_800;
/// `date -u -d 2026-01-01 +%s`.
pub(super) const JAN_1_2026: i64 = 1_767_225_600;

/// 2026-09-06 at hh:mm:ss.
pub(super) fn sep6(h: i64, m: i64, s: i64) -> LogTime {
    LogTime(SEP_6_2026 + h * 3600 + m * 60 + s)
}

pub(super) fn options() -> LogsOptions {
    LogsOptions {
        year: 2026,
        ..LogsOptions::default()
    }
}

pub(super) fn fixture(name: &str) -> LogInput {
    LogInput::read(&Path::new(FIXTURES).join(name), None).expect("fixture")
}

pub(super) fn fixtures() -> Vec<LogInput> {
    ["instance-0.log", "instance-1.log", "instance-2.log"]
        .map(fixture)
        .to_vec()
}

pub(super) fn close(actual: f64, expected: f64) {
    assert!((actual - expected).abs() < 1e-9, "{actual} != {expected}");
}

/// A 0.33 stats line with a given time, generation throughput and running count.
pub(super) fn line(time: &str, generation: f64, running: u32) -> String {
    format!(
        "(APIServer pid=7) INFO {time} [loggers.py:335] Engine 000: Avg prompt throughput: 10.0 \
         tokens/s, Avg generation throughput: {generation:.1} tokens/s, Running: {running} reqs, \
         Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 50.0%"
    )
}

pub(super) fn one(text: &str, year: i32) -> InstanceReport {
    let options = LogsOptions { year, ..options() };
    let mut report = analyze(&[LogInput::new("x", text)], &options).expect("analyze");
    report.instances.remove(0)
}
