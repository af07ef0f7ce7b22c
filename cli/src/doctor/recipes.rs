//! Which recipes can run on this machine, and why not: what each needs (an NVIDIA GPU
//! or several, its engine installed or a container runtime with GPU support, its
//! model directory) against what [`super::examine`] found. Only what is known without
//! the network: the model's size and whether it fits are `sous plan`'s.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use sous_engine::checkpoint::names;
use sous_engine::recipe::{DEFAULT_REVISION, EngineKind, QuantDevice, QuantScheme, Recipe, Runtime};
use sous_engine::version::Version;

use super::Machine;
use super::engines::Installed;
use super::exec::SearchPath;
use crate::hub::cache::RepoCache;
use crate::hub::config::HubConfig;

/// One recipe's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecipeCheck {
    /// The file.
    pub path: String,
    /// The recipe's name, when it loads.
    pub name: Option<String>,
    /// Its engine.
    pub engine: Option<&'static str>,
    /// Where the engine runs: `host`, `docker` or `podman`.
    pub runtime: Option<&'static str>,
    /// Nothing below stops `sous serve` here.
    pub can_run: bool,
    /// What stops it, most fundamental first.
    pub reasons: Vec<String>,
    /// What will not stop it but matters (no native FP4, another engine release).
    pub warnings: Vec<String>,
    /// What to do about the first reason.
    #[serde(skip)]
    pub hint: Option<String>,
    /// Named by `--recipe`, so it must run.
    #[serde(skip)]
    pub explicit: bool,
}

/// Why recipes could not be listed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {source}", path.display())]
pub struct FindError {
    /// The directory.
    pub path: PathBuf,
    /// The cause.
    pub source: std::io::Error,
}

/// The recipe files under `dir` (recursively), in path order. TOML files that are not
/// recipes are left out: `recipes/hardware.toml` (the machines `sous plan` knows) has
/// none of a recipe's top-level keys.
pub fn find(dir: &Path) -> Result<Vec<PathBuf>, FindError> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| FindError {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| FindError {
                    path: dir.clone(),
                    source,
                })?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "toml")
                && std::fs::read_to_string(&path).is_ok_and(|text| is_recipe(&text))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Whether a TOML text is meant as a recipe: it has `name`, `extends`, `[model]` or
/// `[engine]` at the top, or does not parse (a broken recipe is still reported).
pub fn is_recipe(text: &str) -> bool {
    match text.parse::<toml::Table>() {
        Ok(table) => ["name", "extends", "model", "engine"]
            .iter()
            .any(|key| table.contains_key(*key)),
        Err(_) => true,
    }
}

/// What a check needs besides the recipe.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// What the machine has.
    pub machine: &'a Machine,
    /// The `PATH` searched (for `engine.executable`).
    pub search: &'a SearchPath,
    /// The Hub settings (its cache holds downloaded models).
    pub hub: &'a HubConfig,
}

/// A recipe that did not load.
pub fn unloadable(path: &Path, error: String, explicit: bool) -> RecipeCheck {
    RecipeCheck {
        path: path.display().to_string(),
        name: None,
        engine: None,
        runtime: None,
        can_run: false,
        reasons: vec![format!("the recipe does not load: {error}")],
        warnings: Vec::new(),
        hint: Some(format!("`sous recipe check {}` says more", path.display())),
        explicit,
    }
}

