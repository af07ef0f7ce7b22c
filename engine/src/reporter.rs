//! How long operations tell whoever runs them what they are doing: status lines,
//! warnings, an engine's output, and measured progress (bytes of a pull or a
//! quantization, requests of a benchmark).
//!
//! Libraries never print. An operation takes a `&dyn Reporter` (or an
//! `Arc<dyn Reporter>` when it outlives the call) and says what happens; the `sous`
//! binary draws it (bars on a terminal, a line every few seconds elsewhere, nothing
//! with `--quiet`), and tests ignore it ([`Silent`]) or keep it ([`Recorded`]).
//!
//! Not here: what the words are (each operation chooses them) or how they look.

use std::sync::Mutex;

/// Receives what an operation reports.
pub trait Reporter: Send + Sync {
    /// A step began or ended: a short word and what it concerns, e.g.
    /// `("pulled", "org/name into /path")`.
    fn status(&self, word: &str, message: &str);

    /// Something legal that the user should know about.
    fn warn(&self, message: &str);

    /// A line of a running engine's output. `source` names the engine (`vllm`) when
    /// the line should be marked as its output; `None` passes the line on as it is
    /// (the native engine's own log).
    fn output(&self, source: Option<&str>, line: &str);

    /// A measured task begins; the returned handle advances it and ends it.
    fn progress(&self, task: Task) -> Box<dyn Progress>;
}

/// What a [`Progress`] measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// A short label (`total`, a file name, `conc 4`).
    pub label: String,
    /// What is counted.
    pub unit: Unit,
    /// How many there are in all.
    pub total: u64,
}

impl Task {
    /// A task counting `total` bytes.
    pub fn bytes(label: impl Into<String>, total: u64) -> Task {
        Task {
            label: label.into(),
            unit: Unit::Bytes,
            total,
        }
    }

    /// A task counting `total` things called `noun` (plural: `requests`).
    pub fn count(label: impl Into<String>, noun: &'static str, total: u64) -> Task {
        Task {
            label: label.into(),
            unit: Unit::Count(noun),
            total,
        }
    }
}

/// The unit of a [`Task`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, shown with decimal units and a rate.
    Bytes,
    /// Things, named in the plural.
    Count(&'static str),
}

/// The handle of a measured task. Every method takes `&self`: a task may be advanced
/// from several threads or tasks at once.
pub trait Progress: Send + Sync {
    /// How far the task is, in its unit.
    fn set(&self, done: u64);

    /// Advances the task by `n`.
    fn add(&self, n: u64);

    /// A short note shown after the figures (bytes written so far, tokens generated).
    fn note(&self, text: &str);

    /// A part of this task with its own measure (one file of a pull, one tensor).
    fn part(&self, task: Task) -> Box<dyn Progress>;

    /// The task is over. `summary`, when given, is kept where a display keeps lines
    /// (one line per finished file of a pull in a CI log).
    fn finish(&self, summary: Option<&str>);
}

/// A reporter that drops everything: for library callers and tests that only want
/// the result.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Reporter for Silent {
    fn status(&self, _: &str, _: &str) {}

    fn warn(&self, _: &str) {}

    fn output(&self, _: Option<&str>, _: &str) {}

    fn progress(&self, _: Task) -> Box<dyn Progress> {
        Box::new(Silent)
    }
}

impl Progress for Silent {
    fn set(&self, _: u64) {}

    fn add(&self, _: u64) {}

    fn note(&self, _: &str) {}

    fn part(&self, _: Task) -> Box<dyn Progress> {
        Box::new(Silent)
    }

    fn finish(&self, _: Option<&str>) {}
}

/// A reporter that keeps every status and warning, for tests that check what an
/// operation said. Output lines and progress are dropped.
#[derive(Debug, Default)]
pub struct Recorded {
    said: Mutex<Vec<Said>>,
}

/// One thing a [`Recorded`] reporter was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// [`Reporter::status`].
    Status(String, String),
    /// [`Reporter::warn`].
    Warning(String),
}

impl Recorded {
    /// Everything said so far, in order.
    pub fn said(&self) -> Vec<Said> {
        self.said.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The status words said so far, in order.
    pub fn words(&self) -> Vec<String> {
        self.said()
            .into_iter()
            .filter_map(|s| match s {
                Said::Status(word, _) => Some(word),
                Said::Warning(_) => None,
            })
            .collect()
    }

    fn push(&self, said: Said) {
        if let Ok(mut all) = self.said.lock() {
            all.push(said);
        }
    }
}

impl Reporter for Recorded {
    fn status(&self, word: &str, message: &str) {
        self.push(Said::Status(word.to_owned(), message.to_owned()));
    }

    fn warn(&self, message: &str) {
        self.push(Said::Warning(message.to_owned()));
    }

    fn output(&self, _: Option<&str>, _: &str) {}

    fn progress(&self, _: Task) -> Box<dyn Progress> {
        Box::new(Silent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_keeps_statuses_and_warnings_in_order() {
        let r = Recorded::default();
        r.status("pulled", "a/b");
        r.warn("careful");
        r.output(Some("vllm"), "a line");
        let bar = r.progress(Task::bytes("total", 10));
        bar.add(5);
        bar.finish(Some("done"));
        r.status("ready", "http://x");
        assert_eq!(
            r.said(),
            vec![
                Said::Status("pulled".into(), "a/b".into()),
                Said::Warning("careful".into()),
                Said::Status("ready".into(), "http://x".into()),
            ]
        );
        assert_eq!(r.words(), ["pulled", "ready"]);
    }
}
