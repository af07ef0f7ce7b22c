//! All terminal output: data on stdout, talk on stderr (uv's rule), colour only on a
//! terminal and never with `NO_COLOR`. Nothing else in the binary prints.
//!
//! The shell is also the [`Reporter`] every library operation reports through:
//! statuses and warnings as lines, engine output prefixed with the engine's name, and
//! progress drawn by `draw` (bars on a terminal, a line every few seconds
//! elsewhere, nothing with `--quiet`).

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod draw;

use std::io::{IsTerminal, Write};

use sous_engine::reporter::{self, Reporter, Task};

pub use draw::Draw;

/// The terminal.
#[derive(Debug, Clone)]
pub struct Shell {
    color: bool,
    draw: Draw,
}

const RED: &str = "\x1b[1;31m";
const YELLOW: &str = "\x1b[1;33m";
const CYAN: &str = "\x1b[1;36m";
const GREEN: &str = "\x1b[1;32m";
const RESET: &str = "\x1b[0m";

impl Shell {
    /// From the process's environment and stderr.
    pub fn from_env() -> Shell {
        let no_color = sous_engine::env::NO_COLOR.get_os().is_some_and(|v| !v.is_empty());
        let terminal = std::io::stderr().is_terminal();
        Shell {
            color: !no_color && terminal,
            draw: if terminal { Draw::Bars } else { Draw::Lines },
        }
    }

    /// The same shell without progress (`--quiet`): statuses, warnings and errors
    /// are still shown.
    pub fn quiet(&self) -> Shell {
        Shell {
            draw: Draw::Off,
            ..self.clone()
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

    /// Bytes on stdout as they are (a log followed, a reply streamed), flushed.
    pub fn raw(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        out.flush()
    }

    /// A prompt on stderr, without a newline, for the answer typed after it.
    pub fn prompt(&self, text: &str) -> std::io::Result<()> {
        eprint!("{}", self.paint(GREEN, text));
        std::io::stderr().flush()
    }

    /// Whether a person can answer a question: stdin and stderr are terminals.
    pub fn interactive(&self) -> bool {
        std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
    }

    /// Asks `question [y/N]` on stderr and reads the answer from stdin: yes only for
    /// `y` or `yes`.
    pub fn confirm(&self, question: &str) -> std::io::Result<bool> {
        eprint!("{} {question} [y/N] ", self.paint(CYAN, "?"));
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
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

    fn progress(&self, task: Task) -> Box<dyn reporter::Progress> {
        draw::start(self.draw, task)
    }
}
