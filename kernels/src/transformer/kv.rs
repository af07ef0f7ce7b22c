//! The paged KV cache's layout ([`KvShape`]: where a token's keys and values live, and
//! storing them in f32 or bf16) and a sequence's place in a batch ([`Span`]). Not here:
//! allocating the cache or choosing a sequence's blocks (the engine does).

/// The shape of one layer's paged KV cache: `blocks × block_size × kv_heads × head_dim`
/// values each for keys and values.
///
/// Values are stored slot by slot (`[block][slot][kv_head][d]`: a token's values are
/// `slot_len` consecutive floats at [`KvShape::slot_offset`]). Keys are stored
/// transposed within each block (`[block][kv_head][d][slot]`): value `d` of one head's
/// keys of a block's slots is one run of `block_size` floats, so that one vector
/// instruction multiplies a query value into sixteen keys' scores at once, each score
/// one chain in order over `d` (the score's definition: `scores`). Both caches have the
/// same size, and a block's keys and values start at the same offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Token slots per block.
    pub block_size: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl KvShape {
    /// Values in one token slot (all KV heads).
    pub fn slot_len(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Offset of `position`'s slot in the value cache, given the sequence's block table.
    pub fn slot_offset(&self, blocks: &[u32], position: usize) -> usize {
        let block = blocks[position / self.block_size] as usize;
        (block * self.block_size + position % self.block_size) * self.slot_len()
    }

    /// Offset in the key cache of value 0 of KV head `kv_head`'s key at `position`; its
    /// value `d` is `d · block_size` further on.
    pub fn key_offset(&self, blocks: &[u32], position: usize, kv_head: usize) -> usize {
        let block = blocks[position / self.block_size] as usize;
        block * self.block_size * self.slot_len()
            + kv_head * self.head_dim * self.block_size
            + position % self.block_size
    }

    /// Stores the keys and values of `position` (`k`, `v`: `slot_len` values each, KV
    /// head after KV head) in the caches.
    pub fn store(
        &self,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
        blocks: &[u32],
        position: usize,
        k: &[f32],
        v: &[f32],
    ) {
        self.store_as(k_cache, v_cache, blocks, position, k, v, |x| x);
    }

    /// [`KvShape::store`] into caches held in bf16: each value rounded to the nearest
    /// bf16 (ties to even), as PyTorch's `.to(torch.bfloat16)` rounds what vLLM writes
    /// into a bf16 cache. Same layout, half the bytes.
    pub fn store_bf16(
        &self,
        k_cache: &mut [u16],
        v_cache: &mut [u16],
        blocks: &[u32],
        position: usize,
        k: &[f32],
        v: &[f32],
    ) {
        let bits = |x: f32| (crate::formats::bf16::round_bf16(x).to_bits() >> 16) as u16;
        self.store_as(k_cache, v_cache, blocks, position, k, v, bits);
    }

    /// [`KvShape::store`] of the values as `held` turns them into the cache's type.
    #[allow(clippy::too_many_arguments)]
    fn store_as<T>(
        &self,
        k_cache: &mut [T],
        v_cache: &mut [T],
        blocks: &[u32],
        position: usize,
        k: &[f32],
        v: &[f32],
        held: impl Fn(f32) -> T,
    ) {
        let at = self.slot_offset(blocks, position);
        for (dst, &x) in v_cache[at..at + self.slot_len()].iter_mut().zip(v) {
            *dst = held(x);
        }
        for (h, key) in k.chunks_exact(self.head_dim).enumerate() {
            let start = self.key_offset(blocks, position, h);
            for (d, &x) in key.iter().enumerate() {
                k_cache[start + d * self.block_size] = held(x);
            }
        }
    }
}

/// The tokens of one sequence in a batch: consecutive rows of the query matrix at
/// consecutive positions (a prompt chunk, a decode token, or a token and its drafts).
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    /// The sequence's block table.
    pub blocks: &'a [u32],
    /// Position of the first token (it attends to positions `0..=start`).
    pub start: usize,
    /// Tokens in the span.
    pub len: usize,
    /// Row of the first token in `q` and `out`.
    pub row: usize,
}
