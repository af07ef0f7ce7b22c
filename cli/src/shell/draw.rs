//! Progress on stderr, the only place sous draws it: on a terminal, an indicatif bar
//! per task and per part in flight (a file of a pull, a tensor of a quantization);
//! elsewhere (CI logs, `kubectl logs`), a plain line every few seconds and the
//! summary line of each finished part; nothing with `--quiet`.
//!
//! Operations only advance counters through [`Progress`]; drawing is indicatif's
//! (rate-limited, off the caller's thread) or a time check per update.

#![allow(clippy::print_stderr)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sous_engine::reporter::{Progress, Silent, Task, Unit};
use sous_engine::size::human;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draw {
    /// Bars, on a terminal.
    Bars,
    /// A line every [`LINE_EVERY`], for logs.
    Lines,
    /// Nothing.
    Off,
}

/// How often a progress line is printed where there are no bars.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// The handle of a new top-level task.
pub fn start(draw: Draw, task: Task) -> Box<dyn Progress> {
    match draw {
        Draw::Bars => Box::new(Bar::root(task)),
        Draw::Lines => Box::new(Line::root(task)),
        Draw::Off => Box::new(Silent),
    }
}

/// An indicatif bar in the task's [`MultiProgress`].
struct Bar {
    multi: MultiProgress,
    bar: ProgressBar,
    label: Option<String>,
}

impl Bar {
    fn root(task: Task) -> Bar {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let figures = match task.unit {
            Unit::Bytes => "{bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}".to_owned(),
            Unit::Count(noun) => format!("{{pos}}/{{len}} {noun}, {{msg}}"),
        };
        let bar = multi.add(ProgressBar::new(task.total));
        bar.set_style(style(&format!("{{prefix:>12}} [{{bar:30}}] {figures}")));
        bar.set_prefix(task.label);
        Bar {
            multi,
            bar,
            label: None,
        }
    }

    fn part(&self, task: Task) -> Bar {
        let figures = match task.unit {
            Unit::Bytes => "{bytes}/{total_bytes}",
            Unit::Count(_) => "{pos}/{len}",
        };
        let bar = self.multi.add(ProgressBar::new(task.total));
        bar.set_style(style(&format!(
            "{{prefix:>12}} [{{bar:30}}] {figures} {{wide_msg}}"
        )));
        bar.set_message(task.label.clone());
        Bar {
            multi: self.multi.clone(),
            bar,
            label: Some(task.label),
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

impl Progress for Bar {
    fn set(&self, done: u64) {
        self.bar.set_position(done);
    }

    fn add(&self, n: u64) {
        self.bar.inc(n);
    }

    fn note(&self, text: &str) {
        match &self.label {
            Some(label) => self.bar.set_message(format!("{label} {text}")),
            None => self.bar.set_message(text.to_owned()),
        }
    }

    fn part(&self, task: Task) -> Box<dyn Progress> {
        Box::new(Bar::part(self, task))
    }

    fn finish(&self, _summary: Option<&str>) {
        self.bar.finish_and_clear();
        self.multi.remove(&self.bar);
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
            self.multi.remove(&self.bar);
        }
    }
}

/// What the lines of one top-level task share.
struct LineTask {
    label: String,
    unit: Unit,
    total: u64,
    done: AtomicU64,
    note: Mutex<String>,
    started: Instant,
    last: Mutex<Instant>,
}

/// A task or part shown as lines.
struct Line {
    task: Arc<LineTask>,
    root: bool,
}

impl Line {
    fn root(task: Task) -> Line {
        let now = Instant::now();
        Line {
            task: Arc::new(LineTask {
                label: task.label,
                unit: task.unit,
                total: task.total,
                done: AtomicU64::new(0),
                note: Mutex::new(String::new()),
                started: now,
                last: Mutex::new(now),
            }),
            root: true,
        }
    }

    /// Prints the task's line if the last one is old enough.
    fn maybe_print(&self) {
        let Ok(mut last) = self.task.last.lock() else {
            return;
        };
        if last.elapsed() < LINE_EVERY {
            return;
        }
        *last = Instant::now();
        let t = &self.task;
        let done = t.done.load(Ordering::Relaxed);
        let note = t.note.lock().map(|n| n.clone()).unwrap_or_default();
        let line = match t.unit {
            Unit::Bytes => {
                let percent = if t.total == 0 {
                    100.0
                } else {
                    done as f64 * 100.0 / t.total as f64
                };
                let rate = done as f64 / t.started.elapsed().as_secs_f64().max(1e-3);
                let note = if note.is_empty() {
                    note
                } else {
                    format!(" - {note}")
                };
                format!(
                    "{}: {percent:.0}% {} of {}, {}/s{note}",
                    t.label,
                    human(done),
                    human(t.total),
                    human(rate as u64)
                )
            }
            Unit::Count(noun) => {
                let note = if note.is_empty() {
                    note
                } else {
                    format!(", {note}")
                };
                format!("{}: {done}/{} {noun}{note}", t.label, t.total)
            }
        };
        eprintln!("{line}");
    }
}

impl Progress for Line {
    fn set(&self, done: u64) {
        if self.root {
            self.task.done.store(done, Ordering::Relaxed);
            self.maybe_print();
        }
    }

    fn add(&self, n: u64) {
        if self.root {
            self.task.done.fetch_add(n, Ordering::Relaxed);
            self.maybe_print();
        }
    }

    fn note(&self, text: &str) {
        if self.root
            && let Ok(mut note) = self.task.note.lock()
        {
            text.clone_into(&mut note);
        }
    }

    fn part(&self, _task: Task) -> Box<dyn Progress> {
        Box::new(Line {
            task: self.task.clone(),
            root: false,
        })
    }

    fn finish(&self, summary: Option<&str>) {
        if let Some(summary) = summary {
            eprintln!("{}: {summary}", self.task.label);
        }
    }
}
