//! The work: every planned tensor computed and written at its place in the shard
//! files, in source order, a bounded window at a time.
//!
//! A fused group is read twice: once for its amax (the group's global scale needs all
//! of it), once to quantize. Each pass maps at most `window_bytes` of one tensor at a
//! time (whole rows: blocks never cross rows, so a window's bytes are the same as the
//! whole tensor's). Kept tensors are copied window by window.
//!
//! Writing runs on its own thread, fed through a channel of [`QUEUE`] windows, so the
//! disk works while the kernels compute; it also flushes each file every
//! [`FLUSH_EVERY`] bytes, so the device writes while the work goes on rather than all
//! at the final fsync. The full channel holds the computation back to the disk's
//! pace. Peak memory is therefore a few windows plus the fixed working set, whatever
//! the model or tensor size. Not here: what to write (`layout.rs`) or where the
//! directory goes (`sous_engine::atomic`, `marker.rs`).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sous_kernels::formats::bf16::round_bf16;
use sous_kernels::{BlockCounts, Dtype, ErrorStats, Flavor, Matrix, TensorScale, fast};

use super::error::{QuantizeError, io};
use super::layout::{Content, Layout};
use super::meter::Meter;
use super::source::{Source, SourceTensor};

/// How the work is done.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Largest slice of a source tensor mapped at once.
    pub window_bytes: u64,
    /// Also hash every quantized tensor and its bf16 dequantization.
    pub digests: bool,
}

/// What quantization did to one weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorReport {
    /// The source tensor, e.g. `model.layers.0.mlp.down_proj.weight`.
    pub name: String,
    /// `[out, in]`.
    pub shape: Vec<usize>,
    /// Source dtype.
    pub dtype: String,
    /// The other members of its fused group (they share the global scale).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fused_with: Vec<String>,
    /// Largest magnitude over the fused group.
    pub amax: f32,
    /// The stored per-tensor scale (`weight_global_scale` or `weight_scale_2`).
    pub global_scale: f32,
    /// `||dequantized - original|| / ||original||`.
    pub relative_rms_error: f64,
    /// Largest `|dequantized - original|`.
    pub max_abs_error: f64,
    /// Share of blocks whose FP8 scale was clamped at 448 (their largest weights clip).
    pub saturated_block_share: f64,
    /// Share of non-zero blocks whose scale fell below FP8's range.
    pub underflow_block_share: f64,
    /// Share of all-zero blocks.
    pub zero_block_share: f64,
    /// SHA-256 of each output tensor's bytes, by output name (with `--digests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<BTreeMap<String, String>>,
    /// SHA-256 of the dequantized weights as little-endian bf16, the way
    /// compressed-tensors decompresses them (with `--digests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dequantized_bf16_sha256: Option<String>,
}

/// The kernels' name for a safetensors dtype, if it can be quantized.
pub fn kernel_dtype(dtype: safetensors::Dtype) -> Option<Dtype> {
    match dtype {
        safetensors::Dtype::BF16 => Some(Dtype::Bf16),
        safetensors::Dtype::F16 => Some(Dtype::F16),
        safetensors::Dtype::F32 => Some(Dtype::F32),
        _ => None,
    }
}

/// Windows in flight between the kernels and the writer thread.
pub const QUEUE: usize = 2;

/// The writer flushes a file after this many bytes written to it.
pub const FLUSH_EVERY: u64 = 64 << 20;

