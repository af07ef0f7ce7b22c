//! The native engine on the real SmolLM2 test model, driven through its scheduler loop
//! (no HTTP): greedy continuations equal transformers' token for token over 48 tokens
//! (`tests/fixtures/smollm2/generation.json`, bf16 weights computed in f32), batching and prefix caching change no
//! token, seeded sampling reproduces, and the KV cache is empty when requests are done.
//! `kernel_paths` runs the numerics once per kernel path this CPU has.
//!
//! The model is made by `scripts/fetch-test-model.sh` (run by `scripts/test.sh`); outside
//! CI a missing model skips these tests loudly.

// A check that cannot run on this machine says so on stderr.
#![allow(clippy::print_stderr)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde_json::Value;
use sous_engine::native::core::{Command, Event, Request};
use sous_engine::native::sampling::SamplingParams;
use sous_engine::native::speculative::Ngram;
use sous_engine::native::weights::Precision;
use sous_engine::native::{Engine, Settings};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

#[path = "native/kernel_paths.rs"]
mod kernel_paths;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("engine/ has a parent")
        .to_path_buf()
}

fn model_dir() -> Option<PathBuf> {
    let dir = root().join("target/models/HuggingFaceTB/SmolLM2-135M-Instruct");
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").is_err(),
        "the SmolLM2 test model is missing in CI: scripts/test.sh must run scripts/fetch-test-model.sh"
    );
    eprintln!("SKIPPED: the SmolLM2 test model is missing: run scripts/fetch-test-model.sh");
    None
}

