//! The build step: makes sure what a recipe serves is on disk. Pulls the model when
//! the recipe names a Hub repository and the pull is not complete yet; then, with
//! `[quantize]`, quantizes it unless an up-to-date checkpoint of the same source
//! commit, settings and sous version exists; for the native engine, resolves its
//! settings once (refusing what it would refuse at start-up), checks that it will load
//! the result and predicts its KV capacity from those settings. Every step is a no-op
//! when already done.
//!
//! The recipe is never changed: what the build made is returned beside it in
//! [`Built`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};
use sous_engine::launch::{self, RenderContext};
use sous_engine::native::Settings;
use sous_engine::native::config::ModelConfig;
use sous_engine::recipe::{DEFAULT_REVISION, EngineKind, Recipe, Runtime};
use sous_engine::reporter::Reporter;
use sous_engine::serve::logscan::{Phase, PhaseTime};

use super::{PipelineError, Setup};
use crate::hub::api::HubClient;
use crate::hub::pull::{DEFAULT_CONNECTIONS, PullError, PullReport, PullRequest, pull};
use crate::quantize::{self, ModelOptExport, Provenance};

/// A recipe and what its build step made.
#[derive(Debug, Clone)]
pub struct Built {
    /// The recipe, as resolved.
    pub recipe: Recipe,
    /// What the engine serves.
    pub weights: Weights,
    /// The native engine's settings, resolved once from the recipe (which keys it
    /// refuses, its KV dtype and budget), for a native recipe; the plan's prediction
    /// below is made from them.
    pub native: Option<Settings>,
    /// The KV tokens `sous plan` predicts, where it can (the native engine).
    pub planned_kv_tokens: Option<u64>,
    /// How long the pull and the quantization took (finding them up to date included).
    pub phases: Vec<PhaseTime>,
}

/// The model on disk after the build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights {
    /// Where it is: the pulled snapshot, the recipe's local path, or the quantized
    /// checkpoint.
    pub dir: PathBuf,
    /// Whether the engine is given `dir` instead of the recipe's model as written: a
    /// quantized checkpoint exists only there, and the native engine reads files; an
    /// engine given a Hub id finds the pulled files in the Hub cache itself.
    pub given_to_engine: bool,
    /// The Hub repository and commit the weights come from, when known.
    pub provenance: Option<Provenance>,
}

impl Built {
    /// Where the engine keeps its files and what it serves.
    pub fn render_context(&self, setup: &Setup) -> RenderContext {
        let weights = self.weights.given_to_engine.then(|| self.weights.dir.clone());
        setup.render_context(&self.recipe, weights)
    }

    /// The hash of the recipe as the engine serves it, which `--replace` compares to
    /// tell an unchanged recipe from a changed one. `[deploy]` is not part of it: it
    /// changes nothing `sous serve` runs.
    pub fn hash(&self, setup: &Setup) -> Result<String, PipelineError> {
        let served = launch::served_recipe(&self.recipe, &self.render_context(setup));
        let mut file = served.to_file();
        file.deploy = Default::default();
        let toml = toml::to_string(&file)?;
        Ok(hex::encode(Sha256::digest(toml.as_bytes())))
    }
}

