//! Which speculative method a recipe asks for ([`Method`]: prompt lookup, or the
//! checkpoint's MTP head, whose forward is the model's), and the prompt lookup itself.
//!
//! Speculative decoding by prompt lookup (vLLM's `ngram` method): the engine drafts the
//! tokens that followed the last occurrence-in-context of the sequence's most recent
//! n-gram, and the model verifies all of them in one forward pass (the engine loop,
//! `core.rs`; acceptance in `Sampler::verify`).
//!
//! The proposer follows vLLM's `vllm/v1/spec_decode/ngram_proposer.py`
//! (`_find_longest_matched_ngram_and_propose_tokens`): the longest suffix of the
//! context, between `prompt_lookup_min` and `prompt_lookup_max` tokens, that also occurs
//! earlier; of equally long matches the earliest; up to `tokens` tokens that followed it
//! (fewer at the end of the context, none past `max_model_len`).

use super::NativeError;
use crate::recipe::SpeculativeSection;

/// The `ngram` settings of a recipe's `serving.speculative`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ngram {
    /// Tokens drafted per step (`tokens`).
    pub tokens: usize,
    /// Shortest n-gram matched (`prompt_lookup_min`).
    pub min: usize,
    /// Longest n-gram matched (`prompt_lookup_max`).
    pub max: usize,
}

/// What a recipe's `serving.speculative` asks of the native engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Prompt lookup.
    Ngram(Ngram),
    /// The checkpoint's MTP head drafts `tokens` tokens (`qwen3_next_mtp`, `mtp`, ...:
    /// any method vLLM names `*_mtp`); whether the checkpoint has one is known at load.
    Mtp {
        /// Tokens drafted per step.
        tokens: usize,
    },
}

impl Method {
    /// The native engine's reading of `serving.speculative`: `ngram` or an MTP method;
    /// any other is refused, naming what it would need.
    pub fn from_section(section: &SpeculativeSection) -> Result<Method, NativeError> {
        let method = section.method.as_deref().unwrap_or_default();
        if crate::recipe::is_mtp(method) {
            return Ok(Method::Mtp {
                tokens: section.tokens.unwrap_or(1).max(1) as usize,
            });
        }
        Ngram::from_section(section).map(Method::Ngram)
    }
}

impl Ngram {
    /// The `ngram` settings of `serving.speculative`; any other method is refused, naming
    /// what it would need (MTP methods are [`Method`]'s).
    pub fn from_section(section: &SpeculativeSection) -> Result<Ngram, NativeError> {
        let method = section.method.as_deref().unwrap_or_default();
        if method != "ngram" {
            let why = if crate::recipe::is_mtp(method) {
                "multi-token prediction drafts with the checkpoint's MTP head, not by prompt lookup"
            } else if matches!(method, "eagle" | "eagle3" | "draft_model") {
                "drafting with a second model is not built into the native engine"
            } else {
                "the native engine does not know this method"
            };
            return Err(NativeError::Settings {
                message: format!("`serving.speculative.method = \"{method}\"`: {why}"),
                hint: "use `speculative = { method = \"ngram\", tokens = 3 }` (prompt lookup), or serve the \
                       recipe with vLLM or SGLang"
                    .into(),
            });
        }
        // vLLM's defaults: both 5 when neither is given, else the one given for both.
        let (min, max) = match (section.prompt_lookup_min, section.prompt_lookup_max) {
            (None, None) => (5, 5),
            (Some(v), None) | (None, Some(v)) => (v, v),
            (Some(a), Some(b)) => (a, b),
        };
        Ok(Ngram {
            tokens: section.tokens.unwrap_or(1).max(1) as usize,
            min: min.max(1) as usize,
            max: max.max(min).max(1) as usize,
        })
    }

    /// The draft for a sequence whose tokens so far (prompt and output) are `context`.
    pub fn propose(&self, context: &[u32], max_model_len: usize) -> Vec<u32> {
        let total = context.len();
        let k = self.tokens.min(max_model_len.saturating_sub(total));
        if total < self.min || k == 0 {
            return Vec::new();
        }
        // For every earlier end `e` (the match is `context[..=e]`'s suffix), how many of
        // the last tokens it repeats, capped at `max`; keep the longest, the earliest
        // on ties.
        let (mut best_len, mut best_end) = (0, 0);
        for e in 0..total - 1 {
            let mut len = 0;
            while len < self.max && len <= e && context[e - len] == context[total - 1 - len] {
                len += 1;
            }
            if len > best_len {
                (best_len, best_end) = (len, e);
            }
        }
        if best_len < self.min {
            return Vec::new();
        }
        let start = best_end + 1;
        context[start..(start + k).min(total)].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(tokens: usize, min: usize, max: usize) -> Ngram {
        Ngram { tokens, min, max }
    }

    #[test]
    fn the_longest_match_drafts_what_followed_it() {
        // vLLM's docstring example: [4,2,3] has no earlier match, [2,3] does.
        assert_eq!(ngram(4, 2, 3).propose(&[1, 2, 3, 4, 2, 3], 100), vec![4, 2, 3]);
        // The longer match wins over a later shorter one.
        let context = [7, 8, 9, 1, 5, 8, 9, 2, 7, 8, 9];
        assert_eq!(ngram(2, 1, 3).propose(&context, 100), vec![1, 5]);
        // Equally long matches: the earliest.
        assert_eq!(ngram(1, 1, 1).propose(&[3, 10, 3, 11, 3], 100), vec![10]);
        // Below the minimum: nothing.
        assert!(ngram(3, 2, 3).propose(&[1, 2, 3, 4, 5, 3], 100).is_empty());
        // Never past max_model_len.
        assert_eq!(ngram(4, 2, 3).propose(&[1, 2, 3, 4, 2, 3], 7), vec![4]);
        assert!(ngram(4, 2, 3).propose(&[1, 2, 3, 4, 2, 3], 6).is_empty());
    }

    #[test]
    fn methods_other_than_ngram_are_refused_with_a_reason() {
        let section = |method: &str| SpeculativeSection {
            method: Some(method.into()),
            tokens: Some(2),
            ..Default::default()
        };
        let message = |method: &str| match Ngram::from_section(&section(method)) {
            Err(NativeError::Settings { message, .. }) => message,
            other => panic!("{method}: {other:?}"),
        };
        assert!(message("eagle").contains("second model"));
        let ok = Ngram::from_section(&section("ngram")).expect("ngram runs");
        assert_eq!(ok, ngram(2, 5, 5));
        for mtp in ["mtp", "qwen3_next_mtp"] {
            let method = Method::from_section(&section(mtp)).expect("MTP is a method");
            assert_eq!(method, Method::Mtp { tokens: 2 });
        }
        assert!(Method::from_section(&section("eagle")).is_err());
    }
}
