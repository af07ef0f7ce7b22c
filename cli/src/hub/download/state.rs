//! The resume log beside a partial file: one line `chunk bytes-done` appended per
//! megabyte written, read back as the furthest offset reached in each chunk. Which
//! ranges are still to fetch is decided from it in `download`'s `fetch`.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

pub(super) fn record(log: &Mutex<File>, index: u64, done: u64) {
    if let Ok(mut file) = log.lock() {
        // A failed record only costs re-downloading that megabyte later.
        let _ = writeln!(file, "{index} {done}");
    }
}

pub(super) fn read_state(path: &Path) -> HashMap<u64, u64> {
    let mut done = HashMap::new();
    let Ok(text) = fs::read_to_string(path) else {
        return done;
    };
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if let (Some(Ok(index)), Some(Ok(bytes))) = (
            parts.next().map(str::parse::<u64>),
            parts.next().map(str::parse::<u64>),
        ) {
            let entry = done.entry(index).or_insert(0);
            *entry = (*entry).max(bytes);
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_log_keeps_the_furthest_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        fs::write(&path, "0 1048576\n1 5\n0 2097152\ngarbage\n").expect("write");
        let state = read_state(&path);
        assert_eq!(state.get(&0), Some(&2_097_152));
        assert_eq!(state.get(&1), Some(&5));
    }
}
