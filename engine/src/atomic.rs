//! Making files and directories appear whole or not at all, for everything sous writes
//! that another process may read while it is being written: the Hub cache's refs and
//! markers, `instance.json`, reports, and the model directories `sous quantize` and
//! `sous import` produce.
//!
//! - [`write_file`]: a file written beside its destination under a hidden temporary
//!   name and renamed over it, so a reader sees the old contents or the new, never
//!   half of them.
//! - [`StagingDir`]: a hidden sibling directory `.<name>.sous-tmp-<pid>` that is
//!   filled, then renamed to its destination by [`StagingDir::commit`]; dropped
//!   without a commit (an error, a panic), it is removed. A staging directory left by a
//!   run that was killed is removed by the next run for the same destination once its
//!   process is gone.
//!
//! Both rely on `rename` being atomic within one file system, which is why the temporary
//! always sits in the destination's own directory. Neither syncs the data itself: a
//! crash can lose the newest contents (the next run writes them again) but never
//! leaves a torn file or a half-filled directory under the final name.
//!
//! Not here: what goes into the files, or deciding whether an existing output may be
//! replaced beyond "yes" or "no" (`sous quantize` replaces only its own earlier output,
//! and checks that itself before staging).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// Writes `contents` to `path` through a temporary file in the same directory, then
/// renames it over `path`, replacing what was there. Creates the directory if needed.
/// The file gets the permissions `std::fs::write` gives a new file (0666 less the
/// umask), not the owner-only ones of a usual temporary file: engines in containers
/// read what sous writes. Errors do not name the path; callers add it.
pub fn write_file(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = parent(path);
    fs::create_dir_all(&dir)?;
    let prefix = format!(".{}.", file_name(path));
    let mut file = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(mode(0o666))
        .tempfile_in(&dir)?;
    file.write_all(contents)?;
    // On an error the temporary file is removed when `PersistError` drops it.
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// What [`StagingDir`] does about something already at the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Fail, both when staging starts and at the commit.
    Refuse,
    /// Move it aside at the commit and remove it once the new directory is in place.
    Replace,
}

/// Why a staging directory could not be made or moved into place.
#[derive(Debug, thiserror::Error)]
pub enum AtomicError {
    /// The destination exists and [`Existing::Refuse`] was asked for.
    #[error("{} already exists", path.display())]
    Exists {
        /// The destination.
        path: PathBuf,
    },
    /// The destination has no file name (`/`, `..`).
    #[error("{} cannot be a directory to write (it has no name)", path.display())]
    NoName {
        /// The destination.
        path: PathBuf,
    },
    /// A file-system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path it failed on.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> AtomicError {
    let path = path.to_path_buf();
    move |source| AtomicError::Io { path, source }
}

/// A directory being written beside its destination; removed on drop unless
/// [`StagingDir::commit`] moved it into place.
#[derive(Debug)]
pub struct StagingDir {
    /// Removes itself on drop.
    dir: TempDir,
    dest: PathBuf,
    existing: Existing,
}

impl StagingDir {
    /// Creates `.<name>.sous-tmp-<pid>` beside `dest` (creating `dest`'s parent), after
    /// removing the staging directories that dead runs left for the same destination.
    pub fn create(dest: &Path, existing: Existing) -> Result<StagingDir, AtomicError> {
        if dest.file_name().is_none() {
            return Err(AtomicError::NoName {
                path: dest.to_path_buf(),
            });
        }
        if existing == Existing::Refuse && present(dest) {
            return Err(AtomicError::Exists {
                path: dest.to_path_buf(),
            });
        }
        let parent = parent(dest);
        fs::create_dir_all(&parent).map_err(at(&parent))?;
        let prefix = format!(".{}.sous-tmp-", file_name(dest));
        remove_dead(&parent, &prefix);
        let mine = format!("{prefix}{}", std::process::id());
        // Left by an earlier staging of this process (or of a dead one with our pid).
        let mine_path = parent.join(&mine);
        if present(&mine_path) {
            fs::remove_dir_all(&mine_path).map_err(at(&mine_path))?;
        }
        // A fixed name (no random part) so that the next run can tell, from the pid,
        // whether the process that made it is gone. tempfile's `TempDir` removes it on
        // drop; 0777 less the umask, like `create_dir`, since the directory becomes
        // the output.
        let dir = tempfile::Builder::new()
            .prefix(&mine)
            .rand_bytes(0)
            .permissions(mode(0o777))
            .tempdir_in(&parent)
            .map_err(at(&mine_path))?;
        Ok(StagingDir {
            dir,
            dest: dest.to_path_buf(),
            existing,
        })
    }

