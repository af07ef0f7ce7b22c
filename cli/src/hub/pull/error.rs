//! Why a pull fails ([`PullError`]) and how each failure is diagnosed: whose fault it
//! is and what to try next. Not here: the pull itself ([`super`]).

use std::path::{Path, PathBuf};

use sous_engine::diagnose::{Class, Diagnose, user_unless};
use sous_engine::size::human;

use crate::hub::api::HubError;
use crate::hub::download::{self, DISK_FULL, DownloadError, io_is_internal};
use crate::hub::select::GlobError;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The Hub said no, or could not be reached.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// A file could not be fetched or verified.
    #[error(transparent)]
    Download(#[from] DownloadError),
    /// A bad `--include` / `--exclude`.
    #[error(transparent)]
    Glob(#[from] GlobError),
    /// The selection matched nothing.
    #[error("no file of `{repo}` at {commit} matches the selection")]
    NothingSelected {
        /// Repository.
        repo: String,
        /// Commit.
        commit: String,
    },
    /// Not enough free space for what must be downloaded.
    #[error("not enough disk space in `{}`: the pull needs {} more, {} is free", path.display(), human(*needed), human(*available))]
    DiskFull {
        /// Where the files go.
        path: PathBuf,
        /// Bytes to download.
        needed: u64,
        /// Bytes free.
        available: u64,
    },
    /// Offline, and the cache does not hold the revision.
    #[error("`{repo}` at `{revision}` is not in the cache, and the pull is offline")]
    NotCached {
        /// Repository.
        repo: String,
        /// Revision.
        revision: String,
    },
    /// `SOUS_VERIFY` names no verification sous knows.
    #[error("{0}")]
    Verify(String),
    /// `SOUS_PULL_IO` names no way of writing sous knows.
    #[error("{0}")]
    WriteMode(String),
    /// A local file operation failed.
    #[error("{action} `{}`", path.display())]
    Io {
        /// What sous was doing.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl PullError {
    pub(super) fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PullError + use<> {
        let path = path.to_path_buf();
        move |source| PullError::Io { action, path, source }
    }
}

impl Diagnose for PullError {
    /// sous is at fault (exit code 2) only for a local I/O error it cannot explain;
    /// the input, the network or the machine otherwise (exit code 1).
    fn class(&self) -> Class {
        match self {
            PullError::Io { source, .. } => user_unless(io_is_internal(source)),
            PullError::Download(e) => e.class(),
            _ => Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            PullError::Hub(e) => e.hint(),
            PullError::Download(e) => e.hint(),
            PullError::Io { source, .. } if source.raw_os_error() == Some(28) => Some(DISK_FULL.into()),
            PullError::NothingSelected { .. } => Some("check `--include` / `--exclude`".into()),
            PullError::DiskFull { .. } => {
                Some("free space, or pull elsewhere with HF_HUB_CACHE or --local-dir".into())
            }
            PullError::NotCached { .. } => {
                Some("run the pull once with the network (without --offline / HF_HUB_OFFLINE)".into())
            }
            PullError::Verify(_) => Some(format!("unset {} or set it to `auto`", download::VERIFY_ENV)),
            PullError::WriteMode(_) => Some(format!("unset {} or set it to `auto`", download::IO_ENV)),
            _ => None,
        }
    }
}
