//! `sous tune`'s reasoning: which levers to try ([`Lever`], [`default_levers`]), the
//! trials they make ([`Trial`], one lever at a time from the baseline, then the best
//! combination), what each measured run recorded ([`Sample`], kept in a [`journal`] so
//! an interrupted tune resumes), how trials compare (a mean and its 95 % confidence
//! interval, [`Estimate`]), and what comes out: the levers that helped
//! ([`Verdict`]) and the tuned recipe that `extends` the baseline ([`tuned_recipe`]).
//!
//! Not here: serving a trial and measuring it (the `tune` command, through the
//! pipeline and `sous::bench`), or printing.
//!
//! The search is the one the DGX Spark field report did by hand, and the one vLLM's
//! `benchmarks/auto_tune/` does for two scheduler settings: change one thing, measure
//! it against the same seeded workload, keep what helped. A lever *helped* only when its
//! interval lies wholly on the better side of the baseline's: a difference the runs
//! cannot tell from noise is not kept.

pub mod chart;
pub mod journal;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

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

/// The levers tried when none is given: what the recipe's engine honours and the field
/// reports moved, less the values the baseline already has.
pub fn default_levers(recipe: &Recipe) -> Vec<Lever> {
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
    let mut levers = vec![one("serving.prefix_caching", &["true", "false"])];
    let spec = |tokens: &str| Lever {
        key: "serving.speculative".into(),
        values: vec![speculative(&format!("ngram:{tokens}")).unwrap_or_default()],
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
    let (a, b) = (parse_value(a), parse_value(b));
    match (&a, &b) {
        (toml::Value::Integer(x), toml::Value::Float(y))
        | (toml::Value::Float(y), toml::Value::Integer(x)) => (*x as f64 - y).abs() < 1e-12,
        _ => a == b,
    }
}

/// How one measured run of a trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Measured, within the SLO.
    Ok,
    /// The engine ran out of memory at start-up.
    Oom,
    /// Measured, but a p99 latency broke the SLO.
    SloBreach,
    /// The engine did not start or the run failed for another reason.
    Failed,
    /// Not started: `sous plan` says the trial's memory settings cannot hold the
    /// weights and one request of `max_model_len`.
    Unfit,
    /// Not measured: its next-token distributions diverge from the baseline's by more
    /// than the tune's quality gate (`--max-kld`).
    QualityGate,
}

/// What one measured run of a trial recorded (a journal line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The trial's id.
    pub trial: String,
    /// The run's index within the trial (its salt is the tune's salt plus this).
    pub run: usize,
    /// How it ended.
    pub outcome: Outcome,
    /// The objective's value, when measured.
    pub value: Option<f64>,
    /// Why it failed, or which bound the SLO breach broke.
    pub message: Option<String>,
    /// The run's figures and the server's metrics evidence.
    pub figures: BTreeMap<String, f64>,
}

/// A mean and its 95 % confidence interval (Student's t over the runs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    /// Runs.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Estimate {
    /// The estimate of `values`; one value has no interval (both ends infinite).
    pub fn of(values: &[f64]) -> Option<Estimate> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Some(Estimate {
                n,
                mean,
                low: f64::NEG_INFINITY,
                high: f64::INFINITY,
            });
        }
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t95(n - 1) * (var / n as f64).sqrt();
        Some(Estimate {
            n,
            mean,
            low: mean - half,
            high: mean + half,
        })
    }

    /// Whether this is better than `other` beyond doubt: the intervals do not overlap.
    pub fn beats(&self, other: &Estimate, higher_is_better: bool) -> bool {
        if higher_is_better {
            self.low > other.high
        } else {
            self.high < other.low
        }
    }
}

/// The two-sided 95 % quantile of Student's t with `df` degrees of freedom (tabulated;
/// the normal's 1.96 beyond 30).
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042,
    ];
    TABLE.get(df.saturating_sub(1)).copied().unwrap_or(1.96)
}

