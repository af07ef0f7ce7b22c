//! The recipe's memory settings: the accelerator fraction, the lower fractions to
//! fall back to after an out-of-memory start, and the KV-cache type and budgets in
//! bytes. How an engine spells them is its adapter's concern (`launch/`).

use crate::recipe::{At, EmbeddingDtype, KvCacheDtype, Location, MemorySection, Provenance, RecipeError};

use super::Invalid;

/// Memory settings, in bytes where sizes are involved.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    /// Fraction of accelerator memory.
    pub gpu_utilization: Option<f64>,
    /// Fallback fractions after an OOM at start-up.
    pub oom_fallback: Vec<f64>,
    /// KV-cache type.
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Fixed KV budget per GPU.
    pub kv_cache_bytes: Option<u64>,
    /// Host RAM for KV offload.
    pub kv_offload_bytes: Option<u64>,
    /// Globs of the tensors the engine keeps in host memory.
    pub host_weights: Vec<String>,
    /// How the native engine holds embeddings.
    pub embedding_dtype: Option<EmbeddingDtype>,
    /// Host memory `sous serve` keeps available, in bytes.
    pub host_floor: Option<u64>,
}

pub(super) fn resolve_memory(
    raw: MemorySection,
    provenance: &Provenance,
    invalid: &Invalid<'_>,
) -> Result<Memory, RecipeError> {
    let fraction_ok = |f: f64| f > 0.0 && f <= 1.0;
    if let Some(u) = raw.gpu_utilization
        && !fraction_ok(u)
    {
        return Err(invalid(
            &["memory", "gpu_utilization"],
            format!("{u} is outside (0, 1]"),
            Some("it is a fraction of the GPU's memory: 0.9 means 90 %"),
        ));
    }
    let mut raw = raw;
    // Stepping down by hand: an override of the utilization (`--set
    // memory.gpu_utilization=0.85`, what a deployment does after an out-of-memory start)
    // keeps only the recipe's fallbacks below it, the steps still to come.
    let overridden = |path: &[&str]| {
        matches!(
            provenance.locate(path, false),
            Some(Location::Set(_) | Location::Env(_))
        )
    };
    if let Some(u) = raw.gpu_utilization
        && overridden(&["memory", "gpu_utilization"])
        && !overridden(&["memory", "oom_fallback"])
    {
        raw.oom_fallback.retain(|&f| f < u);
    }
    let mut previous = raw.gpu_utilization;
    for (i, &f) in raw.oom_fallback.iter().enumerate() {
        if !fraction_ok(f) {
            return Err(invalid(
                &["memory", "oom_fallback"],
                format!("{f} is outside (0, 1]"),
                None,
            ));
        }
        match previous {
            None => {
                return Err(RecipeError::Conflict {
                    message: "`memory.oom_fallback` lowers `memory.gpu_utilization`, which is not set".into(),
                    at: At::from(provenance.locate(&["memory", "oom_fallback"], false)),
                    hint: Some("set `memory.gpu_utilization` to the value to try first".into()),
                });
            }
            Some(p) if f >= p => {
                let what = if i == 0 {
                    "`memory.gpu_utilization`".to_owned()
                } else {
                    "the value before it".to_owned()
                };
                return Err(invalid(
                    &["memory", "oom_fallback"],
                    format!("{f} is not below {what} ({p}): a fallback must ask for less memory"),
                    None,
                ));
            }
            Some(_) => previous = Some(f),
        }
    }
    if raw.kv_cache_bytes.is_some() && !raw.oom_fallback.is_empty() {
        return Err(RecipeError::Conflict {
            message: "`memory.kv_cache_bytes` fixes the KV budget, so the utilization values in `memory.oom_fallback` would change nothing".into(),
            at: At::from(provenance.locate(&["memory", "oom_fallback"], false)),
            hint: Some("drop `memory.oom_fallback`, or drop `memory.kv_cache_bytes` and size the cache with `memory.gpu_utilization`".into()),
        });
    }
    if raw.kv_cache_bytes.is_some_and(|b| b.bytes() == 0) {
        return Err(invalid(
            &["memory", "kv_cache_bytes"],
            "a KV budget of 0 bytes holds no token".into(),
            None,
        ));
    }
    if raw.host_floor.is_some_and(|b| b.bytes() == 0) {
        return Err(invalid(
            &["memory", "host_floor"],
            "a floor of 0 bytes is never crossed".into(),
            Some("give the host memory to keep free (`8GiB`), or remove the key"),
        ));
    }
    for glob in &raw.host_weights {
        if let Err(e) = host_weight_glob(glob) {
            return Err(invalid(
                &["memory", "host_weights"],
                format!("`{glob}` is not a tensor-name glob: {e}"),
                Some("write e.g. `model.embed_tokens_per_layer.*` or `**.per_layer_*`"),
            ));
        }
    }
    Ok(Memory {
        gpu_utilization: raw.gpu_utilization,
        oom_fallback: raw.oom_fallback,
        kv_cache_dtype: raw.kv_cache_dtype,
        kv_cache_bytes: raw.kv_cache_bytes.map(|b| b.bytes()),
        kv_offload_bytes: raw.kv_offload_bytes.map(|b| b.bytes()),
        host_weights: raw.host_weights,
        embedding_dtype: raw.embedding_dtype,
        host_floor: raw.host_floor.map(|b| b.bytes()),
    })
}

/// A `memory.host_weights` glob as a matcher of tensor names, whose parts are joined by
/// `.`: `*` stays within a part, `**` crosses them.
pub fn host_weight_glob(glob: &str) -> Result<globset::GlobMatcher, globset::Error> {
    // globset's separator is `/`: the names' dots become slashes on both sides.
    Ok(globset::GlobBuilder::new(&glob.replace('.', "/"))
        .literal_separator(true)
        .build()?
        .compile_matcher())
}

/// Whether tensor `name` matches one of `globs` (already checked by resolution).
pub fn is_host_weight(globs: &[globset::GlobMatcher], name: &str) -> bool {
    let path = name.replace('.', "/");
    globs.iter().any(|g| g.is_match(&path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_weight_globs_match_tensor_names_part_by_part() {
        let globs = [
            host_weight_glob("model.embed_tokens_per_layer.*").expect("glob"),
            host_weight_glob("**.per_layer_proj.weight").expect("glob"),
        ];
        assert!(is_host_weight(&globs, "model.embed_tokens_per_layer.weight"));
        assert!(is_host_weight(&globs, "model.layers.3.per_layer_proj.weight"));
        assert!(!is_host_weight(&globs, "model.embed_tokens.weight"));
        assert!(!is_host_weight(&globs, "model.embed_tokens_per_layer.a.b"));
        assert!(host_weight_glob("model.[").is_err());
    }
}
