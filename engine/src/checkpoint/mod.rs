//! What a Hugging Face safetensors checkpoint calls things, in one place for the code
//! that writes checkpoints (`sous quantize`, `sous import`) and the code that reads
//! them (the native engine's loader), so that the two cannot drift apart.
//!
//! - [`names`]: the tensors of an NVFP4-quantized Linear layer in each format
//!   (compressed-tensors, ModelOpt) and the `quantization_config` values that tell the
//!   formats apart;
//! - [`index`]: which files hold the tensors: `model.safetensors`, or shards listed by
//!   `model.safetensors.index.json`, found the way loaders find them and named and
//!   indexed the way transformers writes them.
//!
//! Not here: reading or writing tensor data (the quantizer's `source.rs`/`write.rs`, the
//! loader's `native/weights.rs`), the NVFP4 arithmetic (`sous-kernels`), or the
//! configuration files a quantizer writes (the quantizer's `checkpoint.rs`).
//! `docs/nvfp4.md` describes both formats.

pub mod index;
pub mod names;
