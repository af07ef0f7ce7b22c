//! `sous tune` without a terminal. Its reasoning and its search need no server: which
//! levers to try ([`Lever`], [`default_levers`]) and the trials they make ([`Trial`],
//! one lever at a time from the baseline, then the best combination); the loop that
//! decides which trial runs next and how often ([`search`], driven through its `Bench`
//! trait); what each measured run recorded ([`Sample`], kept in a [`journal`] so an
//! interrupted tune resumes); how trials compare (a mean and its 95 % confidence
//! interval, [`Estimate`], and the [`Verdict`]); the memory [`fit`] and quality
//! [`gate`] that keep a trial from being started or chosen; and what comes out: the
//! tuned recipe that `extends` the baseline ([`tuned_recipe`]), the [`table`] and the
//! [`chart`]. The whole tune ([`run`]) serves each trial through the pipeline and
//! measures it with `sous::bench` (the search's `Bench`), then writes the report and
//! the tuned recipe.
//!
//! Not here: flags, or printing (the `tune` command).
//!
//! The search is the one the DGX Spark field report did by hand, and the one vLLM's
//! `benchmarks/auto_tune/` does for two scheduler settings: change one thing, measure
//! it against the same seeded workload, keep what helped. A lever *helped* only when its
//! interval lies wholly on the better side of the baseline's: a difference the runs
//! cannot tell from noise is not kept.

pub mod chart;
pub mod fit;
pub mod gate;
pub mod journal;
pub mod options;
mod recipe;
pub mod run;
mod sample;
pub mod search;
mod table;
mod trials;
mod verdict;
pub mod workload;

pub use recipe::{TunedRecipe, evidence, fallback, relative_extends, tuned_recipe};
pub use sample::{Outcome, Sample};
pub use table::table;
pub use verdict::{Estimate, TrialResult, Verdict, change, combination, judge, result};

use serde::{Deserialize, Serialize};
use sous_engine::recipe::{EngineKind, ModelDtype, Recipe};

/// What a tune maximizes (or, for TPOT, minimizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Output tokens per second, all requests together.
    OutputThroughput,
    /// Requests meeting the SLO, per second (needs `--slo`).
    Goodput,
    /// Median time per output token (lower is better).
    Tpot,
}

impl Objective {
    /// The key in reports.
    pub fn key(self) -> &'static str {
        match self {
            Objective::OutputThroughput => "output_throughput",
            Objective::Goodput => "request_goodput",
            Objective::Tpot => "median_tpot_ms",
        }
    }

    /// Its unit.
    pub fn unit(self) -> &'static str {
        match self {
            Objective::OutputThroughput => "tok/s",
            Objective::Goodput => "req/s",
            Objective::Tpot => "ms",
        }
    }

    /// Whether a higher value is better.
    pub fn higher_is_better(self) -> bool {
        !matches!(self, Objective::Tpot)
    }
}

/// One recipe value a trial sets: a dotted key and its TOML value, as `--set` takes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Setting {
    /// `serving.prefix_caching`.
    pub key: String,
    /// `true`, `8`, `"ngram"`, `"1GiB"`.
    pub value: String,
}

impl Setting {
    /// The `--set` argument.
    pub fn arg(&self) -> String {
        format!("{}={}", self.key, self.value)
    }
}

/// One thing to try, with its alternatives (each a set of values set together).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lever {
    /// The recipe key it moves (`serving.speculative` for the speculation lever).
    pub key: String,
    /// The alternatives, in the order tried (memory fractions high to low).
    pub values: Vec<Vec<Setting>>,
}

/// Why a `--lever` argument cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LeverError {
    /// Not `KEY=V1,V2,...`.
    #[error("--lever `{0}` is not KEY=V1,V2,... (e.g. serving.max_num_seqs=4,16)")]
    Malformed(String),
    /// A speculation value that is not `METHOD:TOKENS`.
    #[error("--lever serving.speculative: `{0}` is not METHOD:TOKENS (e.g. ngram:3, mtp:2)")]
    Speculative(String),
}

