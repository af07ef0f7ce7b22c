//! The number formats NVFP4 is built from, each as plain scalar functions: bf16
//! rounding, FP8 E4M3 scales, FP4 E2M1 codes and their packing; and llama.cpp's Q8_0,
//! which the native engine may hold embeddings in. The reference
//! implementation and the fast path both call these for anything per block; only the
//! per-element work is re-written for speed.

pub mod bf16;
pub mod fp4;
pub mod fp8;
pub mod q8;
