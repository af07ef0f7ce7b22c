//! vLLM's KV-cache arithmetic, from a model's layers and a memory budget to the two
//! numbers its start-up log prints ("GPU KV cache size: N tokens", "Maximum
//! concurrency for L tokens per request: C x"). Written from vllm-project/vllm at
//! commit 001cabc1 (`vllm/v1/core/kv_cache_utils.py`: `get_kv_cache_groups`,
//! `_get_kv_cache_groups_uniform_page_size`, `get_kv_cache_config_from_groups`,
//! `get_max_concurrency_for_kv_cache_config`, `_report_kv_cache_config`;
//! `vllm/v1/kv_cache_interface.py`: each spec's `page_size_bytes` and
//! `max_memory_usage_bytes`; `vllm/platforms/interface.py`: the hybrid
//! attention/Mamba block-size alignment). Our own code; the formulas are quoted in
//! the comments where each is used.

use super::shape::Layer;

/// What vLLM's cache layout depends on beside the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `--block-size`: vLLM's default is 16 on GPUs and 128 on its CPU backend.
    pub block_size: usize,
    /// Bytes of one KV element (`--kv-cache-dtype`; the model's dtype for `auto`).
    pub kv_bytes: f64,
    /// Bytes of one element of a linear-attention convolution state (the model's dtype).
    pub state_bytes: f64,
    /// Bytes of one element of a linear-attention recurrent state (vLLM's
    /// `mamba_ssm_cache_dtype`: the config's `mamba_ssm_dtype`, else the model's).
    pub ssm_bytes: f64,
    /// Tensor-parallel size: KV heads are split across it.
    pub tensor_parallel: usize,
    /// `--max-model-len`.
    pub max_model_len: u64,
    /// `--max-num-batched-tokens` (sliding windows hold this many in-flight tokens).
    pub max_batched_tokens: u64,
    /// The attention backend's block-size alignment (`MultipleOf(16)` for
    /// FlashAttention and FlashInfer).
    pub kernel_alignment: usize,
}

/// One group of layers sharing a block table.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// What its layers are: `full`, `sliding(4096)`, `mla`, `gdn`.
    pub kind: String,
    /// Layers in it (the padded group size for every group).
    pub layers: usize,
    /// Bytes one request may hold in one layer of it, at `max_model_len`.
    pub max_bytes_per_request: u64,
}

/// The layout and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Tokens per attention block, after the hybrid alignment.
    pub block_size: usize,
    /// Bytes of one block of one layer: the page every layer shares.
    pub page_bytes: u64,
    /// Bytes per token of one layer of each attention kind, before paging (the
    /// arithmetic people check by hand).
    pub attention_bytes_per_token: u64,
    /// The groups.
    pub groups: Vec<Group>,
    /// Layers per group: the number of pools the memory is split into.
    pub group_size: usize,
    /// Blocks in each pool.
    pub num_blocks: u64,
    /// Blocks one request at `max_model_len` needs in each pool.
    pub blocks_per_request: u64,
}

