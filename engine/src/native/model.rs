//! The Llama-family decoder: one forward pass over a batch of tokens from many
//! sequences at once, reading and writing a paged KV cache.
//!
//! A batch is "varlen": the tokens of every scheduled sequence (a prefill chunk, or one
//! decode token) are stacked into one `[tokens, hidden]` matrix, so every linear layer
//! is one matrix product for the whole batch; only attention looks at sequences
//! separately, each token attending to its own sequence's cached positions. This is
//! how iteration-level batching pays off on a CPU: the weights are read once per step,
//! not once per sequence.
//!
//! Matrix products run in the compute dtype (f32 or bf16) through candle; the rest
//! (norms, rotary, attention, activations) runs in f32 in `sous_kernels::transformer`.

use candle_core::{DType, Device, Tensor};
use sous_kernels::transformer::{self as k, KvShape, Query, Rotary};

use super::NativeError;
use super::config::{Family, ModelConfig};
use super::weights::Checkpoint;

/// Products with at most this many rows use the weight-streaming kernel.
const SMALL_PRODUCT_ROWS: usize = 16;

struct Layer {
    input_norm: Vec<f32>,
    /// q, k and v projections stacked: `[(heads + 2 kv_heads) head_dim, hidden]`.
    qkv: Tensor,
    qkv_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Tensor,
    post_norm: Vec<f32>,
    /// gate and up projections stacked: `[2 intermediate, hidden]`.
    gate_up: Tensor,
    down: Tensor,
}

