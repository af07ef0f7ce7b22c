//! Running the model in the native engine with a chosen set of its linear layers in
//! NVFP4 and the rest as the source holds them, and measuring how far its next-token
//! distributions move from the source model's.
//!
//! The NVFP4 layers are read from a checkpoint `sous quantize` wrote of the whole model
//! ([`Overlay`]), so they are multiplied exactly as a served NVFP4A16 checkpoint is.
//! Changing the set reloads only the layers whose modules changed.
//!
//! The divergence is the exact one over the whole vocabulary, `KL(p‖q) = Σ p (log p −
//! log q)` with `p` the source model's distribution and `q` the candidate's, averaged
//! over every position of the text (nats per token), with how often their most likely
//! tokens agree; what `llama-perplexity --kl-divergence` reports, without the top-k
//! truncation a server's log-probabilities impose.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sous_engine::native::NativeError;
use sous_engine::native::config::ModelConfig;
use sous_engine::native::model::{BatchSeq, KvCache, Logits, Model};
use sous_engine::native::weights::{Checkpoint, Overlay, Precision};

use super::super::error::QuantizeError;

/// Positions of a KV block.
const BLOCK: usize = 16;

/// How far a candidate's distributions are from the source model's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// Mean KL divergence, nats per token.
    pub kld: f64,
    /// Fraction of positions whose most likely token is the source model's.
    pub top1: f64,
}

/// The source model, its NVFP4 twin, the text and the source model's answers.
pub struct Measurer {
    config: ModelConfig,
    base: Checkpoint,
    quantized: Arc<Checkpoint>,
    model: Model,
    cache: KvCache,
    windows: Vec<Vec<u32>>,
    /// Log-probabilities of the source model, `[positions, vocab]`.
    baseline: Vec<f32>,
    /// Its most likely token at each position.
    baseline_top: Vec<u32>,
    /// The modules now in NVFP4 in `model`.
    current: HashSet<String>,
}

fn engine(dir: &Path) -> impl Fn(NativeError) -> QuantizeError + '_ {
    move |e| QuantizeError::Scan {
        message: format!(
            "the native engine cannot run the model in `{}`: {e}",
            dir.display()
        ),
    }
}

impl Measurer {
    /// Loads the source model of `source` and its NVFP4 form in `quantized`, runs the
    /// source model over `windows` and keeps its distributions.
    pub fn new(source: &Path, quantized: &Path, windows: Vec<Vec<u32>>) -> Result<Measurer, QuantizeError> {
        let config = ModelConfig::read(source).map_err(engine(source))?;
        let base = Checkpoint::open(source, &config).map_err(engine(source))?;
        let q_config = ModelConfig::read(quantized).map_err(engine(quantized))?;
        let quantized = Arc::new(Checkpoint::open(quantized, &q_config).map_err(engine(quantized))?);
        let longest = windows.iter().map(Vec::len).max().unwrap_or(1);
        let mut model = Model::load(config.clone(), &base, Precision::Stored, longest)
            .map_err(engine(source))?
            .without_mtp();
        model.set_tuning(sous_engine::native::kernel_choices().tuning());
        let cache = KvCache::new(&model, longest.div_ceil(BLOCK), BLOCK).with_state_slots(1);
        let mut measurer = Measurer {
            config,
            base,
            quantized,
            model,
            cache,
            windows,
            baseline: Vec::new(),
            baseline_top: Vec::new(),
            current: HashSet::new(),
        };
        measurer.baseline = measurer.log_probs()?;
        let vocab = measurer.config.vocab_size;
        measurer.baseline_top = measurer.baseline.chunks_exact(vocab).map(argmax).collect();
        Ok(measurer)
    }

    /// Positions measured.
    pub fn positions(&self) -> usize {
        self.baseline_top.len()
    }

    /// The divergence of the model with `modules` in NVFP4.
    pub fn measure(&mut self, modules: &HashSet<String>) -> Result<Divergence, QuantizeError> {
        self.set(modules)?;
        let vocab = self.config.vocab_size;
        let candidate = self.log_probs()?;
        let mut kld = 0.0f64;
        let mut agree = 0usize;
        for ((p, q), top) in self
            .baseline
            .chunks_exact(vocab)
            .zip(candidate.chunks_exact(vocab))
            .zip(&self.baseline_top)
        {
            kld += p
                .iter()
                .zip(q)
                .map(|(&lp, &lq)| {
                    let lp = f64::from(lp);
                    lp.exp() * (lp - f64::from(lq))
                })
                .sum::<f64>();
            agree += usize::from(argmax(q) == *top);
        }
        let n = self.positions().max(1) as f64;
        Ok(Divergence {
            kld: (kld / n).max(0.0),
            top1: agree as f64 / n,
        })
    }

    /// Puts `modules` (and no others) in NVFP4, reloading the layers that change.
    fn set(&mut self, modules: &HashSet<String>) -> Result<(), QuantizeError> {
        let changed: BTreeSet<usize> = self
            .current
            .symmetric_difference(modules)
            .map(|m| layer_of(m, &self.config.prefix))
            .collect::<Result<_, _>>()?;
        self.base.set_overlay(Some(Overlay {
            from: Arc::clone(&self.quantized),
            modules: modules.clone(),
        }));
        for layer in changed {
            self.model
                .reload_layers(&self.base, layer..layer + 1)
                .map_err(engine(self.base.dir()))?;
        }
        self.current = modules.clone();
        Ok(())
    }

    /// Log-probabilities of every position of every window, `[positions, vocab]`.
    fn log_probs(&mut self) -> Result<Vec<f32>, QuantizeError> {
        let vocab = self.config.vocab_size;
        let mut out = Vec::with_capacity(self.windows.iter().map(Vec::len).sum::<usize>() * vocab);
        let blocks: Vec<u32> = (0..self.cache.blocks() as u32).collect();
        for window in &self.windows {
            let seq = BatchSeq {
                blocks: &blocks,
                tokens: window,
                start: 0,
                state: 0,
                logits: Logits::All,
            };
            let logits = self
                .model
                .forward(&[seq], &mut self.cache)
                .map_err(engine(self.base.dir()))?;
            for row in logits.chunks_exact(vocab) {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
                let log_sum = sum.ln() as f32 + max;
                out.extend(row.iter().map(|&v| v - log_sum));
            }
        }
        Ok(out)
    }
}

/// The decoder layer a module belongs to.
fn layer_of(module: &str, prefix: &str) -> Result<usize, QuantizeError> {
    module
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(".layers."))
        .and_then(|rest| rest.split('.').next())
        .and_then(|i| i.parse().ok())
        .ok_or_else(|| QuantizeError::Scan {
            message: format!("`{module}` is not in a decoder layer under `{prefix}`"),
        })
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}
