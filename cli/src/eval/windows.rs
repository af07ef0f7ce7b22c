//! A text cut into the windows perplexity is measured over, as llama.cpp's
//! `llama-perplexity` cuts it (`ggml-org/llama.cpp:tools/perplexity/perplexity.cpp`,
//! `perplexity()`): the tokens split into `ctx`-token windows end to end, the remainder
//! that does not fill a window dropped; each window is evaluated from scratch, and only
//! the tokens after its first `score_from` are scored, so that every scored token has at
//! least that much context (llama.cpp: `first = n_ctx/2`, positions `first + 1 ..
//! n_ctx - 1`, `n_ctx - first - 1` tokens per window). When the tokenizer begins every
//! sequence with a BOS token, each window's first token is replaced by it, as llama.cpp
//! does when the vocabulary says `add_bos`.
//!
//! `score_from = 0` with one window holding the whole text scores every token from the
//! second on: the figure of a single `prompt_logprobs` request over the text.

use serde::{Deserialize, Serialize};

/// How a text is cut and scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// Tokens per window.
    pub ctx: usize,
    /// Tokens of each window that are context only; scoring starts after them.
    pub score_from: usize,
    /// The BOS token each window starts with, when the tokenizer adds one.
    pub bos: Option<u32>,
    /// At most this many windows (llama.cpp's `--chunks`); all when `None`.
    pub max_windows: Option<usize>,
}

/// Why a text cannot be cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CutError {
    /// Fewer tokens than one window.
    #[error("the text has {tokens} tokens; one window of --ctx {ctx} needs at least {ctx}")]
    TooShort {
        /// Tokens in the text.
        tokens: usize,
        /// Tokens a window needs.
        ctx: usize,
    },
    /// A window too small to score anything.
    #[error(
        "--ctx {ctx} with --score-from {score_from} scores no token (a window needs at least score_from + 2 tokens)"
    )]
    NothingScored {
        /// Tokens per window.
        ctx: usize,
        /// Tokens of context.
        score_from: usize,
    },
}

/// How a text is to be cut, before its length and tokenizer are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Windows of `ctx` tokens scored after `score_from` (default `ctx / 2`, llama.cpp's),
    /// at most `chunks` of them.
    Windows {
        /// Tokens per window.
        ctx: usize,
        /// Context-only tokens of each window.
        score_from: Option<usize>,
        /// At most this many windows.
        chunks: Option<usize>,
    },
    /// One window of the whole text, scored from its second token.
    Whole,
}

impl Shape {
    /// The cut of a text of `tokens` tokens whose tokenizer starts sequences with `bos`.
    pub fn cut(self, tokens: usize, bos: Option<u32>) -> Cut {
        match self {
            Shape::Windows {
                ctx,
                score_from,
                chunks,
            } => Cut {
                ctx,
                score_from: score_from.unwrap_or(ctx / 2),
                bos,
                max_windows: chunks,
            },
            Shape::Whole => Cut {
                ctx: tokens,
                score_from: 0,
                bos,
                max_windows: None,
            },
        }
    }
}

impl Cut {
    /// Tokens scored in each window.
    pub fn scored_per_window(&self) -> usize {
        self.ctx.saturating_sub(self.score_from + 1)
    }

    /// The windows of `tokens`, each `ctx` tokens long.
    pub fn windows(&self, tokens: &[u32]) -> Result<Vec<Vec<u32>>, CutError> {
        if self.scored_per_window() == 0 {
            return Err(CutError::NothingScored {
                ctx: self.ctx,
                score_from: self.score_from,
            });
        }
        if tokens.len() < self.ctx {
            return Err(CutError::TooShort {
                tokens: tokens.len(),
                ctx: self.ctx,
            });
        }
        let count = (tokens.len() / self.ctx).min(self.max_windows.unwrap_or(usize::MAX));
        Ok(tokens
            .chunks_exact(self.ctx)
            .take(count)
            .map(|chunk| {
                let mut w = chunk.to_vec();
                if let Some(bos) = self.bos {
                    w[0] = bos;
                }
                w
            })
            .collect())
    }

    /// The positions of a window that are scored: each predicts its token from the
    /// ones before it.
    pub fn scored(&self) -> std::ops::Range<usize> {
        self.score_from + 1..self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's cut: windows of `ctx`, the second half scored.
    fn llama_cpp(ctx: usize, bos: Option<u32>) -> Cut {
        Shape::Windows {
            ctx,
            score_from: None,
            chunks: None,
        }
        .cut(0, bos)
    }

    #[test]
    fn windows_are_cut_end_to_end_and_the_rest_dropped() {
        let tokens: Vec<u32> = (0..1030).collect();
        let cut = llama_cpp(512, None);
        let w = cut.windows(&tokens).expect("two windows");
        assert_eq!(w.len(), 2);
        assert_eq!(w[1][0], 512);
        assert_eq!(w[1][511], 1023);
        // llama.cpp: 512 - 256 - 1 = 255 tokens per window, positions 257..=511.
        assert_eq!(cut.scored_per_window(), 255);
        assert_eq!(cut.scored(), 257..512);
    }

    #[test]
    fn bos_replaces_each_windows_first_token() {
        let tokens: Vec<u32> = (10..30).collect();
        let cut = llama_cpp(8, Some(1));
        let w = cut.windows(&tokens).expect("windows");
        assert!(w.iter().all(|w| w[0] == 1));
        assert_eq!(w[1][1], 19);
    }

    #[test]
    fn whole_text_in_one_window_scores_all_but_the_first_token() {
        let tokens: Vec<u32> = (0..100).collect();
        let cut = Shape::Whole.cut(tokens.len(), None);
        assert_eq!(cut.windows(&tokens).expect("one").len(), 1);
        assert_eq!(cut.scored(), 1..100);
    }

    #[test]
    fn a_short_text_is_refused_with_the_size_it_needs() {
        let err = llama_cpp(512, None).windows(&[1; 300]).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "the text has 300 tokens; one window of --ctx 512 needs at least 512"
        );
        let err = Cut {
            ctx: 4,
            score_from: 3,
            bos: None,
            max_windows: None,
        }
        .windows(&[1; 8])
        .expect_err("refused");
        assert!(matches!(err, CutError::NothingScored { .. }));
    }

    #[test]
    fn chunks_limit_the_windows() {
        let cut = Cut {
            max_windows: Some(1),
            ..llama_cpp(4, None)
        };
        assert_eq!(cut.windows(&[0; 40]).expect("one").len(), 1);
    }
}
