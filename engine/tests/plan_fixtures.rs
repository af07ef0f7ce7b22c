//! Real published `config.json` files (`tests/fixtures/plan/`, sources in its README)
//! read by the planner and laid out by vLLM's rules, against capacities worked out by
//! hand in the comments.

use std::path::PathBuf;

use sous_engine::plan::kv::{Settings, layout};
use sous_engine::plan::{Layer, Shape};

fn shape(name: &str) -> Shape {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/plan")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = serde_json::from_str(&text).expect("JSON");
    Shape::from_config(&config).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn gpu(max_model_len: u64) -> Settings {
    Settings {
        block_size: 16,
        kv_bytes: 2.0,
        state_bytes: 2.0,
        ssm_bytes: 2.0,
        tensor_parallel: 1,
        max_model_len,
        max_batched_tokens: 8192,
        kernel_alignment: 16,
    }
}

const GIB: u64 = 1 << 30;

#[test]
fn llama_3_1_8b_full_attention() {
    let s = shape("llama-3.1-8b.json");
    // 32 layers, 8 KV heads; no head_dim: 4096 / 32 heads = 128.
    assert_eq!(
        s.layers,
        vec![
            Layer::Full {
                kv_heads: 8,
                head_dim: 128
            };
            32
        ]
    );
    assert_eq!(s.dtype, "bfloat16");
    // 2 × 8 × 128 × 2 B = 4,096 B per token per layer: 128 KiB per token.
    // 16 GiB / (4,096 × 16) / 32 = 8,192 blocks = 131,072 tokens; a 131,072-token
    // request needs 8,192 blocks: 1.00x.
    let l = layout(&s.layers, &gpu(131_072), 16 * GIB);
    assert_eq!(l.tokens(), 131_072);
    assert!((l.max_concurrency() - 1.0).abs() < 1e-9);
}

#[test]
fn qwen3_32b_full_attention_fp8_and_tp() {
    let s = shape("qwen3-32b.json");
    // 64 layers, 8 KV heads of 128 (head_dim given: 5,120 / 64 heads would be 80).
    assert_eq!(
        s.layers,
        vec![
            Layer::Full {
                kv_heads: 8,
                head_dim: 128
            };
            64
        ]
    );
    // bf16: 4,096 B per token per layer; 20 GiB / 65,536 / 64 = 5,120 blocks = 81,920.
    assert_eq!(layout(&s.layers, &gpu(40_960), 20 * GIB).tokens(), 81_920);
    // fp8 KV: 2,048 B: twice the tokens.
    let fp8 = Settings {
        kv_bytes: 1.0,
        ..gpu(40_960)
    };
    assert_eq!(layout(&s.layers, &fp8, 20 * GIB).tokens(), 163_840);
    // TP 2: 4 heads a GPU, 2,048 B, and 20 GiB a GPU: the same 163,840.
    let tp2 = Settings {
        tensor_parallel: 2,
        ..gpu(40_960)
    };
    assert_eq!(layout(&s.layers, &tp2, 20 * GIB).tokens(), 163_840);
}

#[test]
fn qwen3_next_hybrid_as_in_the_titan_report() {
    let s = shape("qwen3-next-80b-a3b.json");
    // 48 layers, every 4th full attention: 12 full (2 KV heads of 256), 36 Gated DeltaNet.
    assert_eq!(s.growing_layers(), 12);
    assert_eq!(s.layers.len(), 48);
    assert_eq!(
        s.layers[3],
        Layer::Full {
            kv_heads: 2,
            head_dim: 256
        }
    );
    assert!(matches!(
        s.layers[0],
        Layer::GatedDeltaNet {
            value_heads: 32,
            key_dim: 128,
            ..
        }
    ));
    assert_eq!(s.experts, Some((512, 10)));
    // The Titan recipe: 14.5 GiB of KV, 512K context.
    // Attention: 2 × 2 × 256 × 2 B = 2,048 B per token per layer.
    // State: conv (2 × 16 × 128 + 32 × 128) × 3 = 24,576 values, recurrent 32 × 128 × 128
    // = 524,288 values; bf16: 1,097,728 B per request per layer.
    // Block: 16 × cdiv(1,097,728, 16 × 2,048) = 544 tokens; page 1,114,112 B.
    // Groups: 1 full + 3 GDN of 12 layers; 15,569,256,448 / 1,114,112 / 12 = 1,164 blocks.
    // Start-up line: 1,164 // 4 × 544 = 158,304 tokens. One 524,288-token request:
    // cdiv(524,288, 544) = 964 blocks + 3 state blocks = 967: 1.20x, i.e. 1,164 / 967 × 524,288 = 631,097 tokens
    // of context at full concurrency. (The report states 604,705 tokens for the same
    // budget; its arithmetic is not given.)
    let l = layout(&s.layers, &gpu(524_288), 15_569_256_448);
    assert_eq!(l.block_size, 544);
    assert_eq!(l.num_blocks, 1_164);
    assert_eq!(l.tokens(), 158_304);
    assert_eq!(l.blocks_per_request, 967);
    assert_eq!(l.context_tokens(524_288), 631_097);
}

#[test]
fn deepseek_mla() {
    let v3 = shape("deepseek-v3.json");
    // 61 layers of MLA: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values per token.
    assert_eq!(v3.layers, vec![Layer::Mla { latent: 576 }; 61]);
    assert_eq!(v3.experts, Some((256, 8)));
    // 1,152 B per token per layer, not split by TP: 20 GiB on each of 8 GPUs =
    // 21,474,836,480 / 18,432 / 61 = 19,099 blocks = 305,584 tokens.
    let tp8 = Settings {
        tensor_parallel: 8,
        ..gpu(163_840)
    };
    assert_eq!(layout(&v3.layers, &tp8, 20 * GIB).tokens(), 305_584);
    // V2-Lite: 27 MLA layers of the same latent: 21,474,836,480 / 18,432 / 27 = 43,151
    // blocks = 690,416 tokens.
    let lite = shape("deepseek-v2-lite.json");
    assert_eq!(lite.layers, vec![Layer::Mla { latent: 576 }; 27]);
    assert_eq!(layout(&lite.layers, &gpu(163_840), 20 * GIB).tokens(), 690_416);
}

#[test]
fn gemma_3_sliding_window() {
    let s = shape("gemma-3-27b.json");
    // 62 layers, every 6th global (transformers' default pattern): 10 full, 52 sliding
    // (1,024), 16 KV heads of 128.
    assert_eq!(s.growing_layers(), 10);
    assert_eq!(
        s.layers[5],
        Layer::Full {
            kv_heads: 16,
            head_dim: 128
        }
    );
    assert_eq!(
        s.layers[0],
        Layer::Sliding {
            kv_heads: 16,
            head_dim: 128,
            window: 1024
        }
    );
    // 8,192 B per token per layer; group size 10: 1 full + 6 sliding groups; 40 GiB /
    // 131,072 / 10 = 32,768 blocks; 32,768 // 7 × 16 = 74,896 tokens. A 32,768-token
    // request: 2,048 full blocks + 6 × (cdiv(1,023 + 8,192, 16) + 1) = 5,510: 5.94x.
    let l = layout(&s.layers, &gpu(32_768), 40 * GIB);
    assert_eq!(l.tokens(), 74_896);
    assert_eq!(l.blocks_per_request, 5_510);
}
