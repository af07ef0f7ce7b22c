//! `sous quantize --device cuda`: the fused groups quantized on an NVIDIA GPU, with the
//! bytes of the CPU path (`sous_kernels::cuda`).
//!
//! Two slots take turns, each with its own CUDA stream, pinned input and output
//! buffers and device buffers sized for the largest group. For group k in slot s the
//! CPU reads the members from the shard files into pinned memory (positioned reads on
//! all cores), then queues the host-to-device copy and the amax kernels; it waits only
//! for the amax (four bytes per member), computes the group's scale as the CPU path
//! does, and queues the quantization and the device-to-host copies. While the GPU
//! quantizes group k, the CPU finishes group k-1 (hands its bytes to the writer thread)
//! and reads group k+1 into the other slot. Device memory holds two groups at most.
//!
//! A group larger than a slot (more than [`MAX_SLOT_BYTES`], or than a quarter of the
//! free device memory) is quantized on the CPU, and said so.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use sha2::{Digest, Sha256};
use sous_kernels::cuda::{DeviceOutput, Gpu, GpuError, GpuInfo, Pinned, amax_of_bits, stats_of};
use sous_kernels::formats::bf16::round_bf16;
use sous_kernels::{BLOCK, TensorScale, fast};

use super::error::QuantizeError;
use super::layout::Content;
use super::meter::Meter;
use super::write::{Accelerator, Data, Item, TensorReport, Work, fused_with, kernel_dtype};

/// The most input bytes one slot holds.
pub const MAX_SLOT_BYTES: usize = 2 << 30;

/// Bytes read per task when filling pinned memory from the shard files.
const COPY_CHUNK: usize = 4 << 20;

/// Statistics per member: two f64 sums and four u64 counts.
const STATS_BYTES: usize = 48;

/// The most members a fused group has (q/k/v).
const MAX_MEMBERS: usize = 16;

/// The GPU and its buffers.
pub struct Pipeline {
    gpu: Gpu,
    slots: [Slot; 2],
    capacity: usize,
    /// Groups too large for a slot, quantized on the CPU (first member's name).
    pub on_cpu: Vec<String>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("gpu", self.gpu.info())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

struct Slot {
    stream: Arc<CudaStream>,
    input: Pinned,
    output: Pinned,
    small: Pinned,
    device_in: CudaSlice<u8>,
    amax: CudaSlice<u32>,
    busy: Option<Queued>,
}

/// A group whose quantization is queued on a slot.
struct Queued {
    members: Vec<Member>,
    outputs: Vec<DeviceOutput>,
}

struct Member {
    index: usize,
    amax: f32,
    scale: TensorScale,
    elements: usize,
    packed_at: usize,
    scales_at: usize,
}

impl Accelerator for Pipeline {
    fn run(
        &mut self,
        work: &Work<'_>,
        items: Vec<(usize, Item<'_>)>,
        meter: &mut Meter,
    ) -> Result<Vec<TensorReport>, QuantizeError> {
        self.run_items(work, items, meter)
    }
}

impl Pipeline {
    /// Opens CUDA device `ordinal` (kernels cached under `cache`) with slots for
    /// groups of up to `largest_group` bytes.
    pub fn open(
        ordinal: usize,
        cache: Option<&std::path::Path>,
        largest_group: usize,
    ) -> Result<Pipeline, GpuError> {
        let gpu = Gpu::open(ordinal, cache)?;
        let (free, _) = gpu.memory()?;
        let capacity = largest_group
            .clamp(1 << 20, MAX_SLOT_BYTES.min(free / 4))
            .next_multiple_of(256);
        let slot = || -> Result<Slot, GpuError> {
            let stream = gpu.new_stream()?;
            let alloc = |e: cudarc::driver::DriverError| GpuError::Driver {
                what: "allocation",
                message: e.to_string(),
            };
            Ok(Slot {
                input: Pinned::new(&gpu, capacity)?,
                // Packed codes and scales of `capacity` bytes of bf16, the smallest
                // element, each at a 16-byte boundary.
                output: Pinned::new(&gpu, capacity / 4 + capacity / 32 + 64 * MAX_MEMBERS)?,
                small: Pinned::new(&gpu, (4 + STATS_BYTES) * MAX_MEMBERS)?,
                device_in: stream.alloc_zeros::<u8>(capacity).map_err(alloc)?,
                amax: stream.alloc_zeros::<u32>(MAX_MEMBERS).map_err(alloc)?,
                stream,
                busy: None,
            })
        };
        let slots = [slot()?, slot()?];
        Ok(Pipeline {
            gpu,
            slots,
            capacity,
            on_cpu: Vec::new(),
        })
    }

