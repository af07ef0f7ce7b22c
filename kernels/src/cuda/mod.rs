//! NVFP4 on NVIDIA GPUs: the kernels of `nvfp4.cu`, compiled at run time by NVRTC for
//! the device in hand and launched through `cudarc`, which opens `libcuda` and
//! `libnvrtc` when [`Gpu::open`] is called. A `sous` built on a machine with no CUDA
//! runs them wherever a driver is installed; where none is, [`Gpu::open`] says which
//! library is missing.
//!
//! The numbers are the CPU's: every kernel repeats the arithmetic of
//! [`crate::scale`] and [`crate::formats`] with IEEE rounding written out and no fused
//! multiply-add, so [`Gpu::quantize`] gives the bytes of [`crate::fast::quantize`] (the
//! tests and `sous kernels check` hold it to that). Error statistics are summed in
//! another order, so they agree to rounding, as the CPU's fast path and reference do.
//!
//! NVRTC runs once per architecture and source: the PTX is kept in the cache directory
//! the caller names (`<cache>/kernels/`), and later processes load it from there.
//!
//! Not here: choosing tensors, reading files or overlapping transfers with work across
//! tensors (`sous quantize --device cuda` does that, with [`Pinned`] buffers on two
//! streams).

#![allow(unsafe_code)] // Kernel launches and pinned memory are unsafe in cudarc.

mod bench;
mod compile;
mod error;
mod gpu;
mod output;
mod pinned;

pub use bench::Bench;
pub use error::GpuError;
pub use gpu::{Gpu, GpuInfo, driver_present};
pub use output::{DeviceOutput, amax_of_bits, stats_of};
pub use pinned::Pinned;

/// The kernels' source, compiled at run time.
pub const SOURCE: &str = include_str!("nvfp4.cu");

/// Threads per CUDA block.
const THREADS: u32 = 256;

/// Words of the bf16 kernel's threshold table: 8 for each of the 256 scale bytes.
const THRESHOLD_WORDS: usize = 256 * 8;

#[cfg(test)]
mod tests;