    /// Where to write before the commit.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Moves the directory to its destination and returns that path. With
    /// [`Existing::Replace`], what was there is first renamed aside (so the destination
    /// never holds a mix of old and new), then removed; if the final rename fails, it is
    /// put back.
    ///
    /// Written here rather than taken from tempfile: its `TempDir` has no counterpart of
    /// `NamedTempFile::persist`, and `rename` cannot replace a non-empty directory, so
    /// the old one has to be moved out of the way first.
    pub fn commit(self) -> Result<PathBuf, AtomicError> {
        let StagingDir { dir, dest, existing } = self;
        let parent = parent(&dest);
        let old = present(&dest).then(|| aside(&dest));
        if let Some(old) = &old {
            if existing == Existing::Refuse {
                return Err(AtomicError::Exists { path: dest });
            }
            fs::rename(&dest, old).map_err(at(&dest))?;
        }
        if let Err(source) = fs::rename(dir.path(), &dest) {
            if let Some(old) = &old {
                let _ = fs::rename(old, &dest);
            }
            return Err(AtomicError::Io { path: dest, source });
        }
        // The staging path no longer exists; only its removal on drop is left to stop.
        let _ = dir.keep();
        if let Some(old) = old
            && let Err(error) = fs::remove_dir_all(&old)
        {
            // The new directory is in place: the commit succeeded. What is left is a
            // hidden directory, reported rather than turned into a failure.
            tracing::warn!("could not remove the replaced {}: {error}", old.display());
        }
        // The renames are durable once the parent directory is.
        if let Ok(parent) = fs::File::open(&parent) {
            let _ = parent.sync_all();
        }
        Ok(dest)
    }
}

/// Where a replaced destination waits while the new one is renamed in.
fn aside(dest: &Path) -> PathBuf {
    parent(dest).join(format!(".{}.sous-old-{}", file_name(dest), std::process::id()))
}

