//! The units a scan measures: the quantizable modules of a model grouped by kind (q/k/v,
//! o_proj, gate/up, down, experts, shared expert, linear attention), per layer or over
//! all layers, each with the `quantize.ignore` entries that keep it and the bytes it
//! takes in 16 bits and in NVFP4.
//!
//! A group never splits what vLLM fuses into one layer (q/k/v, gate/up, an expert's
//! projections, `in_proj_qkv`/`in_proj_z`): those must be kept or quantized together. So
//! the output gate that a gated-attention `q_proj` carries is measured with its q/k/v,
//! and can only be kept with them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sous_engine::checkpoint::names;

use super::super::source::SourceTensor;

/// How modules are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Grouping {
    /// One group per layer and kind.
    Layer,
    /// One group per kind, over every layer.
    Kind,
}

/// The kinds, the module path under a layer that makes each, and the `re:` pattern
/// (after the layer's prefix) that keeps it.
const KINDS: &[(&str, &[&str], &str)] = &[
    (
        "q/k/v",
        &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        r"self_attn\.(q|k|v)_proj",
    ),
    ("o_proj", &["self_attn.o_proj"], r"self_attn\.o_proj"),
    (
        "gate/up",
        &["mlp.gate_proj", "mlp.up_proj"],
        r"mlp\.(gate|up)_proj",
    ),
    ("down", &["mlp.down_proj"], r"mlp\.down_proj"),
    (
        "experts",
        &["mlp.experts.", "block_sparse_moe.experts."],
        r"(mlp|block_sparse_moe)\.experts\.",
    ),
    ("shared expert", &["mlp.shared_expert."], r"mlp\.shared_expert\."),
    ("linear attention", &["linear_attn."], r"linear_attn\."),
];

/// One group of modules.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Group {
    /// `layer 3 q/k/v`, or the kind alone.
    pub name: String,
    /// The layer, when grouped by layer.
    pub layer: Option<usize>,
    /// The kind.
    pub kind: String,
    /// Its modules.
    pub modules: Vec<String>,
    /// The `quantize.ignore` entries that keep exactly these modules.
    pub ignore: Vec<String>,
    /// Whether the reference tools' default rules quantize it (linear attention: no).
    pub default_quantized: bool,
    /// Its weights' bytes as the source holds them.
    pub bytes_source: u64,
    /// Its weights' bytes in NVFP4 (codes, block scales, global scale).
    pub bytes_nvfp4: u64,
}

/// The bytes of an `[n, k]` weight in NVFP4: 4-bit codes, one E4M3 scale per 16
/// values, one f32 global scale.
pub fn nvfp4_bytes(shape: &[usize]) -> u64 {
    let n: usize = shape[..shape.len() - 1].iter().product();
    let k = shape[shape.len() - 1];
    (n * k / 2 + n * k / 16 + 4) as u64
}

/// The layer index and the path under it of a decoder module (`model.layers.3.mlp.
/// down_proj` → 3, `mlp.down_proj`).
fn in_layer(module: &str) -> Option<(usize, &str, &str)> {
    let at = module.find(".layers.").map(|i| i + ".layers.".len())?;
    let rest = &module[at..];
    let (index, path) = rest.split_once('.')?;
    Some((index.parse().ok()?, &module[..at + index.len()], path))
}

fn kind_of(path: &str) -> Option<usize> {
    KINDS.iter().position(|(_, members, _)| {
        members
            .iter()
            .any(|m| path == *m || (m.ends_with('.') && path.starts_with(m)))
    })
}