impl Layout {
    /// Where the memory goes, one step a line, for people to check by hand.
    pub fn explain(&self, layers: &[Layer], s: &Settings, available: u64) -> Vec<String> {
        let n = thousands;
        let mut out = Vec::new();
        let specs = specs(layers, s);
        let count = |f: fn(&Spec) -> bool| specs.iter().filter(|sp| f(sp)).count();
        let attention = count(|sp| !matches!(sp, Spec::State { .. }));
        if attention > 0 {
            out.push(format!(
                "{attention} attention layers ({}): {} B per token each{}",
                kinds_of(&specs),
                n(self.attention_bytes_per_token),
                if s.tensor_parallel > 1 {
                    format!(" on each of {} GPUs", s.tensor_parallel)
                } else {
                    String::new()
                }
            ));
        }
        if let Some(state) = specs.iter().find_map(|sp| match sp {
            Spec::State { bytes } => Some(*bytes),
            _ => None,
        }) {
            out.push(format!(
                "{} linear-attention layers: a fixed state of {} B per request each, whatever the context",
                count(|sp| matches!(sp, Spec::State { .. })),
                n(state)
            ));
            out.push(format!(
                "attention blocks of {} tokens, so that one page ({} B) holds a state",
                self.block_size,
                n(self.page_bytes)
            ));
        } else {
            out.push(format!(
                "blocks of {} tokens: {} B a page",
                self.block_size,
                n(self.page_bytes)
            ));
        }
        out.push(format!(
            "{} group(s) of {} layers share {} pools: {} B / {} B / {} = {} blocks",
            self.groups.len(),
            self.group_size,
            self.group_size,
            n(available),
            n(self.page_bytes),
            self.group_size,
            n(self.num_blocks)
        ));
        out.push(format!(
            "one request of {} tokens needs {} blocks in every pool: {:.2} at once",
            n(s.max_model_len),
            n(self.blocks_per_request),
            self.max_concurrency()
        ));
        out.push(format!(
            "{} blocks // {} group(s) × {} tokens = {} tokens (the engine's start-up line); {:.2} × {} = {} tokens of context at full concurrency",
            n(self.num_blocks),
            self.groups.len(),
            self.block_size,
            n(self.tokens()),
            self.max_concurrency(),
            n(s.max_model_len),
            n(self.context_tokens(s.max_model_len))
        ));
        out
    }

    /// Tokens of context the pool holds with every request at `max_model_len`:
    /// `max_concurrency * max_model_len` (what newer vLLM releases log as the cache
    /// size, counting the blocks a sliding window or a state does not need).
    pub fn context_tokens(&self, max_model_len: u64) -> u64 {
        (self.max_concurrency() * max_model_len as f64) as u64
    }

    /// "GPU KV cache size: N tokens": `num_blocks // len(groups) * min_block_size`.
    pub fn tokens(&self) -> u64 {
        self.num_blocks / self.groups.len().max(1) as u64 * self.block_size as u64
    }

    /// "Maximum concurrency for L tokens per request": `num_blocks /
    /// cdiv(max_memory_usage_per_request, memory_per_block)`.
    pub fn max_concurrency(&self) -> f64 {
        if self.blocks_per_request == 0 {
            return 0.0;
        }
        self.num_blocks as f64 / self.blocks_per_request as f64
    }
}

fn thousands(n: u64) -> String {
    crate::dialect::log::vllm::thousands(n as usize)
}

fn kinds_of(specs: &[Spec]) -> String {
    let mut kinds: Vec<String> = Vec::new();
    for sp in specs {
        if matches!(sp, Spec::State { .. }) {
            continue;
        }
        let k = sp.kind();
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    kinds.join(", ")
}

/// The spec of one layer: its bytes per token (attention) or per request (state).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Spec {
    Full { per_token: u64 },
    Sliding { per_token: u64, window: usize },
    Mla { per_token: u64 },
    State { bytes: u64 },
}

impl Spec {
    fn kind(self) -> String {
        match self {
            Spec::Full { .. } => "full".into(),
            Spec::Sliding { window, .. } => format!("sliding({window})"),
            Spec::Mla { .. } => "mla".into(),
            Spec::State { .. } => "gdn".into(),
        }
    }
}

