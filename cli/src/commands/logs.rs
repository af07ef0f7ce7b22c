//! `sous logs NAME [-f] [--tail N]`: an instance's engine log (`<state>/NAME/engine.log`,
//! appended by every `sous serve` of the recipe), followed like `docker logs -f`: new
//! lines as they are written, until the instance's `sous serve` ends or Ctrl-C.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sous::instances::{self, Entry};
use sous_engine::paths;
use sous_engine::serve::instance;

use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  sous logs smollm2-135m --tail 50\n  sous logs -f smollm2-135m")]
pub struct LogsArgs {
    /// The instance: its recipe's name (`sous ps` lists them).
    name: String,
    /// Keep printing new lines until the instance stops (or Ctrl-C).
    #[arg(long, short = 'f')]
    follow: bool,
    /// Print only the last N lines first.
    #[arg(long, short = 'n', value_name = "N")]
    tail: Option<usize>,
}

/// How often a followed log is read again.
const POLL: Duration = Duration::from_millis(200);

pub fn exec(args: LogsArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let entry = instances::find(&paths::state_dir(), &args.name)?;
    let path = entry.log();
    let mut offset = match File::open(&path) {
        Ok(mut file) => {
            let start = match args.tail {
                Some(n) => tail_start(&mut file, n).with_context(|| format!("reading {}", path.display()))?,
                None => 0,
            };
            copy_from(&path, start, shell)?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.follow => 0,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            shell.status(
                "empty",
                &format!("`{}` has no engine log yet ({})", args.name, path.display()),
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if args.follow {
        follow(&entry, &path, &mut offset, shell)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the log from `offset` to its end, returning the new end.
fn copy_from(path: &Path, offset: u64, shell: &Shell) -> anyhow::Result<u64> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let len = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    // Truncated or replaced since the last read: start over.
    let offset = if len < offset { 0 } else { offset };
    file.seek(SeekFrom::Start(offset))
        .with_context(|| format!("reading {}", path.display()))?;
    let mut buffer = vec![0u8; 64 * 1024];
    let mut at = offset;
    loop {
        let n = file
            .read(&mut buffer)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(at);
        }
        shell.raw(&buffer[..n])?;
        at += n as u64;
    }
}

/// Follows the log while the instance's `sous serve` (the last one seen) is alive.
fn follow(entry: &Entry, path: &Path, offset: &mut u64, shell: &Shell) -> anyhow::Result<()> {
    let mut supervisor = entry.live().cloned();
    let mut checked = Instant::now();
    loop {
        let before = *offset;
        *offset = copy_from(path, *offset, shell)?;
        if *offset == before && checked.elapsed() >= Duration::from_secs(1) {
            checked = Instant::now();
            // A restart or `serve --replace` writes a new record: follow that one.
            if let Ok(Some(state)) = instance::read_live(&entry.dir) {
                supervisor = Some(state);
            } else if supervisor.as_ref().is_none_or(|s| !s.alive()) {
                // Whatever the engine wrote while stopping.
                copy_from(path, *offset, shell)?;
                return Ok(());
            }
        }
        std::thread::sleep(POLL);
    }
}

/// The offset of the last `lines` lines of `file`, reading backwards from its end.
fn tail_start(file: &mut File, lines: usize) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    if lines == 0 {
        return Ok(len);
    }
    let mut end = len;
    let mut newlines = 0;
    let mut buffer = vec![0u8; 64 * 1024];
    // A final newline ends the last line rather than starting an empty one.
    let mut skip_last = true;
    while end > 0 {
        let start = end.saturating_sub(buffer.len() as u64);
        let chunk = &mut buffer[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        for (i, byte) in chunk.iter().enumerate().rev() {
            if *byte != b'\n' {
                skip_last = false;
                continue;
            }
            if skip_last {
                skip_last = false;
                continue;
            }
            newlines += 1;
            if newlines == lines {
                return Ok(start + i as u64 + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(text: &str, n: usize) -> String {
        let mut file = tempfile::tempfile().expect("tempfile");
        std::io::Write::write_all(&mut file, text.as_bytes()).expect("write");
        let start = tail_start(&mut file, n).expect("tail") as usize;
        text[start..].to_owned()
    }

    #[test]
    fn tail_counts_lines_from_the_end() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a\nb\nc\n", 9), "a\nb\nc\n");
        assert_eq!(tail("a\nb\n", 0), "");
        assert_eq!(tail("", 3), "");
        let long: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(tail(&long, 2), "line 99998\nline 99999\n");
    }
}