/// What the samples say about one trial.
#[derive(Debug, Clone, Serialize)]
pub struct TrialResult {
    /// The trial.
    pub trial: Trial,
    /// `ok` when every run was; else the first run's failure.
    pub outcome: Outcome,
    /// The objective over its successful runs.
    pub estimate: Option<Estimate>,
    /// Its figures, averaged over the runs.
    pub figures: BTreeMap<String, f64>,
    /// The first failure's message.
    pub message: Option<String>,
}

/// Folds the samples of `trial`.
pub fn result(trial: &Trial, samples: &[Sample]) -> TrialResult {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.trial == trial.id).collect();
    let failure = mine.iter().find(|s| s.outcome != Outcome::Ok);
    let values: Vec<f64> = mine
        .iter()
        .filter(|s| s.outcome == Outcome::Ok)
        .filter_map(|s| s.value)
        .collect();
    let mut figures: BTreeMap<String, f64> = BTreeMap::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in &mine {
        for (k, v) in &s.figures {
            *figures.entry(k.clone()).or_default() += v;
            *counts.entry(k.clone()).or_default() += 1;
        }
    }
    for (k, v) in figures.iter_mut() {
        *v /= counts.get(k).copied().unwrap_or(1) as f64;
    }
    TrialResult {
        trial: trial.clone(),
        outcome: failure.map_or(Outcome::Ok, |s| s.outcome),
        estimate: Estimate::of(&values),
        figures,
        message: failure.and_then(|s| s.message.clone()),
    }
}

/// Which lever helped, and the best value of each.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Per lever that helped: its best trial (beats the baseline beyond doubt).
    pub helped: Vec<TrialResult>,
    /// Levers that did not (their best trial, if any ran), with why.
    pub not_helped: Vec<(String, String)>,
    /// Levers whose best alternative overlaps the baseline: more runs could decide.
    pub undecided: Vec<String>,
}

/// Judges every lever against the baseline.
pub fn judge(
    baseline: &TrialResult,
    levers: &[Lever],
    results: &[TrialResult],
    objective: Objective,
) -> Verdict {
    let better = objective.higher_is_better();
    let mut verdict = Verdict {
        helped: Vec::new(),
        not_helped: Vec::new(),
        undecided: Vec::new(),
    };
    let Some(base) = baseline.estimate else {
        return verdict;
    };
    for lever in levers {
        let mine: Vec<&TrialResult> = results
            .iter()
            .filter(|r| r.trial.lever.as_deref() == Some(lever.key.as_str()) && r.trial.phase == Phase::Lever)
            .collect();
        let usable: Vec<&&TrialResult> = mine
            .iter()
            .filter(|r| r.outcome == Outcome::Ok && r.estimate.is_some())
            .collect();
        let best = usable.iter().max_by(|a, b| {
            let (x, y) = (
                a.estimate.map_or(0.0, |e| e.mean),
                b.estimate.map_or(0.0, |e| e.mean),
            );
            if better { x.total_cmp(&y) } else { y.total_cmp(&x) }
        });
        match best {
            Some(best) if best.estimate.is_some_and(|e| e.beats(&base, better)) => {
                verdict.helped.push((**best).clone())
            }
            // Neither better nor worse beyond doubt: more runs may tell.
            Some(best) if best.estimate.is_some_and(|e| !base.beats(&e, better)) => {
                verdict.undecided.push(lever.key.clone());
                verdict.not_helped.push((
                    lever.key.clone(),
                    "not told apart from the baseline by the runs".into(),
                ));
            }
            Some(_) => verdict
                .not_helped
                .push((lever.key.clone(), "worse than the baseline".into())),
            None if mine.is_empty() => verdict.not_helped.push((
                lever.key.clone(),
                "nothing to try: the baseline already sets it".into(),
            )),
            None => verdict.not_helped.push((
                lever.key.clone(),
                "every alternative failed (out of memory, SLO or start-up)".into(),
            )),
        }
    }
    verdict
}

