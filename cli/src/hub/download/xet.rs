//! The Xet hash of a file: the identity the Hugging Face Hub publishes for every file in
//! Xet storage (`xetHash` in a tree listing, `X-Xet-Hash` on a resolve), computed from
//! the file's bytes as they stream in.
//!
//! It is a hash of the whole content, as SHA-256 is, but not one sequential chain: the
//! file is cut into chunks of 8–128 KiB where a rolling hash says (content-defined
//! chunking), each chunk is hashed on its own with keyed BLAKE3, and the chunk hashes
//! are folded into a Merkle tree. Only the rolling hash has to see the bytes in order,
//! and it is a shift and an add per byte; BLAKE3 runs many times faster than SHA-256 on
//! a CPU without SHA extensions. So a file can be verified at network speed on any CPU.
//!
//! The algorithm is xet-core's (github.com/huggingface/xet-core, at commit af1a3ff9):
//! - chunking (`xet_data/src/deduplication/chunking.rs`, constants in
//!   `xet_core_structures/src/xorb_object/constants.rs`): the gear hash of the `gearhash`
//!   crate's default table, reset at every chunk; the first `MIN - 65` bytes of a chunk
//!   are not fed to it; a chunk ends after the byte at which the hash's top 16 bits are
//!   zero, if it is `MIN` bytes long by then, else at `MAX` bytes; the rest of the file
//!   is the last chunk;
//! - a chunk's hash (`merklehash/data_hash.rs`): BLAKE3 keyed with [`DATA_KEY`];
//! - the tree (`merklehash/aggregated_hashes.rs`): each level is cut into runs of 3 to 9
//!   nodes (a run ends at the first node from its third on whose hash ≡ 0 mod 4, or
//!   at the ninth; the last run of a level may be shorter), each run hashed, BLAKE3
//!   keyed with [`NODE_KEY`], over one line `"{hash} : {size}\n"` per node, until one
//!   node is left;
//! - the file hash: the root hashed once more, BLAKE3 keyed with 32 zero bytes (the
//!   empty salt); an empty file's hash is all zeros.
//!
//! Hashes are printed as xet-core prints them: four little-endian 64-bit words, each in
//! 16 hex digits, so each group of eight bytes appears reversed.
//!
//! The test fixtures are hf_xet's own hashes (`scripts/reference/xet_fixtures.py`).

/// A chunk is at least this long, unless it ends the file.
const MIN: usize = 8 * 1024;
/// A chunk is at most this long.
const MAX: usize = 128 * 1024;
/// Bytes of a chunk that the rolling hash does not see: it needs 64 bytes to forget
/// everything before them, so starting 65 bytes before `MIN` gives the same cuts as
/// hashing the whole chunk would.
const SKIP: usize = MIN - 64 - 1;
/// A chunk may end where the rolling hash has these bits clear (a 64 KiB target).
const MASK: u64 = 0xFFFF_0000_0000_0000;

/// The key of a chunk's hash (xet-core `DATA_KEY`).
pub const DATA_KEY: [u8; 32] = [
    102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28, 157, 228, 33, 16, 155, 235, 43,
    88, 180, 208, 176, 75, 147, 173, 242, 41,
];

/// The key of an inner node's hash (xet-core `INTERNAL_NODE_HASH`).
pub const NODE_KEY: [u8; 32] = [
    1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230, 93, 221, 83, 111, 55, 199, 109,
    210, 248, 99, 82, 230, 74, 83, 113, 63,
];

/// The Xet hash of a stream of bytes, fed in pieces of any size.
#[derive(Debug)]
pub struct XetHasher {
    gear: gearhash::Hasher<'static>,
    /// The current chunk's bytes so far, and their hash under way.
    chunk_len: usize,
    chunk: blake3::Hasher,
    /// Every finished chunk's hash and length.
    chunks: Vec<Node>,
}

/// A node of the tree: its hash and the bytes under it.
#[derive(Debug, Clone, Copy)]
struct Node {
    hash: [u8; 32],
    size: u64,
}

impl Default for XetHasher {
    fn default() -> Self {
        XetHasher::new()
    }
}

impl XetHasher {
    /// A hasher of nothing yet.
    pub fn new() -> XetHasher {
        XetHasher {
            gear: gearhash::Hasher::default(),
            chunk_len: 0,
            chunk: blake3::Hasher::new_keyed(&DATA_KEY),
            chunks: Vec::new(),
        }
    }

    /// Feeds the next bytes of the stream.
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.chunk_len < SKIP {
                let n = (SKIP - self.chunk_len).min(data.len());
                self.take(&data[..n]);
                data = &data[n..];
                continue;
            }
            // Up to the maximum, the first place the rolling hash allows a cut at which
            // the chunk is long enough (a match before `MIN` does not count, and the
            // hash rolls on past it).
            let window = &data[..(MAX - self.chunk_len).min(data.len())];
            let mut at = 0;
            let mut cut = None;
            while let Some(n) = self.gear.next_match(&window[at..], MASK) {
                at += n;
                if self.chunk_len + at >= MIN {
                    cut = Some(at);
                    break;
                }
            }
            let n = cut.unwrap_or(window.len());
            self.take(&data[..n]);
            data = &data[n..];
            if cut.is_some() || self.chunk_len == MAX {
                self.end_chunk();
            }
        }
    }

    /// The file's hash, in xet-core's hex form (64 lowercase hex digits).
    pub fn finalize(mut self) -> String {
        if self.chunk_len > 0 {
            self.end_chunk();
        }
        hex(&file_hash(self.chunks))
    }

    /// Bytes of the stream received in total.
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.size).sum::<u64>() + self.chunk_len as u64
    }

    /// Whether no byte has been fed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn take(&mut self, bytes: &[u8]) {
        self.chunk.update(bytes);
        self.chunk_len += bytes.len();
    }

    fn end_chunk(&mut self) {
        let chunk = std::mem::replace(&mut self.chunk, blake3::Hasher::new_keyed(&DATA_KEY));
        self.chunks.push(Node {
            hash: *chunk.finalize().as_bytes(),
            size: self.chunk_len as u64,
        });
        self.chunk_len = 0;
        self.gear.set_hash(0);
    }
}