/// Removes `<prefix><pid>` entries of `parent` whose process no longer exists.
fn remove_dead(parent: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(prefix).and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid > 0 && !alive(pid) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether process `pid` exists (signal 0: no signal is sent, only the check; EPERM
/// means it exists but belongs to someone else).
fn alive(pid: i32) -> bool {
    use nix::errno::Errno;
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(Errno::ESRCH)
    )
}

/// Whether anything, even a dangling symlink, is at `path`.
fn present(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// `path`'s directory; `.` for a bare name.
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `path`'s last component, lossily; empty when it has none.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

fn mode(bits: u32) -> fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    fs::Permissions::from_mode(bits)
}

impl crate::diagnose::Diagnose for AtomicError {
    /// The destination the user chose, its permissions or its disk.
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            AtomicError::Exists { .. } => Some("choose another destination, or allow replacing it".into()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    fn names(dir: &Path) -> std::io::Result<Vec<String>> {
        let mut names: Vec<String> = fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        Ok(names)
    }

    /// Makes `parent/name`, a directory holding one file `file`.
    fn dir_with(parent: &Path, name: &str, file: &str) -> std::io::Result<PathBuf> {
        let dir = parent.join(name);
        fs::create_dir(&dir)?;
        fs::write(dir.join(file), b"0")?;
        Ok(dir)
    }

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_is_left() -> Result {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("refs/main");
        write_file(&path, b"old")?;
        write_file(&path, b"new")?;
        assert_eq!(fs::read(&path)?, b"new");
        assert_eq!(names(&tmp.path().join("refs"))?, ["main"]);
        Ok(())
    }

    #[test]
    fn a_failed_write_leaves_nothing_behind() -> Result {
        let tmp = tempfile::tempdir()?;
        // A directory cannot be replaced by a file: the rename fails.
        let path = dir_with(tmp.path(), "taken", "inside")?;
        assert!(write_file(&path, b"contents").is_err());
        assert_eq!(names(tmp.path())?, ["taken"]);
        assert_eq!(names(&path)?, ["inside"]);
        Ok(())
    }

    #[test]
    fn a_new_file_is_readable_by_others() -> Result {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("instance.json");
        write_file(&path, b"{}")?;
        let plain = tmp.path().join("plain");
        fs::write(&plain, b"{}")?;
        assert_eq!(
            fs::metadata(&path)?.permissions().mode(),
            fs::metadata(&plain)?.permissions().mode()
        );
        Ok(())
    }

    #[test]
    fn a_reader_never_sees_half_a_file() -> Result {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("report.json");
        let a = vec![b'a'; 1 << 20];
        let b = vec![b'b'; 1 << 20];
        write_file(&path, &a)?;
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| -> Result {
            let writer = scope.spawn(|| -> std::io::Result<()> {
                for round in 0..50 {
                    write_file(&path, if round % 2 == 0 { &b } else { &a })?;
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            });
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
                let seen = fs::read(&path)?;
                assert!(seen == a || seen == b, "a read saw {} mixed bytes", seen.len());
                reads += 1;
            }
            writer.join().map_err(|_| "the writer panicked")??;
            Ok(())
        })?;
        Ok(())
    }

    #[test]
    fn a_dropped_staging_directory_leaves_nothing() -> Result {
        let tmp = tempfile::tempdir()?;
        let dest = tmp.path().join("model");
        {
            let staging = StagingDir::create(&dest, Existing::Refuse)?;
            fs::write(staging.path().join("config.json"), b"{}")?;
            assert!(staging.path().starts_with(tmp.path()));
            assert_eq!(
                names(tmp.path())?,
                [format!(".model.sous-tmp-{}", std::process::id())]
            );
            // Dropped here, as when a later step returns an error.
        }
        assert!(names(tmp.path())?.is_empty());
        Ok(())
    }

    #[test]
    fn a_panic_while_staging_leaves_nothing() -> Result {
        let tmp = tempfile::tempdir()?;
        let dest = tmp.path().join("model");
        let panicked = std::panic::catch_unwind(|| {
            let staging = StagingDir::create(&dest, Existing::Replace).expect("staging");
            fs::write(staging.path().join("half"), b"x").expect("write");
            panic!("interrupted");
        });
        assert!(panicked.is_err());
        assert!(names(tmp.path())?.is_empty());
        Ok(())
    }

    #[test]
    fn commit_moves_the_whole_directory_into_place() -> Result {
        let tmp = tempfile::tempdir()?;
        let dest = tmp.path().join("a/b/model");
        let staging = StagingDir::create(&dest, Existing::Refuse)?;
        fs::write(staging.path().join("x"), b"1")?;
        assert!(!dest.exists(), "nothing at the destination before the commit");
        assert_eq!(staging.commit()?, dest);
        assert_eq!(fs::read(dest.join("x"))?, b"1");
        assert_eq!(names(&tmp.path().join("a/b"))?, ["model"]);
        Ok(())
    }

    #[test]
    fn refuse_keeps_an_existing_destination() -> Result {
        let tmp = tempfile::tempdir()?;
        let dest = dir_with(tmp.path(), "model", "old")?;
        assert!(matches!(
            StagingDir::create(&dest, Existing::Refuse),
            Err(AtomicError::Exists { .. })
        ));
        // One that appears while staging is not replaced either.
        fs::remove_dir_all(&dest)?;
        let staging = StagingDir::create(&dest, Existing::Refuse)?;
        fs::write(staging.path().join("new"), b"1")?;
        dir_with(tmp.path(), "model", "old")?;
        assert!(matches!(staging.commit(), Err(AtomicError::Exists { .. })));
        assert_eq!(names(&dest)?, ["old"]);
        assert_eq!(names(tmp.path())?, ["model"]);
        Ok(())
    }

    #[test]
    fn replace_swaps_the_whole_directory() -> Result {
        let tmp = tempfile::tempdir()?;
        let dest = dir_with(tmp.path(), "model", "old")?;
        let staging = StagingDir::create(&dest, Existing::Replace)?;
        fs::write(staging.path().join("new"), b"1")?;
        assert_eq!(
            names(&dest)?,
            ["old"],
            "the old directory is whole until the commit"
        );
        staging.commit()?;
        assert_eq!(names(&dest)?, ["new"], "no mix of old and new");
        assert_eq!(
            names(tmp.path())?,
            ["model"],
            "neither staging nor old directory is left"
        );
        Ok(())
    }

    #[test]
    fn a_dead_runs_staging_directory_is_removed() -> Result {
        let tmp = tempfile::tempdir()?;
        let dest = tmp.path().join("model");
        // A pid above the kernel's limit (4194304) never runs.
        let dead = tmp.path().join(".model.sous-tmp-2147483646");
        fs::create_dir(&dead)?;
        // Another destination's, and a live process's, are left alone.
        let other = tmp.path().join(".other.sous-tmp-2147483646");
        fs::create_dir(&other)?;
        let live = tmp.path().join(".model.sous-tmp-1");
        fs::create_dir(&live)?;
        let staging = StagingDir::create(&dest, Existing::Replace)?;
        assert!(!dead.exists());
        assert!(other.exists() && live.exists());
        drop(staging);
        Ok(())
    }

    #[test]
    fn a_destination_without_a_name_is_refused() {
        assert!(matches!(
            StagingDir::create(Path::new("/"), Existing::Replace),
            Err(AtomicError::NoName { .. })
        ));
    }
}
