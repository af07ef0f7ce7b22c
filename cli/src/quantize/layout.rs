//! Where every output tensor goes: its name, dtype and shape in the chosen format, the
//! shard it lands in and its byte offset there, each shard's header, and the index.
//!
//! Everything is planned before a byte is quantized, so shard files are created at
//! their final size with their header in place, and each tensor is written at its
//! offset as soon as it is ready, in any order. Shards are filled in source order, so
//! they follow the layers; inside a shard, tensors are ordered by element size, largest
//! first, then by name, as the safetensors crate's `serialize` orders them, so every
//! tensor starts aligned to its element size (the format allows no padding).
//!
//! Tensor names come from [`sous_engine::checkpoint::names`], shard names and the
//! index from [`sous_engine::checkpoint::index`]: the native engine reads them from
//! the same place.

use std::collections::{BTreeMap, HashMap};

use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};
use serde_json::Value;
use sous_engine::checkpoint::index::{Index, shard_name};
use sous_engine::checkpoint::names::{self, Nvfp4Names};
use sous_engine::recipe::QuantFormat;

use super::error::QuantizeError;
use super::select::Decision;
use super::source::SourceTensor;

/// What an output tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Content {
    /// Source tensor `i`, unchanged.
    Copy(usize),
    /// The packed FP4 codes of source tensor `i`.
    Packed(usize),
    /// The FP8 block scales of source tensor `i`.
    Scales(usize),
    /// The per-tensor scale of source tensor `i`.
    Global(usize),
    /// The per-tensor activation scale of source tensor `i`'s module (W4A4).
    InputGlobal(usize),
}

/// One output tensor.
#[derive(Debug, Clone)]
pub struct OutTensor {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Bytes.
    pub len: u64,
    /// Contents.
    pub content: Content,
    /// Offset of its first byte in the shard file.
    pub offset: u64,
}

/// One output file.
#[derive(Debug)]
pub struct OutShard {
    /// File name.
    pub name: String,
    /// The 8-byte length and the JSON header, padded.
    pub header: Vec<u8>,
    /// Tensors in file order.
    pub tensors: Vec<OutTensor>,
    /// Total file size.
    pub size: u64,
}

/// The whole output.
#[derive(Debug)]
pub struct Layout {
    /// Shards in order.
    pub shards: Vec<OutShard>,
    /// `model.safetensors.index.json` when there is more than one shard.
    pub index: Option<Index>,
    /// Where each content goes: (shard, offset).
    places: HashMap<Content, (usize, u64)>,
}

