//! Whether a trial's memory settings can hold the model, as `sous plan` says: a trial
//! that cannot is recorded as unfit instead of started (and left to run out of memory).

use sous_engine::plan::{Hardware, Model, PlanError, plan};
use sous_engine::recipe::Recipe;

/// The model (read once: levers do not change it) and the machine it is planned on.
#[derive(Debug, Clone)]
pub struct Fit {
    model: Model,
    hardware: Hardware,
}

impl Fit {
    /// The fit of `model` on `hardware`.
    pub fn new(model: Model, hardware: Hardware) -> Fit {
        Fit { model, hardware }
    }

    /// Why `recipe` cannot hold the model and one full-length request, if it cannot.
    pub fn unfit(&self, recipe: &Recipe) -> Option<String> {
        match plan(recipe, &self.model, &self.hardware) {
            Ok(p) if p.fits => None,
            Ok(p) => Some(format!(
                "`sous plan` on {}: {} tokens of KV cache, less than one request of max_model_len {}{}",
                p.hardware,
                p.kv_tokens,
                p.max_model_len,
                p.advice.first().map(|a| format!(" ({a})")).unwrap_or_default()
            )),
            Err(PlanError::Native(why)) => Some(format!("`sous plan` on {}: {why}", self.hardware.name)),
            // What the planner does not model is left to the engine.
            Err(_) => None,
        }
    }
}

/// Whether the tune moves a memory setting: the default levers do, and so does any
/// `--lever memory.*`.
pub fn touches_memory(levers: &[String]) -> bool {
    levers.is_empty() || levers.iter().any(|l| l.trim_start().starts_with("memory."))
}
