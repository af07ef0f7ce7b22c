//! The transfer progress of a pull: downloads only bump atomic counters (bytes
//! written and bytes verified, per file in flight), and a ticker task hands them to
//! the [`Reporter`]'s progress handles ten times a second, so reporting never slows
//! the transfer. The bar shows the download and its rate; its note, what is verified
//! and at what rate, so a user sees which of the two bounds the pull.
//!
//! Not here: how progress looks (the binary's shell draws it).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sous_engine::reporter::{Progress, Reporter, Task};
use sous_engine::size::human;

/// How often the counters are handed on.
const TICK: Duration = Duration::from_millis(100);

use super::download::Counters;

struct Entry {
    path: String,
    size: u64,
    counters: Counters,
    part: Option<Box<dyn Progress>>,
}

/// The progress of one pull.
pub struct Tracker {
    total: Box<dyn Progress>,
    baseline: u64,
    started: Instant,
    entries: Mutex<Vec<Entry>>,
}

impl Tracker {
    /// Starts tracking `total` bytes, of which `already` are on disk.
    pub fn new(reporter: &dyn Reporter, total: u64, already: u64) -> Arc<Tracker> {
        let progress = reporter.progress(Task::bytes("pull", total));
        progress.set(already);
        Arc::new(Tracker {
            total: progress,
            baseline: already,
            started: Instant::now(),
            entries: Mutex::new(Vec::new()),
        })
    }

    /// Registers a file being fetched; returns the counters its download bumps.
    pub fn file(&self, path: &str, size: u64) -> Counters {
        let counters = Counters::default();
        let part = self.total.part(Task::bytes(path, size));
        if let Ok(mut entries) = self.entries.lock() {
            entries.push(Entry {
                path: path.to_owned(),
                size,
                counters: counters.clone(),
                part: Some(part),
            });
        }
        counters
    }

    /// Marks a file finished.
    pub fn finish_file(&self, path: &str) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if let Some(entry) = entries.iter_mut().find(|e| e.path == path) {
            entry.counters.written.store(entry.size, Ordering::Relaxed);
            entry.counters.verified.store(entry.size, Ordering::Relaxed);
            if let Some(part) = entry.part.take() {
                part.finish(Some(&format!("fetched {} ({})", entry.path, human(entry.size))));
            }
        }
    }

    /// Hands the counters on; called by the ticker.
    pub fn tick(&self) {
        let Ok(entries) = self.entries.lock() else {
            return;
        };
        let mut in_files = 0;
        let mut verified = 0;
        for entry in entries.iter() {
            let done = entry.counters.written.load(Ordering::Relaxed);
            verified += entry.counters.verified.load(Ordering::Relaxed);
            in_files += done;
            if let Some(part) = &entry.part {
                part.set(done);
            }
        }
        self.total.set(self.baseline + in_files);
        if verified > 0 {
            let rate = verified as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
            self.total.note(&format!(
                "verified {} ({}/s)",
                human(verified),
                human(rate as u64)
            ));
        }
    }

    /// Ends the display of the pull.
    pub fn finish(&self) {
        self.tick();
        self.total.finish(None);
    }

    /// Runs [`Tracker::tick`] until the returned handle is dropped or aborted.
    pub fn spawn_ticker(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let tracker = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(TICK).await;
                tracker.tick();
            }
        })
    }
}
