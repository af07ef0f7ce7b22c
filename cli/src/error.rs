//! Which errors sous knows how to diagnose. Every error type of the library and of
//! `sous-engine` implements [`Diagnose`] next to its definition (its exit class and
//! hint); [`diagnosis`] finds that implementation for an error met in an `anyhow`
//! chain, which Rust can only do type by type, so the types are listed once, here.
//!
//! A new error type implements [`Diagnose`] and joins the list; the binary's
//! `failure` module renders what this finds. [`message`] is an error chain on one line,
//! for the terminal and for what the library records (a failed trial's journal entry).

use std::error::Error;

pub use sous_engine::diagnose::{Class, Diagnose};

/// The [`Diagnose`] implementation of `cause`, if it is one of sous's error types.
pub fn diagnosis<'a>(cause: &'a (dyn Error + 'static)) -> Option<&'a dyn Diagnose> {
    macro_rules! known {
        ($($ty:ty),+ $(,)?) => {
            $(
                if let Some(e) = cause.downcast_ref::<$ty>() {
                    return Some(e);
                }
            )+
        };
    }
    known![
        sous_engine::recipe::RecipeError,
        sous_engine::launch::RenderError,
        sous_engine::serve::ServeError,
        sous_engine::serve::instance::InstanceError,
        sous_engine::native::NativeError,
        sous_engine::chat::ChatError,
        sous_engine::size::ByteSizeError,
        sous_engine::version::VersionError,
        sous_engine::repo::RepoIdError,
        sous_engine::atomic::AtomicError,
        sous_engine::checkpoint::index::IndexError,
        crate::pipeline::PipelineError,
        crate::deploy::DeployError,
        crate::plan::ModelError,
        sous_engine::plan::PlanError,
        sous_engine::plan::HardwareError,
        crate::hub::api::HubError,
        crate::hub::pull::PullError,
        crate::hub::download::DownloadError,
        crate::hub::select::GlobError,
        crate::quantize::QuantizeError,
        crate::import::ImportError,
        crate::bench::BenchError,
        crate::served::ServedError,
        crate::eval::EvalError,
        crate::bench::logs::LogsError,
        crate::bench::scrape::ScrapeError,
        crate::instances::InstancesError,
        crate::inventory::InventoryError,
        crate::tune::journal::JournalError,
        crate::tune::search::SearchError,
        crate::tune::gate::GateError,
        crate::tune::LeverError,
        crate::tune::run::TuneError,
    ];
    None
}

/// The chain on one line, "loading x: cannot read y: No such file", each cause once:
/// errors that already print their source (`{path}: {source}`) are not repeated.
pub fn message(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct Read {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let err = anyhow::Error::new(Read {
            path: "x",
            source: io,
        })
        .context("loading y");
        assert_eq!(message(&err), "loading y: cannot read x: No such file");
    }
}
