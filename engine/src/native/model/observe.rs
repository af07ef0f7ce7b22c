//! What a calibration pass records ([`LayerInputs`]: the largest magnitude at each
//! projection's input) and how it rounds ([`Observer`]).

/// The largest magnitude that reached the input of each of a layer's linear
/// projections during calibration: what an NVFP4 W4A4 checkpoint's per-tensor
/// activation scale (`input_global_scale`) is computed from. q, k and v read one
/// input, as do gate and up (of every expert, too), so a dense layer has four.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerInputs {
    /// Input of q_proj, k_proj and v_proj (the normed residual).
    pub qkv: f32,
    /// Input of o_proj (attention's output).
    pub o: f32,
    /// Input of gate_proj and up_proj (the normed residual), the experts' too.
    pub gate_up: f32,
    /// Input of down_proj (`silu(gate) * up`).
    pub down: f32,
    /// A MoE layer's: each expert's down_proj input, every token through every expert.
    pub experts_down: Vec<f32>,
    /// A MoE layer's shared expert's down_proj input.
    pub shared_down: Option<f32>,
}

impl LayerInputs {
    /// The layer's quantizable projections (their names under the layer's prefix,
    /// `model.layers.N.`) and the input range each saw; `mixtral` names experts as
    /// Mixtral's `block_sparse_moe.experts.E.w1/w3/w2`.
    pub fn modules(&self, mixtral: bool) -> Vec<(String, f32)> {
        let mut out: Vec<(String, f32)> = [
            ("self_attn.q_proj", self.qkv),
            ("self_attn.k_proj", self.qkv),
            ("self_attn.v_proj", self.qkv),
            ("self_attn.o_proj", self.o),
        ]
        .into_iter()
        .map(|(m, v)| (m.to_owned(), v))
        .collect();
        if self.experts_down.is_empty() {
            out.extend([
                ("mlp.gate_proj".to_owned(), self.gate_up),
                ("mlp.up_proj".to_owned(), self.gate_up),
                ("mlp.down_proj".to_owned(), self.down),
            ]);
            return out;
        }
        let (block, [gate, up, down]) = if mixtral {
            ("block_sparse_moe", ["w1", "w3", "w2"])
        } else {
            ("mlp", ["gate_proj", "up_proj", "down_proj"])
        };
        for (e, &amax) in self.experts_down.iter().enumerate() {
            out.push((format!("{block}.experts.{e}.{gate}"), self.gate_up));
            out.push((format!("{block}.experts.{e}.{up}"), self.gate_up));
            out.push((format!("{block}.experts.{e}.{down}"), amax));
        }
        if let Some(amax) = self.shared_down {
            out.push(("mlp.shared_expert.gate_proj".to_owned(), self.gate_up));
            out.push(("mlp.shared_expert.up_proj".to_owned(), self.gate_up));
            out.push(("mlp.shared_expert.down_proj".to_owned(), amax));
        }
        out
    }

    pub(super) fn raise(slot: &mut f32, values: &[f32]) {
        // NaN never wins a `max`: a NaN activation leaves the range as it was.
        *slot = values.iter().fold(*slot, |m, v| m.max(v.abs()));
    }
}

/// What a calibration pass records, and how it rounds.
pub(super) struct Observer<'a> {
    pub(super) ranges: &'a mut [LayerInputs],
    /// The hidden states entering the first layer held (unused, and left empty, when
    /// that is the decoder's first: the tokens are embedded), replaced by those leaving
    /// the last layer held.
    pub(super) hidden: &'a mut Vec<f32>,
    pub(super) bf16: bool,
    /// Called with each layer's index once the pass is through it.
    pub(super) layer_done: &'a (dyn Fn(usize) + Sync),
}
