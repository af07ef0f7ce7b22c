//! NVFP4 numerics: turning 16-bit or 32-bit weights into FP4 (E2M1) codes with FP8
//! (E4M3) block scales and one FP32 scale per tensor, bit for bit as the reference tools
//! do it, and back.
//!
//! Two tools are imitated ([`Flavor`]): compressed-tensors 0.19 / llm-compressor 0.14
//! (the default) and NVIDIA ModelOpt 0.47. They agree on the FP4 grid, the rounding and
//! the packing, and differ in how the per-tensor scale is formed and applied
//! (`docs/nvfp4.md`, "The two are not the same bytes"), so both are kept exactly.
//!
//! The crate has two implementations of the same function:
//! - [`reference`]: scalar code written to be read beside the spec, one step per line;
//! - [`fast`]: the same arithmetic over rows in parallel (rayon), with an AVX2 kernel
//!   chosen at run time on x86-64 and a portable block kernel elsewhere.
//!
//! They are bit-identical on every input, finite or not; the tests check that on the
//! tools' own test vectors and on random tensors full of edge cases.
//!
//! [`transformer`] holds the other hot loops of the native engine: RMSNorm, rotary
//! embeddings, the gated MLP activation and paged attention, in f32.
//!
//! Not here: reading or writing checkpoints, choosing which tensors to quantize, or fused
//! layers (the caller takes the amax over a fused group and passes one [`TensorScale`]).

pub mod activation;
pub mod bandwidth;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fast;
pub mod formats;
pub mod gemm;
pub mod pages;
pub mod reference;
pub mod scale;
pub mod stats;
pub mod transformer;

mod error;
mod matrix;

pub use error::KernelError;
pub use matrix::{Dtype, Matrix};
pub use scale::{BlockKind, Flavor, TensorScale};
pub use stats::{BlockCounts, ErrorStats};

/// Elements per block: one FP8 scale for every 16 consecutive weights along a row.
pub const BLOCK: usize = 16;