impl Layout {
    /// Plans the output of `source` with `decisions`, in `format`, in shards of at most
    /// `max_shard` bytes of tensor data (a tensor larger than that gets a shard of its
    /// own), with `metadata` in every header; `w4a4` adds each quantized module's
    /// `input_global_scale` (compressed-tensors).
    pub fn plan(
        tensors: &[SourceTensor],
        decisions: &[Decision],
        format: QuantFormat,
        max_shard: u64,
        metadata: &HashMap<String, String>,
        w4a4: bool,
    ) -> Result<Layout, QuantizeError> {
        let nvfp4 = Nvfp4Names::of(format);
        // Units that stay together in one shard: a kept tensor, or a quantized
        // layer's three tensors.
        let mut units: Vec<Vec<OutTensor>> = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            let out = |name: String, dtype: Dtype, shape: Vec<usize>, len: u64, content: Content| OutTensor {
                name,
                dtype,
                shape,
                len,
                content,
                offset: 0,
            };
            if decisions[i] != Decision::Quantize {
                units.push(vec![out(
                    t.name.clone(),
                    t.dtype,
                    t.shape.clone(),
                    t.len,
                    Content::Copy(i),
                )]);
                continue;
            }
            let module = names::module_of(&t.name);
            let (rows, cols) = (t.shape[0], t.shape[1]);
            units.push(vec![
                out(
                    names::tensor(module, nvfp4.packed),
                    Dtype::U8,
                    vec![rows, cols / 2],
                    (rows * cols / 2) as u64,
                    Content::Packed(i),
                ),
                out(
                    names::tensor(module, nvfp4.scales),
                    Dtype::F8_E4M3,
                    vec![rows, cols / 16],
                    (rows * cols / 16) as u64,
                    Content::Scales(i),
                ),
                out(
                    names::tensor(module, nvfp4.global),
                    Dtype::F32,
                    nvfp4.global_shape.to_vec(),
                    4,
                    Content::Global(i),
                ),
            ]);
            if w4a4 && let Some(unit) = units.last_mut() {
                // compressed-tensors: `input_global_scale`, F32 of shape [1], beside
                // `weight_global_scale`; ModelOpt: `input_scale`, an F32 scalar (shape
                // []), as `weight_scale_2`.
                unit.push(out(
                    names::tensor(module, nvfp4.input),
                    Dtype::F32,
                    nvfp4.global_shape.to_vec(),
                    4,
                    Content::InputGlobal(i),
                ));
            }
        }
        let mut groups: Vec<Vec<OutTensor>> = vec![Vec::new()];
        let mut filled = 0u64;
        for unit in units {
            let size: u64 = unit.iter().map(|t| t.len).sum();
            if filled > 0 && filled + size > max_shard {
                groups.push(Vec::new());
                filled = 0;
            }
            filled += size;
            if let Some(last) = groups.last_mut() {
                last.extend(unit);
            }
        }
        let count = groups.len();
        let mut shards = Vec::with_capacity(count);
        let mut places = HashMap::new();
        let mut weight_map = BTreeMap::new();
        let mut total = 0u64;
        for (s, mut tensors) in groups.into_iter().enumerate() {
            let name = shard_name(s, count);
            tensors.sort_by(|a, b| {
                b.dtype
                    .bitsize()
                    .cmp(&a.dtype.bitsize())
                    .then_with(|| a.name.cmp(&b.name))
            });
            let mut infos = Vec::with_capacity(tensors.len());
            let mut at = 0usize;
            for t in &tensors {
                let len = t.len as usize;
                infos.push((
                    t.name.clone(),
                    TensorInfo {
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        data_offsets: (at, at + len),
                    },
                ));
                at += len;
            }
            let header = encode_header(metadata, infos)?;
            let data_start = header.len() as u64;
            let mut at = data_start;
            for t in &mut tensors {
                t.offset = at;
                places.insert(t.content, (s, at));
                weight_map.insert(t.name.clone(), name.clone());
                at += t.len;
                total += t.len;
            }
            shards.push(OutShard {
                name,
                header,
                tensors,
                size: at,
            });
        }
        let index = (count > 1).then(|| Index::new(weight_map, total));
        Ok(Layout {
            shards,
            index,
            places,
        })
    }

    /// The shard and file offset of a content.
    pub fn place(&self, content: Content) -> Option<(usize, u64)> {
        self.places.get(&content).copied()
    }

    /// Bytes of tensor data in all shards.
    pub fn data_bytes(&self) -> u64 {
        self.shards.iter().flat_map(|s| &s.tensors).map(|t| t.len).sum()
    }
}

/// The 8-byte little-endian length and the JSON header, padded with spaces to a
/// multiple of 8 as the safetensors crate pads it. The crate's `Metadata` checks that
/// offsets are contiguous and match every shape; the JSON is written with sorted keys
/// (the crate's own serializer iterates a `HashMap`), so the same inputs give the same
/// bytes.
fn encode_header(
    metadata: &HashMap<String, String>,
    tensors: Vec<(String, TensorInfo)>,
) -> Result<Vec<u8>, QuantizeError> {
    let mut object = serde_json::Map::new();
    for (name, info) in &tensors {
        let info = serde_json::to_value(info).map_err(|e| QuantizeError::Bug(e.to_string()))?;
        object.insert(name.clone(), info);
    }
    Metadata::new(None, tensors).map_err(|e| QuantizeError::Bug(format!("output header: {e}")))?;
    let metadata: serde_json::Map<String, Value> = metadata
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    object.insert("__metadata__".into(), Value::Object(metadata));
    let mut json = serde_json::to_vec(&object).map_err(|e| QuantizeError::Bug(e.to_string()))?;
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut header = Vec::with_capacity(8 + json.len());
    header.extend_from_slice(&(json.len() as u64).to_le_bytes());
    header.extend_from_slice(&json);
    Ok(header)
}