/// The hash of the tree over `chunks`, hashed once more with the empty salt.
fn file_hash(mut level: Vec<Node>) -> [u8; 32] {
    if level.is_empty() {
        return [0; 32];
    }
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len() / 4 + 1);
        let mut rest = &level[..];
        while !rest.is_empty() {
            let (run, after) = rest.split_at(run_length(rest));
            next.push(join(run));
            rest = after;
        }
        level = next;
    }
    *blake3::keyed_hash(&[0; 32], &level[0].hash).as_bytes()
}

/// How many of `nodes` the next run of a level takes (xet-core `next_merge_cut`): all of
/// them up to two; else up to the first from the third on whose hash is 0 mod 4 (its last
/// little-endian word's, i.e. byte 24's low bits), at most nine.
fn run_length(nodes: &[Node]) -> usize {
    if nodes.len() <= 2 {
        return nodes.len();
    }
    let end = nodes.len().min(9);
    (2..end)
        .find(|&i| nodes[i].hash[24] & 3 == 0)
        .map_or(end, |i| i + 1)
}

/// The inner node over `run`.
fn join(run: &[Node]) -> Node {
    let mut hasher = blake3::Hasher::new_keyed(&NODE_KEY);
    for node in run {
        hasher.update(format!("{} : {}\n", hex(&node.hash), node.size).as_bytes());
    }
    Node {
        hash: *hasher.finalize().as_bytes(),
        size: run.iter().map(|n| n.size).sum(),
    }
}

/// xet-core's hex form: four little-endian words, each printed most significant first.
fn hex(hash: &[u8; 32]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(64);
    for word in hash.chunks_exact(8) {
        for byte in word.iter().rev() {
            // Writing to a String cannot fail.
            let _ = write!(s, "{byte:02x}");
        }
    }
    s
}

/// The Xet hash of `bytes` at once.
pub fn xet_hash(bytes: &[u8]) -> String {
    let mut hasher = XetHasher::new();
    hasher.update(bytes);
    hasher.finalize()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The fixtures' generated data: the low byte of each xorshift64 (13, 7, 17) step.
    pub(in crate::hub::download) fn generated(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn fixtures() -> serde_json::Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/xet/hashes.json");
        let text = std::fs::read_to_string(path).expect("the fixture file is committed");
        serde_json::from_str(&text).expect("the fixture is JSON")
    }

    fn case(name: &str, len: usize) -> Vec<u8> {
        match name {
            "empty" => Vec::new(),
            "hello" => b"hello world".to_vec(),
            "const-1m" => vec![59; len],
            _ => {
                let seed = match name {
                    "min-1" => 1,
                    "min" => 2,
                    "300k" => 3,
                    "3m" => 4,
                    other => panic!("no generator for fixture {other}"),
                };
                generated(len, seed)
            }
        }
    }

    #[test]
    fn generated_data_hashes_as_hf_xet_hashes_it() {
        let fixtures = fixtures();
        let cases = fixtures["generated"].as_array().expect("a list of cases");
        assert_eq!(cases.len(), 7);
        for c in cases {
            let name = c["name"].as_str().expect("a name");
            let len = c["len"].as_u64().expect("a length") as usize;
            let data = case(name, len);
            assert_eq!(data.len(), len, "{name}");
            assert_eq!(xet_hash(&data), c["xet_hash"].as_str().expect("a hash"), "{name}");
        }
    }

    #[test]
    fn the_hash_does_not_depend_on_how_the_stream_is_cut() {
        let data = generated(1_000_003, 9);
        let whole = xet_hash(&data);
        for piece in [1, 7, 4096, 8127, 8128, 65_536, 131_071, 131_073] {
            let mut hasher = XetHasher::new();
            for part in data.chunks(piece) {
                hasher.update(part);
            }
            assert_eq!(hasher.len(), data.len() as u64);
            assert_eq!(hasher.finalize(), whole, "pieces of {piece}");
        }
    }

    #[test]
    fn a_changed_byte_changes_the_hash() {
        let mut data = generated(300_000, 3);
        let before = xet_hash(&data);
        data[200_000] ^= 1;
        assert_ne!(xet_hash(&data), before);
    }

    #[test]
    fn runs_end_at_a_hash_that_is_zero_mod_four_from_the_third_node_on() {
        let node = |low: u8| {
            let mut hash = [1; 32];
            hash[24] = low;
            Node { hash, size: 1 }
        };
        // A multiple of four at the first two nodes does not end a run.
        assert_eq!(run_length(&[node(4), node(8), node(1), node(4), node(1)]), 4);
        assert_eq!(run_length(&[node(1), node(1), node(12)]), 3);
        // None: nine at most, or all that are left.
        assert_eq!(run_length(&[node(1); 12]), 9);
        assert_eq!(run_length(&[node(1); 5]), 5);
        assert_eq!(run_length(&[node(4), node(4)]), 2);
    }

    #[test]
    fn hex_prints_four_little_endian_words() {
        let mut hash = [0u8; 32];
        hash[..8].copy_from_slice(&[22, 175, 58, 132, 4, 75, 131, 214]);
        assert!(hex(&hash).starts_with("d6834b04843aaf16"));
    }
}
