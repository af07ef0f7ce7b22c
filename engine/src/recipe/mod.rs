//! Recipes: the TOML a user writes ([`RecipeFile`]), how layers of it are loaded and
//! merged (`load`), and the checked result every other part of sous works from
//! ([`Recipe`]). Nothing here starts or renders an engine; that is `launch`.

mod error;
mod file;
mod load;
mod resolve;
pub mod schema;

pub use crate::size::{ByteSize, ByteSizeError};
pub use error::{At, Location, RecipeError, closest};
pub use file::{
    AccessMode, CalibrationFormat, DeploySection, EmbeddingDtype, EngineKind, EngineSection, KvCacheDtype,
    MemorySection, ModelDtype, ModelSection, QuantFormat, QuantScheme, QuantizeSection, RecipeFile,
    RouterKind, RouterPolicy, RouterSection, Runtime, ServerSection, ServingSection, SpeculativeSection,
    StartupProbeSection, StorageSection, TolerationSection,
};
pub use load::{ENV_PREFIX, Overrides, Provenance};
pub use resolve::{
    Calibration, CalibrationText, DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SEQ_LEN,
    DEFAULT_CONTAINER_NAME, DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_REVISION,
    DEFAULT_SHM_SIZE, DEFAULT_STARTUP_PERIOD, Deploy, Engine, Memory, Model, QuantDevice, Quantity, Quantize,
    RESTART_WINDOW, Recipe, Router, SGLANG_ROUTER_VERSION, Server, Storage, VLLM_ROUTER_VERSION, Warning,
    default_router, default_sous_image, host_weight_glob, is_dns_label, is_dns_subdomain, is_host_weight,
    is_label_value, is_mtp, is_qualified_name,
};

use std::path::Path;

/// A resolved recipe and what it was built from.
#[derive(Debug)]
pub struct Loaded {
    /// The recipe.
    pub recipe: Recipe,
    /// Legal but suspicious settings.
    pub warnings: Vec<Warning>,
    /// The layers, to locate values in later messages.
    pub provenance: Provenance,
}

/// Loads the recipe at `path` with its `extends` chain and `overrides`, and resolves it.
pub fn load(path: &Path, overrides: &Overrides) -> Result<Loaded, RecipeError> {
    let (raw, provenance) = load::load_layers(path, overrides)?;
    let (recipe, warnings) = resolve::resolve(raw, &provenance)?;
    Ok(Loaded {
        recipe,
        warnings,
        provenance,
    })
}
