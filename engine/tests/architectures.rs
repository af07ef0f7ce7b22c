//! The native engine's MoE and hybrid decoders against transformers 5.17 on tiny random
//! models that transformers itself built and saved (`tests/fixtures/architectures/`,
//! made by `scripts/reference/tiny_architectures.py`): every prompt position's
//! log-probability and every greedy token of each model, in f32; the same tokens
//! batched with another sequence and with the prompt split into chunks; and the same
//! logits from fused 3-D expert tensors as from one tensor per expert.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sous_engine::native::config::ModelConfig;
use sous_engine::native::model::{BatchSeq, KvCache, Logits, Model};
use sous_engine::native::weights::{Checkpoint, Precision};

/// How far a log-probability may be from transformers': f32 sums in another order
/// through a few layers (the largest gap seen is about a tenth of this).
const LOGPROB_TOLERANCE: f32 = 2e-4;

const BLOCK: usize = 16;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("engine/ has a parent")
        .join("tests/fixtures/architectures")
}

fn reference(dir: &Path) -> Value {
    let path = dir.join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

fn load(dir: &Path) -> Model {
    let config = ModelConfig::read(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let checkpoint = Checkpoint::open(dir, &config).expect("checkpoint");
    Model::load(config, &checkpoint, Precision::Stored, 512)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<Option<f32>> {
    v.as_array()
        .expect("floats")
        .iter()
        .map(|x| x.as_f64().map(|f| f as f32))
        .collect()
}

fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    row.iter().map(|&v| v - max - sum.ln() as f32).collect()
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

/// What a run gives for one sequence: its prompt logits (every position) and its greedy
/// tokens with their log-probabilities.
type Ran = (Vec<f32>, Vec<(u32, f32)>);

/// A sequence being run: its prompt, blocks, state slot and what it has computed.
struct Run {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
    slot: usize,
    computed: usize,
}

/// Prefills each sequence's prompt in chunks of `chunk` tokens (all sequences in every
/// step), then decodes `steps` greedy tokens for each, every step one batch. Returns
/// each sequence's prompt logits (every position, `vocab` each) and greedy tokens with
/// their log-probabilities.
fn run(model: &Model, prompts: &[Vec<u32>], chunk: usize, steps: usize) -> Vec<Ran> {
    let vocab = model.config().vocab_size;
    let per_seq = 512 / BLOCK;
    let mut cache = KvCache::new(model, per_seq * prompts.len(), BLOCK).with_state_slots(prompts.len());
    let mut runs: Vec<Run> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Run {
            tokens: p.clone(),
            blocks: ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect(),
            slot: i,
            computed: 0,
        })
        .collect();
    let mut out: Vec<Ran> = vec![(Vec::new(), Vec::new()); prompts.len()];
    // Prefill.
    while runs.iter().any(|r| r.computed < r.tokens.len()) {
        let batch: Vec<(usize, BatchSeq)> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.computed < r.tokens.len())
            .map(|(i, r)| {
                let end = (r.computed + chunk).min(r.tokens.len());
                let seq = BatchSeq {
                    blocks: &r.blocks,
                    tokens: &r.tokens[r.computed..end],
                    start: r.computed,
                    state: r.slot,
                    logits: Logits::All,
                };
                (i, seq)
            })
            .collect();
        let seqs: Vec<BatchSeq> = batch.iter().map(|(_, s)| s.clone()).collect();
        let logits = model.forward(&seqs, &mut cache).expect("prefill");
        let mut at = 0;
        let done: Vec<(usize, usize)> = batch.iter().map(|(i, s)| (*i, s.tokens.len())).collect();
        for (i, len) in done {
            out[i]
                .0
                .extend_from_slice(&logits[at * vocab..(at + len) * vocab]);
            at += len;
            runs[i].computed += len;
        }
    }
    // The first greedy token comes from the prompt's last position.
    for (i, r) in runs.iter_mut().enumerate() {
        let last = &out[i].0[(r.tokens.len() - 1) * vocab..];
        let id = argmax(last);
        let lp = log_softmax(last)[id as usize];
        out[i].1.push((id, lp));
        r.tokens.push(id);
    }
    for _ in 1..steps {
        let seqs: Vec<BatchSeq> = runs
            .iter()
            .map(|r| BatchSeq {
                blocks: &r.blocks,
                tokens: &r.tokens[r.computed..],
                start: r.computed,
                state: r.slot,
                logits: Logits::Last,
            })
            .collect();
        let logits = model.forward(&seqs, &mut cache).expect("decode");
        for (i, (r, row)) in runs.iter_mut().zip(logits.chunks_exact(vocab)).enumerate() {
            r.computed += 1;
            let id = argmax(row);
            out[i].1.push((id, log_softmax(row)[id as usize]));
            r.tokens.push(id);
        }
    }
    out
}

/// Checks one fixture model: alone, batched, chunked.
fn check(name: &str) {
    let dir = fixtures().join(name);
    let want = reference(&dir);
    let model = load(&dir);
    let vocab = model.config().vocab_size;
    let cases = want["cases"].as_array().expect("cases");
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["prompt"])).collect();
    let steps = ids(&cases[0]["greedy"]).len();
    let mut worst = 0.0f32;
    for (case, prompt) in cases.iter().zip(&prompts) {
        let got = run(&model, std::slice::from_ref(prompt), usize::MAX, steps).remove(0);
        for (i, lp) in floats(&case["prompt_logprobs"]).iter().enumerate() {
            let Some(lp) = lp else { continue };
            let row = log_softmax(&got.0[(i - 1) * vocab..i * vocab]);
            let gap = (row[prompt[i] as usize] - lp).abs();
            worst = worst.max(gap);
            assert!(
                gap <= LOGPROB_TOLERANCE,
                "{name}: prompt position {i}: {} vs transformers' {lp}",
                row[prompt[i] as usize]
            );
        }
        let greedy: Vec<u32> = got.1.iter().map(|(id, _)| *id).collect();
        assert_eq!(greedy, ids(&case["greedy"]), "{name}: greedy tokens");
        for ((step, (_, lp)), want) in got.1.iter().enumerate().zip(floats(&case["greedy_logprobs"])) {
            let want = want.expect("a logprob");
            worst = worst.max((lp - want).abs());
            assert!(
                (lp - want).abs() <= LOGPROB_TOLERANCE,
                "{name}: greedy step {step}: {lp} vs {want}"
            );
        }
    }
    // Both prompts in one batch, and prefilled 5 tokens a step: every row's
    // arithmetic is its own, so the same tokens.
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            run(&model, std::slice::from_ref(p), usize::MAX, steps)
                .remove(0)
                .1
                .iter()
                .map(|t| t.0)
                .collect()
        })
        .collect();
    for chunk in [usize::MAX, 5] {
        let together = run(&model, &prompts, chunk, steps);
        for (i, (got, alone)) in together.iter().zip(&alone).enumerate() {
            let tokens: Vec<u32> = got.1.iter().map(|t| t.0).collect();
            assert_eq!(
                &tokens, alone,
                "{name}: case {i} batched, prefill chunks of {chunk}"
            );
        }
    }
    // The figure the tolerance is set from (`--nocapture`).
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{name}: largest log-probability gap to transformers {worst:e}");
    }
}

