//! SentencePiece-style vocabularies (`tokenizer.ggml.model = "llama"`: Llama 1/2,
//! Mistral v0.1–v0.3, TinyLlama) as a `tokenizers` BPE model with byte fallback, the way
//! transformers rebuilds them from a GGUF: `integrations/gguf/gguf_tokenizer_mapping.py`
//! (`sentencepiece_tokenizer`, `get_merges`), `models/llama/tokenization_llama.py`
//! (`LlamaTokenizer`: `Metaspace` with prepend scheme `first`, no normalizer, a
//! Replace/ByteFallback/Fuse/Strip decoder) and `tokenization_utils_base.py`
//! (`generate_merges`, for files that store scores instead of merges).
//!
//! Not here: special tokens and the post-processor, which both vocabulary kinds share
//! (`tokenizer`).

use std::collections::HashMap;

use tokenizers::Tokenizer;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};

/// SentencePiece's word-boundary mark.
const SPACE: char = '\u{2581}';

/// A BPE tokenizer with byte fallback over `tokens`. `merges` are the file's when it
/// has them; otherwise they are recovered from `scores`.
pub fn build(
    tokens: &[&str],
    scores: Option<&[f32]>,
    merges: Option<Vec<(String, String)>>,
) -> Result<Tokenizer, String> {
    let merges = match merges {
        Some(m) => m,
        None => {
            let scores =
                scores.ok_or("the file has neither `tokenizer.ggml.merges` nor `tokenizer.ggml.scores`")?;
            generate_merges(tokens, scores)
        }
    };
    let mut vocab = Vocab::default();
    for (id, token) in tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| "more than 2^32 tokens")?;
        vocab.insert((*token).to_owned(), id);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(|e| format!("the BPE model: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Metaspace::new(SPACE, PrependScheme::First, false)));
    let replace = Replace::new(SPACE.to_string(), " ").map_err(|e| format!("the decoder: {e}"))?;
    tokenizer.with_decoder(Some(DecoderSequence::new(vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
        Strip::new(' ', 1, 0).into(),
    ])));
    Ok(tokenizer)
}

/// Merges implied by a vocabulary and its scores: every way to split a token into two
/// tokens of the vocabulary, best score first (ties: longer left piece, then longer
/// right piece, then vocabulary order), as transformers `generate_merges` orders them.
pub fn generate_merges(tokens: &[&str], scores: &[f32]) -> Vec<(String, String)> {
    // Python dicts: the last id of a repeated token wins, but it keeps the position
    // (and so the iteration order) of its first occurrence.
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    let mut score_of: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    for (id, (&token, &score)) in tokens.iter().zip(scores).enumerate() {
        if ids.insert(token, id).is_none() {
            order.push(token);
        }
        score_of.insert(token, score);
    }
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    for token in order {
        let score = score_of[token];
        let mut local: Vec<(&str, &str)> = token
            .char_indices()
            .skip(1)
            .map(|(at, _)| token.split_at(at))
            .filter(|(l, r)| ids.contains_key(l) && ids.contains_key(r))
            .collect();
        local.sort_by_key(|(l, r)| (ids[l], ids[r]));
        merges.extend(local.into_iter().map(|(l, r)| (l, r, score)));
    }
    // Python's `sorted(..., reverse=True)` is stable: equal keys keep their order.
    merges.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then_with(|| b.0.chars().count().cmp(&a.0.chars().count()))
            .then_with(|| b.1.chars().count().cmp(&a.1.chars().count()))
    });
    merges
        .into_iter()
        .map(|(l, r, _)| (l.to_owned(), r.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_scores_then_lengths() {
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -0.5];
        let merges = generate_merges(&tokens, &scores);
        let pairs: Vec<(&str, &str)> = merges.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
        // "abc" (score -0.5) splits as "ab"+"c" and "a"+"bc"; the longer left piece first.
        assert_eq!(pairs, [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c")]);
    }
}
