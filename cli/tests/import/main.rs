//! `sous import gguf`, end to end through the real binary, in one test binary (one link
//! of candle and tokenizers instead of three):
//!
//! - `gguf`: small GGUF files written here, checked value by value, and broken ones;
//! - `smollm2`: the SmolLM2 test model against transformers' reading of the same file;
//! - `sentencepiece`: a SentencePiece-vocabulary llama against transformers.

mod gguf;
mod sentencepiece;
mod smollm2;
mod support;
