//! The starts `sous serve` saw become ready, one JSON line each in
//! `<state>/<name>/starts.jsonl`: when, which engine and release, the seconds from the
//! launch to ready and the phases. Unlike `instance.json` they outlive the instance:
//! `sous deploy render` sizes a start-up probe from them.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::logscan::PhaseTime;
use crate::recipe::EngineKind;

/// The file name in an instance directory.
pub const FILE: &str = "starts.jsonl";

/// How many starts are kept: the file is cut back to the newest this many when it has
/// twice as many lines.
const KEEP: usize = 50;

/// One start that became ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Start {
    /// When it became ready, seconds since the Unix epoch.
    pub ready_unix: u64,
    /// The engine.
    pub engine: EngineKind,
    /// Its release, as rendered.
    pub version: String,
    /// The GPU it ran on, as the driver names it (`NVIDIA GB10`); `None` for none (the
    /// native engine, a CPU backend) or where no driver answered.
    #[serde(default)]
    pub gpu: Option<String>,
    /// Seconds from the launch to ready.
    pub seconds: f64,
    /// The phases (the build's on a first start, then the engine's).
    pub phases: Vec<PhaseTime>,
    /// What the kept compile caches held when it began: empty for a cold start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_cache: Option<crate::launch::caches::Contents>,
}

/// Appends `start` to the record in `instance_dir`, cutting the file back to the newest
/// [`KEEP`] starts when it has grown to twice that (atomically: a reader sees the old
/// file or the new one).
pub fn record(instance_dir: &Path, start: &Start) -> std::io::Result<()> {
    let path = instance_dir.join(FILE);
    let line = serde_json::to_string(start).map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    writeln!(file, "{line}")?;
    drop(file);
    let text = std::fs::read_to_string(&path)?;
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() >= 2 * KEEP {
        let kept = lines[lines.len() - KEEP..].join("\n") + "\n";
        crate::atomic::write_file(&path, kept.as_bytes())?;
    }
    Ok(())
}

/// The starts recorded in `instance_dir`, oldest first; lines that do not parse (a
/// file cut short by a crash, or written by another release) are skipped.
pub fn read(instance_dir: &Path) -> Vec<Start> {
    let Ok(text) = std::fs::read_to_string(instance_dir.join(FILE)) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The slowest of `starts` made by `engine` at `version` (seconds from launch to
/// ready), and how many there were; `None` when there were none.
pub fn slowest(starts: &[Start], engine: EngineKind, version: &str) -> Option<(f64, usize)> {
    let same: Vec<f64> = starts
        .iter()
        .filter(|s| s.engine == engine && s.version == version)
        .map(|s| s.seconds)
        .collect();
    let most = same
        .iter()
        .copied()
        .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))))?;
    Some((most, same.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::logscan::Phase;

    fn start(seconds: f64, version: &str) -> Start {
        Start {
            ready_unix: 1_765_000_000,
            engine: EngineKind::Vllm,
            version: version.into(),
            gpu: Some("NVIDIA H100 80GB HBM3".into()),
            seconds,
            phases: vec![PhaseTime {
                phase: Phase::Weights,
                seconds: 1.5,
            }],
            compile_cache: None,
        }
    }

    #[test]
    fn starts_round_trip_and_the_file_is_cut_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(read(dir.path()).is_empty());
        for i in 0..2 * KEEP {
            record(dir.path(), &start(i as f64, "0.33.0")).expect("record");
        }
        let starts = read(dir.path());
        assert_eq!(starts.len(), KEEP, "cut back to the newest");
        assert_eq!(starts[0].seconds, KEEP as f64);
        assert_eq!(starts.last(), Some(&start((2 * KEEP - 1) as f64, "0.33.0")));
        // A torn last line is skipped, not an error.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE))
            .expect("open");
        write!(file, "{{\"ready_unix\": 1").expect("write");
        assert_eq!(read(dir.path()).len(), KEEP);
    }

    #[test]
    fn the_slowest_start_counts_only_the_same_engine_and_release() {
        let starts = [
            start(40.0, "0.33.0"),
            start(95.5, "0.33.0"),
            start(300.0, "0.32.0"),
        ];
        assert_eq!(slowest(&starts, EngineKind::Vllm, "0.33.0"), Some((95.5, 2)));
        assert_eq!(slowest(&starts, EngineKind::Sglang, "0.33.0"), None);
        assert_eq!(slowest(&starts, EngineKind::Vllm, "0.34.0"), None);
    }
}
