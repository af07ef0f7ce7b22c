//! The tune's quality gate (`--max-kld`): every trial's next-token distributions are
//! scored over the same windows of the built-in text (`sous eval`'s windows, cut with
//! the first served trial's tokenizer), and a lever whose mean KL divergence from the
//! baseline's exceeds the gate is recorded as over it and never chosen.
//!
//! Each trial's scores are kept in the tune's folder, so a resumed tune scores nothing
//! twice and finds the baseline's where an earlier run left them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sous_engine::reporter::Reporter;

use super::{Phase, Trial};
use crate::eval::quality::{Position, compare};
use crate::eval::resume::Saved;
use crate::eval::score::Server;
use crate::eval::windows::Shape;
use crate::eval::{DEFAULT_TOP_K, EvalError, Scoring, score_all, scoring};
use crate::served::ServedError;

/// Tokens per window of the gate's text.
const WINDOW: usize = 512;

/// Why a trial could not be scored.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The served model or its tokenizer could not be found.
    #[error(transparent)]
    Served(#[from] ServedError),
    /// Scoring failed.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// A lever came before the baseline's scores (a journal from an older tune).
    #[error("the baseline's quality scores are missing")]
    BaselineMissing,
}

impl sous_engine::diagnose::Diagnose for GateError {
    fn class(&self) -> sous_engine::diagnose::Class {
        match self {
            GateError::Served(e) => e.class(),
            GateError::Eval(e) => e.class(),
            GateError::BaselineMissing => sous_engine::diagnose::Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            GateError::Served(e) => e.hint(),
            GateError::Eval(e) => e.hint(),
            GateError::BaselineMissing => Some("run the tune again with --fresh".into()),
        }
    }
}

/// What the gate says of a trial: its figures against the baseline, and why it is over
/// the gate, if it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// `kld_mean`, `kld_p99`, `top1_agreement`, `delta_perplexity` (none for the baseline).
    pub figures: BTreeMap<String, f64>,
    /// Why the trial is over the gate.
    pub over: Option<String>,
}

/// The gate, with the windows and the baseline's scores once they are known.
#[derive(Debug)]
pub struct Gate {
    max_kld: f64,
    dir: PathBuf,
    tokenizer: Option<PathBuf>,
    job: Option<Scoring>,
    baseline: Option<Vec<Position>>,
}

impl Gate {
    /// A gate of `max_kld` nats that keeps its scores in `dir`; `tokenizer` as `--tokenizer`
    /// gives it (default: the served model's).
    pub fn new(max_kld: f64, dir: &Path, tokenizer: Option<&Path>) -> Gate {
        Gate {
            max_kld,
            dir: dir.to_path_buf(),
            tokenizer: tokenizer.map(Path::to_path_buf),
            job: None,
            baseline: None,
        }
    }

    /// Scores `trial`, served at `url`, and for a lever compares it with the baseline.
    pub async fn judge(
        &mut self,
        trial: &Trial,
        url: &str,
        api_key: Option<&str>,
        reporter: &dyn Reporter,
    ) -> Result<Judgement, GateError> {
        let client = reqwest::Client::new();
        let served = crate::served::models(&client, url, api_key).await?;
        let job = match &self.job {
            Some(job) => job,
            None => {
                let (tokenizer, _) =
                    crate::served::tokenizer(self.tokenizer.as_deref(), served.root.as_deref(), &served.id)?;
                let shape = Shape::Windows {
                    ctx: WINDOW,
                    score_from: None,
                    chunks: None,
                };
                let (job, _) = scoring(
                    &tokenizer,
                    crate::quantize::calibrate::BUILTIN,
                    shape,
                    DEFAULT_TOP_K,
                )?;
                self.job.insert(job)
            }
        };
        let server = Server {
            url: url.to_owned(),
            model: served.id.clone(),
            api_key: api_key.map(str::to_owned),
        };
        let saved = |id: &str| Saved::new(&self.dir, id);
        let positions = score_all(&client, &server, job, &saved(&trial.id), reporter, &trial.id).await?;
        if trial.phase == Phase::Baseline {
            self.baseline = Some(positions);
            return Ok(Judgement {
                figures: BTreeMap::new(),
                over: None,
            });
        }
        if self.baseline.is_none() {
            // A resumed tune whose baseline was measured before: its saved scores.
            let windows = saved(&Trial::baseline().id).load()?;
            if windows.len() == job.windows.len() && windows.iter().all(Option::is_some) {
                self.baseline = Some(windows.into_iter().flatten().flatten().collect());
            }
        }
        let baseline = self.baseline.as_deref().ok_or(GateError::BaselineMissing)?;
        let c = compare(baseline, &positions, job.top_k).map_err(EvalError::from)?;
        let figures = BTreeMap::from([
            ("kld_mean".to_owned(), c.kld_mean.value),
            ("kld_p99".to_owned(), c.kld_p99),
            ("top1_agreement".to_owned(), c.top1_agreement.value),
            ("delta_perplexity".to_owned(), c.delta_perplexity.value),
        ]);
        let over = (c.kld_mean.value > self.max_kld).then(|| {
            format!(
                "mean KL divergence {:.4} from the baseline exceeds --max-kld {} (same top token {:.1} %, perplexity {:+.2})",
                c.kld_mean.value,
                self.max_kld,
                c.top1_agreement.value * 100.0,
                c.delta_perplexity.value
            )
        });
        Ok(Judgement { figures, over })
    }
}