/// Whether `recipe` (from `path`) can run here.
pub fn check(path: &Path, recipe: &Recipe, cx: &Context<'_>, explicit: bool) -> RecipeCheck {
    let mut reasons: Vec<(String, Option<String>)> = Vec::new();
    let mut warnings = Vec::new();
    let machine = cx.machine;
    let gpus = &machine.gpus;
    let kind = recipe.engine.kind;
    let runtime = recipe.engine.runtime;
    let no_gpu = || {
        machine
            .driver
            .problem
            .clone()
            .unwrap_or_else(|| "no NVIDIA GPU found".into())
    };
    let on_disk = model_on_disk(recipe, cx.hub);

    if kind != EngineKind::Native {
        let serving = &recipe.serving;
        let needed: u32 = [
            serving.tensor_parallel,
            serving.pipeline_parallel,
            serving.data_parallel,
        ]
        .iter()
        .map(|n| n.unwrap_or(1).max(1))
        .product();
        if gpus.is_empty() {
            reasons.push((
                format!("{} needs an NVIDIA GPU: {}", kind.display_name(), no_gpu()),
                Some("run it on a machine with an NVIDIA GPU and driver, or serve a native-engine recipe (recipes/local/) on this CPU".into()),
            ));
        } else if needed as usize > gpus.len() {
            reasons.push((
                format!(
                    "it needs {needed} GPUs (tensor_parallel × pipeline_parallel × data_parallel), this machine has {}",
                    gpus.len()
                ),
                Some("lower `serving.tensor_parallel` (or the other parallel sizes) with --set, or run it on a larger machine".into()),
            ));
        }
        match runtime {
            Runtime::Host => {
                if let Some(reason) = engine_missing(recipe, cx) {
                    reasons.push(reason);
                }
                if let Some(warning) = release_differs(recipe, cx) {
                    warnings.push(warning);
                }
            }
            Runtime::Docker | Runtime::Podman => {
                let containers = &machine.containers;
                let found = if runtime == Runtime::Docker {
                    &containers.docker
                } else {
                    &containers.podman
                };
                if !found.available || !found.gpu {
                    reasons.push((
                        format!(
                            "{}: {}",
                            runtime.as_str(),
                            found.problem.as_deref().unwrap_or("not usable")
                        ),
                        Some(format!(
                            "install {} with the NVIDIA Container Toolkit, or set `engine.runtime = \"host\"` with the engine installed",
                            runtime.as_str()
                        )),
                    ));
                }
            }
        }
        let w4a4 = match &recipe.quantize {
            Some(q) => q.scheme == QuantScheme::Nvfp4,
            None => on_disk.as_deref().is_some_and(checkpoint_is_w4a4),
        };
        if w4a4 {
            let used = gpus.iter().take(needed as usize);
            if let Some(gpu) = used.clone().find(|g| !g.native_fp4) {
                warnings.push(no_native_fp4(
                    kind,
                    &gpu.name,
                    &gpu.compute_capability.to_string(),
                ));
            }
        }
    }

    if let Some(q) = &recipe.quantize
        && let QuantDevice::Cuda(n) = q.device
        && n as usize >= gpus.len()
    {
        let have = if gpus.is_empty() {
            no_gpu()
        } else {
            format!("this machine has {} GPUs", gpus.len())
        };
        reasons.push((
            format!("`quantize.device` is cuda:{n}: {have}"),
            Some("set `quantize.device = \"cpu\"` (the same bytes, slower)".into()),
        ));
    }

    match (&recipe.model.repo, &recipe.model.path) {
        (None, Some(dir)) if runtime == Runtime::Host && !Path::new(dir).exists() => {
            reasons.push((
                format!("`model.path` {dir} does not exist and the recipe names no `model.repo` to download it from"),
                Some("put the model there, or set `model.repo`".into()),
            ));
        }
        (Some(repo), _) if on_disk.is_none() => {
            let hub = &machine.hub;
            if hub.offline {
                warnings.push(format!(
                    "{repo} is not on disk and HF_HUB_OFFLINE is set: `sous serve` cannot download it"
                ));
            } else if hub.reachable == Some(false) {
                warnings.push(format!(
                    "{repo} is not on disk and the Hub ({}) does not answer: `sous serve` cannot download it now",
                    hub.endpoint
                ));
            }
        }
        _ => {}
    }

    let hint = reasons.first().and_then(|(_, hint)| hint.clone());
    RecipeCheck {
        path: path.display().to_string(),
        name: Some(recipe.name.clone()),
        engine: Some(kind.as_str()),
        runtime: Some(runtime.as_str()),
        can_run: reasons.is_empty(),
        reasons: reasons.into_iter().map(|(reason, _)| reason).collect(),
        warnings,
        hint,
        explicit,
    }
}