    /// The device.
    pub fn info(&self) -> &GpuInfo {
        self.gpu.info()
    }

    /// Runs `items` in order: copies through the writer, groups on the GPU (or the
    /// CPU, when too large for a slot).
    fn run_items(
        &mut self,
        work: &Work<'_>,
        items: Vec<(usize, Item<'_>)>,
        meter: &mut Meter,
    ) -> Result<Vec<TensorReport>, QuantizeError> {
        let mut reports = Vec::new();
        let mut turn = 0;
        let mut order: Vec<usize> = Vec::new();
        for (_, item) in items {
            match item {
                Item::Copy(i) => work.copy(i, meter)?,
                Item::Group(members) => {
                    let bytes: u64 = members.iter().map(|&i| work.source.tensors[i].len).sum();
                    if bytes as usize > self.capacity || members.len() > MAX_MEMBERS {
                        self.on_cpu.push(work.source.tensors[members[0]].name.clone());
                        reports.extend(work.group(members, meter)?);
                        continue;
                    }
                    let s = turn % 2;
                    turn += 1;
                    if let Some(queued) = self.slots[s].busy.take() {
                        reports.extend(self.finish(s, queued, work, meter)?);
                        order.retain(|&o| o != s);
                    }
                    self.start(s, members, work)?;
                    order.push(s);
                }
            }
        }
        for s in order {
            if let Some(queued) = self.slots[s].busy.take() {
                reports.extend(self.finish(s, queued, work, meter)?);
            }
        }
        Ok(reports)
    }

    /// Reads a group into slot `s`, measures its amax on the GPU and queues its
    /// quantization.
    fn start(&mut self, s: usize, members: &[usize], work: &Work<'_>) -> Result<(), QuantizeError> {
        let gpu = &self.gpu;
        let slot = &mut self.slots[s];
        let tensors: Vec<_> = members.iter().map(|&i| &work.source.tensors[i]).collect();
        // Into pinned memory, the members one after another (each a whole number of
        // 16-byte lanes, so every member starts aligned).
        let mut offsets = Vec::with_capacity(members.len());
        {
            let input = slot.input.bytes_mut().map_err(gpu_error)?;
            let mut at = 0usize;
            for tensor in &tensors {
                let len = tensor.len as usize;
                offsets.push(at);
                work.source
                    .read_into(tensor, &mut input[at..at + len], COPY_CHUNK)?;
                at += len;
            }
        }
        let total: usize = tensors.iter().map(|t| t.len as usize).sum();
        slot.input
            .upload(&slot.stream, 0, &mut slot.device_in.slice_mut(..total))
            .map_err(gpu_error)?;
        slot.stream
            .memset_zeros(&mut slot.amax)
            .map_err(|e| gpu_error(GpuError::driver("memset", e)))?;
        for (k, tensor) in tensors.iter().enumerate() {
            let dtype = dtype_of(tensor)?;
            let len = tensor.len as usize;
            gpu.launch_amax(
                &slot.stream,
                dtype,
                &slot.device_in.slice(offsets[k]..offsets[k] + len),
                len,
                &mut slot.amax.slice_mut(k..k + 1),
            )
            .map_err(gpu_error)?;
        }
        slot.small
            .download(&slot.stream, &slot.amax.slice(..members.len()), 0)
            .map_err(gpu_error)?;
        // The group's scale needs every member's amax: wait for those bytes only.
        let bits: Vec<u32> = slot.small.bytes().map_err(gpu_error)?[..4 * members.len()]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut amax = 0.0f32;
        for (tensor, &b) in tensors.iter().zip(&bits) {
            let member = amax_of_bits(b);
            if !member.is_finite() {
                return Err(QuantizeError::NonFinite {
                    tensor: tensor.name.clone(),
                });
            }
            amax = amax.max(member);
        }
        let mut queued = Queued {
            members: Vec::with_capacity(members.len()),
            outputs: Vec::with_capacity(members.len()),
        };
        let (mut packed_at, mut stats_at) = (0usize, 4 * MAX_MEMBERS);
        for (k, (&index, tensor)) in members.iter().zip(&tensors).enumerate() {
            let dtype = dtype_of(tensor)?;
            let len = tensor.len as usize;
            let elements = len / dtype.size();
            let scale = TensorScale::from_amax(work.flavor, dtype, amax);
            let mut out = DeviceOutput::new(&slot.stream, elements, true).map_err(gpu_error)?;
            gpu.launch_quantize(
                &slot.stream,
                dtype,
                &slot.device_in.slice(offsets[k]..offsets[k] + len),
                len,
                &scale,
                &mut out,
            )
            .map_err(gpu_error)?;
            let scales_at = (packed_at + elements / 2).next_multiple_of(16);
            if elements > 0 {
                slot.output
                    .download(&slot.stream, &out.packed.slice(..elements / 2), packed_at)
                    .map_err(gpu_error)?;
                slot.output
                    .download(&slot.stream, &out.scales.slice(..elements / BLOCK), scales_at)
                    .map_err(gpu_error)?;
            }
            if let Some((sums, counts)) = &out.stats {
                slot.small
                    .download(&slot.stream, &sums.as_view(), stats_at)
                    .map_err(gpu_error)?;
                slot.small
                    .download(&slot.stream, &counts.as_view(), stats_at + 16)
                    .map_err(gpu_error)?;
            }
            stats_at += STATS_BYTES;
            queued.members.push(Member {
                index,
                amax,
                scale,
                elements,
                packed_at,
                scales_at,
            });
            queued.outputs.push(out);
            packed_at = (scales_at + elements / BLOCK).next_multiple_of(16);
        }
        slot.busy = Some(queued);
        Ok(())
    }

    /// Waits for a slot's group and hands its bytes to the writer.
    fn finish(
        &mut self,
        s: usize,
        queued: Queued,
        work: &Work<'_>,
        meter: &mut Meter,
    ) -> Result<Vec<TensorReport>, QuantizeError> {
        let slot = &mut self.slots[s];
        let small = slot.small.bytes().map_err(gpu_error)?.to_vec();
        let output = slot.output.bytes().map_err(gpu_error)?;
        let names: Vec<&str> = queued
            .members
            .iter()
            .map(|m| work.source.tensors[m.index].name.as_str())
            .collect();
        let mut reports = Vec::with_capacity(queued.members.len());
        for (k, m) in queued.members.iter().enumerate() {
            let tensor = &work.source.tensors[m.index];
            meter.tensor(&tensor.name, tensor.len);
            let packed = output[m.packed_at..m.packed_at + m.elements / 2].to_vec();
            let scales = output[m.scales_at..m.scales_at + m.elements / BLOCK].to_vec();
            let at = 4 * MAX_MEMBERS + k * STATS_BYTES;
            let word = |i: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&small[at + 8 * i..at + 8 * i + 8]);
                b
            };
            let sums = [f64::from_le_bytes(word(0)), f64::from_le_bytes(word(1))];
            let counts = [0, 1, 2, 3].map(|i| u64::from_le_bytes(word(2 + i)));
            let (blocks, errors) = stats_of(m.elements, &sums, &counts);
            let hashes = work.options.digests.then(|| {
                let mut h = [Sha256::new(), Sha256::new(), Sha256::new()];
                h[0].update(&packed);
                h[1].update(&scales);
                let bf16: Vec<u8> = fast::dequantize(&packed, &scales, &m.scale)
                    .into_iter()
                    .flat_map(|v| ((round_bf16(v).to_bits() >> 16) as u16).to_le_bytes())
                    .collect();
                h[2].update(&bf16);
                h
            });
            let out = (packed.len() + scales.len()) as u64;
            let (packed_shard, packed_offset) = work.place(Content::Packed(m.index))?;
            let (scales_shard, scales_offset) = work.place(Content::Scales(m.index))?;
            work.send(packed_shard, packed_offset, Data::Owned(packed))?;
            work.send(scales_shard, scales_offset, Data::Owned(scales))?;
            meter.advance(tensor.len, out);
            let mut report = work.finish_tensor(m.index, m.amax, &m.scale, blocks, errors, hashes, meter)?;
            report.fused_with = fused_with(&names, &report.name);
            reports.push(report);
        }
        drop(queued.outputs);
        Ok(reports)
    }
}

fn dtype_of(tensor: &super::source::SourceTensor) -> Result<sous_kernels::Dtype, QuantizeError> {
    kernel_dtype(tensor.dtype).ok_or_else(|| QuantizeError::UnsupportedDtype {
        tensor: tensor.name.clone(),
        dtype: format!("{:?}", tensor.dtype),
    })
}

fn gpu_error(e: GpuError) -> QuantizeError {
    QuantizeError::Gpu {
        message: e.to_string(),
    }
}
