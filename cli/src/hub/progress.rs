//! Progress of a pull on stderr: on a terminal, one indicatif bar per file in flight
//! and a total with rate and ETA; elsewhere (CI logs, `kubectl logs`), a plain line
//! every few seconds and one per finished file. Downloads only bump atomic counters;
//! a ticker task reads them, so progress never slows the transfer.

#![allow(clippy::print_stderr)]

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Bars on a terminal.
    Bars,
    /// Periodic lines.
    Lines,
    /// Nothing.
    Quiet,
}

impl Style {
    /// Bars when stderr is a terminal, lines otherwise.
    pub fn detect() -> Style {
        if std::io::stderr().is_terminal() {
            Style::Bars
        } else {
            Style::Lines
        }
    }
}

struct Entry {
    path: String,
    size: u64,
    done: Arc<AtomicU64>,
    bar: Option<ProgressBar>,
    finished: bool,
}

/// The progress of one pull.
pub struct Tracker {
    style: Style,
    multi: Option<MultiProgress>,
    total_bar: Option<ProgressBar>,
    total: u64,
    baseline: u64,
    entries: Mutex<Vec<Entry>>,
    started: Instant,
    last_line: Mutex<Instant>,
}

impl Tracker {
    /// Starts tracking `total` bytes, of which `already` are on disk.
    pub fn new(style: Style, total: u64, already: u64) -> Arc<Tracker> {
        let (multi, total_bar) = if style == Style::Bars {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let bar = multi.add(ProgressBar::new(total));
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_prefix("total");
            bar.set_position(already);
            (Some(multi), Some(bar))
        } else {
            (None, None)
        };
        Arc::new(Tracker {
            style,
            multi,
            total_bar,
            total,
            baseline: already,
            entries: Mutex::new(Vec::new()),
            started: Instant::now(),
            last_line: Mutex::new(Instant::now()),
        })
    }

    /// Registers a file being fetched; returns the counter its download bumps.
    pub fn file(&self, path: &str, size: u64) -> Arc<AtomicU64> {
        let done = Arc::new(AtomicU64::new(0));
        let bar = self.multi.as_ref().map(|multi| {
            let bar = multi.add(ProgressBar::new(size));
            bar.set_style(
                ProgressStyle::with_template("{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_prefix("file");
            bar.set_message(path.to_owned());
            bar
        });
        if let Ok(mut entries) = self.entries.lock() {
            entries.push(Entry {
                path: path.to_owned(),
                size,
                done: done.clone(),
                bar,
                finished: false,
            });
        }
        done
    }

    /// Marks a file finished.
    pub fn finish_file(&self, path: &str) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if let Some(entry) = entries.iter_mut().find(|e| e.path == path) {
            entry.finished = true;
            entry.done.store(entry.size, Ordering::Relaxed);
            if let Some(bar) = entry.bar.take() {
                bar.finish_and_clear();
                if let Some(multi) = &self.multi {
                    multi.remove(&bar);
                }
            }
            if self.style == Style::Lines {
                eprintln!("pull: fetched {} ({})", entry.path, human(entry.size));
            }
        }
    }

    fn bytes(&self) -> u64 {
        let in_files: u64 = self
            .entries
            .lock()
            .map(|e| e.iter().map(|e| e.done.load(Ordering::Relaxed)).sum())
            .unwrap_or(0);
        self.baseline + in_files
    }

    /// Redraws; called by the ticker.
    pub fn tick(&self) {
        let bytes = self.bytes().min(self.total);
        match self.style {
            Style::Bars => {
                if let Ok(entries) = self.entries.lock() {
                    for entry in entries.iter() {
                        if let Some(bar) = &entry.bar {
                            bar.set_position(entry.done.load(Ordering::Relaxed));
                        }
                    }
                }
                if let Some(bar) = &self.total_bar {
                    bar.set_position(bytes);
                }
            }
            Style::Lines => {
                let Ok(mut last) = self.last_line.lock() else {
                    return;
                };
                if last.elapsed() >= Duration::from_secs(5) {
                    *last = Instant::now();
                    let secs = self.started.elapsed().as_secs_f64().max(1e-3);
                    let rate = (bytes.saturating_sub(self.baseline)) as f64 / secs;
                    let percent = if self.total == 0 {
                        100.0
                    } else {
                        bytes as f64 * 100.0 / self.total as f64
                    };
                    eprintln!(
                        "pull: {percent:.0}% {} of {}, {}/s",
                        human(bytes),
                        human(self.total),
                        human(rate as u64)
                    );
                }
            }
            Style::Quiet => {}
        }
    }

    /// Clears the bars.
    pub fn finish(&self) {
        if let Some(bar) = &self.total_bar {
            bar.finish_and_clear();
        }
    }

    /// Runs [`Tracker::tick`] until the returned handle is dropped or aborted.
    pub fn spawn_ticker(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let tracker = self.clone();
        let every = if tracker.style == Style::Bars {
            Duration::from_millis(100)
        } else {
            Duration::from_millis(500)
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                tracker.tick();
            }
        })
    }
}

/// `269.1 MB`.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}