#[test]
fn qwen3_moe_matches_transformers() {
    check("qwen3_moe");
}

#[test]
fn qwen2_moe_matches_transformers() {
    check("qwen2_moe");
}

#[test]
fn mixtral_matches_transformers() {
    check("mixtral");
}

#[test]
fn qwen3_next_matches_transformers() {
    check("qwen3_next");
}

#[test]
fn qwen3_5_matches_transformers() {
    check("qwen3_5");
}

#[test]
fn qwen3_5_moe_matches_transformers() {
    check("qwen3_5_moe");
}

/// The same model with its experts in the other layout gives the same logits, bit for
/// bit: the same matrices, packed the same way.
fn same_logits_in_both_layouts(name: &str, variant: &str) {
    let dir = fixtures();
    let want = reference(&dir.join(name));
    let prompts: Vec<Vec<u32>> = want["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| ids(&c["prompt"]))
        .collect();
    let a = run(&load(&dir.join(name)), &prompts, usize::MAX, 4);
    let b = run(&load(&dir.join(variant)), &prompts, usize::MAX, 4);
    for (a, b) in a.iter().zip(&b) {
        assert!(a.0 == b.0, "{variant}: prompt logits differ from {name}'s");
        assert_eq!(a.1, b.1, "{variant}: greedy tokens");
    }
}

#[test]
fn fused_expert_tensors_give_the_same_logits_as_one_tensor_per_expert() {
    for name in ["qwen3_moe", "qwen2_moe", "mixtral", "qwen3_next", "qwen3_5_moe"] {
        same_logits_in_both_layouts(name, &format!("{name}-fused"));
    }
}

/// The checkpoint's MTP head drafts what an independent PyTorch reference of vLLM's
/// MTP forward drafts (`scripts/reference/mtp_reference.py`): two tokens after every
/// greedy token, the head reading the decoder's final hidden states and keeping keys
/// and values of its own.
fn mtp_drafts_match_the_reference(name: &str) {
    let dir = fixtures().join(name);
    let want = reference(&dir);
    let model = load(&dir);
    assert!(model.has_mtp(), "{name}: the MTP head is not loaded");
    let vocab = model.config().vocab_size;
    let h = model.config().hidden_size;
    let mut worst = 0.0f32;
    for (case, drafts) in want["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .zip(want["mtp"]["cases"].as_array().expect("mtp cases"))
    {
        let prompt = ids(&case["prompt"]);
        let greedy = ids(&case["greedy"]);
        let blocks: Vec<u32> = (0..(512 / BLOCK) as u32).collect();
        let mut cache = KvCache::new(&model, blocks.len(), BLOCK);
        let n = prompt.len();
        for (j, want_drafts) in drafts["drafts"].as_array().expect("drafts").iter().enumerate() {
            // The decoder over what is new (the prompt, then the last greedy token).
            let (input, start) = if j == 0 {
                (prompt.clone(), 0)
            } else {
                (vec![greedy[j - 1]], n + j - 1)
            };
            let seq = BatchSeq {
                blocks: &blocks,
                tokens: &input,
                start,
                state: 0,
                logits: Logits::Last,
            };
            let passed = model.forward_hidden(&[seq], &mut cache).expect("decoder");
            assert_eq!(passed.hidden.len(), input.len() * h);
            // The head over the same positions, each with the token after it.
            let next: Vec<u32> = if j == 0 {
                prompt[1..].iter().chain(&greedy[..1]).copied().collect()
            } else {
                vec![greedy[j]]
            };
            let mut drafted = Vec::new();
            let mut lps = Vec::new();
            let (mut tokens, mut hidden, mut at) = (next, passed.hidden, start);
            for _ in 0..2 {
                let seq = BatchSeq {
                    blocks: &blocks,
                    tokens: &tokens,
                    start: at,
                    state: 0,
                    logits: Logits::Last,
                };
                let out = model.forward_mtp(&[seq], &hidden, &mut cache).expect("MTP");
                assert_eq!(out.logits.len(), vocab);
                let id = argmax(&out.logits);
                lps.push(log_softmax(&out.logits)[id as usize]);
                drafted.push(id);
                at += tokens.len();
                (tokens, hidden) = (vec![id], out.hidden);
            }
            assert_eq!(drafted, ids(want_drafts), "{name}: drafts after greedy token {j}");
            for (lp, want) in lps.iter().zip(floats(&drafts["draft_logprobs"][j])) {
                let want = want.expect("a logprob");
                worst = worst.max((lp - want).abs());
                assert!(
                    (lp - want).abs() <= LOGPROB_TOLERANCE,
                    "{name}: draft logprob {lp} vs {want}"
                );
            }
        }
    }
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{name}: largest MTP draft log-probability gap to the reference {worst:e}");
    }
}

#[test]
fn qwen3_next_mtp_drafts_match_the_reference() {
    mtp_drafts_match_the_reference("qwen3_next");
}

#[test]
fn qwen3_5_mtp_drafts_match_the_reference() {
    mtp_drafts_match_the_reference("qwen3_5");
}

#[test]
fn multimodal_qwen3_5_checkpoints_run_their_text_decoder() {
    // `Qwen3_5(Moe)ForConditionalGeneration`, as the Hub's Qwen3.5 checkpoints are:
    // settings in `text_config`, the decoder under `model.language_model.`, a vision
    // tower beside it. The same text weights as `qwen3_5` and `qwen3_5_moe`.
    check("qwen3_5-vl");
    check("qwen3_5_moe-vl");
}

#[test]
fn a_checkpoint_missing_an_expert_tensor_is_refused_naming_it() {
    let source = fixtures().join("qwen3_moe");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(source.join("config.json"), dir.path().join("config.json")).expect("config");
    let bytes = std::fs::read(source.join("model.safetensors")).expect("weights");
    let tensors = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let missing = "model.layers.2.mlp.experts.5.up_proj.weight";
    let kept: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != missing)
        .collect();
    safetensors::serialize_to_file(kept, None, &dir.path().join("model.safetensors")).expect("written");
    let config = ModelConfig::read(dir.path()).expect("config");
    let checkpoint = Checkpoint::open(dir.path(), &config).expect("checkpoint");
    let err = Model::load(config, &checkpoint, Precision::Stored, 64).expect_err("an expert is missing");
    assert!(err.to_string().contains(missing), "{err}");
}