/// The combination trial of the levers that helped (none for fewer than two).
pub fn combination(verdict: &Verdict) -> Option<Trial> {
    (verdict.helped.len() >= 2).then(|| {
        Trial::new(
            Phase::Combination,
            None,
            verdict
                .helped
                .iter()
                .flat_map(|r| r.trial.settings.clone())
                .collect(),
        )
    })
}

/// `+45 %` or `-12 %`, how `value` moved from `base`.
pub fn change(base: f64, value: f64) -> String {
    if base == 0.0 {
        return "n/a".into();
    }
    format!("{:+.0} %", (value / base - 1.0) * 100.0)
}

fn interval(e: &Estimate) -> String {
    if e.n < 2 {
        format!("{:.1} (1 run)", e.mean)
    } else {
        format!("{:.1} (95 % CI {:.1}–{:.1}, {} runs)", e.mean, e.low, e.high, e.n)
    }
}

/// What the tuned recipe says about itself and what it sets.
pub struct TunedRecipe<'a> {
    /// The baseline's path, as `extends` names it (relative to the tuned file).
    pub extends: &'a str,
    /// The tuned recipe's name.
    pub name: &'a str,
    /// The baseline's result.
    pub baseline: &'a TrialResult,
    /// The chosen trial (a lever's or the combination).
    pub chosen: &'a TrialResult,
    /// Each helping lever's own result (for its comment).
    pub helped: &'a [TrialResult],
    /// The objective.
    pub objective: Objective,
    /// A line describing the workload.
    pub workload: &'a str,
    /// For a chosen memory fraction: the next lower fraction that started, as the
    /// out-of-memory fallback.
    pub fallback: Option<String>,
}

/// The tuned recipe's text: `extends` the baseline, sets only what helped, each value
/// with its measured gain in a comment.
pub fn tuned_recipe(t: &TunedRecipe<'_>) -> String {
    let unit = t.objective.unit();
    let key = t.objective.key();
    let mut out = String::new();
    let (Some(base), Some(best)) = (t.baseline.estimate, t.chosen.estimate) else {
        return out;
    };
    let _ = writeln!(
        out,
        "# Tuned by `sous tune` (sous {}) on {}.",
        env!("CARGO_PKG_VERSION"),
        t.workload
    );
    let _ = writeln!(out, "# {key}: baseline {} {unit}", interval(&base));
    let _ = writeln!(
        out,
        "# tuned: {} {unit}, {} ({:.2}x).",
        interval(&best),
        change(base.mean, best.mean),
        best.mean / base.mean
    );
    let _ = writeln!(out, "extends = {}", toml_string(t.extends));
    let _ = writeln!(out, "name = {}", toml_string(t.name));
    // Group the settings by table, each with the gain its lever gave alone.
    let mut tables: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    let mut settings = t.chosen.trial.settings.clone();
    if let Some(fallback) = &t.fallback {
        settings.push(Setting {
            key: "memory.oom_fallback".into(),
            value: format!("[{fallback}]"),
        });
    }
    for s in &settings {
        let (table, leaf) = s.key.rsplit_once('.').unwrap_or(("", s.key.as_str()));
        let alone = t
            .helped
            .iter()
            .find(|r| r.trial.settings.iter().any(|x| x.key == s.key))
            .and_then(|r| r.estimate.map(|e| (r, e)));
        let comment = match alone {
            _ if s.key == "memory.oom_fallback" => {
                "the next fraction down that started, should this one run out of memory".to_owned()
            }
            Some((r, e)) => {
                let mut c = format!(
                    "{} alone: {:.1} -> {:.1} {unit}",
                    change(base.mean, e.mean),
                    base.mean,
                    e.mean
                );
                if let Some(ev) = evidence(&t.baseline.figures, &r.figures) {
                    c.push_str(&format!("; {ev}"));
                }
                c
            }
            None => "set with the lever above".into(),
        };
        tables
            .entry(table.to_owned())
            .or_default()
            .push((leaf.to_owned(), s.value.clone(), comment));
    }
    for (table, entries) in tables {
        let _ = writeln!(out, "\n[{table}]");
        for (leaf, value, comment) in entries {
            let _ = writeln!(out, "# {comment}");
            let _ = writeln!(out, "{leaf} = {}", toml_value(&value));
        }
    }
    out
}

