//! The Hugging Face Hub: `sous pull` (a fast, resumable, verified downloader into the
//! shared Hub cache) and `sous hub serve` (a local read-only mirror).
//!
//! - `config`: endpoint, token and cache directory from the environment.
//! - `api`: the HTTP API and its errors.
//! - `cache`: the cache layout shared with huggingface_hub, and the completion marker.
//! - `select`: which files a pull takes.
//! - `download`: one file, in parallel ranges, resumable and verified.
//! - `pull`: a whole pull.
//! - `transfer`: the progress of a pull's transfers, handed to the reporter.
//! - `mirror`: the mirror server.

pub mod api;
pub mod cache;
pub mod config;
pub mod download;
pub mod mirror;
pub mod pull;
pub mod select;
pub mod transfer;
