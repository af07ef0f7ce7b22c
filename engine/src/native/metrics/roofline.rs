//! The decode roofline: how many bytes the engine's decode steps had to read
//! ([`crate::native::model::Model::step_bytes`]), in how long, against the machine's
//! read bandwidth measured at load. Logged as a `Decode roofline:` line after vLLM's
//! stats line, and served as `sous:` series beside vLLM's (`sous bench` reads them to
//! say how close a run came to the memory wall). Names of our own: vLLM has no such
//! series.

use std::fmt::Write as _;

/// The read bandwidth measured at load, GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadBandwidth {
    /// The median pass (what the fraction is of: on a machine shared with other work
    /// the best pass is a moment's, the median the usual).
    pub median_gb_per_s: f64,
    /// The fastest pass (STREAM's figure).
    pub best_gb_per_s: f64,
    /// Threads that read.
    pub threads: usize,
}

/// Decode steps counted: steps with one token for each running sequence and no prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Steps {
    steps: u64,
    sequences: u64,
    bytes: u64,
    seconds: f64,
}

impl Steps {
    pub(super) fn add(&mut self, sequences: usize, bytes: u64, seconds: f64) {
        self.steps += 1;
        self.sequences += sequences as u64;
        self.bytes += bytes;
        self.seconds += seconds;
    }

    /// GB/s over these steps.
    fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }

    /// The `Decode roofline:` line of these steps; none when there were none.
    pub(super) fn line(&self, bandwidth: Option<ReadBandwidth>) -> Option<String> {
        if self.steps == 0 {
            return None;
        }
        let steps = self.steps as f64;
        let rate = self.gb_per_s();
        let mut line = format!(
            "Decode roofline: {} steps of {:.1} sequences on average, {:.3} GB read per step in {:.2} ms, {:.1} GB/s",
            self.steps,
            self.sequences as f64 / steps,
            self.bytes as f64 / steps / 1e9,
            self.seconds / steps * 1e3,
            rate
        );
        match bandwidth {
            Some(b) => {
                let _ = write!(
                    line,
                    ", {:.0} % of the read bandwidth ({:.1} GB/s measured at load, median of the passes; {:.1} GB/s the best)",
                    rate / b.median_gb_per_s * 100.0,
                    b.median_gb_per_s,
                    b.best_gb_per_s
                );
            }
            None => line.push_str(" (read bandwidth not measured: SOUS_READ_BANDWIDTH=off)"),
        }
        Some(line)
    }

    /// The Prometheus series of these steps (the totals since start), with `labels`.
    pub(super) fn render(&self, bandwidth: Option<ReadBandwidth>, labels: &str, out: &mut String) {
        for (name, help, value) in [
            (
                DECODE_STEPS,
                "Decode steps (one token per running sequence, no prompt tokens).",
                self.steps as f64,
            ),
            (
                DECODE_SEQUENCES,
                "Sequences those decode steps advanced, summed over the steps.",
                self.sequences as f64,
            ),
            (
                DECODE_READ_BYTES,
                "Bytes those decode steps had to read: the weights they touched and the KV cache.",
                self.bytes as f64,
            ),
            (DECODE_SECONDS, "Seconds those decode steps took.", self.seconds),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {value:?}"
            );
        }
        if let Some(b) = bandwidth {
            let name = READ_BANDWIDTH;
            let _ = writeln!(
                out,
                "# HELP {name} The CPU's read bandwidth measured at load (median of the passes).\n\
                 # TYPE {name} gauge\n{name}{{{labels}}} {:?}",
                b.median_gb_per_s * 1e9
            );
        }
    }
}

/// `sous:decode_steps_total`.
pub const DECODE_STEPS: &str = "sous:decode_steps_total";
/// `sous:decode_sequences_total`.
pub const DECODE_SEQUENCES: &str = "sous:decode_sequences_total";
/// `sous:decode_read_bytes_total`.
pub const DECODE_READ_BYTES: &str = "sous:decode_read_bytes_total";
/// `sous:decode_seconds_total`.
pub const DECODE_SECONDS: &str = "sous:decode_seconds_total";
/// `sous:read_bandwidth_bytes_per_second`.
pub const READ_BANDWIDTH: &str = "sous:read_bandwidth_bytes_per_second";