/// The server's metrics that explain a change: prefix hit rate, acceptance, preemptions,
/// KV peak, where they moved.
pub fn evidence(base: &BTreeMap<String, f64>, trial: &BTreeMap<String, f64>) -> Option<String> {
    let mut parts = Vec::new();
    for (key, label, pct) in [
        ("prefix_cache_hit_rate", "prefix-cache hit rate", true),
        ("spec_decode_acceptance_rate", "draft acceptance", true),
        ("preemptions", "preemptions", false),
        ("kv_cache_usage_max", "KV peak", true),
        ("kld_mean", "KL divergence", false),
    ] {
        let (a, b) = (base.get(key).copied(), trial.get(key).copied());
        let show = |v: Option<f64>| match v {
            Some(v) if pct => format!("{:.0} %", v * 100.0),
            Some(v) if key == "kld_mean" => format!("{v:.4}"),
            Some(v) => format!("{v:.0}"),
            None => "-".into(),
        };
        match (a, b) {
            // Only the trial has it (draft acceptance with speculation switched on).
            (None, Some(_)) => parts.push(format!("{label} {}", show(b))),
            (Some(x), None) => parts.push(format!("{label} {} -> none", show(Some(x)))),
            (Some(x), Some(y)) if (x - y).abs() > 1e-9 => {
                parts.push(format!("{label} {} -> {}", show(a), show(b)))
            }
            _ => {}
        }
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A value's text read as TOML (`8`, `true`, `"1GiB"`, `[0.85]`), or as a string when
/// it is a bare word, as `--set` reads it.
fn parse_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// A value as a recipe file spells it: TOML as given, or a quoted string for a bare word.
fn toml_value(text: &str) -> String {
    match parse_value(text) {
        toml::Value::String(s) if format!("v = {text}").parse::<toml::Table>().is_err() => toml_string(&s),
        _ => text.to_owned(),
    }
}

/// `extends` for a file in `out_dir` naming `base`: relative when they share an
/// ancestor, else absolute.
pub fn relative_extends(base: &Path, out_dir: &Path) -> String {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (base, dir) = (canon(base), canon(out_dir));
    let common = base
        .components()
        .zip(dir.components())
        .take_while(|(a, b)| a == b)
        .count();
    if common <= 1 {
        return base.display().to_string();
    }
    let ups = dir.components().count() - common;
    let mut rel = std::path::PathBuf::new();
    for _ in 0..ups {
        rel.push("..");
    }
    for c in base.components().skip(common) {
        rel.push(c);
    }
    rel.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_names_what_moved_and_what_only_the_trial_has() {
        let figures = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
        let base = figures(&[("prefix_cache_hit_rate", 0.0), ("kv_cache_usage_max", 0.16)]);
        let trial = figures(&[
            ("prefix_cache_hit_rate", 0.5),
            ("kv_cache_usage_max", 0.16),
            ("spec_decode_acceptance_rate", 0.44),
        ]);
        assert_eq!(
            evidence(&base, &trial).as_deref(),
            Some("prefix-cache hit rate 0 % -> 50 %, draft acceptance 44 %")
        );
        assert_eq!(evidence(&base, &base), None);
    }

    fn sample(trial: &str, run: usize, value: f64) -> Sample {
        Sample {
            trial: trial.into(),
            run,
            outcome: Outcome::Ok,
            value: Some(value),
            message: None,
            figures: BTreeMap::new(),
        }
    }

    #[test]
    fn levers_parse_values_lists_and_speculation() {
        let l = Lever::parse("memory.oom_fallback=[0.85, 0.8],[0.8]").expect("lever");
        assert_eq!(l.values.len(), 2);
        assert_eq!(l.values[0][0].value, "[0.85, 0.8]");
        let s = Lever::parse("serving.speculative=ngram:3,mtp:2").expect("spec");
        assert_eq!(s.values[1][0].arg(), "serving.speculative.method=\"mtp\"");
        assert_eq!(s.values[1][1].arg(), "serving.speculative.tokens=2");
        assert!(matches!(
            Lever::parse("serving.speculative=ngram"),
            Err(LeverError::Speculative(_))
        ));
        assert!(matches!(
            Lever::parse("max_num_seqs"),
            Err(LeverError::Malformed(_))
        ));
        assert!(matches!(Lever::parse("a=1,,2"), Err(LeverError::Malformed(_))));
    }

    #[test]
    fn the_first_pass_skips_what_the_baseline_already_sets() {
        let levers = vec![
            Lever::parse("serving.prefix_caching=true,false").expect("lever"),
            Lever::parse("memory.kv_cache_bytes=\"1GiB\"").expect("lever"),
        ];
        let current = |key: &str| match key {
            "serving.prefix_caching" => Some("false".to_owned()),
            "memory.kv_cache_bytes" => Some("\"1GiB\"".to_owned()),
            _ => None,
        };
        let ids: Vec<String> = first_pass(&levers, current).into_iter().map(|t| t.id).collect();
        assert_eq!(ids, ["baseline", "serving.prefix_caching=true"]);
    }

    #[test]
    fn the_native_engine_s_default_levers_move_the_arithmetic_and_cache_to_the_other_dtype() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/local/smollm2-135m.toml");
        let recipe = sous_engine::recipe::load(&path, &sous_engine::recipe::Overrides::new())
            .expect("the shipped recipe loads")
            .recipe;
        let offered = |recipe: &Recipe, key: &str| -> Vec<Vec<Setting>> {
            default_levers(recipe)
                .into_iter()
                .find(|l| l.key == key)
                .unwrap_or_else(|| panic!("no {key} lever"))
                .values
        };
        let setting = |key: &str, value: &str| {
            vec![vec![Setting {
                key: key.into(),
                value: value.into(),
            }]]
        };
        // The shipped recipe computes and caches in bf16: f32 is what is tried (the
        // cache follows the served dtype).
        assert_eq!(
            offered(&recipe, "serving.dtype"),
            setting("serving.dtype", "\"float32\"")
        );
        assert!(
            !default_levers(&recipe)
                .iter()
                .any(|l| l.key == "memory.kv_cache_dtype")
        );
        // A recipe in f32 is offered bf16 arithmetic and a bf16 cache.
        let mut f32 = recipe.clone();
        f32.serving.dtype = Some(ModelDtype::Float32);
        assert_eq!(
            offered(&f32, "serving.dtype"),
            setting("serving.dtype", "\"bfloat16\"")
        );
        assert_eq!(
            offered(&f32, "memory.kv_cache_dtype"),
            setting("memory.kv_cache_dtype", "\"bfloat16\"")
        );
        // Neither is offered for a GPU engine's recipe (vLLM computes in the model's dtype).
        let mut vllm = recipe.clone();
        vllm.engine.kind = EngineKind::Vllm;
        assert!(!default_levers(&vllm).iter().any(|l| l.key == "serving.dtype"));
    }

    #[test]
    fn only_a_lever_whose_interval_clears_the_baseline_helped() {
        let levers = vec![
            Lever::parse("a=1,2,3").expect("lever"),
            Lever::parse("b=1").expect("lever"),
            Lever::parse("c=1").expect("lever"),
        ];
        let trials = first_pass(&levers, |_| None);
        let mut samples = Vec::new();
        for (i, v) in [100.0, 102.0, 98.0].iter().enumerate() {
            samples.push(sample("baseline", i, *v));
            samples.push(sample("a=1", i, v + 1.0)); // noise
            samples.push(sample("a=2", i, v * 1.5)); // a clear gain
            samples.push(sample("b=1", i, v * 0.5)); // a loss
        }
        // A breach of the SLO is never chosen, however fast.
        for run in 0..3 {
            samples.push(Sample {
                outcome: Outcome::SloBreach,
                value: Some(1000.0),
                message: Some("p99 TTFT 900 ms > 500 ms".into()),
                ..sample("a=3", run, 0.0)
            });
        }
        samples.push(Sample {
            outcome: Outcome::Oom,
            value: None,
            message: Some("CUDA out of memory".into()),
            ..sample("c=1", 0, 0.0)
        });
        let results: Vec<TrialResult> = trials.iter().map(|t| result(t, &samples)).collect();
        let verdict = judge(&results[0], &levers, &results, Objective::OutputThroughput);
        let helped: Vec<&str> = verdict.helped.iter().map(|r| r.trial.id.as_str()).collect();
        assert_eq!(helped, ["a=2"]);
        assert_eq!(verdict.not_helped.len(), 2);
        assert!(
            verdict.not_helped[1].1.contains("failed"),
            "{:?}",
            verdict.not_helped
        );
        // For a lower-is-better objective the same numbers read the other way.
        let verdict = judge(&results[0], &levers, &results, Objective::Tpot);
        let helped: Vec<&str> = verdict.helped.iter().map(|r| r.trial.id.as_str()).collect();
        assert_eq!(helped, ["b=1"]);
    }

    #[test]
    fn the_interval_uses_student_t() {
        let e = Estimate::of(&[1.0, 2.0, 3.0]).expect("estimate");
        // sd 1, n 3: 4.303 / sqrt(3)
        assert!((e.high - e.mean - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert!(Estimate::of(&[5.0]).is_some_and(|e| e.low.is_infinite()));
    }

    #[test]
    fn the_tuned_recipe_extends_the_baseline_and_says_what_each_value_gained() {
        let mut base = result(
            &Trial::baseline(),
            &[sample("baseline", 0, 100.0), sample("baseline", 1, 110.0)],
        );
        base.figures.insert("prefix_cache_hit_rate".into(), 0.0);
        let trial = Trial::new(
            Phase::Lever,
            Some("serving.prefix_caching".into()),
            vec![Setting {
                key: "serving.prefix_caching".into(),
                value: "true".into(),
            }],
        );
        let mut best = result(
            &trial,
            &[sample(&trial.id, 0, 200.0), sample(&trial.id, 1, 210.0)],
        );
        best.figures.insert("prefix_cache_hit_rate".into(), 0.62);
        let text = tuned_recipe(&TunedRecipe {
            extends: "base.toml",
            name: "base-tuned",
            baseline: &base,
            chosen: &best,
            helped: std::slice::from_ref(&best),
            objective: Objective::OutputThroughput,
            workload: "the agent workload",
            fallback: None,
        });
        assert!(
            text.contains("extends = \"base.toml\"\nname = \"base-tuned\"\n"),
            "{text}"
        );
        assert!(
            text.contains("[serving]\n# +95 % alone: 105.0 -> 205.0 tok/s; prefix-cache hit rate 0 % -> 62 %\nprefix_caching = true\n"),
            "{text}"
        );
        let parsed: toml::Value = text.parse().expect("TOML");
        assert_eq!(parsed["serving"]["prefix_caching"].as_bool(), Some(true));
    }

    #[test]
    fn values_keep_their_toml_type() {
        assert_eq!(toml_value("4"), "4");
        assert_eq!(toml_value("\"1GiB\""), "\"1GiB\"");
        assert_eq!(toml_value("ngram"), "\"ngram\"");
        assert_eq!(toml_value("[0.85, 0.8]"), "[0.85, 0.8]");
        assert!(same_value("8", "8") && same_value("\"1GiB\"", "1GiB") && same_value("1", "1.0"));
        assert!(!same_value("true", "false"));
    }

    #[test]
    fn extends_is_relative_where_it_can_be() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("recipes/base.toml");
        std::fs::create_dir_all(base.parent().expect("parent")).expect("mkdir");
        std::fs::write(&base, "").expect("write");
        std::fs::create_dir_all(dir.path().join("out")).expect("mkdir");
        assert_eq!(relative_extends(&base, &dir.path().join("recipes")), "base.toml");
        assert_eq!(
            relative_extends(&base, &dir.path().join("out")),
            "../recipes/base.toml"
        );
    }
}
