//! Timing the kernels on a device ([`Gpu::bench`], [`Bench`]) on deterministic data,
//! beside a device-to-device copy of the same bytes.

use super::error::driver;
use super::{DeviceOutput, Gpu, GpuError, Pinned, amax_of_bits};
use crate::scale::{Flavor, TensorScale};
use crate::{BLOCK, Dtype};

impl Gpu {
    /// Times the kernels on `bytes` of random-looking `dtype` data already on the
    /// device, beside a device-to-device copy of the same bytes: the median of
    /// `repeats` runs of each, after a warm-up.
    pub fn bench(&self, dtype: Dtype, bytes: usize, repeats: usize) -> Result<Bench, GpuError> {
        let bytes = bytes / (BLOCK * dtype.size()) * (BLOCK * dtype.size());
        let elements = bytes / dtype.size();
        let host = bench_data(dtype, elements);
        let input = self.upload(&host)?;
        drop(host);
        let mut copy = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(driver("allocation"))?;
        let mut amax = self.stream.alloc_zeros::<u32>(1).map_err(driver("allocation"))?;
        let mut plain = DeviceOutput::new(&self.stream, elements, false)?;
        let mut stats = DeviceOutput::new(&self.stream, elements, true)?;
        self.launch_amax(
            &self.stream,
            dtype,
            &input.as_view(),
            bytes,
            &mut amax.as_view_mut(),
        )?;
        let bits = self
            .stream
            .clone_dtoh(&amax)
            .map_err(driver("device-to-host copy"))?;
        let scale = TensorScale::from_amax(Flavor::CompressedTensors, dtype, amax_of_bits(bits[0]));
        let time = |run: &mut dyn FnMut() -> Result<(), GpuError>| -> Result<f64, GpuError> {
            run()?;
            let mut times = Vec::with_capacity(repeats.max(1));
            for _ in 0..repeats.max(1) {
                let start = self
                    .stream
                    .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("event"))?;
                run()?;
                let end = self
                    .stream
                    .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("event"))?;
                end.synchronize().map_err(driver("synchronize"))?;
                times.push(f64::from(start.elapsed_ms(&end).map_err(driver("event timing"))?) / 1e3);
            }
            times.sort_by(f64::total_cmp);
            Ok(times[times.len() / 2])
        };
        let copy_s = time(&mut || {
            self.stream
                .memcpy_dtod(&input, &mut copy)
                .map_err(driver("device-to-device copy"))
        })?;
        let mut pinned = Pinned::new(self, bytes)?;
        pinned.bytes_mut()?.fill(0x3c);
        let mut target = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(driver("allocation"))?;
        let upload_s = time(&mut || pinned.upload(&self.stream, 0, &mut target.as_view_mut()))?;
        drop(target);
        let view = input.as_view();
        let amax_s =
            time(&mut || self.launch_amax(&self.stream, dtype, &view, bytes, &mut amax.as_view_mut()))?;
        let quantize_s =
            time(&mut || self.launch_quantize(&self.stream, dtype, &view, bytes, &scale, &mut plain))?;
        let quantize_stats_s =
            time(&mut || self.launch_quantize(&self.stream, dtype, &view, bytes, &scale, &mut stats))?;
        Ok(Bench {
            bytes,
            elements,
            upload_s,
            copy_s,
            amax_s,
            quantize_s,
            quantize_stats_s,
        })
    }
}

/// Kernel timings from [`Gpu::bench`], in seconds (medians).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bench {
    /// Input bytes.
    pub bytes: usize,
    /// Input elements.
    pub elements: usize,
    /// A host-to-device copy of the input from pinned memory.
    pub upload_s: f64,
    /// A device-to-device copy of the input.
    pub copy_s: f64,
    /// The amax pass.
    pub amax_s: f64,
    /// Quantization (block scales and packed FP4), without statistics.
    pub quantize_s: f64,
    /// Quantization with error statistics.
    pub quantize_stats_s: f64,
}

impl Bench {
    /// Bytes the quantization reads and writes per element of `dtype`.
    pub fn quantize_bytes(&self) -> f64 {
        self.bytes as f64 + self.elements as f64 * (0.5 + 1.0 / BLOCK as f64)
    }
}

/// Deterministic data for [`Gpu::bench`]: weights of a few magnitudes, some blocks zero.
fn bench_data(dtype: Dtype, elements: usize) -> Vec<u8> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut out = Vec::with_capacity(elements * dtype.size());
    for i in 0..elements {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let v = if (i / BLOCK).is_multiple_of(97) {
            0.0
        } else {
            unit * 0.1
        };
        match dtype {
            Dtype::Bf16 => out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&half_bits(v).to_le_bytes()),
            Dtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// f32 to f16 bits, truncating (bench data only: any f16 will do).
fn half_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xFF) as i32 - 127 + 15;
    if exponent <= 0 {
        return sign;
    }
    sign | ((exponent as u16) << 10) | ((bits >> 13) & 0x3FF) as u16
}