fn specs(layers: &[Layer], s: &Settings) -> Vec<Spec> {
    let tp = s.tensor_parallel.max(1);
    // `ModelConfig.get_num_kv_heads`: `max(1, total_num_kv_heads // tp)`.
    let per_rank = |heads: usize| (heads / tp).max(1);
    layers
        .iter()
        .map(|l| match *l {
            // AttentionSpec.page_size_bytes: `2 * block_size * num_kv_heads * head_size * dtype_size`.
            Layer::Full { kv_heads, head_dim } => Spec::Full {
                per_token: (2.0 * (per_rank(kv_heads) * head_dim) as f64 * s.kv_bytes) as u64,
            },
            Layer::Sliding {
                kv_heads,
                head_dim,
                window,
            } => Spec::Sliding {
                per_token: (2.0 * (per_rank(kv_heads) * head_dim) as f64 * s.kv_bytes) as u64,
                window,
            },
            // MLAAttentionSpec: one latent per token (no K/V pair), not split by TP.
            Layer::Mla { latent } => Spec::Mla {
                per_token: (latent as f64 * s.kv_bytes) as u64,
            },
            // `MambaStateShapeCalculator.gated_delta_net_state_shape`: a conv state of
            // (conv_dim / tp, conv_kernel - 1), conv_dim = 2 * key_dim + value_dim, and a
            // temporal state of (value_heads / tp, head_k_dim, head_v_dim).
            Layer::GatedDeltaNet {
                key_heads,
                value_heads,
                key_dim,
                value_dim,
                conv_kernel,
            } => {
                let conv_dim = 2 * key_heads * key_dim + value_heads * value_dim;
                let conv = (conv_dim / tp) * (conv_kernel - 1);
                let temporal = (value_heads / tp) * key_dim * value_dim;
                Spec::State {
                    bytes: (conv as f64 * s.state_bytes + temporal as f64 * s.ssm_bytes) as u64,
                }
            }
        })
        .collect()
}

