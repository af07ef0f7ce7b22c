//! The device buffers of one quantized tensor ([`DeviceOutput`]) and turning what the
//! kernels leave in them into the CPU's types: packed codes, scales, block counts and
//! error statistics.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::error::driver;
use super::{GpuError, THRESHOLD_WORDS};
use crate::BLOCK;
use crate::reference::Quantized;
use crate::stats::{BlockCounts, ErrorStats};

/// Device buffers for one quantized tensor (or window).
pub struct DeviceOutput {
    /// Packed FP4 codes.
    pub packed: CudaSlice<u8>,
    /// E4M3 block scales.
    pub scales: CudaSlice<u8>,
    /// Error sums and counts, when asked for.
    pub stats: Option<(CudaSlice<f64>, CudaSlice<u64>)>,
    /// The bf16 kernel's thresholds for the tensor in hand (8 words per scale byte),
    /// written before each bf16 launch; per output so that streams do not share them.
    pub(super) thresholds: CudaSlice<u32>,
}

impl DeviceOutput {
    /// Buffers for `elements` elements (zeroed statistics), on `stream`.
    pub fn new(stream: &Arc<CudaStream>, elements: usize, stats: bool) -> Result<DeviceOutput, GpuError> {
        let alloc = driver("allocation");
        Ok(DeviceOutput {
            packed: stream.alloc_zeros::<u8>((elements / 2).max(1)).map_err(&alloc)?,
            scales: stream
                .alloc_zeros::<u8>((elements / BLOCK).max(1))
                .map_err(&alloc)?,
            stats: if stats {
                Some((
                    stream.alloc_zeros::<f64>(2).map_err(&alloc)?,
                    stream.alloc_zeros::<u64>(4).map_err(&alloc)?,
                ))
            } else {
                None
            },
            thresholds: stream.alloc_zeros::<u32>(THRESHOLD_WORDS).map_err(&alloc)?,
        })
    }

    /// Copies the first `elements`' results back (waits for `stream`).
    pub fn download(
        &self,
        stream: &Arc<CudaStream>,
        elements: usize,
    ) -> Result<(Quantized, ErrorStats), GpuError> {
        let copy = driver("device-to-host copy");
        let mut packed = stream.clone_dtoh(&self.packed).map_err(&copy)?;
        let mut scales = stream.clone_dtoh(&self.scales).map_err(&copy)?;
        packed.truncate(elements / 2);
        scales.truncate(elements / BLOCK);
        let (blocks, errors) = match &self.stats {
            Some((sums, counts)) => {
                let sums = stream.clone_dtoh(sums).map_err(&copy)?;
                let counts = stream.clone_dtoh(counts).map_err(&copy)?;
                stats_of(elements, &sums, &counts)
            }
            None => (
                BlockCounts {
                    total: (elements / BLOCK) as u64,
                    ..BlockCounts::default()
                },
                ErrorStats::default(),
            ),
        };
        Ok((
            Quantized {
                packed,
                scales,
                blocks,
            },
            errors,
        ))
    }
}

/// The block counts and error statistics from the kernels' sums and counts.
pub fn stats_of(elements: usize, sums: &[f64], counts: &[u64]) -> (BlockCounts, ErrorStats) {
    (
        BlockCounts {
            total: (elements / BLOCK) as u64,
            zero: counts[1],
            saturated: counts[2],
            underflow: counts[3],
        },
        ErrorStats {
            count: elements as u64,
            sum_sq_error: sums[0],
            sum_sq_weight: sums[1],
            max_abs_error: f64::from_bits(counts[0]),
        },
    )
}

/// The amax kernel's bits as the CPU's value: NaN for any NaN.
pub fn amax_of_bits(bits: u32) -> f32 {
    if bits > 0x7F80_0000 {
        f32::NAN
    } else {
        f32::from_bits(bits)
    }
}