/// A loaded model.
pub struct Model {
    config: ModelConfig,
    dtype: DType,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None`: tied to `embed`.
    lm_head: Option<Tensor>,
    rotary: Rotary,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("architecture", &self.config.architecture)
            .field("dtype", &self.dtype)
            .finish()
    }
}

/// The KV cache of every layer: `blocks × block_size` token slots of keys and values.
pub struct KvCache {
    shape: KvShape,
    blocks: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// A cache of `blocks` blocks for `model`. The memory is reserved lazily by the OS,
    /// page by page as blocks are first written.
    pub fn new(model: &Model, blocks: usize, block_size: usize) -> KvCache {
        let shape = KvShape {
            block_size,
            kv_heads: model.config.kv_heads,
            head_dim: model.config.head_dim,
        };
        let len = blocks * block_size * shape.slot_len();
        KvCache {
            shape,
            blocks,
            k: (0..model.config.layers).map(|_| vec![0.0; len]).collect(),
            v: (0..model.config.layers).map(|_| vec![0.0; len]).collect(),
        }
    }

    /// Blocks in the cache.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.shape.block_size
    }
}

/// Bytes of KV cache one token takes in every layer, in f32.
pub fn kv_bytes_per_token(config: &ModelConfig) -> u64 {
    (config.layers * 2 * config.kv_heads * config.head_dim * 4) as u64
}

/// One scheduled sequence in a batch.
#[derive(Debug, Clone)]
pub struct BatchSeq<'a> {
    /// Its block table (enough blocks for every position in this step).
    pub blocks: &'a [u32],
    /// Its tokens in this step.
    pub tokens: &'a [u32],
    /// Position of the first of them.
    pub start: usize,
    /// Logits wanted for: the last token only, or every token (prompt logprobs).
    pub logits: Logits,
}

/// Which rows of logits a sequence wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// The last token's.
    Last,
    /// Every token's.
    All,
}

impl Model {
    /// Loads the weights of `checkpoint` for computing in `dtype`, with rotary tables for
    /// `max_len` positions.
    pub fn load(
        config: ModelConfig,
        checkpoint: &Checkpoint,
        dtype: DType,
        max_len: usize,
    ) -> Result<Model, NativeError> {
        let c = &config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let p = format!("model.layers.{i}");
            let q = checkpoint.linear(&format!("{p}.self_attn.q_proj"), [c.heads * hd, h], dtype)?;
            let kp = checkpoint.linear(&format!("{p}.self_attn.k_proj"), [c.kv_heads * hd, h], dtype)?;
            let v = checkpoint.linear(&format!("{p}.self_attn.v_proj"), [c.kv_heads * hd, h], dtype)?;
            let qkv_bias = if c.attention_bias {
                let mut bias = checkpoint.vector(&format!("{p}.self_attn.q_proj.bias"))?;
                bias.extend(checkpoint.vector(&format!("{p}.self_attn.k_proj.bias"))?);
                bias.extend(checkpoint.vector(&format!("{p}.self_attn.v_proj.bias"))?);
                Some(bias)
            } else {
                None
            };
            let (q_norm, k_norm) = if c.family == Family::Qwen3 {
                (
                    Some(checkpoint.vector(&format!("{p}.self_attn.q_norm.weight"))?),
                    Some(checkpoint.vector(&format!("{p}.self_attn.k_norm.weight"))?),
                )
            } else {
                (None, None)
            };
            let gate = checkpoint.linear(&format!("{p}.mlp.gate_proj"), [c.intermediate_size, h], dtype)?;
            let up = checkpoint.linear(&format!("{p}.mlp.up_proj"), [c.intermediate_size, h], dtype)?;
            layers.push(Layer {
                input_norm: checkpoint.vector(&format!("{p}.input_layernorm.weight"))?,
                qkv: Tensor::cat(&[q, kp, v], 0)?,
                qkv_bias,
                q_norm,
                k_norm,
                o: checkpoint.linear(&format!("{p}.self_attn.o_proj"), [h, c.heads * hd], dtype)?,
                post_norm: checkpoint.vector(&format!("{p}.post_attention_layernorm.weight"))?,
                gate_up: Tensor::cat(&[gate, up], 0)?,
                down: checkpoint.linear(&format!("{p}.mlp.down_proj"), [h, c.intermediate_size], dtype)?,
            });
        }
        let embed = checkpoint.stored("model.embed_tokens.weight", dtype)?;
        if embed.dims() != [c.vocab_size, h] {
            return Err(NativeError::Config {
                path: "model.embed_tokens.weight".into(),
                message: format!("shape {:?}, expected [{}, {h}]", embed.dims(), c.vocab_size),
            });
        }
        let lm_head = if c.tie_word_embeddings && !checkpoint.has("lm_head.weight") {
            None
        } else {
            Some(checkpoint.linear("lm_head", [c.vocab_size, h], dtype)?)
        };
        let rotary = Rotary::new(&config.inv_freq(), max_len, 1.0);
        Ok(Model {
            norm: checkpoint.vector("model.norm.weight")?,
            config,
            dtype,
            embed,
            layers,
            lm_head,
            rotary,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The compute dtype of the matrix products.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes the weights take in memory.
    pub fn weight_bytes(&self) -> u64 {
        let tensor = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        let mut total = tensor(&self.embed) + self.lm_head.as_ref().map_or(0, tensor);
        for l in &self.layers {
            total += tensor(&l.qkv) + tensor(&l.o) + tensor(&l.gate_up) + tensor(&l.down);
        }
        total
    }

    /// `x · wᵀ` for `rows` rows of `x`, in the compute dtype, back to f32.
    ///
    /// A few rows (decode steps) in f32 go through `sous_kernels::transformer::matmul_t`,
    /// which reads the weight once in its stored layout; more rows (prefill) go through
    /// candle's GEMM, which packs the weight and then runs at the CPU's peak.
    fn linear(&self, x: &[f32], rows: usize, w: &Tensor) -> Result<Vec<f32>, NativeError> {
        let cols = x.len() / rows.max(1);
        if rows <= SMALL_PRODUCT_ROWS && self.dtype == DType::F32 && w.is_contiguous() {
            let (storage, layout) = w.storage_and_layout();
            if let candle_core::Storage::Cpu(cpu) = &*storage {
                let (start, len) = (layout.start_offset(), w.elem_count());
                let mut out = vec![0.0f32; rows * w.dims()[0]];
                match w.dtype() {
                    DType::F32 => k::matmul_t(
                        x,
                        rows,
                        &cpu.as_slice::<f32>()?[start..start + len],
                        cols,
                        &mut out,
                    ),
                    DType::BF16 => {
                        use half::slice::HalfFloatSliceExt;
                        let bits: &[u16] =
                            cpu.as_slice::<half::bf16>()?[start..start + len].reinterpret_cast();
                        k::matmul_t_bf16(x, rows, bits, cols, &mut out);
                    }
                    other => return Err(NativeError::Internal(format!("weights stored as {other:?}"))),
                }
                return Ok(out);
            }
        }
        // Weights kept narrower than the compute dtype are widened for the product.
        let wide;
        let w = if w.dtype() == self.dtype {
            w
        } else {
            wide = w.to_dtype(self.dtype)?;
            &wide
        };
        let mut t = Tensor::from_slice(x, (rows, cols), &Device::Cpu)?;
        if self.dtype != DType::F32 {
            t = t.to_dtype(self.dtype)?;
        }
        let y = t.matmul(&w.t()?)?;
        Ok(y.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
    }

    /// Runs the batch: writes its keys and values into `cache` and returns the logits the
    /// sequences asked for, `vocab_size` values per row, in sequence order (for `All`,
    /// one row per token).
    pub fn forward(&self, batch: &[BatchSeq], cache: &mut KvCache) -> Result<Vec<f32>, NativeError> {
        let c = &self.config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let tokens: Vec<u32> = batch.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        // Each token's sequence and position.
        let mut queries = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        for s in batch {
            for i in 0..s.tokens.len() {
                let position = s.start + i;
                if position >= self.rotary.positions() || position >= s.blocks.len() * cache.block_size() {
                    return Err(NativeError::Internal(format!(
                        "position {position} is beyond the sequence's {} cached blocks or the rotary table",
                        s.blocks.len()
                    )));
                }
                positions.push(position);
                queries.push(Query {
                    blocks: s.blocks,
                    len: position + 1,
                });
            }
        }
        let ids = Tensor::from_slice(&tokens, n, &Device::Cpu)?;
        let mut x: Vec<f32> = self
            .embed
            .index_select(&ids, 0)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        let mut normed = vec![0.0f32; n * h];
        let (q_len, kv_len) = (c.heads * hd, c.kv_heads * hd);
        let mut q = vec![0.0f32; n * q_len];
        let mut attn = vec![0.0f32; n * q_len];
        let mut act = vec![0.0f32; n * c.intermediate_size];
        for (li, layer) in self.layers.iter().enumerate() {
            k::rms_norm(&x, &layer.input_norm, c.rms_norm_eps, &mut normed);
            let mut qkv = self.linear(&normed, n, &layer.qkv)?;
            let row_len = q_len + 2 * kv_len;
            if let Some(bias) = &layer.qkv_bias {
                for row in qkv.chunks_exact_mut(row_len) {
                    k::add_assign(row, bias);
                }
            }
            let (k_cache, v_cache) = (&mut cache.k[li], &mut cache.v[li]);
            for (t, row) in qkv.chunks_exact_mut(row_len).enumerate() {
                let (qr, rest) = row.split_at_mut(q_len);
                let (kr, vr) = rest.split_at_mut(kv_len);
                if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                    k::rms_norm_heads(qr, qn, c.rms_norm_eps);
                    k::rms_norm_heads(kr, kn, c.rms_norm_eps);
                }
                self.rotary.apply(qr, positions[t]);
                self.rotary.apply(kr, positions[t]);
                q[t * q_len..(t + 1) * q_len].copy_from_slice(qr);
                let at = cache.shape.slot_offset(queries[t].blocks, positions[t]);
                k_cache[at..at + kv_len].copy_from_slice(kr);
                v_cache[at..at + kv_len].copy_from_slice(vr);
            }
            k::paged_attention(&q, &queries, c.heads, cache.shape, k_cache, v_cache, &mut attn);
            let o = self.linear(&attn, n, &layer.o)?;
            k::add_assign(&mut x, &o);
            k::rms_norm(&x, &layer.post_norm, c.rms_norm_eps, &mut normed);
            let gate_up = self.linear(&normed, n, &layer.gate_up)?;
            k::silu_mul(&gate_up, c.intermediate_size, &mut act);
            let down = self.linear(&act, n, &layer.down)?;
            k::add_assign(&mut x, &down);
        }
        // Final norm and lm_head, only for the rows asked for.
        let mut rows = Vec::new();
        let mut offset = 0;
        for s in batch {
            let len = s.tokens.len();
            match s.logits {
                Logits::None => {}
                Logits::Last => rows.push(offset + len - 1),
                Logits::All => rows.extend(offset..offset + len),
            }
            offset += len;
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut hidden = vec![0.0f32; rows.len() * h];
        for (dst, &r) in hidden.chunks_exact_mut(h).zip(&rows) {
            k::rms_norm_row(&x[r * h..(r + 1) * h], &self.norm, c.rms_norm_eps, dst);
        }
        self.linear(&hidden, rows.len(), self.lm_head.as_ref().unwrap_or(&self.embed))
    }
}
