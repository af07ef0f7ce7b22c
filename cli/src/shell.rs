//! All terminal output: data on stdout, talk on stderr (uv's rule), colour only on a
//! terminal and never with `NO_COLOR`. Nothing else in the binary prints. The shell is
//! also the [`Reporter`] that library operations report through.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{IsTerminal, Write};

use sous_engine::reporter::{Progress, Reporter, Silent, Task, Unit};

/// The terminal.
#[derive(Debug, Clone)]
pub struct Shell {
    color: bool,
}

const RED: &str = "\x1b[1;31m";
const YELLOW: &str = "\x1b[1;33m";
const CYAN: &str = "\x1b[1;36m";
const GREEN: &str = "\x1b[1;32m";
const RESET: &str = "\x1b[0m";

impl Shell {
    /// From the process's environment and stderr.
    pub fn from_env() -> Shell {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Shell {
            color: !no_color && std::io::stderr().is_terminal(),
        }
    }

    fn paint(&self, style: &str, text: &str) -> String {
        if self.color {
            format!("{style}{text}{RESET}")
        } else {
            text.to_owned()
        }
    }

    /// Data for the user or a script, on stdout.
    pub fn data(&self, text: &str) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        if !text.ends_with('\n') {
            out.write_all(b"\n")?;
        }
        out.flush()
    }

    /// `error: ...` and an optional `hint: ...` on stderr.
    pub fn error(&self, message: &str, hint: Option<&str>) {
        eprintln!("{} {message}", self.paint(RED, "error:"));
        if let Some(hint) = hint {
            eprintln!("{} {hint}", self.paint(CYAN, "hint:"));
        }
    }

    /// `warning: ...` on stderr.
    pub fn warn(&self, message: &str) {
        eprintln!("{} {message}", self.paint(YELLOW, "warning:"));
    }

    /// A line of an engine's output on stderr, prefixed with the engine's name.
    pub fn engine_line(&self, engine: &str, line: &str) {
        eprintln!("{} {line}", self.paint(CYAN, &format!("{engine} |")));
    }

    /// A line of the engine's own log on stderr, as it is: the native engine's process
    /// writes these and the supervising `sous serve` prefixes them.
    pub fn log_line(&self, line: &str) {
        eprintln!("{line}");
    }

    /// A status line on stderr, e.g. `ok recipes/x.toml`.
    pub fn status(&self, word: &str, message: &str) {
        eprintln!("{} {message}", self.paint(GREEN, word));
    }
}

/// The shell as a [`Reporter`] for library operations: statuses and warnings as the
/// shell writes them, engine output with or without the engine's prefix, and a bar on
/// a terminal for measured progress (nothing elsewhere).
impl Reporter for Shell {
    fn status(&self, word: &str, message: &str) {
        Shell::status(self, word, message);
    }

    fn warn(&self, message: &str) {
        Shell::warn(self, message);
    }

    fn output(&self, source: Option<&str>, line: &str) {
        match source {
            Some(engine) => self.engine_line(engine, line),
            None => self.log_line(line),
        }
    }

    fn progress(&self, task: Task) -> Box<dyn Progress> {
        if !std::io::stderr().is_terminal() {
            return Box::new(Silent);
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(task.total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        let figures = match task.unit {
            Unit::Bytes => "{bytes}/{total_bytes}".to_owned(),
            Unit::Count(noun) => format!("{{pos}}/{{len}} {noun}"),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{{prefix:>12}} [{{bar:30}}] {figures}, {{msg}}"
            ))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(task.label);
        Box::new(Bar(bar))
    }
}

/// A bar on the terminal.
struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn set(&self, done: u64) {
        self.0.set_position(done);
    }

    fn add(&self, n: u64) {
        self.0.inc(n);
    }

    fn note(&self, text: &str) {
        self.0.set_message(text.to_owned());
    }

    fn part(&self, _: Task) -> Box<dyn Progress> {
        Box::new(Silent)
    }

    fn finish(&self, summary: Option<&str>) {
        self.0.finish_and_clear();
        if let Some(summary) = summary {
            eprintln!("{summary}");
        }
    }
}
