//! Reading a model directory's safetensors into packed weights for
//! [`sous_kernels::gemm`], keeping NVFP4 packed.
//!
//! The files are those [`crate::checkpoint::index::Shards`] finds (`model.safetensors`,
//! or the shards `model.safetensors.index.json` lists); they are memory-mapped and each
//! tensor is copied out once into the product's panel layout. Float weights keep their
//! stored precision (bf16 stays bf16; f16 is widened to f32, which is exact) unless the
//! recipe asks for bf16 ([`Precision`]). NVFP4 weights come in the two layouts
//! `sous quantize` writes, named by [`crate::checkpoint::names`]: compressed-tensors and
//! ModelOpt (`docs/nvfp4.md`). They stay packed (FP4 codes, E4M3 block scales) and are
//! dequantized in registers by the product, with the reference tools' arithmetic
//! (`sous_kernels::reference::dequantize`'s values, bit for bit).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value;
use sous_kernels::gemm::Packed;
use sous_kernels::scale::{Flavor, TensorScale};

use super::NativeError;
use super::config::ModelConfig;
use crate::checkpoint::index::{IndexError, SINGLE, Shards};
use crate::checkpoint::names::{self, Nvfp4Names};
use crate::recipe::QuantFormat;

/// How the checkpoint's linear weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// Plain floating-point weights.
    None,
    /// NVFP4 weights with 16-bit activations, compressed-tensors layout.
    Nvfp4CompressedTensors,
    /// NVFP4 weights with 16-bit activations, ModelOpt layout.
    Nvfp4ModelOpt,
    /// NVFP4 weights and activations (W4A4), compressed-tensors layout: every
    /// quantized Linear has an `input_global_scale`, and its input is quantized to
    /// NVFP4 before the product (`sous_kernels::activation`).
    Nvfp4W4a4CompressedTensors,
    /// NVFP4 weights and activations (W4A4), ModelOpt layout (`quant_algo` `NVFP4`):
    /// every quantized Linear has an `input_scale`, a divisor; its inverse is the
    /// activations' global scale, as vLLM takes it (`input_scale_inv`).
    Nvfp4W4a4ModelOpt,
}

/// Whether compressed-tensors `input_activations` are NVFP4's: FP4 floats in groups of
/// 16 under a static per-tensor scale, block scales at run time (`dynamic: "local"`).
fn is_nvfp4_activations(a: &Value) -> bool {
    a.get("num_bits").and_then(Value::as_u64) == Some(4)
        && a.get("type").and_then(Value::as_str) == Some("float")
        && a.get("strategy").and_then(Value::as_str) == Some("tensor_group")
        && a.get("group_size").and_then(Value::as_u64) == Some(16)
        && a.get("dynamic").and_then(Value::as_str) == Some("local")
}

impl Quantization {
    /// Whether the checkpoint quantizes activations (W4A4).
    pub fn activations(self) -> bool {
        matches!(
            self,
            Quantization::Nvfp4W4a4CompressedTensors | Quantization::Nvfp4W4a4ModelOpt
        )
    }

    /// Reads `quantization_config` and refuses what the engine cannot run.
    pub fn of(config: &ModelConfig, dir: &Path) -> Result<Quantization, NativeError> {
        let Some(q) = &config.quantization else {
            return Ok(Quantization::None);
        };
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or_default();
        let unsupported = |what: String| NativeError::Unsupported {
            what: format!("{what} in {}", dir.join("config.json").display()),
            hint:
                "the native engine runs unquantized checkpoints and NVFP4 checkpoints (weight-only or W4A4, \
                   compressed-tensors or ModelOpt) as `sous quantize` writes them; serve others with vLLM"
                    .into(),
        };
        match method {
            names::COMPRESSED_TENSORS => {
                let format = q.get("format").and_then(Value::as_str).unwrap_or_default();
                if format != names::NVFP4_PACK_QUANTIZED {
                    return Err(unsupported(format!("compressed-tensors format `{format}`")));
                }
                let groups = q.get("config_groups").and_then(Value::as_object);
                let mut w4a4 = None;
                for (name, group) in groups.into_iter().flatten() {
                    let activations = group.get("input_activations").filter(|a| !a.is_null());
                    let this = match activations {
                        None => false,
                        Some(a) if is_nvfp4_activations(a) => true,
                        Some(a) => {
                            return Err(unsupported(format!(
                                "quantized activations other than NVFP4 (`{name}.input_activations`: {a})"
                            )));
                        }
                    };
                    if w4a4.is_some_and(|w| w != this) {
                        return Err(unsupported(
                            "groups with and without quantized activations".into(),
                        ));
                    }
                    w4a4 = Some(this);
                }
                Ok(if w4a4 == Some(true) {
                    Quantization::Nvfp4W4a4CompressedTensors
                } else {
                    Quantization::Nvfp4CompressedTensors
                })
            }
            names::MODELOPT => {
                let algo = q.get("quant_algo").and_then(Value::as_str).unwrap_or_default();
                match algo {
                    names::W4A16_NVFP4 => Ok(Quantization::Nvfp4ModelOpt),
                    names::NVFP4 => Ok(Quantization::Nvfp4W4a4ModelOpt),
                    _ => Err(unsupported(format!("ModelOpt quant_algo `{algo}`"))),
                }
            }
            other => Err(unsupported(format!("quant_method `{other}`"))),
        }
    }