/// Bytes for the writer: computed output, or a mapped window of a kept tensor.
pub(super) enum Data {
    Owned(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl Data {
    fn bytes(&self) -> &[u8] {
        match self {
            Data::Owned(v) => v,
            Data::Mapped(m) => m,
        }
    }
}

/// One write: shard index, file offset, bytes.
struct Write(usize, u64, Data);

/// Writes what arrives, flushing each file as it goes; returns the first error.
fn writer(files: &[(PathBuf, File)], jobs: Receiver<Write>) -> Result<(), QuantizeError> {
    let mut unflushed = vec![0u64; files.len()];
    for Write(shard, offset, data) in jobs {
        let (path, file) = &files[shard];
        file.write_all_at(data.bytes(), offset).map_err(io(path))?;
        unflushed[shard] += data.bytes().len() as u64;
        if unflushed[shard] >= FLUSH_EVERY {
            file.sync_data().map_err(io(path))?;
            unflushed[shard] = 0;
        }
    }
    for (path, file) in files {
        file.sync_all().map_err(io(path))?;
    }
    Ok(())
}

/// A device that computes the items itself instead of the CPU loop here (the GPU
/// pipeline of `gpu.rs`): every item in order, copies through `work`'s writer.
pub(super) trait Accelerator {
    /// Runs `items` and returns the quantized tensors' reports.
    fn run(
        &mut self,
        work: &Work<'_>,
        items: Vec<(usize, Item<'_>)>,
        meter: &mut Meter,
    ) -> Result<Vec<TensorReport>, QuantizeError>;
}

/// One unit of work, in source order.
pub(super) enum Item<'a> {
    Copy(usize),
    Group(&'a [usize]),
}

/// Creates the shard files in `dir` and fills them.
#[allow(clippy::too_many_arguments)]
pub fn write(
    source: &Source,
    layout: &Layout,
    groups: &[Vec<usize>],
    flavor: Flavor,
    dir: &Path,
    options: Options,
    inputs: &BTreeMap<usize, f32>,
    gpu: Option<&mut dyn Accelerator>,
    meter: &mut Meter,
) -> Result<Vec<TensorReport>, QuantizeError> {
    let mut files = Vec::with_capacity(layout.shards.len());
    for shard in &layout.shards {
        let path = dir.join(&shard.name);
        let file = File::create(&path).map_err(io(&path))?;
        file.set_len(shard.size).map_err(io(&path))?;
        file.write_all_at(&shard.header, 0).map_err(io(&path))?;
        files.push((path, file));
    }
    let mut items: Vec<(usize, Item)> = groups.iter().map(|g| (g[0], Item::Group(g))).collect();
    for shard in &layout.shards {
        for t in &shard.tensors {
            if let Content::Copy(i) = t.content {
                items.push((i, Item::Copy(i)));
            }
        }
    }
    items.sort_by_key(|(first, _)| *first);
    std::thread::scope(|scope| {
        let (jobs, queue) = sync_channel(QUEUE);
        let writing = scope.spawn(|| writer(&files, queue));
        let work = Work {
            source,
            layout,
            jobs,
            flavor,
            options,
            inputs,
        };
        let mut reports = Vec::new();
        let mut outcome = Ok(());
        match gpu {
            Some(pipeline) => match pipeline.run(&work, items, meter) {
                Ok(r) => reports = r,
                Err(e) => outcome = Err(e),
            },
            None => {
                for (_, item) in items {
                    let done = match item {
                        Item::Copy(i) => work.copy(i, meter),
                        Item::Group(members) => work.group(members, meter).map(|r| reports.extend(r)),
                    };
                    if let Err(e) = done {
                        outcome = Err(e);
                        break;
                    }
                }
            }
        }
        // Closing the channel ends the writer; its error, if any, explains ours (a
        // send fails only because the writer stopped).
        drop(work);
        let written = writing
            .join()
            .unwrap_or_else(|_| Err(QuantizeError::Bug("the writer thread panicked".into())));
        written?;
        outcome.map(|()| reports)
    })
}

/// The computing side: reads windows, runs the kernels, hands bytes to the writer.
pub(super) struct Work<'a> {
    pub(super) source: &'a Source,
    layout: &'a Layout,
    jobs: SyncSender<Write>,
    pub(super) flavor: Flavor,
    pub(super) options: Options,
    /// W4A4: each quantized source tensor's `input_global_scale`.
    inputs: &'a BTreeMap<usize, f32>,
}

impl Work<'_> {
    pub(super) fn place(&self, content: Content) -> Result<(usize, u64), QuantizeError> {
        self.layout
            .place(content)
            .ok_or_else(|| QuantizeError::Bug(format!("{content:?} has no place in the output")))
    }

    /// Queues a write; fails only if the writer has stopped (on an error it reports).
    pub(super) fn send(&self, shard: usize, offset: u64, data: Data) -> Result<(), QuantizeError> {
        self.jobs
            .send(Write(shard, offset, data))
            .map_err(|_| QuantizeError::Bug("the writer stopped".into()))
    }

    pub(super) fn copy(&self, index: usize, meter: &mut Meter) -> Result<(), QuantizeError> {
        let tensor = &self.source.tensors[index];
        let (shard, offset) = self.place(Content::Copy(index))?;
        meter.tensor(&tensor.name, tensor.len);
        let window = self.options.window_bytes.max(1);
        let mut at = 0;
        while at < tensor.len {
            let len = window.min(tensor.len - at);
            let map = self.source.map(tensor, at, len)?;
            self.send(shard, offset + at, Data::Mapped(map))?;
            meter.advance(len, len);
            at += len;
        }
        Ok(())
    }

    /// Windows of whole rows of a 2-D tensor: (first row, rows).
    fn windows(&self, tensor: &SourceTensor) -> Vec<(usize, usize)> {
        let (rows, cols) = (tensor.shape[0], tensor.shape[1]);
        let row_bytes = (cols * tensor.dtype.bitsize() / 8).max(1) as u64;
        let per = (self.options.window_bytes / row_bytes).max(1) as usize;
        (0..rows).step_by(per).map(|r| (r, per.min(rows - r))).collect()
    }

    fn matrix<'m>(
        &self,
        tensor: &SourceTensor,
        map: &'m [u8],
        rows: usize,
    ) -> Result<Matrix<'m>, QuantizeError> {
        let dtype = kernel_dtype(tensor.dtype).ok_or_else(|| QuantizeError::UnsupportedDtype {
            tensor: tensor.name.clone(),
            dtype: format!("{:?}", tensor.dtype),
        })?;
        Matrix::new(dtype, rows, tensor.shape[1], map).map_err(|e| QuantizeError::BadSource {
            file: self.source.shards[tensor.shard].path.clone(),
            message: format!("{}: {e}", tensor.name),
        })
    }

    fn map_rows(
        &self,
        tensor: &SourceTensor,
        first: usize,
        rows: usize,
    ) -> Result<memmap2::Mmap, QuantizeError> {
        let row_bytes = (tensor.shape[1] * tensor.dtype.bitsize() / 8) as u64;
        self.source
            .map(tensor, first as u64 * row_bytes, rows as u64 * row_bytes)
    }

    /// The largest magnitude of one tensor, a window at a time.
    fn amax(&self, tensor: &SourceTensor) -> Result<f32, QuantizeError> {
        let mut amax = 0.0f32;
        for (first, rows) in self.windows(tensor) {
            let map = self.map_rows(tensor, first, rows)?;
            let window = fast::amax(&self.matrix(tensor, &map, rows)?);
            amax = if window.is_nan() || amax.is_nan() {
                f32::NAN
            } else {
                amax.max(window)
            };
        }
        Ok(amax)
    }

    pub(super) fn group(
        &self,
        members: &[usize],
        meter: &mut Meter,
    ) -> Result<Vec<TensorReport>, QuantizeError> {
        // A group that fits in one window is mapped once for both passes.
        let tensors: Vec<&SourceTensor> = members.iter().map(|&i| &self.source.tensors[i]).collect();
        let total: u64 = tensors.iter().map(|t| t.len).sum();
        let whole = if total <= self.options.window_bytes && tensors.iter().all(|t| t.len > 0) {
            Some(
                tensors
                    .iter()
                    .map(|t| self.source.map(t, 0, t.len))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        } else {
            None
        };
        let mut amax = 0.0f32;
        for (k, tensor) in tensors.iter().enumerate() {
            let member = match &whole {
                Some(maps) => fast::amax(&self.matrix(tensor, &maps[k], tensor.shape[0])?),
                None => self.amax(tensor)?,
            };
            if !member.is_finite() {
                return Err(QuantizeError::NonFinite {
                    tensor: tensor.name.clone(),
                });
            }
            amax = amax.max(member);
        }
        let names: Vec<&str> = members
            .iter()
            .map(|&i| self.source.tensors[i].name.as_str())
            .collect();
        let mut reports = Vec::with_capacity(members.len());
        for (k, &i) in members.iter().enumerate() {
            let mut report = self.quantize(i, amax, whole.as_ref().map(|maps| &maps[k][..]), meter)?;
            report.fused_with = fused_with(&names, &report.name);
            reports.push(report);
        }
        Ok(reports)
    }

    /// Quantizes one member with the group's `amax`, from `whole` (the tensor, mapped
    /// already) or window by window.
    fn quantize(
        &self,
        index: usize,
        amax: f32,
        whole: Option<&[u8]>,
        meter: &mut Meter,
    ) -> Result<TensorReport, QuantizeError> {
        let tensor = &self.source.tensors[index];
        let cols = tensor.shape[1];
        let dtype = kernel_dtype(tensor.dtype).ok_or_else(|| QuantizeError::UnsupportedDtype {
            tensor: tensor.name.clone(),
            dtype: format!("{:?}", tensor.dtype),
        })?;
        let scale = TensorScale::from_amax(self.flavor, dtype, amax);
        let (packed_shard, packed_at) = self.place(Content::Packed(index))?;
        let (scales_shard, scales_at) = self.place(Content::Scales(index))?;
        meter.tensor(&tensor.name, tensor.len);
        let mut blocks = BlockCounts::default();
        let mut errors = ErrorStats::default();
        let mut hashes = self
            .options
            .digests
            .then(|| [Sha256::new(), Sha256::new(), Sha256::new()]);
        let row_bytes = cols * tensor.dtype.bitsize() / 8;
        for (first, rows) in self.windows(tensor) {
            let mapped;
            let bytes = match whole {
                Some(all) => &all[first * row_bytes..(first + rows) * row_bytes],
                None => {
                    mapped = self.map_rows(tensor, first, rows)?;
                    &mapped[..]
                }
            };
            let matrix = self.matrix(tensor, bytes, rows)?;
            let (q, window_errors) = fast::quantize_with_stats(&matrix, &scale);
            blocks = blocks.merge(q.blocks);
            errors = errors.merge(window_errors);
            if let Some([packed, scales, dequantized]) = &mut hashes {
                packed.update(&q.packed);
                scales.update(&q.scales);
                let bf16: Vec<u8> = fast::dequantize(&q.packed, &q.scales, &scale)
                    .into_iter()
                    .flat_map(|v| ((round_bf16(v).to_bits() >> 16) as u16).to_le_bytes())
                    .collect();
                dequantized.update(&bf16);
            }
            let out = (q.packed.len() + q.scales.len()) as u64;
            self.send(
                packed_shard,
                packed_at + (first * cols / 2) as u64,
                Data::Owned(q.packed),
            )?;
            self.send(
                scales_shard,
                scales_at + (first * cols / 16) as u64,
                Data::Owned(q.scales),
            )?;
            meter.advance((rows * cols * tensor.dtype.bitsize() / 8) as u64, out);
        }
        self.finish_tensor(index, amax, &scale, blocks, errors, hashes, meter)
    }

    /// Queues what follows a quantized tensor's blocks (its global scale and, for W4A4,
    /// its input scale) and builds its report.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_tensor(
        &self,
        index: usize,
        amax: f32,
        scale: &TensorScale,
        blocks: BlockCounts,
        errors: ErrorStats,
        hashes: Option<[Sha256; 3]>,
        meter: &mut Meter,
    ) -> Result<TensorReport, QuantizeError> {
        let tensor = &self.source.tensors[index];
        let (global_shard, global_at) = self.place(Content::Global(index))?;
        let global = scale.value().to_le_bytes();
        self.send(global_shard, global_at, Data::Owned(global.to_vec()))?;
        meter.advance(0, 4);
        if let Some(value) = self.inputs.get(&index) {
            let (shard, at) = self.place(Content::InputGlobal(index))?;
            self.send(shard, at, Data::Owned(value.to_le_bytes().to_vec()))?;
            meter.advance(0, 4);
        }
        let share = |n: u64| {
            if blocks.total == 0 {
                0.0
            } else {
                n as f64 / blocks.total as f64
            }
        };
        let (sha256, dequantized_bf16_sha256) = match hashes {
            Some([packed, scales, dequantized]) => {
                let names = self.output_names(index)?;
                let mut map = BTreeMap::new();
                map.insert(names[0].clone(), hex::encode(packed.finalize()));
                map.insert(names[1].clone(), hex::encode(scales.finalize()));
                map.insert(names[2].clone(), hex::encode(Sha256::digest(global)));
                (Some(map), Some(hex::encode(dequantized.finalize())))
            }
            None => (None, None),
        };
        Ok(TensorReport {
            name: tensor.name.clone(),
            shape: tensor.shape.clone(),
            dtype: format!("{:?}", tensor.dtype),
            fused_with: Vec::new(),
            amax,
            global_scale: scale.value(),
            relative_rms_error: errors.relative_rms_error(),
            max_abs_error: errors.max_abs_error,
            saturated_block_share: share(blocks.saturated),
            underflow_block_share: share(blocks.underflow),
            zero_block_share: share(blocks.zero),
            sha256,
            dequantized_bf16_sha256,
        })
    }

    /// The output names of a quantized tensor: packed, scales, global scale.
    fn output_names(&self, index: usize) -> Result<[String; 3], QuantizeError> {
        let name = |content: Content| {
            self.layout
                .shards
                .iter()
                .flat_map(|s| &s.tensors)
                .find(|t| t.content == content)
                .map(|t| t.name.clone())
                .ok_or_else(|| QuantizeError::Bug(format!("{content:?} has no output tensor")))
        };
        Ok([
            name(Content::Packed(index))?,
            name(Content::Scales(index))?,
            name(Content::Global(index))?,
        ])
    }
}

/// The other members of a fused group, by name.
pub(super) fn fused_with(names: &[&str], name: &str) -> Vec<String> {
    names
        .iter()
        .filter(|n| **n != name)
        .map(|n| (*n).to_owned())
        .collect()
}