impl sous_engine::diagnose::Diagnose for LeverError {
    fn class(&self) -> sous_engine::diagnose::Class {
        sous_engine::diagnose::Class::User
    }
}

impl Lever {
    /// Parses `KEY=V1,V2,...`; values are TOML (`true`, `8`, `0.85`, `"1GiB"` or a bare
    /// word), split at commas outside brackets; `serving.speculative=ngram:3,mtp:2` sets
    /// the method and the tokens together.
    pub fn parse(arg: &str) -> Result<Lever, LeverError> {
        let (key, values) = arg
            .split_once('=')
            .filter(|(k, v)| !k.trim().is_empty() && !v.trim().is_empty())
            .ok_or_else(|| LeverError::Malformed(arg.to_owned()))?;
        let key = key.trim().to_owned();
        let mut out = Vec::new();
        for value in split_top(values) {
            let value = value.trim();
            if value.is_empty() {
                return Err(LeverError::Malformed(arg.to_owned()));
            }
            if key == "serving.speculative" {
                out.push(speculative(value)?);
            } else {
                out.push(vec![Setting {
                    key: key.clone(),
                    value: value.to_owned(),
                }]);
            }
        }
        Ok(Lever { key, values: out })
    }
}

/// `ngram:3` as the two settings it makes.
fn speculative(value: &str) -> Result<Vec<Setting>, LeverError> {
    let (method, tokens) = value
        .split_once(':')
        .filter(|(m, t)| !m.is_empty() && t.parse::<u32>().is_ok_and(|t| t > 0))
        .ok_or_else(|| LeverError::Speculative(value.to_owned()))?;
    Ok(vec![
        Setting {
            key: "serving.speculative.method".into(),
            value: format!("\"{method}\""),
        },
        Setting {
            key: "serving.speculative.tokens".into(),
            value: tokens.to_owned(),
        },
    ])
}

/// Splits at commas that are not inside `[...]` or quotes.
fn split_top(text: &str) -> Vec<&str> {
    let (mut depth, mut quoted, mut start) = (0i32, false, 0);
    let mut parts = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '[' if !quoted => depth += 1,
            ']' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// What the model brings to the choice of levers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelTraits {
    /// Linear-attention layers: the native engine refuses prefix caching.
    pub hybrid: bool,
    /// An MTP head (`mtp.fc.weight`): drafting with it is a lever (the DGX Spark report's).
    pub mtp: bool,
}

impl ModelTraits {
    /// The traits of the model directory `dir` as the native engine reads it; none where
    /// it cannot (a model on the Hub only, or one it does not run).
    pub fn of(dir: &std::path::Path) -> ModelTraits {
        use sous_engine::native::config::ModelConfig;
        use sous_engine::native::weights::Checkpoint;
        let Ok(config) = ModelConfig::read(dir) else {
            return ModelTraits::default();
        };
        ModelTraits {
            hybrid: config.linear.is_some(),
            mtp: Checkpoint::open(dir, &config).is_ok_and(|c| c.has("mtp.fc.weight")),
        }
    }
}

