//! The forward pass ([`Model::pass`]): every layer over a varlen batch, attention
//! layers reading and writing the paged KV cache, linear-attention layers each
//! sequence's state, then the final norm and the output projection for the rows whose
//! logits are asked for. Calibration runs the same pass with an [`Observer`].

use rayon::prelude::*;
use sous_kernels::activation::quantize_dequantize_nvfp4;
use sous_kernels::gemm::Packed;
use sous_kernels::transformer::linear::sigmoid;
use sous_kernels::transformer::{self as k, Span};

use super::cache::Held;
use super::{
    BatchSeq, Ffn, KvCache, LayerInputs, Logits, Mixer, Model, Observer, PARALLEL_ROWS, Passed, Route,
    Scratch, linear,
};
use crate::native::NativeError;

impl Model {
    pub(super) fn pass(
        &self,
        batch: &[BatchSeq],
        cache: &mut KvCache,
        mut observe: Option<Observer<'_>>,
        route: Route<'_>,
    ) -> Result<Passed, NativeError> {
        let bf16 = observe.as_ref().is_some_and(|o| o.bf16);
        let norm = if bf16 { k::rms_norm_bf16 } else { k::rms_norm };
        let c = &self.config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let tokens: Vec<u32> = batch.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let mut n = tokens.len();
        if n == 0 {
            return Ok(Passed::default());
        }
        // The layers this pass runs, the index of the first one's KV cache, and its
        // final norm: the decoder's, or the MTP head's one layer, whose keys and values
        // are the cache's last layer.
        let (layers, mut kv_index, final_norm) = match (&route, &self.mtp) {
            (Route::Mtp { .. }, Some(mtp)) => (
                std::slice::from_ref(&mtp.layer),
                cache.layers.len() - 1,
                &mtp.norm,
            ),
            (Route::Mtp { .. }, None) => {
                return Err(NativeError::Internal("an MTP pass without an MTP head".into()));
            }
            (Route::Decoder { .. }, _) => (&self.layers[..], 0, &self.norm),
        };
        let keep_hidden = matches!(route, Route::Decoder { hidden: true });
        // Each token's block table and position, and each sequence's span of rows.
        let mut tables = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        let mut spans = Vec::with_capacity(batch.len());
        for s in batch {
            spans.push(Span {
                blocks: s.blocks,
                start: s.start,
                len: s.tokens.len(),
                row: positions.len(),
            });
            for i in 0..s.tokens.len() {
                let position = s.start + i;
                if position >= self.rotary.positions() || position >= s.blocks.len() * cache.block_size() {
                    return Err(NativeError::Internal(format!(
                        "position {position} is beyond the sequence's {} cached blocks or the rotary table",
                        s.blocks.len()
                    )));
                }
                positions.push(position);
                tables.push(s.blocks);
            }
        }
        let mut x = match observe.as_mut() {
            // A calibration pass from a later layer: the hidden states an earlier one left.
            Some(seen) if self.first_layer > 0 => {
                if seen.hidden.len() != n * h {
                    return Err(NativeError::Internal(format!(
                        "{} hidden values enter layer {} for {n} tokens of {h}",
                        seen.hidden.len(),
                        self.first_layer
                    )));
                }
                std::mem::take(seen.hidden)
            }
            _ => {
                let mut x = vec![0.0f32; n * h];
                for (row, &id) in x.chunks_exact_mut(h).zip(&tokens) {
                    if id as usize >= c.vocab_size {
                        return Err(NativeError::Internal(format!(
                            "token id {id} is outside the vocabulary"
                        )));
                    }
                    self.embed.row(id as usize, row);
                }
                if let (Route::Mtp { hidden }, Some(mtp)) = (&route, &self.mtp) {
                    x = mtp.input(&x, hidden, c.rms_norm_eps, &|x, rows, w, out| {
                        self.product(x, rows, w, out)
                    })?;
                }
                x
            }
        };
        // The pass's buffers, those of the last pass if no other pass holds them: fresh
        // ones are fresh pages, faulted in and cleared by the kernel 4 KiB at a time
        // (about 1 % of a 512-token prefill, and a tenth of a calibration that runs one
        // layer per pass). Each is zeroed to its length here, as a fresh one would be.
        let mut scratch = self
            .scratch
            .try_lock()
            .map(|mut kept| std::mem::take(&mut *kept))
            .unwrap_or_default();
        let zeroed = |v: &mut Vec<f32>, len: usize| {
            let mut v = std::mem::take(v);
            v.clear();
            v.resize(len, 0.0);
            v
        };
        let mut normed = zeroed(&mut scratch.normed, n * h);
        let (q_len, kv_len) = (c.heads * hd, c.kv_heads * hd);
        let mut q = zeroed(&mut scratch.q, n * q_len);
        let mut attn = zeroed(&mut scratch.attn, n * q_len);
        let mut act = zeroed(&mut scratch.act, n * c.intermediate_size);
        let tuning = self.tuning;
        let product = |x: &[f32], rows: usize, w: &Packed, out: &mut [f32]| self.product(x, rows, w, out);
        // The products' outputs, once per pass (fresh pages for every layer's products
        // cost more than the norms between them). A gated attention's q rows hold each
        // head's query and output gate.
        let gated = c.linear.is_some();
        let q_width = if gated { 2 * q_len } else { q_len };
        let row_len = q_width + 2 * kv_len;
        let mut qkv = zeroed(&mut scratch.qkv, n * row_len);
        let mut gate = if gated {
            vec![0.0f32; n * q_len]
        } else {
            Vec::new()
        };
        let mut o = zeroed(&mut scratch.o, n * h);
        let mut gate_up = zeroed(&mut scratch.gate_up, n * 2 * c.intermediate_size);
        let mut down = zeroed(&mut scratch.down, n * h);
        // The rows whose logits are asked for.
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
        let mut pruned = false;
        // Each layer's index among the attention layers (its KV cache) and among the
        // linear-attention ones (its states).
        let mut linear_index = 0;
        let decoder_end = match route {
            Route::Mtp { .. } => 1,
            Route::Decoder { .. } => c.layers,
        };
        for (li, layer) in layers.iter().enumerate() {
            // Past the last layer's mixer, only the rows whose logits are asked for
            // matter (a prompt chunk's last token, or none). (Calibration observes
            // every row, and a pass that hands its hidden states on keeps them.)
            let last = self.first_layer + li + 1 == decoder_end
                && observe.is_none()
                && !keep_hidden
                && rows.len() < n;
            norm(&x, &layer.input_norm, c.rms_norm_eps, &mut normed);
            if let Some(seen) = observe.as_mut() {
                LayerInputs::raise(&mut seen.ranges[li].qkv, &normed);
            }
            if let Some(scale) = layer.input_scales[0] {
                quantize_dequantize_nvfp4(&mut normed, scale);
            }
            match &layer.mixer {
                Mixer::Linear(mixer) => {
                    let states = cache.linear.as_mut().ok_or_else(|| {
                        NativeError::Internal("a linear-attention layer without states in the cache".into())
                    })?;
                    let seqs: Vec<linear::Rows> = batch
                        .iter()
                        .zip(&spans)
                        .map(|(s, span)| linear::Rows {
                            slot: s.state,
                            fresh: s.start == 0,
                            first: span.row,
                            len: span.len,
                        })
                        .collect();
                    if let Some(s) = seqs.iter().find(|s| s.slot >= states.slots()) {
                        return Err(NativeError::Internal(format!(
                            "state slot {} of {}",
                            s.slot,
                            states.slots()
                        )));
                    }
                    mixer.forward(&normed, &seqs, states, linear_index, &product, &mut o);
                    linear_index += 1;
                    if last {
                        if rows.is_empty() {
                            break;
                        }
                        let m = rows.len();
                        (x, o) = (pick_rows(&x, &rows, h), pick_rows(&o, &rows, h));
                        let mlp = [&mut normed, &mut gate_up, &mut act, &mut down];
                        keep_rows(m, mlp, [h, 2 * c.intermediate_size, c.intermediate_size, h]);
                        (n, pruned) = (m, true);
                    }
                }
                Mixer::Attention(a) => {
                    product(&normed, n, &a.qkv, &mut qkv);
                    if bf16 {
                        k::round_bf16_all(&mut qkv);
                    }
                    if let Some(bias) = &a.qkv_bias {
                        for row in qkv.chunks_exact_mut(row_len) {
                            k::add_assign(row, bias);
                            if bf16 {
                                k::round_bf16_all(row);
                            }
                        }
                    }
                    if gated {
                        for (row, g) in qkv.chunks_exact(row_len).zip(gate.chunks_exact_mut(q_len)) {
                            for (head, g) in row[..q_width].chunks_exact(2 * hd).zip(g.chunks_exact_mut(hd)) {
                                g.copy_from_slice(&head[hd..]);
                            }
                        }
                    }
                    // Each token's q/k norms and rotary embedding, and its query copied
                    // out for attention while the row is in cache, on the pool for a
                    // prompt chunk (every row alone, so the same bits wherever it runs):
                    // a quarter of the time of one thread copying them after the
                    // rotation (benchmarks/native.md, "Figures that were in code comments").
                    let partial = c.rotary_dim < hd;
                    let rotate = |((row, &position), q): ((&mut [f32], &usize), &mut [f32])| {
                        let (qr, rest) = row.split_at_mut(q_width);
                        let kr = &mut rest[..kv_len];
                        let turn = |qr: &mut [f32], kr: &mut [f32]| {
                            if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
                                k::rms_norm_heads(qr, qn, c.rms_norm_eps);
                                k::rms_norm_heads(kr, kn, c.rms_norm_eps);
                            }
                            if bf16 {
                                self.rotary.apply_bf16(qr, position);
                                self.rotary.apply_bf16(kr, position);
                            } else if partial {
                                self.rotary.apply_heads(qr, hd, position);
                                self.rotary.apply_heads(kr, hd, position);
                            } else {
                                self.rotary.apply(qr, position);
                                self.rotary.apply(kr, position);
                            }
                        };
                        if gated {
                            for (dst, head) in q.chunks_exact_mut(hd).zip(qr.chunks_exact(2 * hd)) {
                                dst.copy_from_slice(&head[..hd]);
                            }
                            turn(q, kr);
                        } else {
                            turn(qr, kr);
                            q.copy_from_slice(qr);
                        }
                    };
                    if n >= PARALLEL_ROWS {
                        qkv.par_chunks_exact_mut(row_len)
                            .zip(positions.par_iter())
                            .zip(q.par_chunks_exact_mut(q_len))
                            .with_min_len(PARALLEL_ROWS / 2)
                            .for_each(rotate);
                    } else {
                        qkv.chunks_exact_mut(row_len)
                            .zip(positions.iter())
                            .zip(q.chunks_exact_mut(q_len))
                            .for_each(rotate);
                    }
                    let shape = cache.shape;
                    let held = &mut cache.layers[kv_index];
                    kv_index += 1;
                    for (t, row) in qkv.chunks_exact(row_len).enumerate() {
                        let (kr, vr) = row[q_width..].split_at(kv_len);
                        match held {
                            Held::F32 { k, v } => shape.store(k, v, tables[t], positions[t], kr, vr),
                            Held::Bf16 { k, v } => shape.store_bf16(k, v, tables[t], positions[t], kr, vr),
                        }
                    }
                    // Past the last layer's keys and values, the rest of the layer runs
                    // on the rows asked for alone. Every row's arithmetic is its own, so
                    // their bits do not change.
                    if last {
                        if rows.is_empty() {
                            break;
                        }
                        let m = rows.len();
                        (q, x) = (pick_rows(&q, &rows, q_len), pick_rows(&x, &rows, h));
                        if gated {
                            gate = pick_rows(&gate, &rows, q_len);
                        }
                        spans = rows
                            .iter()
                            .enumerate()
                            .map(|(i, &r)| Span {
                                blocks: tables[r],
                                start: positions[r],
                                len: 1,
                                row: i,
                            })
                            .collect();
                        keep_rows(m, [&mut attn, &mut o], [q_len, h]);
                        let mlp = [&mut normed, &mut gate_up, &mut act, &mut down];
                        keep_rows(m, mlp, [h, 2 * c.intermediate_size, c.intermediate_size, h]);
                        (n, pruned) = (m, true);
                    }
                    match held {
                        Held::F32 { k, v } if bf16 => {
                            k::attention_eager_bf16(&q, &spans, c.heads, shape, k, v, &mut attn)
                        }
                        Held::F32 { k, v } => {
                            k::attention(&q, &spans, c.heads, shape, k, v, &mut attn, tuning.isa())
                        }
                        Held::Bf16 { .. } if bf16 => {
                            return Err(NativeError::Internal(
                                "calibration's bf16 attention reads an f32 cache".into(),
                            ));
                        }
                        Held::Bf16 { k, v } => {
                            k::attention_bf16_cache(&q, &spans, c.heads, shape, k, v, &mut attn, tuning.isa())
                        }
                    }
                    if gated {
                        for (v, &g) in attn.iter_mut().zip(&gate) {
                            *v *= sigmoid(g);
                        }
                    }
                    if let Some(seen) = observe.as_mut() {
                        LayerInputs::raise(&mut seen.ranges[li].o, &attn);
                    }
                    if let Some(scale) = layer.input_scales[1] {
                        quantize_dequantize_nvfp4(&mut attn, scale);
                    }
                    product(&attn, n, &a.o, &mut o);
                    if bf16 {
                        k::round_bf16_all(&mut o);
                    }
                }
            }
            k::add_assign(&mut x, &o);
            if bf16 {
                k::round_bf16_all(&mut x);
            }
            norm(&x, &layer.post_norm, c.rms_norm_eps, &mut normed);
            match &layer.mlp {
                Ffn::Experts(experts) => {
                    if let Some(seen) = observe.as_mut() {
                        let ranges = &mut seen.ranges[li];
                        LayerInputs::raise(&mut ranges.gate_up, &normed);
                        let (each, shared) = experts.observe_down(&normed, n, &product);
                        ranges.experts_down.resize(each.len(), 0.0);
                        for (slot, amax) in ranges.experts_down.iter_mut().zip(each) {
                            *slot = slot.max(amax);
                        }
                        if let Some(amax) = shared {
                            ranges.shared_down = Some(ranges.shared_down.unwrap_or(0.0).max(amax));
                        }
                    }
                    experts.forward(&normed, n, &product, &mut down)
                }
                Ffn::Dense(mlp) => {
                    if let Some(seen) = observe.as_mut() {
                        LayerInputs::raise(&mut seen.ranges[li].gate_up, &normed);
                    }
                    if let Some([scale, _]) = mlp.input_scales {
                        quantize_dequantize_nvfp4(&mut normed, scale);
                    }
                    product(&normed, n, &mlp.gate_up, &mut gate_up);
                    if bf16 {
                        k::round_bf16_all(&mut gate_up);
                        k::silu_mul_bf16(&gate_up, c.intermediate_size, &mut act);
                    } else {
                        k::silu_mul(&gate_up, c.intermediate_size, &mut act);
                    }
                    if let Some(seen) = observe.as_mut() {
                        LayerInputs::raise(&mut seen.ranges[li].down, &act);
                    }
                    if let Some([_, scale]) = mlp.input_scales {
                        quantize_dequantize_nvfp4(&mut act, scale);
                    }
                    product(&act, n, &mlp.down, &mut down);
                    if bf16 {
                        k::round_bf16_all(&mut down);
                    }
                }
            }
            k::add_assign(&mut x, &down);
            if bf16 {
                k::round_bf16_all(&mut x);
            }
            if let Some(seen) = observe.as_ref() {
                (seen.layer_done)(li);
            }
        }
        if let Ok(mut kept) = self.scratch.try_lock() {
            *kept = Scratch {
                normed,
                q,
                attn,
                act,
                qkv,
                o,
                gate_up,
                down,
            };
        }
        // A calibration pass hands its hidden states on, for the layers after these.
        if let Some(seen) = observe {
            *seen.hidden = x;
            return Ok(Passed::default());
        }
        // Final norm and lm_head, only for the rows asked for (after a pruned last
        // layer, the first rows of `x`).
        if pruned {
            rows = (0..rows.len()).collect();
        }
        // A pass that hands its hidden states on (to an MTP head) norms every row.
        let normed_rows: Vec<usize> = if keep_hidden {
            (0..n).collect()
        } else {
            rows.clone()
        };
        let mut hidden = vec![0.0f32; normed_rows.len() * h];
        for (dst, &r) in hidden.chunks_exact_mut(h).zip(&normed_rows) {
            k::rms_norm_row(&x[r * h..(r + 1) * h], final_norm, c.rms_norm_eps, dst);
        }
        if rows.is_empty() {
            return Ok(Passed {
                logits: Vec::new(),
                hidden,
            });
        }
        let asked: Vec<f32> = if keep_hidden {
            rows.iter()
                .flat_map(|&r| hidden[r * h..(r + 1) * h].iter().copied())
                .collect()
        } else {
            hidden.clone()
        };
        let head = self.head();
        let mut logits = vec![0.0f32; rows.len() * head.n()];
        product(&asked, rows.len(), head, &mut logits);
        Ok(Passed { logits, hidden })
    }
}

/// The rows `rows` of `v` (`width` values each), in that order: what a pruned last layer
/// goes on with.
fn pick_rows(v: &[f32], rows: &[usize], width: usize) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| v[r * width..(r + 1) * width].iter().copied())
        .collect()
}

/// Shortens each buffer to its first `m` rows (of the matching width): the buffers a
/// pruned last layer writes from the start again.
fn keep_rows<const N: usize>(m: usize, buffers: [&mut Vec<f32>; N], widths: [usize; N]) {
    for (buffer, width) in buffers.into_iter().zip(widths) {
        buffer.truncate(m * width);
    }
}