    /// The checkpoint format of NVFP4 weights; `None` for plain ones.
    pub fn format(self) -> Option<QuantFormat> {
        match self {
            Quantization::None => None,
            Quantization::Nvfp4CompressedTensors | Quantization::Nvfp4W4a4CompressedTensors => {
                Some(QuantFormat::CompressedTensors)
            }
            Quantization::Nvfp4ModelOpt | Quantization::Nvfp4W4a4ModelOpt => Some(QuantFormat::Modelopt),
        }
    }
}

/// The precision of the weights and of the products' inputs; products accumulate in
/// f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// As stored: bf16 and f32 as they are, f16 widened to f32 (exact).
    Stored,
    /// bf16: f32 and f16 weights rounded to the nearest bf16 at load, and bf16
    /// arithmetic in the products (inputs rounded to bf16, f32 accumulation;
    /// AVX512-BF16 dot products for prompt chunks where the CPU has them).
    Bf16,
}

/// A float tensor's values, in the precision the engine holds them in.
enum Floats {
    F32(Vec<f32>),
    /// Raw bf16 bits.
    Bf16(Vec<u16>),
}

/// The memory-mapped safetensors files of one model directory.
pub struct Checkpoint {
    dir: PathBuf,
    maps: Vec<(PathBuf, Mmap)>,
    index: HashMap<String, usize>,
    quantization: Quantization,
    /// The dtype the source model had (for the dequantization arithmetic).
    source: sous_kernels::Dtype,
    /// Linear layers read from another checkpoint instead.
    overlay: Option<Overlay>,
}

/// Linear layers (`modules`, as `model.layers.0.mlp.down_proj`) that a checkpoint reads
/// from another one, `from`, of the same model: how `sous quantize --scan` runs a model
/// with some of its layers in their NVFP4 form and the rest as they were.
#[derive(Clone)]
pub struct Overlay {
    /// The checkpoint the modules come from (NVFP4, with one tensor per expert).
    pub from: Arc<Checkpoint>,
    /// The modules.
    pub modules: HashSet<String>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("files", &self.maps.len())
            .finish()
    }
}