/// The levers tried when none is given: what the recipe's engine honours and the field
/// reports moved, less the values the baseline already has and what the model cannot
/// take (`model`).
pub fn default_levers(recipe: &Recipe, model: ModelTraits) -> Vec<Lever> {
    let one = |key: &str, values: &[&str]| Lever {
        key: key.to_owned(),
        values: values
            .iter()
            .map(|v| {
                vec![Setting {
                    key: key.to_owned(),
                    value: (*v).to_owned(),
                }]
            })
            .collect(),
    };
    let mut levers = Vec::new();
    if !(model.hybrid && recipe.engine.kind == EngineKind::Native) {
        levers.push(one("serving.prefix_caching", &["true", "false"]));
    }
    let spec = |tokens: &str| Lever {
        key: "serving.speculative".into(),
        values: std::iter::once(format!("ngram:{tokens}"))
            .chain(model.mtp.then(|| "mtp:2".to_owned()))
            .map(|v| speculative(&v).unwrap_or_default())
            .collect(),
    };
    match recipe.engine.kind {
        EngineKind::Native => {
            levers.push(one("serving.max_num_seqs", &["4", "16"]));
            levers.push(one("memory.kv_cache_bytes", &["\"256MiB\"", "\"1GiB\""]));
            // bf16 arithmetic and a bf16 KV cache pay on some CPUs and not on others
            // (AVX512-BF16's dot products; the AVX-512 decode kernel reading the cache in
            // bf16), so the other side is measured: f32 for a recipe served in bf16 (its
            // `auto` cache follows), bf16 for one in f32, and a bf16 cache wherever the
            // cache is f32.
            let other = match recipe.serving.dtype {
                Some(ModelDtype::Bfloat16) => "\"float32\"",
                _ => "\"bfloat16\"",
            };
            levers.push(one("serving.dtype", &[other]));
            if sous_engine::native::kv_dtype(recipe) == sous_engine::native::KvDtype::F32 {
                levers.push(one("memory.kv_cache_dtype", &["\"bfloat16\""]));
            }
            if recipe.serving.speculative.is_none() {
                levers.push(spec("3"));
            }
        }
        EngineKind::Vllm | EngineKind::Sglang | EngineKind::Trtllm => {
            // High to low: a fraction that runs out of memory is recorded, and the next
            // one down becomes the tuned recipe's fallback.
            levers.push(one("memory.gpu_utilization", &["0.95", "0.9", "0.85"]));
            levers.push(one("serving.max_num_seqs", &["64", "128", "256"]));
            levers.push(one("serving.max_batched_tokens", &["2048", "8192", "16384"]));
            levers.push(one("memory.kv_cache_dtype", &["\"fp8\""]));
            if recipe.serving.speculative.is_none() {
                levers.push(spec("3"));
            }
        }
    }
    levers
}

/// Which phase of the search a trial belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The recipe as given.
    Baseline,
    /// One lever moved.
    Lever,
    /// The levers that helped, together.
    Combination,
}

/// A recipe variant to measure: the baseline plus some settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// `baseline`, or the settings as `key=value; key=value` (the journal's key).
    pub id: String,
    /// Its phase.
    pub phase: Phase,
    /// The lever it moves (none for the baseline and the combination).
    pub lever: Option<String>,
    /// What it sets over the baseline.
    pub settings: Vec<Setting>,
}

impl Trial {
    /// The baseline.
    pub fn baseline() -> Trial {
        Trial {
            id: "baseline".into(),
            phase: Phase::Baseline,
            lever: None,
            settings: Vec::new(),
        }
    }

    /// A trial of `settings` in `phase`.
    pub fn new(phase: Phase, lever: Option<String>, mut settings: Vec<Setting>) -> Trial {
        settings.sort();
        let id = settings.iter().map(Setting::arg).collect::<Vec<_>>().join("; ");
        Trial {
            id,
            phase,
            lever,
            settings,
        }
    }
}

/// The first pass: the baseline, then each lever's alternatives one at a time, less
/// those that equal what the baseline already sets (`current` reads a dotted key of the
/// resolved baseline as TOML text).
pub fn first_pass(levers: &[Lever], current: impl Fn(&str) -> Option<String>) -> Vec<Trial> {
    let mut trials = vec![Trial::baseline()];
    for lever in levers {
        for settings in &lever.values {
            let unchanged = settings
                .iter()
                .all(|s| current(&s.key).is_some_and(|c| same_value(&c, &s.value)));
            let trial = Trial::new(Phase::Lever, Some(lever.key.clone()), settings.clone());
            if !unchanged && !trials.iter().any(|t| t.id == trial.id) {
                trials.push(trial);
            }
        }
    }
    trials
}

/// Whether two TOML value texts mean the same value (`"1GiB"` and `1GiB`, `8` and `8`).
fn same_value(a: &str, b: &str) -> bool {
    let (a, b) = (recipe::parse_value(a), recipe::parse_value(b));
    match (&a, &b) {
        (toml::Value::Integer(x), toml::Value::Float(y))
        | (toml::Value::Float(y), toml::Value::Integer(x)) => (*x as f64 - y).abs() < 1e-12,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests;
