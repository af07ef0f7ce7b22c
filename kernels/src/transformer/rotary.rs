//! Rotary position embeddings ([`Rotary`]): the cos and sin tables of every position
//! and their application to a token's heads, in f32. The bf16 form for calibration is
//! in `bf16`.

/// Rotary position embedding tables: `cos` and `sin` of `position × inv_freq[i]` for
/// every position below `positions`, `half = inv_freq.len()` values per position.
#[derive(Debug, Clone)]
pub struct Rotary {
    pub(super) half: usize,
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
}

impl Rotary {
    /// Tables for `positions` positions. `attention_factor` scales cos and sin (YaRN's
    /// `mscale`; 1.0 otherwise).
    pub fn new(inv_freq: &[f32], positions: usize, attention_factor: f32) -> Rotary {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in inv_freq {
                // transformers multiplies in f32 (`inv_freq @ position_ids.float()`).
                let angle = p as f32 * f;
                cos.push(angle.cos() * attention_factor);
                sin.push(angle.sin() * attention_factor);
            }
        }
        Rotary { half, cos, sin }
    }

    /// How many positions the tables cover.
    pub fn positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates the first `2·half` values of every `head_dim`-sized head of `x` and
    /// leaves the rest (a partial rotary embedding, as Qwen3-Next's
    /// `apply_rotary_pos_emb` splits `q_rot` from `q_pass`).
    pub fn apply_heads(&self, x: &mut [f32], head_dim: usize, position: usize) {
        for head in x.chunks_exact_mut(head_dim) {
            self.apply(&mut head[..2 * self.half], position);
        }
    }

    /// Rotates every head of `x` (`heads × 2·half` values) for `position`, in place:
    /// `x·cos + rotate_half(x)·sin`.
    pub fn apply(&self, x: &mut [f32], position: usize) {
        let half = self.half;
        let cos = &self.cos[position * half..(position + 1) * half];
        let sin = &self.sin[position * half..(position + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] - x2 * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}