/// The engine a host-runtime recipe starts, if it is not there.
fn engine_missing(recipe: &Recipe, cx: &Context<'_>) -> Option<(String, Option<String>)> {
    let kind = recipe.engine.kind;
    let engines = &cx.machine.engines;
    let (installed, default, install): (&Installed, &str, &str) = match kind {
        EngineKind::Vllm => (&engines.vllm, "vllm", "pip install vllm"),
        EngineKind::Sglang => (&engines.sglang, "python3", "pip install sglang"),
        EngineKind::Trtllm => (&engines.trtllm, "trtllm-serve", "pip install tensorrt_llm"),
        EngineKind::Native => return None,
    };
    let container = recipe
        .engine
        .image
        .as_ref()
        .map(|image| format!(", or run {image} with `engine.runtime = \"docker\"`"))
        .unwrap_or_default();
    match recipe.engine.executable.as_deref() {
        Some(program) if program != default => cx.search.which(program).is_none().then(|| {
            (
                format!("`engine.executable` {program} not found"),
                Some("install the engine there or fix `engine.executable`".into()),
            )
        }),
        _ => (!installed.available).then(|| {
            (
                format!(
                    "{} is not installed: {}",
                    kind.display_name(),
                    installed.problem.as_deref().unwrap_or("not found")
                ),
                Some(format!("install it (`{install}`){container}")),
            )
        }),
    }
}

/// A recipe written for another release of the engine than the one installed.
fn release_differs(recipe: &Recipe, cx: &Context<'_>) -> Option<String> {
    let wanted = recipe.engine.version.as_ref()?;
    if recipe.engine.executable.is_some() {
        return None;
    }
    let engines = &cx.machine.engines;
    let installed = match recipe.engine.kind {
        EngineKind::Vllm => &engines.vllm,
        EngineKind::Sglang => &engines.sglang,
        EngineKind::Trtllm => &engines.trtllm,
        EngineKind::Native => return None,
    };
    let have = installed.version.as_deref()?;
    let parsed: Version = have.parse().ok()?;
    (parsed.cmp(wanted) != Ordering::Equal).then(|| {
        format!(
            "written for {} {wanted} (its flags are rendered for that release); this machine has {have}",
            recipe.engine.kind.display_name()
        )
    })
}

/// The warning for an NVFP4 W4A4 model on a GPU without FP4 tensor cores.
///
/// vLLM picks its NVFP4 GEMM in `select_nvfp4_linear_backend`
/// (`vllm/model_executor/layers/quantization/utils/nvfp4_utils.py`): CUTLASS or
/// FlashInfer FP4 kernels where `cutlass_scaled_mm_supports_fp4` (capability 100 and
/// later), else Marlin, which logs "Weight-only FP4 compression will be used leveraging
/// the Marlin kernel" and multiplies 16-bit activations (`get_marlin_input_dtype` in
/// `marlin_utils.py` is `None` unless `VLLM_MARLIN_INPUT_DTYPE` is set): W4A16.
fn no_native_fp4(kind: EngineKind, gpu: &str, cc: &str) -> String {
    let head = format!("{gpu} (compute capability {cc}) has no native FP4");
    match kind {
        EngineKind::Vllm => format!(
            "{head}: vLLM runs this NVFP4 W4A4 model as W4A16 emulation (Marlin kernels), not on FP4 tensor cores"
        ),
        _ => format!("{head}: FP4 tensor cores need compute capability 10.0 (Blackwell) or later"),
    }
}

/// The model's directory when it is on this machine: `model.path`, else the Hub
/// cache's snapshot of `model.repo` at its revision.
fn model_on_disk(recipe: &Recipe, hub: &HubConfig) -> Option<PathBuf> {
    if let Some(dir) = &recipe.model.path
        && Path::new(dir).join("config.json").is_file()
    {
        return Some(PathBuf::from(dir));
    }
    let repo = recipe.model.repo.as_ref()?;
    let revision = recipe.model.revision.as_deref().unwrap_or(DEFAULT_REVISION);
    let cache = RepoCache::new(&hub.cache_dir, repo);
    let snapshot = cache.snapshot(&cache.read_ref(revision)?);
    snapshot.join("config.json").is_file().then_some(snapshot)
}

