//! The tune's journal (`<state>/journal.jsonl`): a header line naming what is tuned
//! (the baseline recipe, the workload, the objective and the levers, as a fingerprint),
//! then one [`Sample`] per measured run, appended and flushed as each run ends. A tune
//! killed at any point loses at most the run it was measuring; started again with the
//! same settings it reads the journal and measures only what is missing. A journal of
//! other settings is refused rather than mixed in.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Sample;

/// The journal's first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// What the samples were measured for (hash of baseline, workload, objective, levers).
    pub fingerprint: String,
    /// The same, for people.
    pub describes: String,
}

/// Why the journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Reading or writing it failed.
    #[error("{action} the tune journal `{}`", path.display())]
    Io {
        /// What sous was doing.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It records another tune.
    #[error("`{}` records another tune ({theirs}), not this one ({ours})", path.display())]
    Other {
        /// The file.
        path: PathBuf,
        /// What it records.
        theirs: String,
        /// What this tune is.
        ours: String,
    },
}

impl sous_engine::diagnose::Diagnose for JournalError {
    fn class(&self) -> sous_engine::diagnose::Class {
        sous_engine::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            JournalError::Other { .. } => {
                Some("pass --fresh to start over (the old journal is removed), or another --out".into())
            }
            JournalError::Io { .. } => None,
        }
    }
}

/// An open journal.
pub struct Journal {
    path: PathBuf,
    file: File,
    /// The samples recorded so far, earlier tunes' included.
    pub samples: Vec<Sample>,
}

impl Journal {
    /// Opens the journal at `path` for `header`, reading what an earlier run of the same
    /// tune recorded; `fresh` starts over.
    pub fn open(path: &Path, header: &Header, fresh: bool) -> Result<Journal, JournalError> {
        let io = |action: &'static str| {
            let path = path.to_path_buf();
            move |source| JournalError::Io { action, path, source }
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("creating the directory of"))?;
        }
        if fresh {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("removing")(e)),
            }
        }
        let mut samples = Vec::new();
        let mut has_header = false;
        if let Ok(file) = File::open(path) {
            let mut lines = BufReader::new(file).lines();
            if let Some(first) = lines.next() {
                let first = first.map_err(io("reading"))?;
                match serde_json::from_str::<Header>(&first) {
                    Ok(theirs) if theirs.fingerprint == header.fingerprint => has_header = true,
                    Ok(theirs) => {
                        return Err(JournalError::Other {
                            path: path.to_path_buf(),
                            theirs: theirs.describes,
                            ours: header.describes.clone(),
                        });
                    }
                    // A header cut short by a kill: nothing was measured yet.
                    Err(_) => {}
                }
            }
            for line in lines {
                let line = line.map_err(io("reading"))?;
                // The last line may be cut short by a kill: it is measured again.
                if let Ok(sample) = serde_json::from_str::<Sample>(&line) {
                    samples.push(sample);
                }
            }
        }
        if !has_header {
            samples.clear();
            let mut file = File::create(path).map_err(io("creating"))?;
            let line = serde_json::to_string(header).map_err(|e| io("writing")(std::io::Error::other(e)))?;
            writeln!(file, "{line}").map_err(io("writing"))?;
            file.sync_data().map_err(io("writing"))?;
        } else {
            // Rewrite without a torn last line, so that appends start on a line of their own.
            let mut text =
                serde_json::to_string(header).map_err(|e| io("writing")(std::io::Error::other(e)))?;
            text.push('\n');
            for s in &samples {
                text.push_str(
                    &serde_json::to_string(s).map_err(|e| io("writing")(std::io::Error::other(e)))?,
                );
                text.push('\n');
            }
            sous_engine::atomic::write_file(path, text.as_bytes()).map_err(io("writing"))?;
        }
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(io("opening"))?;
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            samples,
        })
    }

    /// Whether run `run` of `trial` is recorded.
    pub fn has(&self, trial: &str, run: usize) -> bool {
        self.samples.iter().any(|s| s.trial == trial && s.run == run)
    }

    /// Records a sample, on disk before it returns.
    pub fn record(&mut self, sample: Sample) -> Result<(), JournalError> {
        let line = serde_json::to_string(&sample).map_err(|e| JournalError::Io {
            action: "writing",
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        let io = |source| JournalError::Io {
            action: "writing",
            path: self.path.clone(),
            source,
        };
        writeln!(self.file, "{line}").map_err(io)?;
        self.file.sync_data().map_err(|source| JournalError::Io {
            action: "writing",
            path: self.path.clone(),
            source,
        })?;
        self.samples.push(sample);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::Outcome;
    use super::*;

    fn header(f: &str) -> Header {
        Header {
            fingerprint: f.into(),
            describes: format!("tune {f}"),
        }
    }

    fn sample(run: usize) -> Sample {
        Sample {
            trial: "baseline".into(),
            run,
            outcome: Outcome::Ok,
            value: Some(1.0),
            message: None,
            figures: BTreeMap::new(),
        }
    }

    #[test]
    fn a_journal_resumes_survives_a_torn_line_and_refuses_another_tune() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t/journal.jsonl");
        let mut j = Journal::open(&path, &header("a"), false).expect("open");
        j.record(sample(0)).expect("record");
        j.record(sample(1)).expect("record");
        drop(j);
        // A kill in the middle of a line.
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        write!(f, "{{\"trial\":\"base").expect("write");
        drop(f);
        let mut j = Journal::open(&path, &header("a"), false).expect("reopen");
        assert_eq!(j.samples.len(), 2);
        assert!(j.has("baseline", 1) && !j.has("baseline", 2));
        j.record(sample(2)).expect("record");
        drop(j);
        let j = Journal::open(&path, &header("a"), false).expect("reopen");
        assert_eq!(j.samples.len(), 3);
        assert!(matches!(
            Journal::open(&path, &header("b"), false),
            Err(JournalError::Other { .. })
        ));
        let j = Journal::open(&path, &header("b"), true).expect("fresh");
        assert!(j.samples.is_empty());
    }
}