/// What a decode step reads (`Model::step_bytes`): a MoE layer reads its `top_k`
/// experts for one token and nearly all of them for many, the rest of the weights
/// every time, and the KV cache grows by a token's keys and values per position.
#[test]
fn a_decode_step_reads_the_routed_experts_and_the_cache() {
    use sous_engine::native::KvDtype;
    let model = load(&fixtures().join("qwen3_moe"));
    // From the fixture's config.json: 8 experts, 2 per token, of width 32 on a hidden
    // size of 64, in layers 0, 2 and 3 (layer 1 is dense); f32 weights.
    let expert = ((2 * 32 * 64) + (64 * 32)) * 4;
    let one = model.step_bytes(&[1], KvDtype::F32);
    let many = model.step_bytes(&[1; 4096], KvDtype::F32);
    // 255 more embedding rows of 64 f32 values (the whole table of 256); the other six
    // experts of three layers.
    let rows = 255 * 64 * 4;
    assert_eq!(many.weights - one.weights - rows, 3 * 6 * expert);
    // Every weight the model holds, once all experts and embedding rows are read.
    assert_eq!(many.weights, model.weight_bytes());
    // Two KV heads of 16 values, keys and values, f32, in 4 attention layers.
    let per_token = 2 * 2 * 16 * 4 * 4;
    assert_eq!(
        model.step_bytes(&[101], KvDtype::F32).kv - one.kv,
        100 * per_token
    );
    assert_eq!(model.step_bytes(&[1, 1], KvDtype::Bf16).kv, per_token);
}