/// Whether the checkpoint in `dir` quantizes activations to FP4 (W4A4):
/// compressed-tensors `nvfp4-pack-quantized` with 4-bit float `input_activations`, or
/// ModelOpt `quant_algo` `NVFP4` (in `config.json` or `hf_quant_config.json`).
pub fn checkpoint_is_w4a4(dir: &Path) -> bool {
    let read = |name: &str| -> Option<Value> {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok()
    };
    let from_config =
        read("config.json").is_some_and(|config| quantization_is_w4a4(&config["quantization_config"]));
    from_config
        || read("hf_quant_config.json").is_some_and(|q| q["quantization"]["quant_algo"] == names::NVFP4)
}

/// [`checkpoint_is_w4a4`] of a `quantization_config` object.
pub fn quantization_is_w4a4(q: &Value) -> bool {
    match q["quant_method"].as_str() {
        Some(names::COMPRESSED_TENSORS) => {
            q["format"] == names::NVFP4_PACK_QUANTIZED
                && q["config_groups"].as_object().is_some_and(|groups| {
                    groups.values().any(|g| {
                        let a = &g["input_activations"];
                        a["num_bits"] == 4 && a["type"] == "float"
                    })
                })
        }
        Some(names::MODELOPT) => q["quant_algo"] == names::NVFP4,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hardware_toml_is_not_a_recipe() {
        assert!(!is_recipe("[[device]]\nname = \"gb10\"\nmemory = \"128GB\"\n"));
        assert!(is_recipe("extends = \"base.toml\"\n"));
        assert!(is_recipe("[engine]\nkind = \"native\"\n"));
        assert!(is_recipe("this is = not [toml"));
    }

    #[test]
    fn finds_the_shipped_recipes_and_nothing_else() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../recipes");
        let found = find(&dir).expect("lists");
        let names: Vec<String> = found
            .iter()
            .filter_map(|p| p.strip_prefix(&dir).ok())
            .map(|p| p.display().to_string())
            .collect();
        assert!(names.contains(&"local/smollm2-135m.toml".to_owned()), "{names:?}");
        assert!(
            names.contains(&"dgx-spark/qwen3.8-27b-nvfp4.toml".to_owned()),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n.contains("hardware")), "{names:?}");
        assert!(names.windows(2).all(|w| w[0] <= w[1]), "sorted: {names:?}");
        assert!(find(&dir.join("no-such-dir")).is_err());
    }

    #[test]
    fn tells_w4a4_checkpoints_from_weight_only_ones() {
        // compressed-tensors, as llm-compressor's NVFP4 scheme writes it.
        let w4a4 = json!({
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
                "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"}
            }}
        });
        assert!(quantization_is_w4a4(&w4a4));
        let mut w4a16 = w4a4.clone();
        w4a16["config_groups"]["group_0"]["input_activations"] = Value::Null;
        assert!(!quantization_is_w4a4(&w4a16));
        assert!(quantization_is_w4a4(
            &json!({"quant_method": "modelopt", "quant_algo": "NVFP4"})
        ));
        assert!(!quantization_is_w4a4(
            &json!({"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4"})
        ));
        assert!(!quantization_is_w4a4(&Value::Null));

        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.json"), r#"{"model_type":"llama"}"#).expect("write");
        assert!(!checkpoint_is_w4a4(dir.path()));
        std::fs::write(
            dir.path().join("hf_quant_config.json"),
            r#"{"producer":{"name":"modelopt"},"quantization":{"quant_algo":"NVFP4","group_size":16}}"#,
        )
        .expect("write");
        assert!(checkpoint_is_w4a4(dir.path()));
    }

    #[test]
    fn the_fp4_warning_names_what_vllm_does() {
        let vllm = no_native_fp4(EngineKind::Vllm, "NVIDIA H200", "9.0");
        assert!(
            vllm.contains("W4A16") && vllm.contains("not on FP4 tensor cores"),
            "{vllm}"
        );
        let sglang = no_native_fp4(EngineKind::Sglang, "NVIDIA H200", "9.0");
        assert!(
            sglang.contains("no native FP4") && !sglang.contains("W4A16"),
            "{sglang}"
        );
    }
}