impl Checkpoint {
    /// Maps every shard of `dir`.
    pub fn open(dir: &Path, config: &ModelConfig) -> Result<Checkpoint, NativeError> {
        let quantization = Quantization::of(config, dir)?;
        let found = Shards::find(dir).map_err(|e| match e {
            IndexError::Io { path, source } => NativeError::Io { path, source },
            IndexError::Malformed { path, message } => NativeError::Config { path, message },
        })?;
        // With no safetensors at all, opening `model.safetensors` reports the missing file.
        let names = if found.files.is_empty() {
            vec![SINGLE.to_owned()]
        } else {
            found.files
        };
        let files: Vec<PathBuf> = names.into_iter().map(|n| dir.join(n)).collect();
        let mut maps = Vec::with_capacity(files.len());
        let mut index = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(|source| NativeError::Io {
                path: path.clone(),
                source,
            })?;
            let map = map_file(&file).map_err(|source| NativeError::Io {
                path: path.clone(),
                source,
            })?;
            let tensors = SafeTensors::deserialize(&map).map_err(|e| safetensors_error(&path, e))?;
            for name in tensors.names() {
                index.insert(name.to_string(), maps.len());
            }
            maps.push((path, map));
        }
        let source = match config.dtype.as_deref() {
            Some("float32") => sous_kernels::Dtype::F32,
            Some("float16") => sous_kernels::Dtype::F16,
            _ => sous_kernels::Dtype::Bf16,
        };
        Ok(Checkpoint {
            dir: dir.to_owned(),
            maps,
            index,
            quantization,
            source,
            overlay: None,
        })
    }

    /// Reads the linear layers `overlay` names from its checkpoint from now on (layers
    /// already loaded are not changed: reload them), or none with `None`.
    pub fn set_overlay(&mut self, overlay: Option<Overlay>) {
        self.overlay = overlay;
    }

    /// Whether linear layer `module` is read from the overlay's checkpoint.
    pub fn overlaid(&self, module: &str) -> bool {
        self.overlay.as_ref().is_some_and(|o| o.modules.contains(module))
    }

    /// How the linear weights are stored.
    pub fn quantization(&self) -> Quantization {
        self.quantization
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `experts` float matrices stacked in one 3-D tensor (`name`, shape `[experts,
    /// n, k]` as `shape` says: fused expert weights), each packed for the product.
    pub fn expert_matrices(
        &self,
        name: &str,
        shape: [usize; 3],
        precision: Precision,
    ) -> Result<Vec<Packed>, NativeError> {
        let (values, dims) = self.floats(name, precision)?;
        let [experts, n, k] = shape;
        if dims != shape {
            let hint = if dims == [experts, k, n] {
                " (the transposed layout, which the native engine does not read)"
            } else {
                ""
            };
            return Err(NativeError::Config {
                path: self.dir.clone(),
                message: format!("fused expert tensor `{name}` has shape {dims:?}, expected {shape:?}{hint}"),
            });
        }
        let packed = |e: usize| match &values {
            Floats::F32(v) => Packed::from_f32(&v[e * n * k..(e + 1) * n * k], n, k),
            Floats::Bf16(v) => Packed::from_bf16(&v[e * n * k..(e + 1) * n * k], n, k),
        };
        (0..experts)
            .map(|e| {
                packed(e).map_err(|err| NativeError::Config {
                    path: self.dir.clone(),
                    message: format!("`{name}` expert {e}: {err}"),
                })
            })
            .collect()
    }

    /// Plain float matrices (`name`, shape `[n, k]`, all of one `k`) stacked row after
    /// row into one, packed for the product: small ones whose row counts
    /// [`Packed::stack`] cannot join.
    pub fn stacked_matrix(
        &self,
        parts: &[(&str, [usize; 2])],
        precision: Precision,
    ) -> Result<Packed, NativeError> {
        let mut f32s = Vec::new();
        let mut bf16s = Vec::new();
        let mut rows = 0;
        let k = parts.first().map_or(0, |(_, [_, k])| *k);
        for &(name, shape) in parts {
            let (values, dims) = self.floats(name, precision)?;
            if dims != shape || shape[1] != k {
                return Err(NativeError::Config {
                    path: self.dir.clone(),
                    message: format!("`{name}` has shape {dims:?}, expected {shape:?}"),
                });
            }
            rows += shape[0];
            match values {
                Floats::F32(v) => f32s.extend(v),
                Floats::Bf16(v) => bf16s.extend(v),
            }
        }
        let packed = match (f32s.is_empty(), bf16s.is_empty()) {
            (_, true) => Packed::from_f32(&f32s, rows, k),
            (true, false) => Packed::from_bf16(&bf16s, rows, k),
            (false, false) => {
                return Err(NativeError::Config {
                    path: self.dir.clone(),
                    message: format!(
                        "`{}` mix f32 and bf16 tensors",
                        parts.iter().map(|p| p.0).collect::<Vec<_>>().join("`, `")
                    ),
                });
            }
        };
        packed.map_err(|e| NativeError::Config {
            path: self.dir.clone(),
            message: format!("`{}`: {e}", parts[0].0),
        })
    }

    /// Whether the checkpoint has a tensor of this name.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn view(&self, name: &str) -> Result<(safetensors::tensor::TensorView<'_>, &Path), NativeError> {
        let Some(&file) = self.index.get(name) else {
            return Err(NativeError::MissingTensor {
                name: name.to_owned(),
                dir: self.dir.clone(),
            });
        };
        let (path, map) = &self.maps[file];
        let tensors = SafeTensors::deserialize(map).map_err(|e| safetensors_error(path, e))?;
        let view = tensors.tensor(name).map_err(|e| safetensors_error(path, e))?;
        Ok((view, path))
    }

    /// A float tensor's values in `precision`, and its shape.
    fn floats(&self, name: &str, precision: Precision) -> Result<(Floats, Vec<usize>), NativeError> {
        let (view, path) = self.view(name)?;
        let data = view.data();
        let values = match (view.dtype(), precision) {
            (StDtype::BF16, _) => Floats::Bf16(decode(data, u16::from_le_bytes)),
            (StDtype::F32, Precision::Stored) => Floats::F32(decode(data, f32::from_le_bytes)),
            (StDtype::F32, Precision::Bf16) => Floats::Bf16(decode(data, |b: [u8; 4]| {
                half::bf16::from_f32(f32::from_le_bytes(b)).to_bits()
            })),
            (StDtype::F16, Precision::Stored) => {
                Floats::F32(decode(data, |b: [u8; 2]| half::f16::from_le_bytes(b).to_f32()))
            }
            (StDtype::F16, Precision::Bf16) => Floats::Bf16(decode(data, |b: [u8; 2]| {
                half::bf16::from_f32(half::f16::from_le_bytes(b).to_f32()).to_bits()
            })),
            (other, _) => {
                return Err(NativeError::Config {
                    path: path.to_owned(),
                    message: format!("tensor `{name}` is {other:?}, not a floating-point type"),
                });
            }
        };
        Ok((values, view.shape().to_vec()))
    }

    /// A tensor as f32 values (norm weights, biases, scales).
    pub fn vector(&self, name: &str) -> Result<Vec<f32>, NativeError> {
        Ok(match self.floats(name, Precision::Stored)?.0 {
            Floats::F32(v) => v,
            Floats::Bf16(v) => v
                .into_iter()
                .map(|b| f32::from_bits(u32::from(b) << 16))
                .collect(),
        })
    }

    /// A plain float matrix (`name`, shape `[n, k]`), packed for the product.
    pub fn matrix(&self, name: &str, shape: [usize; 2], precision: Precision) -> Result<Packed, NativeError> {
        let (values, dims) = self.floats(name, precision)?;
        if dims != shape {
            return Err(NativeError::Config {
                path: self.dir.clone(),
                message: format!("`{name}` has shape {dims:?}, expected {shape:?}"),
            });
        }
        let [n, k] = shape;
        let packed = match values {
            Floats::F32(v) => Packed::from_f32(&v, n, k),
            Floats::Bf16(v) => Packed::from_bf16(&v, n, k),
        };
        packed.map_err(|e| NativeError::Config {
            path: self.dir.clone(),
            message: format!("`{name}`: {e}"),
        })
    }

    /// A plain float matrix (`name`, shape `[n, k]`) quantized to llama.cpp's Q8_0
    /// ([`sous_kernels::formats::q8`]) as it is packed, row by row from the mapped file.
    pub fn matrix_q8_0(&self, name: &str, shape: [usize; 2]) -> Result<Packed, NativeError> {
        let (view, path) = self.view(name)?;
        if view.shape() != shape {
            return Err(NativeError::Config {
                path: path.to_owned(),
                message: format!("`{name}` has shape {:?}, expected {shape:?}", view.shape()),
            });
        }
        let widen: fn(&[u8]) -> f32 = match view.dtype() {
            StDtype::BF16 => |b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
            StDtype::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            StDtype::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            other => {
                return Err(NativeError::Config {
                    path: path.to_owned(),
                    message: format!("tensor `{name}` is {other:?}, not a floating-point type"),
                });
            }
        };
        let [n, k] = shape;
        let data = view.data();
        let size = view.dtype().bitsize() / 8;
        Packed::q8_0_rows(n, k, |r, out| {
            let bytes = &data[r * k * size..(r + 1) * k * size];
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(size)) {
                *o = widen(b);
            }
        })
        .map_err(|e| NativeError::Config {
            path: path.to_owned(),
            message: format!("`{name}` cannot be held as Q8_0: {e}"),
        })
    }

    /// The weight of linear layer `prefix` (`prefix.weight`, or its NVFP4 form), `[out,
    /// in]` as `shape` says, packed for the product: NVFP4 stays NVFP4.
    pub fn linear(
        &self,
        prefix: &str,
        shape: [usize; 2],
        precision: Precision,
    ) -> Result<Packed, NativeError> {
        if let Some(overlay) = self.overlay.as_ref().filter(|o| o.modules.contains(prefix)) {
            return overlay.from.linear(prefix, shape, precision);
        }
        let format = self.quantization.format();
        let flavor = match format {
            Some(QuantFormat::Modelopt) => Flavor::ModelOptGpu,
            _ => Flavor::CompressedTensors,
        };
        // A layer the quantizer kept has its plain `weight` even in an NVFP4 checkpoint.
        let quantized = format.map(Nvfp4Names::of).filter(|n| {
            self.has(&names::tensor(prefix, n.global))
                && self
                    .view(&names::tensor(prefix, n.packed))
                    .is_ok_and(|(v, _)| v.dtype() == StDtype::U8)
        });
        let Some(n) = quantized else {
            return self.matrix(&names::tensor(prefix, names::WEIGHT), shape, precision);
        };
        let (codes, path) = self.view(&names::tensor(prefix, n.packed))?;
        let (scales, _) = self.view(&names::tensor(prefix, n.scales))?;
        let global = self.vector(&names::tensor(prefix, n.global))?;
        let [out, inp] = shape;
        if codes.shape() != [out, inp / 2] || scales.shape() != [out, inp / 16] || global.len() != 1 {
            return Err(NativeError::Config {
                path: path.to_owned(),
                message: format!(
                    "NVFP4 weight `{prefix}` has shapes {:?}/{:?}/{:?}, expected [{out}, {}]/[{out}, {}]/[1]",
                    codes.shape(),
                    scales.shape(),
                    global.len(),
                    inp / 2,
                    inp / 16
                ),
            });
        }
        let scale = TensorScale::from_value(flavor, self.source, global[0]);
        Packed::from_nvfp4_scale(codes.data(), scales.data(), &scale, out, inp).map_err(|e| {
            NativeError::Config {
                path: path.to_owned(),
                message: format!("NVFP4 weight `{prefix}`: {e}"),
            }
        })
    }
}

