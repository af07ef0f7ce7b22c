//! The KV block pool: which cache blocks are in use, by how many sequences, and which
//! full blocks can be found again by the tokens they hold (prefix caching).
//!
//! The scheme is vLLM's (`vllm/v1/core/block_pool.py`, `kv_cache_utils.py`): a full block
//! is identified by a hash of its tokens chained with its parent block's hash, so equal
//! hashes mean equal prefixes. A block whose last user finishes goes back to the free
//! queue but keeps its contents and hash; a later request with the same prefix takes it
//! back from the queue (a hit), and only when the block is handed out for new tokens is
//! its hash forgotten (evicted). The free queue is least-recently-freed first, and a
//! finishing sequence frees its blocks tail first, so shared prefixes are evicted last.

use std::collections::{HashMap, VecDeque};

use sha2::{Digest, Sha256};

/// Identifies a full block by its tokens and everything before them.
pub type BlockHash = [u8; 32];

/// The hash of a full block of `tokens` following the block hashed `parent`.
pub fn block_hash(parent: Option<&BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(parent.map_or([0u8; 32], |p| *p));
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// The pool.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    prefix_caching: bool,
    refs: Vec<u32>,
    hash_of: Vec<Option<BlockHash>>,
    cached: HashMap<BlockHash, u32>,
    /// Free blocks with the generation they were freed at; stale entries (the block was
    /// taken back since) are skipped when popped.
    free: VecDeque<(u32, u64)>,
    generation: Vec<u64>,
    free_count: usize,
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block_size` tokens.
    pub fn new(blocks: usize, block_size: usize, prefix_caching: bool) -> BlockPool {
        BlockPool {
            block_size,
            prefix_caching,
            refs: vec![0; blocks],
            hash_of: vec![None; blocks],
            cached: HashMap::new(),
            free: (0..blocks as u32).map(|b| (b, 0)).collect(),
            generation: vec![0; blocks],
            free_count: blocks,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks no sequence holds (cached ones included: they can be evicted).
    pub fn free(&self) -> usize {
        self.free_count
    }

    /// Blocks some sequence holds.
    pub fn used(&self) -> usize {
        self.total() - self.free_count
    }

    /// Fraction of blocks in use, as vLLM's `kv_cache_usage_perc`.
    pub fn usage(&self) -> f64 {
        if self.total() == 0 {
            0.0
        } else {
            self.used() as f64 / self.total() as f64
        }
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// The cached blocks holding the longest prefix of `hashes` (one hash per full block
    /// of the prompt, in order), taken for the caller. Empty when prefix caching is off.
    pub fn lookup(&mut self, hashes: &[BlockHash]) -> Vec<u32> {
        if !self.prefix_caching {
            return Vec::new();
        }
        let mut hits = Vec::new();
        for hash in hashes {
            let Some(&block) = self.cached.get(hash) else {
                break;
            };
            self.take(block);
            hits.push(block);
        }
        hits
    }

    fn take(&mut self, block: u32) {
        let b = block as usize;
        if self.refs[b] == 0 {
            self.free_count -= 1;
            self.generation[b] += 1;
        }
        self.refs[b] += 1;
    }

    /// A block for new tokens, or `None` when every block is held.
    pub fn allocate(&mut self) -> Option<u32> {
        while let Some((block, generation)) = self.free.pop_front() {
            let b = block as usize;
            if self.generation[b] != generation || self.refs[b] != 0 {
                continue;
            }
            if let Some(hash) = self.hash_of[b].take() {
                self.cached.remove(&hash);
            }
            self.take(block);
            return Some(block);
        }
        None
    }

    /// Gives back a sequence's blocks, the last one first.
    pub fn release(&mut self, blocks: &[u32]) {
        for &block in blocks.iter().rev() {
            let b = block as usize;
            debug_assert!(self.refs[b] > 0, "block {block} released twice");
            self.refs[b] = self.refs[b].saturating_sub(1);
            if self.refs[b] == 0 {
                self.free_count += 1;
                self.generation[b] += 1;
                self.free.push_back((block, self.generation[b]));
            }
        }
    }

    /// Records that `block` is full and holds the prefix `hash`, so later requests can
    /// find it. A prefix already cached in another block keeps that block.
    pub fn register(&mut self, block: u32, hash: BlockHash) {
        if !self.prefix_caching || self.hash_of[block as usize].is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(block);
            self.hash_of[block as usize] = Some(hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_blocks_are_found_again_until_evicted() {
        let mut pool = BlockPool::new(3, 2, true);
        let h0 = block_hash(None, &[1, 2]);
        let h1 = block_hash(Some(&h0), &[3, 4]);
        let a = pool.allocate().expect("free");
        let b = pool.allocate().expect("free");
        pool.register(a, h0);
        pool.register(b, h1);
        assert_eq!(pool.used(), 2);
        pool.release(&[a, b]);
        assert_eq!((pool.used(), pool.free()), (0, 3));
        // Same prefix: both blocks come back.
        assert_eq!(pool.lookup(&[h0, h1]), vec![a, b]);
        assert_eq!(pool.used(), 2);
        pool.release(&[a, b]);
        // A different first block: no hit at all (hashes chain).
        assert!(pool.lookup(&[block_hash(None, &[9, 9]), h1]).is_empty());
        // Allocating everything evicts the cached blocks.
        let all: Vec<u32> = (0..3).map(|_| pool.allocate().expect("free")).collect();
        assert!(pool.allocate().is_none());
        pool.release(&all);
        assert!(pool.lookup(&[h0]).is_empty());
    }

    #[test]
    fn without_prefix_caching_nothing_is_found() {
        let mut pool = BlockPool::new(2, 2, false);
        let h0 = block_hash(None, &[1, 2]);
        let a = pool.allocate().expect("free");
        pool.register(a, h0);
        pool.release(&[a]);
        assert!(pool.lookup(&[h0]).is_empty());
    }

    #[test]
    fn shared_blocks_stay_in_use_until_the_last_user_leaves() {
        let mut pool = BlockPool::new(2, 2, true);
        let h0 = block_hash(None, &[1, 2]);
        let a = pool.allocate().expect("free");
        pool.register(a, h0);
        assert_eq!(pool.lookup(&[h0]), vec![a]);
        pool.release(&[a]);
        assert_eq!(pool.used(), 1);
        pool.release(&[a]);
        assert_eq!(pool.used(), 0);
    }
}