fn fixture() -> Value {
    let path = root().join("tests/fixtures/smollm2/generation.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// A running engine loop.
struct Loop {
    tx: UnboundedSender<Command>,
    metrics: Arc<sous_engine::native::metrics::Metrics>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Loop {
    fn start(
        dir: &std::path::Path,
        prefix_caching: bool,
        max_num_seqs: usize,
        max_batched_tokens: usize,
    ) -> Loop {
        Loop::start_with(
            dir,
            prefix_caching,
            max_num_seqs,
            max_batched_tokens,
            None,
            Precision::Stored,
        )
    }

    fn start_with(
        dir: &std::path::Path,
        prefix_caching: bool,
        max_num_seqs: usize,
        max_batched_tokens: usize,
        speculative: Option<Ngram>,
        precision: Precision,
    ) -> Loop {
        Loop::launch(settings(
            dir,
            prefix_caching,
            max_num_seqs,
            max_batched_tokens,
            speculative,
            precision,
        ))
    }

    fn launch(settings: Settings) -> Loop {
        let engine =
            Engine::load(settings, Arc::new(sous_engine::reporter::Silent)).expect("the engine loads");
        let (tx, rx) = unbounded_channel();
        let metrics = engine.metrics.clone();
        let core = engine.core;
        let thread = std::thread::spawn(move || core.run(rx));
        Loop {
            tx,
            metrics,
            thread: Some(thread),
        }
    }

    fn submit(&self, prompt: Vec<u32>, params: SamplingParams) -> UnboundedReceiver<Event> {
        let (events, rx) = unbounded_channel();
        self.tx
            .send(Command::Submit(Request {
                prompt,
                params,
                events,
                stopped: Arc::new(AtomicBool::new(false)),
                arrival: Instant::now(),
            }))
            .expect("the loop runs");
        rx
    }

    /// Tokens of a finished request, and how many prompt tokens came from the cache.
    fn collect(mut rx: UnboundedReceiver<Event>) -> (Vec<u32>, usize) {
        let mut tokens = Vec::new();
        let mut cached = 0;
        while let Some(event) = rx.blocking_recv() {
            match event {
                Event::Token {
                    id, cached_tokens, ..
                } => {
                    tokens.push(id);
                    cached = cached_tokens;
                }
                Event::Finished(_) => break,
                Event::Failed(m) => panic!("the engine failed: {m}"),
                Event::PromptLogprobs(_) => {}
            }
        }
        (tokens, cached)
    }

    fn generate(&self, prompt: Vec<u32>, params: SamplingParams) -> (Vec<u32>, usize) {
        Loop::collect(self.submit(prompt, params))
    }

    fn idle(&self) -> (usize, usize, f64) {
        // The loop publishes its gauges after every step; give it that step.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.metrics.snapshot();
            if (s.0, s.1, s.2) == (0, 0, 0.0) || Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let (tx, _) = unbounded_channel();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The engine settings the tests run with (a 256 MiB KV cache, 2,048 tokens a sequence).
fn settings(
    dir: &std::path::Path,
    prefix_caching: bool,
    max_num_seqs: usize,
    max_batched_tokens: usize,
    speculative: Option<Ngram>,
    precision: Precision,
) -> Settings {
    Settings {
        model_dir: dir.to_owned(),
        served_name: "smollm2".into(),
        precision,
        embeddings: Default::default(),
        kv_dtype: Default::default(),
        max_model_len: Some(2048),
        max_num_seqs,
        max_batched_tokens,
        prefix_caching,
        chunked_prefill: true,
        speculative,
        mtp: None,
        kv_cache_bytes: Some(256 << 20),
        memory_fraction: None,
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        stop_grace: Duration::from_secs(1),
        log_interval: Duration::from_secs(3600),
        kernels: Default::default(),
    }
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// The fixture's prompts (single and batch): name, input ids, and transformers' greedy
/// ids for the bf16 import (which target/models holds; transformers ran it in f32, as
/// the engine computes).
fn greedy_prompts(fixture: &Value) -> Vec<(String, Vec<u32>, Vec<u32>)> {
    fixture["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .chain(fixture["batch_prompts"].as_array().into_iter().flatten())
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("?").to_owned(),
                ids(&p["input_ids"]),
                ids(&p["imported_bf16"]["greedy_ids"]),
            )
        })
        .collect()
}

#[test]
fn greedy_decoding_matches_transformers_and_batching_changes_nothing() {
    let Some(dir) = model_dir() else { return };
    let fixture = fixture();
    let n = fixture["greedy_tokens"].as_u64().expect("greedy_tokens") as usize;
    let prompts = greedy_prompts(&fixture);
    // Small steps so that prompts are prefilled in several chunks.
    let engine = Loop::start(&dir, false, 16, 24);
    let mut alone = Vec::new();
    for (name, input, want) in &prompts {
        let (got, _) = engine.generate(input.clone(), greedy(n));
        assert_eq!(
            &got, want,
            "prompt `{name}`: greedy ids differ from transformers'"
        );
        alone.push(got);
    }
    // All prompts at once: each gets exactly the tokens it got alone.
    let receivers: Vec<_> = prompts
        .iter()
        .map(|(_, input, _)| engine.submit(input.clone(), greedy(n)))
        .collect();
    for ((name, ..), (rx, want)) in prompts.iter().zip(receivers.into_iter().zip(&alone)) {
        assert_eq!(
            &Loop::collect(rx).0,
            want,
            "prompt `{name}` batched with the others"
        );
    }
    assert_eq!(engine.idle(), (0, 0, 0.0), "nothing running, no KV block in use");
}

#[test]
fn a_prefix_cache_hit_gives_the_same_tokens_as_a_miss() {
    let Some(dir) = model_dir() else { return };
    let fixture = fixture();
    let base = ids(&fixture["prompts"][0]["input_ids"]);
    // A long shared prefix (several 16-token blocks) and two different endings.
    let mut prefix = base.clone();
    prefix.extend(base.iter().take(30));
    let a: Vec<u32> = prefix.iter().copied().chain([504, 3575]).collect();
    let b: Vec<u32> = prefix.iter().copied().chain([1780, 314]).collect();
    let cold = Loop::start(&dir, false, 4, 512);
    let (a_cold, cached) = cold.generate(a.clone(), greedy(24));
    assert_eq!(cached, 0);
    let (b_cold, _) = cold.generate(b.clone(), greedy(24));
    drop(cold);

    let warm = Loop::start(&dir, true, 4, 512);
    let (a_first, cached) = warm.generate(a.clone(), greedy(24));
    assert_eq!(cached, 0, "nothing is cached yet");
    let (a_again, cached_a) = warm.generate(a.clone(), greedy(24));
    let (b_hit, cached_b) = warm.generate(b.clone(), greedy(24));
    assert_eq!(a_first, a_cold);
    assert_eq!(a_again, a_cold, "a full-prompt hit");
    assert_eq!(b_hit, b_cold, "a shared-prefix hit");
    let full_blocks = |len: usize| (len - 1) / 16 * 16;
    assert_eq!(
        cached_a,
        full_blocks(a.len()),
        "every full block of the prompt is reused"
    );
    assert_eq!(
        cached_b,
        prefix.len() / 16 * 16,
        "the blocks of the shared prefix are reused"
    );
    assert_eq!(warm.idle(), (0, 0, 0.0));
    let text = warm.metrics.render();
    assert!(
        text.contains(&format!(
            "vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"smollm2\"}} {}.0",
            cached_a + cached_b
        )),
        "{text}"
    );
}

#[test]
fn seeded_sampling_reproduces_whatever_runs_beside_it() {
    let Some(dir) = model_dir() else { return };
    let prompt = ids(&fixture()["prompts"][0]["input_ids"]);
    let engine = Loop::start(&dir, false, 8, 512);
    let sampled = |seed: u64| SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        top_k: 50,
        seed: Some(seed),
        max_tokens: 24,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let (first, _) = engine.generate(prompt.clone(), sampled(7));
    // The same seed again, now batched with two other sampled requests.
    let others: Vec<_> = (0..2)
        .map(|s| engine.submit(prompt.clone(), sampled(100 + s)))
        .collect();
    let (second, _) = engine.generate(prompt.clone(), sampled(7));
    let other_outputs: Vec<Vec<u32>> = others.into_iter().map(|rx| Loop::collect(rx).0).collect();
    assert_eq!(first, second, "same seed, same tokens");
    assert!(
        other_outputs.iter().any(|o| o != &first),
        "other seeds sample other tokens: {other_outputs:?} vs {first:?}"
    );
    let (greedy_out, _) = engine.generate(prompt, greedy(24));
    assert_ne!(first, greedy_out, "temperature 1 really samples");
}

#[test]
fn a_dropped_request_frees_its_blocks_and_a_full_cache_queues() {
    let Some(dir) = model_dir() else { return };
    let prompt = ids(&fixture()["prompts"][0]["input_ids"]);
    // Room for two sequences at a time; eight requests must all complete, queued.
    let engine = Loop::start(&dir, false, 2, 512);
    let rxs: Vec<_> = (0..8).map(|_| engine.submit(prompt.clone(), greedy(8))).collect();
    let cancelled = engine.submit(prompt.clone(), greedy(500));
    drop(cancelled);
    for rx in rxs {
        assert_eq!(Loop::collect(rx).0.len(), 8);
    }
    assert_eq!(engine.idle(), (0, 0, 0.0));
    let text = engine.metrics.render();
    assert!(
        text.contains(
            "vllm:request_success_total{finished_reason=\"abort\",engine=\"0\",model_name=\"smollm2\"} 1.0"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "vllm:request_success_total{finished_reason=\"length\",engine=\"0\",model_name=\"smollm2\"} 8.0"
        ),
        "{text}"
    );
}

/// The value of a counter series in `/metrics` text.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l.as_bytes().get(name.len()) == Some(&b'{'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn ngram_speculation_changes_no_greedy_token_and_reports_its_acceptance() {
    let Some(dir) = model_dir() else { return };
    let fixture = fixture();
    let n = fixture["greedy_tokens"].as_u64().expect("greedy_tokens") as usize;
    let ngram = Ngram {
        tokens: 4,
        min: 1,
        max: 3,
    };
    let engine = Loop::start_with(&dir, false, 16, 64, Some(ngram), Precision::Stored);
    let prompts = greedy_prompts(&fixture);
    assert_eq!(prompts.len(), 11, "the fixture's 11 prompts");
    for (name, input, want) in &prompts {
        assert_eq!(
            &engine.generate(input.clone(), greedy(n)).0,
            want,
            "prompt `{name}` with speculation"
        );
    }
    let receivers: Vec<_> = prompts
        .iter()
        .map(|(_, input, _)| engine.submit(input.clone(), greedy(n)))
        .collect();
    for ((name, _, want), rx) in prompts.iter().zip(receivers) {
        assert_eq!(
            &Loop::collect(rx).0,
            want,
            "prompt `{name}` batched, with speculation"
        );
    }
    // A prompt that repeats itself: drafts are found and most of them stand, and the
    // output is the one without speculation.
    let base = ids(&fixture["prompts"][0]["input_ids"]);
    let repetitive: Vec<u32> = base.iter().chain(&base).chain(&base).copied().collect();
    let plain = Loop::start(&dir, false, 16, 64);
    let want = plain.generate(repetitive.clone(), greedy(48)).0;
    let text = engine.metrics.render();
    let before = counter(&text, "vllm:spec_decode_num_accepted_tokens_total");
    assert_eq!(
        engine.generate(repetitive, greedy(48)).0,
        want,
        "the repetitive prompt"
    );
    let text = engine.metrics.render();
    let drafted = counter(&text, "vllm:spec_decode_num_draft_tokens_total");
    let accepted = counter(&text, "vllm:spec_decode_num_accepted_tokens_total");
    assert!(
        drafted > 0.0 && accepted > before,
        "drafted {drafted}, accepted {accepted} (before {before})"
    );
    assert!(accepted <= drafted);
    // Seeded sampling through rejection sampling reproduces itself.
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: Some(11),
        max_tokens: 32,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let a = engine.generate(base.clone(), seeded.clone()).0;
    assert_eq!(engine.generate(base, seeded).0, a, "a seed gives the same tokens");
    assert_eq!(engine.idle(), (0, 0, 0.0), "nothing running, no KV block in use");
}

/// The log-probabilities of a prompt's tokens (from the second on) under `engine`.
fn prompt_logprobs(engine: &Loop, prompt: &[u32]) -> Vec<f32> {
    let params = SamplingParams {
        prompt_logprobs: Some(0),
        ..greedy(1)
    };
    let mut rx = engine.submit(prompt.to_vec(), params);
    while let Some(event) = rx.blocking_recv() {
        match event {
            Event::PromptLogprobs(lps) => return lps.into_iter().flatten().map(|t| t.logprob).collect(),
            Event::Failed(m) => panic!("the engine failed: {m}"),
            Event::Finished(_) => break,
            Event::Token { .. } => {}
        }
    }
    panic!("no prompt logprobs")
}

/// The mean of log-probabilities.
fn mean(v: &[f32]) -> f64 {
    v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64
}

/// The mean absolute difference of two runs' log-probabilities.
fn mean_gap(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .sum::<f64>()
        / a.len() as f64
}

#[test]
fn bf16_arithmetic_stays_close_to_f32_over_a_long_prompt() {
    let Some(dir) = model_dir() else { return };
    let text: Vec<u32> = greedy_prompts(&fixture())
        .into_iter()
        .flat_map(|(_, input, _)| input)
        .collect();
    // Twice over: long enough for prompt-sized products (the dot-product kernel, where
    // the CPU has AVX512-BF16) in several chunks.
    let text = [text.clone(), text].concat();
    let f32s = prompt_logprobs(&Loop::start(&dir, false, 4, 128), &text);
    let bf16 = prompt_logprobs(
        &Loop::start_with(&dir, false, 4, 128, None, Precision::Bf16),
        &text,
    );
    assert_eq!(f32s.len(), text.len() - 1);
    assert_eq!(bf16.len(), f32s.len());
    let gap = mean_gap(&f32s, &bf16);
    // Different arithmetic (bf16 inputs), the same model: per-token log-probabilities
    // within a few hundredths of a nat on average, and the same mean to 1 %.
    assert!(
        gap > 0.0,
        "bf16 arithmetic gave the f32 numbers exactly: was it used?"
    );
    assert!(gap < 0.05, "mean |Δ logprob| {gap}");
    assert!(
        (mean(&bf16) / mean(&f32s) - 1.0).abs() < 0.01,
        "{} vs {}",
        mean(&bf16),
        mean(&f32s)
    );
}

/// The shipped recipe's arithmetic (`serving.dtype = "bfloat16"`, its cache in bf16):
/// greedy tokens do not depend on batching or on ngram speculation there either. They
/// did when products of a few rows took the f32 kernels and larger ones AVX512-BF16's dot
/// product (2 of the 11 prompts changed batched, 1 with speculation, on a Zen 5).
#[test]
fn bf16_arithmetic_changes_no_greedy_token_batched_or_speculated() {
    let Some(dir) = model_dir() else { return };
    let launch = |speculative| {
        Loop::launch(Settings {
            kv_dtype: sous_engine::native::KvDtype::Bf16,
            ..settings(&dir, false, 16, 64, speculative, Precision::Bf16)
        })
    };
    let plain = launch(None);
    let prompts = greedy_prompts(&fixture());
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|(_, input, _)| plain.generate(input.clone(), greedy(48)).0)
        .collect();
    let receivers: Vec<_> = prompts
        .iter()
        .map(|(_, input, _)| plain.submit(input.clone(), greedy(48)))
        .collect();
    for (((name, ..), want), rx) in prompts.iter().zip(&alone).zip(receivers) {
        assert_eq!(&Loop::collect(rx).0, want, "prompt `{name}` batched, bf16");
    }
    let speculating = launch(Some(Ngram {
        tokens: 4,
        min: 1,
        max: 3,
    }));
    for ((name, input, _), want) in prompts.iter().zip(&alone) {
        assert_eq!(
            &speculating.generate(input.clone(), greedy(48)).0,
            want,
            "prompt `{name}` with speculation, bf16"
        );
    }
}

/// `memory.kv_cache_dtype = "bfloat16"`: keys and values rounded to bf16 in the cache. The
/// same budget holds twice the tokens, the log-probabilities stay within a few
/// thousandths of a nat of the f32 cache's, and greedy decoding of the fixture prompts
/// keeps almost every token (a rounding can tip a near tie).
#[test]
fn a_bf16_kv_cache_holds_twice_the_tokens_and_keeps_the_numbers_close() {
    use sous_engine::native::KvDtype;
    let Some(dir) = model_dir() else { return };
    let fixture = fixture();
    let text: Vec<u32> = greedy_prompts(&fixture)
        .into_iter()
        .flat_map(|(_, input, _)| input)
        .collect();
    let text = [text.clone(), text].concat();
    let f32s = Loop::start(&dir, false, 4, 128);
    let bf16 = Loop::launch(Settings {
        kv_dtype: KvDtype::Bf16,
        ..settings(&dir, false, 4, 128, None, Precision::Stored)
    });
    let info = |engine: &Loop| {
        let text = engine.metrics.render();
        let line = text
            .lines()
            .find(|l| l.starts_with("vllm:cache_config_info{"))
            .map(str::to_owned);
        line.unwrap_or_else(|| panic!("no cache_config_info in {text}"))
    };
    let blocks = |line: &str| -> u64 {
        let at = line.find("num_cpu_blocks=\"").expect("num_cpu_blocks") + "num_cpu_blocks=\"".len();
        line[at..]
            .split('"')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a number")
    };
    let (info32, info16) = (info(&f32s), info(&bf16));
    assert!(info32.contains("cache_dtype=\"float32\""), "{info32}");
    assert!(info16.contains("cache_dtype=\"bfloat16\""), "{info16}");
    assert_eq!(blocks(&info16), 2 * blocks(&info32), "{info32}\n{info16}");

    let (a, b) = (prompt_logprobs(&f32s, &text), prompt_logprobs(&bf16, &text));
    assert_eq!(a.len(), b.len());
    let gap = mean_gap(&a, &b);
    assert!(
        gap > 0.0,
        "the bf16 cache gave the f32 numbers exactly: was it used?"
    );
    assert!(gap < 0.01, "mean |Δ logprob| {gap}");

    let (mut same, mut total) = (0, 0);
    for (name, input, _) in greedy_prompts(&fixture) {
        let (want, _) = f32s.generate(input.clone(), greedy(24));
        let (got, _) = bf16.generate(input, greedy(24));
        // Up to the first difference, the tokens are the f32 cache's.
        let agree = want.iter().zip(&got).take_while(|(x, y)| x == y).count();
        eprintln!(
            "{name}: {agree} of {} tokens before the first difference",
            want.len()
        );
        same += agree;
        total += want.len();
    }
    assert!(
        same * 10 >= total * 8,
        "{same} of {total} greedy tokens before the first difference"
    );
}

/// A prompt chunk asking for its last token's logits runs the last layer past its keys
/// and values on that row alone; the logits are those of the row computed with every
/// other row, bit for bit, and so is what the cache holds for the next token.
#[test]
fn the_last_layer_on_the_asked_rows_alone_gives_the_same_logits() {
    use sous_engine::native::config::ModelConfig;
    use sous_engine::native::model::{BatchSeq, KvCache, Logits, Model};
    use sous_engine::native::weights::Checkpoint;
    let Some(dir) = model_dir() else { return };
    let config = ModelConfig::read(&dir).expect("config");
    let checkpoint = Checkpoint::open(&dir, &config).expect("checkpoint");
    let model = Model::load(config, &checkpoint, Precision::Stored, 256).expect("model");
    let cases = fixture();
    let prompt = ids(&cases["prompts"][0]["input_ids"]);
    let n = prompt.len();
    let blocks: Vec<u32> = (0..16).collect();
    let run = |logits: Logits, chunks: &[usize]| {
        let mut cache = KvCache::new(&model, 16, 16);
        let mut start = 0;
        let mut out = Vec::new();
        for &len in chunks {
            let batch = [BatchSeq {
                blocks: &blocks,
                tokens: &prompt[start..start + len],
                start,
                state: 0,
                logits: if start + len == n { logits } else { Logits::None },
            }];
            out = model.forward(&batch, &mut cache).expect("forward");
            start += len;
        }
        // One more token after the prompt reads every layer's cached keys and values.
        let next = [BatchSeq {
            blocks: &blocks,
            tokens: &[42],
            start: n,
            state: 0,
            logits: Logits::Last,
        }];
        (out, model.forward(&next, &mut cache).expect("forward"))
    };
    let (all, after_all) = run(Logits::All, &[n]);
    let vocab = all.len() / n;
    for (logits, chunks) in [(Logits::Last, vec![n]), (Logits::Last, vec![n / 2, n - n / 2])] {
        let (last, after) = run(logits, &chunks);
        assert_eq!(last.len(), vocab);
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same(&last, &all[(n - 1) * vocab..]), "chunks {chunks:?}");
        assert!(same(&after, &after_all), "chunks {chunks:?}");
    }
}

/// `memory.embedding_dtype = "q8_0"`: the tied embedding/lm_head is held as llama.cpp's
/// Q8_0 (8.5 bits a value instead of 16), the lookups and the output projection read the
/// quantized values, and a prompt's logits stay close to the bf16 embedding's, with the
/// same greedy token.
#[test]
fn embeddings_held_as_q8_0_take_about_half_the_bytes_and_keep_the_logits_close() {
    use sous_engine::native::config::ModelConfig;
    use sous_engine::native::model::{BatchSeq, Embeddings, KvCache, Logits, Model};
    use sous_engine::native::weights::Checkpoint;
    let Some(dir) = model_dir() else { return };
    let config = ModelConfig::read(&dir).expect("config");
    let checkpoint = Checkpoint::open(&dir, &config).expect("checkpoint");
    let (vocab, hidden) = (config.vocab_size as u64, config.hidden_size as u64);
    let load = |e| Model::load_with(config.clone(), &checkpoint, Precision::Stored, e, 256).expect("model");
    let (stored, q8) = (load(Embeddings::Stored), load(Embeddings::Q8_0));
    assert_eq!(
        (stored.embedding_format(), q8.embedding_format()),
        ("bf16", "q8_0")
    );
    // Codes and one f16 scale per 32 values, in place of bf16 values.
    assert_eq!(
        stored.weight_bytes() - q8.weight_bytes(),
        vocab * hidden * 2 - vocab * hidden * 17 / 16
    );
    // The load-time tile choices are measured on a float matrix either way.
    assert_eq!(q8.tuning_matrix().format(), "bf16");
    let cases = fixture();
    let blocks: Vec<u32> = (0..16).collect();
    for case in cases["prompts"].as_array().expect("prompts").iter().take(3) {
        let prompt = ids(&case["input_ids"]);
        let logits = |model: &Model| {
            let mut cache = KvCache::new(model, 16, 16);
            let batch = [BatchSeq {
                blocks: &blocks,
                tokens: &prompt,
                start: 0,
                state: 0,
                logits: Logits::Last,
            }];
            model.forward(&batch, &mut cache).expect("forward")
        };
        let (a, b) = (logits(&stored), logits(&q8));
        let argmax = |v: &[f32]| {
            (0..v.len())
                .max_by(|&i, &j| v[i].total_cmp(&v[j]))
                .expect("logits")
        };
        assert_eq!(argmax(&a), argmax(&b));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        let spread = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        eprintln!("q8_0 embeddings: largest logit difference {worst} (largest logit {spread})");
        assert!(worst > 0.0 && worst < 0.01 * spread, "{worst} against {spread}");
    }
}

#[test]
fn calibration_keeps_the_running_maximum_of_every_projection_input() {
    use sous_engine::native::config::ModelConfig;
    use sous_engine::native::model::{LayerInputs, Model};
    use sous_engine::native::weights::Checkpoint;
    let Some(dir) = model_dir() else { return };
    let config = ModelConfig::read(&dir).expect("config");
    let checkpoint = Checkpoint::open(&dir, &config).expect("checkpoint");
    let layers = config.layers;
    let model = Model::load(config, &checkpoint, Precision::Stored, 256).expect("model");
    let cases = fixture();
    let cases = cases["prompts"].as_array().expect("prompts");
    let a = ids(&cases[0]["input_ids"]);
    let b = ids(&cases[1]["input_ids"]);
    assert_ne!(a, b);

    let observe = |samples: &[&[u32]]| {
        let mut ranges = vec![LayerInputs::default(); layers];
        for sample in samples {
            // Every layer reports that it is done, once and in order (the progress bar).
            let done = std::sync::Mutex::new(Vec::new());
            let record = |li: usize| done.lock().expect("lock").push(li);
            model
                .observe_inputs(sample, &mut Vec::new(), &mut ranges, false, &record)
                .expect("observe");
            assert_eq!(done.into_inner().expect("lock"), (0..layers).collect::<Vec<_>>());
        }
        ranges
    };
    let (only_a, only_b) = (observe(&[&a]), observe(&[&b]));
    for r in &only_a {
        for v in [r.qkv, r.o, r.gate_up, r.down] {
            assert!(v.is_finite() && v > 0.0, "{r:?}");
        }
    }
    // Deterministic, order-free, and the elementwise maximum of the samples alone.
    assert_eq!(observe(&[&a, &a]), only_a);
    let both = observe(&[&a, &b]);
    assert_eq!(observe(&[&b, &a]), both);
    for ((x, y), z) in only_a.iter().zip(&only_b).zip(&both) {
        assert_eq!(z.qkv, x.qkv.max(y.qkv));
        assert_eq!(z.o, x.o.max(y.o));
        assert_eq!(z.gate_up, x.gate_up.max(y.gate_up));
        assert_eq!(z.down, x.down.max(y.down));
    }
    // The samples differ, so somewhere one of them must set a range the other did not.
    assert!(only_a != only_b);
    // A wrong layer count is refused, not indexed out of bounds.
    assert!(
        model
            .observe_inputs(&a, &mut Vec::new(), &mut [LayerInputs::default()], false, &|_| {})
            .is_err()
    );

    // Layer by layer (the embedding alone, then one layer at a time, the hidden states
    // handed on), the ranges are the whole model's, bit for bit, in f32 and in bf16.
    let stem = Model::load_stem(model.config().clone(), &checkpoint, Precision::Stored, 256).expect("stem");
    for bf16 in [false, true] {
        let mut whole = vec![LayerInputs::default(); layers];
        let mut streamed = vec![LayerInputs::default(); layers];
        let mut hidden = vec![Vec::new(), Vec::new()];
        for sample in [&a, &b] {
            model
                .observe_inputs(sample, &mut Vec::new(), &mut whole, bf16, &|_| {})
                .expect("observe");
        }
        for li in 0..layers {
            let layer = stem.with_layers(&checkpoint, li..li + 1).expect("layer");
            for (sample, hidden) in [&a, &b].into_iter().zip(&mut hidden) {
                layer
                    .observe_inputs(sample, hidden, &mut streamed[li..=li], bf16, &|_| {})
                    .expect("observe a layer");
                assert_eq!(hidden.len(), sample.len() * model.config().hidden_size);
            }
        }
        assert_eq!(streamed, whole, "bf16: {bf16}");
    }
    // Hidden states of the wrong size, and layers the model does not have, are refused.
    let second = stem.with_layers(&checkpoint, 1..2).expect("layer 1");
    assert!(
        second
            .observe_inputs(
                &a,
                &mut vec![0.0; 3],
                &mut [LayerInputs::default()],
                false,
                &|_| {}
            )
            .is_err()
    );
    assert!(stem.with_layers(&checkpoint, layers..layers + 1).is_err());
}

/// The activation scales calibration gives beside llm-compressor's: `oneshot` with the
/// NVFP4 (W4A4) scheme on the same token ids
/// (`tests/fixtures/nvfp4/smollm2-135m-instruct.w4a4.llmcompressor.json`, made by
/// `scripts/reference/nvfp4_w4a4_reference.py`). llm-compressor runs the model in bf16,
/// sous in f32 (or with bf16 products); the scales are bf16 numbers (compressed-tensors
/// computes `2688 / amax` in the activations' dtype), one bf16 step apart is 0.4–0.8 %.
#[test]
fn calibrated_activation_scales_match_llm_compressor() {
    use sous_engine::native::config::ModelConfig;
    use sous_engine::native::model::{LayerInputs, Model};
    use sous_engine::native::weights::Checkpoint;
    use sous_kernels::formats::bf16::round_bf16;
    use sous_kernels::{Dtype, Flavor, TensorScale};
    let Some(dir) = model_dir() else { return };
    let path = root().join("tests/fixtures/nvfp4/smollm2-135m-instruct.w4a4.llmcompressor.json");
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
    let config = ModelConfig::read(&dir).expect("config");
    let checkpoint = Checkpoint::open(&dir, &config).expect("checkpoint");
    let layers = config.layers;
    let model = Model::load(config, &checkpoint, Precision::Stored, 512).expect("model");
    for bf16 in [false, true] {
        let mut ranges = vec![LayerInputs::default(); layers];
        for sample in fixture["calibration_input_ids"].as_array().expect("ids") {
            model
                .observe_inputs(&ids(sample), &mut Vec::new(), &mut ranges, bf16, &|_| {})
                .expect("observe");
        }
        let mut worst = (0.0f64, String::new());
        let mut exact = 0;
        for (i, r) in ranges.iter().enumerate() {
            for (module, amax) in r.modules(false) {
                let name = format!("model.layers.{i}.{module}");
                let theirs = fixture["tensors"][&name]["input_global_scale"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{name} in the fixture"));
                // The observer sees bf16 activations: their largest magnitude is a bf16.
                let ours =
                    TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, round_bf16(amax)).value();
                let diff = (f64::from(ours) - theirs).abs() / theirs;
                exact += usize::from(diff == 0.0);
                if diff > worst.0 {
                    worst = (diff, format!("{name}: {ours} vs {theirs}"));
                }
            }
        }
        eprintln!(
            "bf16 {bf16}: {exact} of {} input_global_scale equal to llm-compressor's; largest difference {:.3} % ({})",
            layers * 7,
            worst.0 * 100.0,
            worst.1
        );
        // Not yet the 0.5 % the W4A4 work aims at: attention outputs (o_proj) differ most,
        // where bf16 arithmetic throughout (transformers) and f32 (sous) part ways.
        assert!(worst.0 <= 0.03, "bf16 {bf16}: {}", worst.1);
    }
}

/// A hybrid model (Qwen3.5, Gated DeltaNet) through the loop: ngram drafts that are
/// rejected take the linear-attention state back, so the greedy tokens with speculation,
/// alone and batched, are those without it, which are transformers'.
#[test]
fn a_hybrid_model_speculates_and_gives_the_tokens_it_gives_without() {
    let dir = root().join("tests/fixtures/architectures/qwen3_5");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).expect("reference"))
            .expect("reference JSON");
    let start = |speculative| {
        Loop::launch(Settings {
            max_model_len: Some(512),
            ..settings(&dir, false, 4, 64, speculative, Precision::Stored)
        })
    };
    let ngram = Ngram {
        tokens: 3,
        min: 1,
        max: 2,
    };
    let (plain, speculating) = (start(None), start(Some(ngram)));
    let cases = reference["cases"].as_array().expect("cases");
    for case in cases {
        let prompt = ids(&case["prompt"]);
        let want = ids(&case["greedy"]);
        assert_eq!(plain.generate(prompt.clone(), greedy(want.len())).0, want);
        assert_eq!(
            speculating.generate(prompt, greedy(want.len())).0,
            want,
            "with ngram drafts"
        );
    }
    // Longer, repetitive prompts, two at a time: more drafts, some of them standing.
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| {
            let p = ids(&c["prompt"]);
            p.iter().chain(&p).chain(&p).copied().collect()
        })
        .collect();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| plain.generate(p.clone(), greedy(40)).0)
        .collect();
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| speculating.submit(p.clone(), greedy(40)))
        .collect();
    for (rx, want) in receivers.into_iter().zip(&want) {
        assert_eq!(&Loop::collect(rx).0, want, "batched, with ngram drafts");
    }
    let text = speculating.metrics.render();
    let drafted = counter(&text, "vllm:spec_decode_num_draft_tokens_total");
    let accepted = counter(&text, "vllm:spec_decode_num_accepted_tokens_total");
    assert!(
        drafted > accepted,
        "drafted {drafted}, accepted {accepted}: no draft was rejected"
    );
}