/// Builds what `recipe` serves. With `no_build`, nothing is pulled or quantized: what
/// is on disk is used as it is, and its absence is an error.
pub async fn build(
    recipe: &Recipe,
    setup: &Setup,
    no_build: bool,
    reporter: &Arc<dyn Reporter>,
) -> Result<Built, PipelineError> {
    let started = Instant::now();
    let (source, provenance) = fetch(recipe, setup, no_build, reporter.as_ref()).await?;
    // A model on the Hub is pulled or found up to date; a local path is taken as it is.
    let mut phases = Vec::new();
    if recipe.model.repo.is_some() {
        phases.push(PhaseTime {
            phase: Phase::Pull,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let started = Instant::now();
    let dir = match &recipe.quantize {
        None => source,
        Some(_) if no_build => {
            // Serve the checkpoint there is, without checking it against the recipe.
            let out = setup.quantized_dir(recipe);
            if !out.join(quantize::MARKER).is_file() {
                return Err(PipelineError::NotQuantized(out));
            }
            reporter.status(
                "quantized",
                &format!("{} (not rebuilt: --no-build)", out.display()),
            );
            out
        }
        Some(q) => {
            let request = quantize::Request {
                source,
                out: setup.quantized_dir(recipe),
                scheme: q.scheme,
                format: q.format,
                modelopt_export: ModelOptExport::Gpu,
                ignore: q.ignore.clone(),
                max_shard_bytes: quantize::DEFAULT_MAX_SHARD_BYTES,
                force: true,
                digests: false,
                provenance: provenance.clone(),
                window_bytes: quantize::DEFAULT_WINDOW,
                calibration: q
                    .calibration
                    .as_ref()
                    .map(quantize::CalibrationSet::load)
                    .transpose()?,
                device: q.device,
                linear_attention: false,
            };
            let worker = reporter.clone();
            let summary = tokio::task::spawn_blocking(move || quantize::run(&request, worker.as_ref()))
                .await
                .map_err(|_| PipelineError::Thread("quantization"))??;
            if summary.up_to_date {
                reporter.status(
                    "quantized",
                    &format!("{} is up to date", summary.output.display()),
                );
            } else {
                reporter.status(
                    "quantized",
                    &format!(
                        "{} weights to {} in {:.1} s",
                        summary.quantized,
                        summary.output.display(),
                        summary.seconds
                    ),
                );
            }
            summary.output
        }
    };
    if recipe.quantize.is_some() {
        phases.push(PhaseTime {
            phase: Phase::Quantize,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let native = match recipe.engine.kind {
        EngineKind::Native => {
            // What the engine process would refuse, refused before anything starts.
            let settings = Settings::from_recipe(recipe, &dir)?;
            ModelConfig::read(&dir)?;
            Some(settings)
        }
        _ => None,
    };
    let planned_kv_tokens = native
        .as_ref()
        .and_then(|settings| crate::plan::predicted_native_tokens(recipe, settings));
    Ok(Built {
        recipe: recipe.clone(),
        planned_kv_tokens,
        phases,
        weights: Weights {
            dir,
            given_to_engine: recipe.quantize.is_some() || native.is_some(),
            provenance,
        },
        native,
    })
}

/// Pulls the recipe's model if needed; returns its directory and, for a Hub model,
/// where it came from.
async fn fetch(
    recipe: &Recipe,
    setup: &Setup,
    no_build: bool,
    reporter: &dyn Reporter,
) -> Result<(PathBuf, Option<Provenance>), PipelineError> {
    let Some(repo) = &recipe.model.repo else {
        let path = recipe.model.path.as_deref().unwrap_or_default();
        if recipe.engine.runtime == Runtime::Host && !Path::new(path).exists() {
            return Err(PipelineError::MissingPath(path.to_owned()));
        }
        return Ok((PathBuf::from(path), None));
    };
    let request = PullRequest {
        repo: repo.clone(),
        revision: recipe
            .model
            .revision
            .clone()
            .unwrap_or_else(|| DEFAULT_REVISION.to_owned()),
        include: Vec::new(),
        exclude: Vec::new(),
        local_dir: recipe.model.path.as_ref().map(PathBuf::from),
        offline: no_build || setup.hub.offline,
        connections: DEFAULT_CONNECTIONS,
    };
    let client = HubClient::new(setup.hub.clone())?;
    let provenance = |report: &PullReport| {
        Some(Provenance {
            repo: Some(repo.to_string()),
            commit: Some(report.commit.clone()),
        })
    };
    match pull(&client, &request, reporter).await {
        Ok(report) => {
            if report.up_to_date {
                reporter.status("model", &format!("{repo} is on disk ({})", report.path.display()));
            } else {
                reporter.status("pulled", &format!("{repo} into {}", report.path.display()));
            }
            Ok((report.path.clone(), provenance(&report)))
        }
        Err(PullError::NotCached { .. }) if no_build => Err(PipelineError::NotPulled(repo.clone())),
        Err(source) => Err(PipelineError::Pull {
            repo: repo.clone(),
            source: Box::new(source),
        }),
    }
}