/// The groups of the `quantized` tensors (those an everything-quantized selection
/// quantizes), given which of them the default rules quantize.
pub fn groups(
    tensors: &[SourceTensor],
    quantized: &[bool],
    default: &[bool],
    grouping: Grouping,
) -> Vec<Group> {
    // (layer or none, kind index) -> group; modules outside the known kinds get a
    // group of their own path.
    let mut by_key: BTreeMap<(Option<usize>, usize, String), Group> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        if !quantized[i] {
            continue;
        }
        let module = names::module_of(&t.name).to_owned();
        let (layer, prefix, path) =
            in_layer(&module).map_or((None, "", module.as_str()), |(l, p, rest)| (Some(l), p, rest));
        let (kind_index, kind, pattern) = match kind_of(path) {
            Some(k) => (k, KINDS[k].0.to_owned(), KINDS[k].2.to_owned()),
            None => (KINDS.len(), path.to_owned(), regex::escape(path)),
        };
        let layer = match grouping {
            Grouping::Layer => layer,
            Grouping::Kind => None,
        };
        let key = (layer, kind_index, kind.clone());
        let group = by_key.entry(key).or_insert_with(|| Group {
            name: match layer {
                Some(l) => format!("layer {l} {kind}"),
                None => kind.clone(),
            },
            layer,
            kind: kind.clone(),
            modules: Vec::new(),
            ignore: vec![match (grouping, layer) {
                (Grouping::Layer, Some(_)) => format!("re:{}\\.{pattern}", regex::escape(prefix)),
                _ if prefix.is_empty() => format!("re:{pattern}$"),
                _ => format!(r"re:.*\.layers\.\d+\.{pattern}"),
            }],
            default_quantized: true,
            bytes_source: 0,
            bytes_nvfp4: 0,
        });
        group.modules.push(module);
        group.default_quantized &= default[i];
        group.bytes_source += t.len;
        group.bytes_nvfp4 += nvfp4_bytes(&t.shape);
    }
    let mut out: Vec<Group> = by_key.into_values().collect();
    for g in &mut out {
        // A few modules read better as their names, as llm-compressor's lists are; a
        // layer's experts stay one pattern, however few.
        let distinct: BTreeSet<&String> = g.modules.iter().collect();
        if g.layer.is_some() && distinct.len() <= 3 && g.kind != "experts" {
            g.ignore = distinct.into_iter().cloned().collect();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str) -> SourceTensor {
        SourceTensor {
            name: name.into(),
            shard: 0,
            dtype: safetensors::Dtype::BF16,
            shape: vec![64, 64],
            offset: 0,
            len: 64 * 64 * 2,
        }
    }

    #[test]
    fn modules_group_by_layer_and_kind_with_patterns_that_keep_them() {
        let names = [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "model.layers.0.mlp.experts.1.down_proj.weight",
            "model.layers.1.linear_attn.in_proj_qkvz.weight",
            "model.layers.1.mlp.down_proj.weight",
        ];
        let tensors: Vec<SourceTensor> = names.iter().map(|n| tensor(n)).collect();
        let quantized = vec![true; names.len()];
        let mut default = quantized.clone();
        default[5] = false;
        let g = groups(&tensors, &quantized, &default, Grouping::Layer);
        let summary: Vec<(&str, usize, bool)> = g
            .iter()
            .map(|g| (g.name.as_str(), g.modules.len(), g.default_quantized))
            .collect();
        assert_eq!(
            summary,
            [
                ("layer 0 q/k/v", 3, true),
                ("layer 0 experts", 2, true),
                ("layer 1 down", 1, true),
                ("layer 1 linear attention", 1, false),
            ]
        );
        assert_eq!(
            g[1].ignore,
            [r"re:model\.layers\.0\.(mlp|block_sparse_moe)\.experts\."]
        );
        assert_eq!(g[2].ignore, ["model.layers.1.mlp.down_proj"]);
        assert_eq!(g[0].bytes_source, 3 * 8192);
        assert_eq!(g[0].bytes_nvfp4, 3 * (2048 + 256 + 4));
        let k = groups(&tensors, &quantized, &default, Grouping::Kind);
        assert_eq!(k[0].name, "q/k/v");
        assert_eq!(k[0].ignore, [r"re:.*\.layers\.\d+\.self_attn\.(q|k|v)_proj"]);
    }
}