/// The MTP head of the tiny Qwen3-Next and Qwen3.5 drafts two tokens a step (the
/// `qwen3_next_mtp` lever of the DGX Spark recipe); the model verifies them, so greedy
/// tokens, alone and batched, are transformers'; vLLM's spec-decode counters count the
/// drafts.
#[test]
fn mtp_drafts_change_no_greedy_token_and_are_counted() {
    for name in ["qwen3_next", "qwen3_5"] {
        let dir = root().join("tests/fixtures/architectures").join(name);
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).expect("reference"))
                .expect("reference JSON");
        let engine = Loop::launch(Settings {
            max_model_len: Some(512),
            mtp: Some(2),
            ..settings(&dir, false, 4, 64, None, Precision::Stored)
        });
        let cases = reference["cases"].as_array().expect("cases");
        for case in cases {
            let want = ids(&case["greedy"]);
            let got = engine.generate(ids(&case["prompt"]), greedy(want.len())).0;
            assert_eq!(got, want, "{name} with MTP drafts");
        }
        let receivers: Vec<_> = cases
            .iter()
            .map(|c| engine.submit(ids(&c["prompt"]), greedy(12)))
            .collect();
        for (rx, case) in receivers.into_iter().zip(cases) {
            assert_eq!(
                Loop::collect(rx).0,
                ids(&case["greedy"]),
                "{name} batched, with MTP drafts"
            );
        }
        let text = engine.metrics.render();
        let drafted = counter(&text, "vllm:spec_decode_num_draft_tokens_total");
        // No draft of these random heads stands (reference.json's drafts never equal
        // the next greedy token), so each of the 4 requests takes a step per token and
        // drafts two tokens at each, as far as `max_tokens` leaves room: 2 × 9 + 1.
        assert_eq!(drafted, 4.0 * 19.0, "{name}: tokens drafted");
    }
}
