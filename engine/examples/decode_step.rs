//! Times single-token decode steps and a 512-token prefill of the native engine's model on
//! a model directory:
//! `cargo run -p sous-engine --example decode_step -- DIR [STEPS] [decode|prefill]`
//! (`decode`: the decode steps only; `prefill`: ten prefills and nothing else; for
//! profiling them).
#![allow(clippy::print_stdout)]

use std::time::Instant;

use sous_engine::native::config::ModelConfig;
use sous_engine::native::model::{BatchSeq, Embeddings, KvCache, Logits, Model};
use sous_engine::native::weights::Checkpoint;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: decode_step DIR [STEPS]")?);
    let steps: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let only = args.next();
    let (decode_only, prefill_only) = (
        only.as_deref() == Some("decode"),
        only.as_deref() == Some("prefill"),
    );
    let config = ModelConfig::read(&dir)?;
    let checkpoint = Checkpoint::open(&dir, &config)?;
    // `PRECISION=bf16`: bf16 arithmetic, as `serving.dtype = "bfloat16"`.
    let precision = match std::env::var("PRECISION").as_deref() {
        Ok("bf16") => sous_engine::native::weights::Precision::Bf16,
        _ => sous_engine::native::weights::Precision::Stored,
    };
    // `EMBEDDINGS=q8_0`: as `memory.embedding_dtype = "q8_0"`.
    let embeddings = match std::env::var("EMBEDDINGS").as_deref() {
        Ok("q8_0") => Embeddings::Q8_0,
        _ => Embeddings::Stored,
    };
    // `KV=bf16`: as `memory.kv_cache_dtype = "bfloat16"`.
    let kv_dtype = match std::env::var("KV").as_deref() {
        Ok("bf16") => sous_engine::native::KvDtype::Bf16,
        _ => sous_engine::native::KvDtype::F32,
    };
    let mut model = Model::load_with(config, &checkpoint, precision, embeddings, 4096)?;
    // As the engine does (`SOUS_HUGE_PAGES=off`: not).
    if let Some(placement) = model.place_in_huge_pages()? {
        println!("{placement}");
    }
    sous_engine::native::tune(&mut model, sous_engine::native::kernel_choices(), |line| {
        println!("{line}")
    });
    // `BATCH=N`: N sequences decoding side by side, one token each per step.
    let batch_size: usize = std::env::var("BATCH").map_or(Ok(1), |s| s.parse())?;
    let mut cache = KvCache::with_dtype(&model, 64 * batch_size, 16, kv_dtype).with_state_slots(batch_size);
    let tables: Vec<Vec<u32>> = (0..batch_size as u32)
        .map(|b| (64 * b..64 * (b + 1)).collect())
        .collect();
    // `TOKENS=N`: N tokens per sequence and step with the logits of every one, as a
    // speculative step verifying N - 1 drafted tokens computes them.
    let per_step: usize = std::env::var("TOKENS").map_or(Ok(1), |s| s.parse())?;
    let mut tokens: Vec<Vec<u32>> = (0..batch_size as u32)
        .map(|b| (0..per_step as u32).map(|t| 1 + b + 31 * t).collect())
        .collect();
    // `START=P`: the steps attend over P cached positions already (whatever the cache
    // holds), as a decode deep into a conversation does.
    let start: usize = std::env::var("START").map_or(Ok(0), |s| s.parse())?;
    let steps = if prefill_only { 0 } else { steps };
    // The read bandwidth probed before every eight steps and after the last
    // (`sous_engine::native::read_bandwidth`, as the engine probes it at load): on a
    // shared machine the bandwidth changes from minute to minute, so each eight steps
    // are compared with the probes on either side of them. `ROOFLINE=off`: no probes.
    let probing = per_step == 1 && std::env::var("ROOFLINE").as_deref() != Ok("off");
    let probe = || {
        if probing {
            sous_engine::native::read_bandwidth()
        } else {
            None
        }
    };
    let mut probes = vec![probe()];
    let mut chunks: Vec<(u64, f64)> = Vec::new();
    let mut chunk = (0u64, Instant::now());
    let mut elapsed = 0.0;
    for step in 0..steps {
        let batch: Vec<BatchSeq> = tables
            .iter()
            .zip(&tokens)
            .enumerate()
            .map(|(state, (blocks, tokens))| BatchSeq {
                blocks,
                tokens,
                start: start + step * per_step,
                state,
                logits: if per_step == 1 { Logits::Last } else { Logits::All },
            })
            .collect();
        let logits = model.forward(&batch, &mut cache)?;
        let vocab = logits.len() / (batch_size * per_step);
        for (token, rows) in tokens.iter_mut().zip(logits.chunks_exact(vocab * per_step)) {
            for (t, row) in token.iter_mut().zip(rows.chunks_exact(vocab)) {
                *t = sous_engine::native::sampling::argmax(row);
            }
        }
        // What the step had to read (`Model::step_bytes`).
        let contexts = vec![start + step * per_step + 1; batch_size];
        chunk.0 += model.step_bytes(&contexts, kv_dtype).total();
        if step % 8 == 7 {
            let seconds = chunk.1.elapsed().as_secs_f64();
            chunks.push((chunk.0, seconds));
            elapsed += seconds;
            probes.push(probe());
            chunk = (0, Instant::now());
        }
    }
    if chunk.0 > 0 {
        let seconds = chunk.1.elapsed().as_secs_f64();
        chunks.push((chunk.0, seconds));
        elapsed += seconds;
        probes.push(probe());
    }
    let s = elapsed;
    println!(
        "{steps} decode steps of {batch_size} × {per_step} token(s): {:.2} ms each, {:.1} tok/s",
        s / steps as f64 * 1e3,
        (steps * batch_size * per_step) as f64 / s
    );
    if per_step == 1 && steps > 0 {
        let bytes: u64 = chunks.iter().map(|c| c.0).sum();
        let rate = bytes as f64 / s / 1e9;
        // Each run of steps' rate over the mean of the probes on either side of it.
        let mut fractions: Vec<f64> = chunks
            .iter()
            .zip(probes.windows(2))
            .filter_map(|(&(b, t), p)| {
                let (before, after) = (p[0].as_ref()?, p[1].as_ref()?);
                Some(b as f64 / t / 1e9 / ((before.median_gb_per_s + after.median_gb_per_s) / 2.0))
            })
            .collect();
        fractions.sort_by(f64::total_cmp);
        let medians: Vec<f64> = probes.iter().flatten().map(|b| b.median_gb_per_s).collect();
        let (low, high) = medians
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(l, h), &m| (l.min(m), h.max(m)));
        let gb_per_step = bytes as f64 / steps as f64 / 1e9;
        match fractions.get(fractions.len() / 2) {
            Some(f) => println!(
                "decode read {gb_per_step:.3} GB per step at {rate:.1} GB/s: {:.0} % of the read bandwidth (median of {} runs of up to 8 steps, each against the probes beside it, {low:.1} to {high:.1} GB/s)",
                f * 100.0,
                fractions.len()
            ),
            None => println!("decode read {gb_per_step:.3} GB per step at {rate:.1} GB/s"),
        }
    }
    let blocks: Vec<u32> = (0..64).collect();
    if decode_only {
        return Ok(());
    }
    // One prompt chunk of 512 tokens (a prefill), timed the same way.
    let prompt: Vec<u32> = (0..512u32).map(|i| 100 + i * 7 % 4000).collect();
    let mut cache = KvCache::with_dtype(&model, 64, 16, kv_dtype);
    for round in 0..if prefill_only { 10 } else { 3 } {
        let started = Instant::now();
        let batch = [BatchSeq {
            blocks: &blocks,
            tokens: &prompt,
            start: 0,
            state: 0,
            logits: Logits::Last,
        }];
        model.forward(&batch, &mut cache)?;
        let s = started.elapsed().as_secs_f64();
        println!(
            "prefill of 512 tokens (round {round}): {:.1} ms, {:.1} tok/s",
            s * 1e3,
            512.0 / s
        );
    }
    drop(model);
    if prefill_only {
        return Ok(());
    }

    // The same through the engine loop, on its own thread, as `sous serve` runs it.
    let settings = sous_engine::native::Settings {
        model_dir: dir.clone(),
        served_name: "m".into(),
        precision,
        embeddings,
        kv_dtype,
        max_model_len: Some(4096),
        max_num_seqs: batch_size.max(8),
        max_batched_tokens: 512,
        prefix_caching: false,
        chunked_prefill: true,
        speculative: None,
        mtp: None,
        kv_cache_bytes: Some(1 << 30),
        memory_fraction: None,
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        stop_grace: std::time::Duration::from_secs(1),
        log_interval: std::time::Duration::from_secs(3600),
        kernels: sous_engine::native::kernel_choices(),
    };
    let engine =
        sous_engine::native::Engine::load(settings, std::sync::Arc::new(sous_engine::reporter::Silent))?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let core = engine.core;
    let thread = std::thread::spawn(move || core.run(rx));
    // BATCH streams at once, each with a 128-token prompt when there are several (as
    // `scripts/bench/native.sh` sends them; `PROMPT=N` sets the length), `steps` tokens
    // each.
    let (events, mut out) = tokio::sync::mpsc::unbounded_channel();
    let params = sous_engine::native::sampling::SamplingParams {
        temperature: 0.0,
        max_tokens: steps,
        ignore_eos: true,
        ..Default::default()
    };
    let started = Instant::now();
    let prompt_len: u32 =
        std::env::var("PROMPT").map_or(Ok(if batch_size == 1 { 1 } else { 128 }), |s| s.parse())?;
    for b in 0..batch_size as u32 {
        let prompt = (0..prompt_len).map(|i| 100 + (i * 7 + b * 13) % 4000).collect();
        tx.send(sous_engine::native::core::Command::Submit(
            sous_engine::native::core::Request {
                prompt,
                params: params.clone(),
                events: events.clone(),
                stopped: Default::default(),
                arrival: Instant::now(),
            },
        ))?;
    }
    drop(events);
    let (mut n, mut finished) = (0, 0);
    let (mut first, mut last) = (None, started);
    while let Some(e) = out.blocking_recv() {
        match e {
            sous_engine::native::core::Event::Token { .. } => {
                n += 1;
                last = Instant::now();
                first.get_or_insert(last);
            }
            sous_engine::native::core::Event::Finished(_) => {
                finished += 1;
                if finished == batch_size {
                    break;
                }
            }
            _ => {}
        }
    }
    let s = started.elapsed().as_secs_f64();
    let decoding = first.map_or(0.0, |f| (last - f).as_secs_f64());
    println!(
        "engine loop, {batch_size} streams: {n} tokens, {:.1} tok/s ({:.1} tok/s from the first token on)",
        n as f64 / s,
        (n - 1) as f64 / decoding
    );
    drop(tx);
    let _ = thread.join();
    Ok(())
}