/// Lays out the cache of `layers` in `available` bytes as vLLM does.
pub fn layout(layers: &[Layer], s: &Settings, available: u64) -> Layout {
    let specs = specs(layers, s);
    let attention_bytes_per_token = specs
        .iter()
        .find_map(|sp| match *sp {
            Spec::Full { per_token } | Spec::Sliding { per_token, .. } | Spec::Mla { per_token } => {
                Some(per_token)
            }
            Spec::State { .. } => None,
        })
        .unwrap_or(0);
    // Hybrid attention + state models: the attention block grows until one attention
    // page holds a whole state ("Setting attention block size to N tokens to ensure
    // that attention page size is >= mamba page size"), then the state page is
    // padded to it: `attn_block_size = alignment * cdiv(mamba_page_size, alignment *
    // attn_page_size_1_token)`.
    let state = specs.iter().find_map(|sp| match *sp {
        Spec::State { bytes } => Some(bytes),
        _ => None,
    });
    let mut block_size = s.block_size;
    if let Some(state) = state
        && attention_bytes_per_token > 0
    {
        let align = s.kernel_alignment.max(1) as u64;
        let needed = align * state.div_ceil(align * attention_bytes_per_token);
        block_size = block_size.max(needed as usize);
    }
    let page_bytes = if attention_bytes_per_token > 0 {
        attention_bytes_per_token * block_size as u64
    } else {
        state.unwrap_or(0)
    };

    // Group the layers by spec; all layers of one spec make one group when the
    // model has a single kind, else every kind is split into groups of `group_size`
    // layers (the smallest kind's count, or the largest's when that is less than
    // 1.5 times the smallest), the last one padded.
    let mut kinds: Vec<(Spec, usize)> = Vec::new();
    for sp in &specs {
        match kinds.iter_mut().find(|(k, _)| k == sp) {
            Some((_, n)) => *n += 1,
            None => kinds.push((*sp, 1)),
        }
    }
    let min = kinds.iter().map(|(_, n)| *n).min().unwrap_or(0);
    let max = kinds.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let group_size = if kinds.len() == 1 || (max as f64) < min as f64 * 1.5 {
        max
    } else {
        min
    };
    let max_usage = |sp: Spec| -> u64 {
        let blocks = |tokens: u64| tokens.div_ceil(block_size as u64);
        match sp {
            // FullAttentionSpec: `cdiv(max_model_len, block_size) * page_size_bytes`.
            Spec::Full { .. } | Spec::Mla { .. } => blocks(s.max_model_len) * page_bytes,
            // SlidingWindowSpec: `(cdiv(min(window - 1 + max_num_batched_tokens,
            // max_model_len), block_size) + 1) * page_size_bytes`.
            Spec::Sliding { window, .. } => {
                let tokens = (window as u64 - 1 + s.max_batched_tokens).min(s.max_model_len);
                (blocks(tokens) + 1) * page_bytes
            }
            // MambaSpec: one page, whatever the length.
            Spec::State { .. } => page_bytes,
        }
    };
    let mut groups = Vec::new();
    for (sp, n) in &kinds {
        for _ in 0..n.div_ceil(group_size.max(1)) {
            groups.push(Group {
                kind: sp.kind(),
                layers: group_size,
                max_bytes_per_request: max_usage(*sp),
            });
        }
    }
    // `get_num_blocks`: `available_memory // page_size // num_layers` (num_layers =
    // group_size: one pool per layer position, shared by one layer of each group).
    let num_blocks = if page_bytes == 0 || group_size == 0 {
        0
    } else {
        available / page_bytes / group_size as u64
    };
    // `max_memory_usage_per_request = group_size * sum(spec.max_memory_usage_bytes)`
    // over the groups; `memory_per_block = page_size * group_size`.
    let per_request: u64 = groups.iter().map(|g| g.max_bytes_per_request).sum::<u64>() * group_size as u64;
    let per_block = page_bytes * group_size as u64;
    let blocks_per_request = if per_block == 0 {
        0
    } else {
        per_request.div_ceil(per_block)
    };
    Layout {
        block_size,
        page_bytes,
        attention_bytes_per_token,
        groups,
        group_size,
        num_blocks,
        blocks_per_request,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(kv_bytes: f64, max_model_len: u64) -> Settings {
        Settings {
            block_size: 16,
            kv_bytes,
            state_bytes: 2.0,
            ssm_bytes: 2.0,
            tensor_parallel: 1,
            max_model_len,
            max_batched_tokens: 8192,
            kernel_alignment: 16,
        }
    }

    #[test]
    fn full_attention_llama_3_1_8b() {
        // 32 layers, 8 KV heads of 128, bf16: 2 × 8 × 128 × 2 = 4096 B per token per
        // layer, 128 KiB per token for the model; a 16-token page is 65,536 B.
        let layers = vec![
            Layer::Full {
                kv_heads: 8,
                head_dim: 128
            };
            32
        ];
        let l = layout(&layers, &gpu(2.0, 8192), 10 << 30);
        assert_eq!(l.attention_bytes_per_token, 4096);
        assert_eq!(l.page_bytes, 65_536);
        // 10 GiB / 65,536 / 32 = 5,120 blocks of 16 tokens = 81,920 tokens.
        assert_eq!(l.num_blocks, 5_120);
        assert_eq!(l.tokens(), 81_920);
        // 8,192 tokens need 512 blocks: 10x.
        assert_eq!(l.blocks_per_request, 512);
        assert!((l.max_concurrency() - 10.0).abs() < 1e-9);
        // fp8 KV halves the page: twice the tokens.
        assert_eq!(layout(&layers, &gpu(1.0, 8192), 10 << 30).tokens(), 163_840);
        // TP 2 splits the 8 KV heads: each GPU holds 4 per layer.
        let tp2 = Settings {
            tensor_parallel: 2,
            ..gpu(2.0, 8192)
        };
        assert_eq!(layout(&layers, &tp2, 10 << 30).attention_bytes_per_token, 2048);
    }

    #[test]
    fn mla_deepseek_v3() {
        // 61 layers, one latent of 512 + 64 = 576 values, bf16: 1,152 B per token per
        // layer, whatever the TP size.
        let layers = vec![Layer::Mla { latent: 576 }; 61];
        let tp8 = Settings {
            tensor_parallel: 8,
            ..gpu(2.0, 4096)
        };
        let l = layout(&layers, &tp8, 20 << 30);
        assert_eq!(l.attention_bytes_per_token, 1152);
        // 21,474,836,480 B / (1,152 × 16) = 1,165,084 pages / 61 = 19,099 blocks →
        // 305,584 tokens.
        assert_eq!(l.num_blocks, 19_099);
        assert_eq!(l.tokens(), 305_584);
    }

    #[test]
    fn sliding_and_full_gemma_3_27b() {
        // 62 layers, every 6th global: 10 full, 52 sliding (window 1024); 16 KV heads of
        // 128, bf16 → 8,192 B per token per layer.
        let full = Layer::Full {
            kv_heads: 16,
            head_dim: 128,
        };
        let sliding = Layer::Sliding {
            kv_heads: 16,
            head_dim: 128,
            window: 1024,
        };
        let layers: Vec<Layer> = (0..62)
            .map(|i| if (i + 1) % 6 == 0 { full } else { sliding })
            .collect();
        let l = layout(&layers, &gpu(2.0, 32_768), 40 << 30);
        // group_size = 10 (52 ≥ 1.5 × 10): 1 full group + 6 sliding groups (the last
        // padded with 8 empty layers).
        assert_eq!(l.group_size, 10);
        assert_eq!(l.groups.len(), 7);
        // 40 GiB / (8,192 × 16) / 10 = 32,768 blocks; tokens = 32,768 // 7 × 16.
        assert_eq!(l.num_blocks, 32_768);
        assert_eq!(l.tokens(), 32_768 / 7 * 16);
        // One 32K request: full 2,048 blocks; each sliding group cdiv(min(1,023 + 8,192,
        // 32,768), 16) + 1 = 576 + 1 = 577 blocks; total 2,048 + 6 × 577 = 5,510.
        assert_eq!(l.blocks_per_request, 2_048 + 6 * 577);
    }

    #[test]
    fn hybrid_gated_delta_net_qwen3_next() {
        // Qwen3-Next-80B-A3B: 48 layers, every 4th full attention (2 KV heads of 256),
        // the others Gated DeltaNet (16 key heads, 32 value heads, 128 × 128, conv 4).
        let full = Layer::Full {
            kv_heads: 2,
            head_dim: 256,
        };
        let gdn = Layer::GatedDeltaNet {
            key_heads: 16,
            value_heads: 32,
            key_dim: 128,
            value_dim: 128,
            conv_kernel: 4,
        };
        let layers: Vec<Layer> = (0..48)
            .map(|i| if (i + 1) % 4 == 0 { full } else { gdn })
            .collect();
        let l = layout(&layers, &gpu(2.0, 524_288), 15_569_256_448);
        // Attention: 2 × 2 × 256 × 2 = 2,048 B per token per layer.
        assert_eq!(l.attention_bytes_per_token, 2048);
        // State: conv (2 × 16 × 128 + 32 × 128) × 3 = 24,576 and temporal 32 × 128 ×
        // 128 = 524,288 elements, bf16 → 1,097,728 B. Block: 16 × cdiv(1,097,728, 16 ×
        // 2,048) = 16 × 34 = 544 tokens; page 544 × 2,048 = 1,114,112 B.
        assert_eq!(l.block_size, 544);
        assert_eq!(l.page_bytes, 1_114_112);
        // 12 full, 36 GDN: group_size 12, 1 + 3 groups.
        assert_eq!(l.group_size, 12);
        assert_eq!(l.groups.len(), 4);
        // 15,569,256,448 / 1,114,112 / 12 = 1,164 blocks; 1,164 // 4 × 544 = 158,304.
        assert_eq!(l.num_blocks, 1_164);
        assert_eq!(l.tokens(), 158_304);
        // One 512K request: cdiv(524,288, 544) = 964 blocks + 3 state blocks = 967.
        assert_eq!(l.blocks_per_request, 967);
    }
}
