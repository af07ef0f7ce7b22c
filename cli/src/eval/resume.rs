//! What an interrupted eval keeps: the windows a server has scored, one JSON line each,
//! appended as they come, under sous's state directory in a file named after everything
//! the scores depend on (the server, the model, the text's tokens, the cut and k). The
//! same command run again reads them and scores only the rest; a completed run removes
//! its file. A line cut short by a kill is ignored.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::EvalError;
use super::quality::Position;

/// One scored window, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    window: usize,
    positions: Vec<Position>,
}

/// The saved scores of one side of an eval.
#[derive(Debug, Clone)]
pub struct Saved {
    path: PathBuf,
}

impl Saved {
    /// The file for `identity` (any text that changes when the scores would) in `dir`.
    pub fn new(dir: &Path, identity: &str) -> Saved {
        let digest = sha2::Sha256::digest(identity.as_bytes());
        Saved {
            path: dir.join(format!("{}.jsonl", &hex::encode(digest)[..16])),
        }
    }

    /// Where it lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The windows already scored, by index.
    pub fn load(&self) -> Result<Vec<Option<Vec<Position>>>, EvalError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(EvalError::State {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let mut out: Vec<Option<Vec<Position>>> = Vec::new();
        for line in text.lines() {
            // A line cut short by a kill is the last one; it is scored again.
            let Ok(line) = serde_json::from_str::<Line>(line) else {
                continue;
            };
            if out.len() <= line.window {
                out.resize(line.window + 1, None);
            }
            out[line.window] = Some(line.positions);
        }
        Ok(out)
    }

    /// Appends one scored window, on disk before it returns.
    pub fn append(&self, window: usize, positions: &[Position]) -> Result<(), EvalError> {
        let fail = |source| EvalError::State {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        let mut line = serde_json::to_string(&Line {
            window,
            positions: positions.to_vec(),
        })
        .map_err(|e| fail(std::io::Error::other(e)))?;
        line.push('\n');
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(fail)?;
        file.write_all(line.as_bytes()).map_err(fail)?;
        file.sync_data().map_err(fail)
    }

    /// Forgets the scores (a completed run, or `--fresh`).
    pub fn remove(&self) -> Result<(), EvalError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(EvalError::State {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_survive_and_a_torn_line_is_dropped() {
        let dir = tempfile::tempdir().expect("tmp");
        let saved = Saved::new(dir.path(), "server a, text b");
        assert!(saved.load().expect("empty").is_empty());
        let p = Position {
            token: 3,
            logprob: -1.25,
            top: vec![(3, -1.25), (4, -2.0)],
        };
        saved.append(1, std::slice::from_ref(&p)).expect("append");
        // A write cut short.
        std::fs::OpenOptions::new()
            .append(true)
            .open(saved.path())
            .and_then(|mut f| f.write_all(b"{\"window\": 0, \"posi"))
            .expect("torn");
        let loaded = saved.load().expect("load");
        assert_eq!(loaded.len(), 2);
        assert!(loaded[0].is_none());
        assert_eq!(loaded[1].as_deref(), Some(&[p][..]));
        assert_ne!(Saved::new(dir.path(), "server a, text c").path(), saved.path());
        saved.remove().expect("remove");
        assert!(saved.load().expect("gone").is_empty());
    }
}
