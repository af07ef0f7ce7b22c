//! Which errors sous knows how to diagnose. Every error type of the library and of
//! `sous-engine` implements [`Diagnose`] next to its definition (its exit class and
//! hint); [`diagnosis`] finds that implementation for an error met in an `anyhow`
//! chain, which Rust can only do type by type, so the types are listed once, here.
//!
//! A new error type implements [`Diagnose`] and joins the list; the binary's
//! `failure` module renders what this finds. Nothing in the library imports this list
//! (it names every module's errors); an error told on one line is [`crate::chain`].

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
