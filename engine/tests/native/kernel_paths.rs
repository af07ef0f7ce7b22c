//! The native engine's numerics once per kernel path this CPU has
//! ([`KernelPath::available`]: each instruction set, and AVX-512 with and without
//! AVX512-BF16's dot product), so that a difference between paths shows on whatever
//! machine runs the suite, not only on the one whose CPU happens to take the other path.
//!
//! f32 arithmetic: the same bits on every path, and transformers' greedy tokens. bf16
//! arithmetic: the same bits on every path but the dot product's, whose numbers stay
//! within the spread measured between the two kernels; on every path, batching changes
//! no greedy token.

use std::time::Instant;

use sous_engine::native::KvDtype;
use sous_kernels::gemm::{Isa, KernelPath};

use super::{
    Loop, Precision, Settings, greedy, greedy_prompts, mean, mean_gap, model_dir, prompt_logprobs, settings,
};

/// How much each path computes: prompt tokens scored, greedy tokens decoded. The
/// portable kernels (scalar fused multiply-adds, for CPUs with none of the vector sets)
/// are tens of times slower than the vector ones (benchmarks/native.md, "Numbers
/// across kernel paths"), so they run the start of the same work: a row's numbers do
/// not depend on the rows after it, so the start of a longer run gives them too.
fn budget(path: KernelPath) -> (usize, usize) {
    match path.isa {
        Isa::Portable => (16, 2),
        _ => (usize::MAX, 16),
    }
}

/// The largest mean |Δ logprob| between bf16 arithmetic with and without the dot
/// product over the fixture's prompts, in nats: about twice what was measured
/// (benchmarks/native.md, "Numbers across kernel paths"). The dot product's bits are the
/// instruction's, the same on every CPU that has it, so the measured gap is the gap
/// anywhere; a broken kernel moves it by far more.
const DOT_MEAN_GAP: f64 = 0.04;

/// The largest difference of the two bf16 paths' mean log-probabilities over the same
/// text, in nats (the log of their perplexities' ratio): about 2.5 times what was
/// measured (benchmarks/native.md, "Numbers across kernel paths").
const DOT_MEAN_SHIFT: f64 = 0.005;

/// What one path computed.
struct Run {
    path: KernelPath,
    f32_logprobs: Vec<f32>,
    f32_greedy: Vec<u32>,
    bf16_logprobs: Vec<f32>,
    bf16_alone: Vec<Vec<u32>>,
    bf16_batched: Vec<Vec<u32>>,
}

/// The first position where `a` and the start of `b` differ in their bits, if any.
fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    assert!(a.len() <= b.len());
    a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits())
}

#[test]
fn every_kernel_path_gives_the_f32_bits_and_bf16_within_the_measured_spread() {
    let Some(dir) = model_dir() else { return };
    let prompts = greedy_prompts(&super::fixture());
    // Every prompt of the fixture one after the other (125 tokens): a prompt-sized
    // product in one chunk. Then decode steps of one and of three rows, from three short
    // prompts (4 to 6 tokens).
    let text: Vec<u32> = prompts.iter().flat_map(|(_, input, _)| input.clone()).collect();
    let few = &prompts[1..4];
    let runs: Vec<Run> = KernelPath::available()
        .into_iter()
        .map(|path| {
            let started = Instant::now();
            let (scored, tokens) = budget(path);
            let text = &text[..scored.min(text.len())];
            let f32s = Loop::launch(Settings {
                kernels: path.choices(),
                ..settings(&dir, false, 4, 512, None, Precision::Stored)
            });
            let f32_logprobs = prompt_logprobs(&f32s, text);
            let f32_greedy = f32s.generate(few[0].1.clone(), greedy(tokens)).0;
            drop(f32s);
            // The shipped recipe's arithmetic: bf16 products and a bf16 cache.
            let bf16 = Loop::launch(Settings {
                kernels: path.choices(),
                kv_dtype: KvDtype::Bf16,
                ..settings(&dir, false, 4, 512, None, Precision::Bf16)
            });
            let bf16_logprobs = prompt_logprobs(&bf16, text);
            let bf16_alone = few
                .iter()
                .map(|(_, input, _)| bf16.generate(input.clone(), greedy(tokens)).0)
                .collect();
            let receivers: Vec<_> = few
                .iter()
                .map(|(_, input, _)| bf16.submit(input.clone(), greedy(tokens)))
                .collect();
            let bf16_batched = receivers.into_iter().map(|rx| Loop::collect(rx).0).collect();
            eprintln!("{path}: {:.1} s", started.elapsed().as_secs_f64());
            Run {
                path,
                f32_logprobs,
                f32_greedy,
                bf16_logprobs,
                bf16_alone,
                bf16_batched,
            }
        })
        .collect();

    let first = &runs[0];
    let (name, _, want) = &few[0];
    for run in &runs {
        let path = run.path;
        let (scored, tokens) = budget(path);
        assert_eq!(run.f32_logprobs.len(), scored.min(text.len()) - 1, "{path}");
        assert_eq!(
            first_difference(&run.f32_logprobs, &first.f32_logprobs),
            None,
            "{path}: f32 log-probabilities differ from {}'s",
            first.path
        );
        assert_eq!(
            run.f32_greedy,
            want[..tokens],
            "{path}: f32 greedy ids of prompt `{name}` differ from transformers'"
        );
        assert!(
            first_difference(&run.bf16_logprobs, &run.f32_logprobs).is_some(),
            "{path}: bf16 arithmetic gave the f32 numbers: was it used?"
        );
        assert_eq!(run.bf16_batched, run.bf16_alone, "{path}: bf16, batched");
    }
    // Without the dot product, bf16 products are the f32 kernels on rounded inputs: the
    // same bits on every path.
    let plain: Vec<&Run> = runs.iter().filter(|r| !r.path.bf16_dot).collect();
    for run in &plain {
        assert_eq!(
            first_difference(&run.bf16_logprobs, &plain[0].bf16_logprobs),
            None,
            "{}: bf16 log-probabilities differ from {}'s",
            run.path,
            plain[0].path
        );
    }
    for dot in runs.iter().filter(|r| r.path.bf16_dot) {
        let gap = mean_gap(&dot.bf16_logprobs, &plain[0].bf16_logprobs);
        let shift = (mean(&dot.bf16_logprobs) - mean(&plain[0].bf16_logprobs)).abs();
        eprintln!(
            "bf16, {} against {}: mean |Δ logprob| {gap:.6}, mean logprob shift {shift:.6} nats",
            dot.path, plain[0].path
        );
        assert!(
            gap > 0.0,
            "{}: the dot product gave the f32 kernels' bits",
            dot.path
        );
        assert!(gap <= DOT_MEAN_GAP, "{}: mean |Δ logprob| {gap}", dot.path);
        assert!(
            shift <= DOT_MEAN_SHIFT,
            "{}: mean logprob shift {shift}",
            dot.path
        );
    }
}
