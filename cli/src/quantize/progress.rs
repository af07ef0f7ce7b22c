//! Progress of a quantization on stderr: on a terminal, a bar for the tensor in hand
//! and one for the whole model (bytes in, bytes out, rate, ETA); elsewhere (CI,
//! `kubectl logs`), a plain line every few seconds. The work loop calls [`Progress`]
//! between windows; nothing here blocks it.

#![allow(clippy::print_stderr)]

use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::hub::progress::{Style, human};

/// How often a plain progress line is printed.
const LINE_EVERY: Duration = Duration::from_secs(3);

/// The progress of one quantization.
pub struct Progress {
    style: Style,
    total: u64,
    done: u64,
    out: u64,
    tensor: String,
    started: Instant,
    last_line: Instant,
    bars: Option<(MultiProgress, ProgressBar, ProgressBar)>,
}

impl Progress {
    /// Starts tracking `total` source bytes.
    pub fn new(style: Style, total: u64) -> Progress {
        let bars = (style == Style::Bars).then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let tensor = multi.add(ProgressBar::new(0));
            tensor.set_style(
                ProgressStyle::with_template("{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            tensor.set_prefix("tensor");
            let overall = multi.add(ProgressBar::new(total));
            overall.set_style(
                ProgressStyle::with_template(
                    "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} in, {msg} out, {bytes_per_sec}, ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            overall.set_prefix("model");
            overall.set_message("0 B");
            (multi, tensor, overall)
        });
        let now = Instant::now();
        Progress {
            style,
            total,
            done: 0,
            out: 0,
            tensor: String::new(),
            started: now,
            last_line: now,
            bars,
        }
    }

    /// A new tensor of `len` source bytes is being worked on.
    pub fn tensor(&mut self, name: &str, len: u64) {
        self.tensor = name.to_owned();
        if let Some((_, bar, _)) = &self.bars {
            bar.set_length(len);
            bar.set_position(0);
            bar.set_message(name.to_owned());
        }
    }

    /// `bytes_in` more source bytes were processed and `bytes_out` written.
    pub fn advance(&mut self, bytes_in: u64, bytes_out: u64) {
        self.done += bytes_in;
        self.out += bytes_out;
        match (&self.bars, self.style) {
            (Some((_, tensor, overall)), _) => {
                tensor.inc(bytes_in);
                overall.inc(bytes_in);
                overall.set_message(human(self.out));
            }
            (None, Style::Lines) if self.last_line.elapsed() >= LINE_EVERY => {
                self.last_line = Instant::now();
                eprintln!("quantize: {} - {}", self.line(), self.tensor);
            }
            _ => {}
        }
    }

    fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let percent = if self.total == 0 {
            100.0
        } else {
            self.done as f64 * 100.0 / self.total as f64
        };
        format!(
            "{} of {} in ({percent:.0}%), {} out, {:.0} MB/s",
            human(self.done),
            human(self.total),
            human(self.out),
            self.done as f64 / 1e6 / secs
        )
    }

    /// Clears the bars (the caller reports the outcome).
    pub fn finish(&self) {
        if let Some((multi, tensor, overall)) = &self.bars {
            tensor.finish_and_clear();
            overall.finish_and_clear();
            let _ = multi.clear();
        }
    }
}