impl Checkpoint {
    /// Drops the pages of the mapped files from this process's memory (they stay in the
    /// page cache, and are mapped again from it when next read). Weights already loaded
    /// are copies and stay; a calibration that loads one layer at a time calls this
    /// after each, so that it holds one layer, not every layer it has read.
    #[allow(unsafe_code)]
    pub fn release_pages(&self) {
        for (_, map) in &self.maps {
            // SAFETY: the mappings are read-only and of files never modified in place
            // (see `map_file`): after MADV_DONTNEED a read faults the same bytes in from
            // the file, so a slice borrowed from the mapping reads what it read before.
            // A failure only leaves the pages where they were.
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }
}

/// Maps a whole file read-only.
#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: a mapping is undefined behaviour only if the file changes underneath it.
    // Model directories are written once (atomically, by `sous pull`/`quantize`) and
    // never modified in place; a file replaced by rename keeps this mapping's inode.
    unsafe { Mmap::map(file) }
}

fn safetensors_error(path: &Path, e: safetensors::SafeTensorError) -> NativeError {
    NativeError::Config {
        path: path.to_owned(),
        message: format!("not a readable safetensors file: {e}"),
    }
}

/// Each little-endian `N`-byte word of `data`, as `word` decodes it. An indexed loop, not
/// `chunks_exact(N).map(..)`: rustc shares generic code between crates at opt-level 0 and 1,
/// so the iterator ran as an opt-level-0 dependency compiled it, several times slower
/// (the aarch64 job's profile; benchmarks/build.md, issue 62).
fn decode<T: Copy + Default, const N: usize>(data: &[u8], word: impl Fn([u8; N]) -> T) -> Vec<T> {
    let count = data.len() / N;
    let mut out = vec![T::default(); count];
    let slots: &mut [T] = &mut out;
    let mut i = 0;
    while i < count {
        let mut bytes = [0u8; N];
        let mut j = 0;
        while j < N {
            bytes[j] = data[i * N + j];
            j += 1;
        }
        slots[i] = word(bytes);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use safetensors::tensor::TensorView;

    use super::*;
    use crate::checkpoint::index::{INDEX, Index, shard_name};

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn words_are_decoded_little_endian_and_a_partial_one_is_dropped() {
        assert_eq!(
            decode(&[0x80, 0x3f, 0x00, 0xc0], u16::from_le_bytes),
            vec![0x3f80, 0xc000]
        );
        let bytes = [1.5f32.to_le_bytes(), (-0.25f32).to_le_bytes()].concat();
        assert_eq!(decode(&bytes, f32::from_le_bytes), vec![1.5, -0.25]);
        assert_eq!(decode(&[1, 2, 3], u16::from_le_bytes), vec![0x0201]);
    }

    const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":32,"intermediate_size":64,
        "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":8,
        "quantization_config":{"quant_method":"compressed-tensors","format":"nvfp4-pack-quantized",
        "config_groups":{"group_0":{"input_activations":null}}}}"#;

    /// A sharded compressed-tensors checkpoint: one NVFP4 layer (all-zero codes) in the
    /// first shard, one kept layer in the second, and the index naming both.
    fn sharded(dir: &Path) -> Result {
        let (out, inp) = (4usize, 32usize);
        let names = Nvfp4Names::of(QuantFormat::CompressedTensors);
        let codes = vec![0u8; out * inp / 2];
        let scales = vec![0x20u8; out * inp / 16];
        let global = 1.0f32.to_le_bytes();
        let kept: Vec<u8> = (0..out * inp).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let q = "model.layers.0.mlp.down_proj";
        let first = [
            (
                names::tensor(q, names.packed),
                StDtype::U8,
                vec![out, inp / 2],
                &codes[..],
            ),
            (
                names::tensor(q, names.scales),
                StDtype::F8_E4M3,
                vec![out, inp / 16],
                &scales[..],
            ),
            (names::tensor(q, names.global), StDtype::F32, vec![1], &global[..]),
        ];
        let second = [(
            "lm_head.weight".to_owned(),
            StDtype::F32,
            vec![out, inp],
            &kept[..],
        )];
        let mut weight_map = BTreeMap::new();
        for (shard, tensors) in [&first[..], &second[..]].into_iter().enumerate() {
            let file = shard_name(shard, 2);
            let mut views = Vec::new();
            for (name, dtype, shape, data) in tensors {
                views.push((name.clone(), TensorView::new(*dtype, shape.clone(), data)?));
                weight_map.insert(name.clone(), file.clone());
            }
            safetensors::serialize_to_file(views, None, &dir.join(file))?;
        }
        let index = Index::new(weight_map, 0).to_json().to_string();
        std::fs::write(dir.join(INDEX), index)?;
        Ok(())
    }

    #[test]
    fn a_sharded_nvfp4_checkpoint_loads_through_its_index() -> Result {
        let dir = tempfile::tempdir()?;
        sharded(dir.path())?;
        let config = ModelConfig::parse(CONFIG, &dir.path().join("config.json"))?;
        let checkpoint = Checkpoint::open(dir.path(), &config)?;
        assert_eq!(checkpoint.quantization(), Quantization::Nvfp4CompressedTensors);
        let zeros = checkpoint.linear("model.layers.0.mlp.down_proj", [4, 32], Precision::Stored)?;
        assert_eq!(zeros.format(), "nvfp4");
        let mut row = vec![1.0f32; 32];
        zeros.row(3, &mut row);
        assert!(row.iter().all(|v| *v == 0.0));
        let kept = checkpoint.linear("lm_head", [4, 32], Precision::Stored)?;
        kept.row(0, &mut row);
        assert_eq!(row[5], 5.0);
        assert_eq!(
            checkpoint.linear("lm_head", [4, 32], Precision::Bf16)?.format(),
            "bf16"
        );
        Ok(())
    }
}
