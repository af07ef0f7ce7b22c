//! The engines' compile caches, kept between starts: torch.compile's graphs, the
//! kernels Triton, Inductor and FlashInfer compile at start-up, the CUDA driver's PTX
//! cache. A cold start of vLLM spends minutes filling them; a warm one reads them back.
//!
//! They are kept in one directory per engine release and GPU
//! (`<sous cache>/engines/vllm-0.32.0/nvidia-h100-80gb-hbm3/`), so a new release or
//! another GPU starts from an empty directory instead of from what an older one left:
//! not every cache below checks what wrote it (a TensorRT engine or a Triton kernel
//! built for another GPU fails at load; FlashInfer's JIT directory was keyed by
//! neither before 0.2.6). Each directory holds `key.json`, what it is keyed by.
//!
//! What each engine reads, from the upstream sources:
//! - `VLLM_CACHE_ROOT` (vLLM, `vllm/envs.py`; default `~/.cache/vllm`): its
//!   `torch_compile_cache/`, in which vLLM also places Inductor's cache for the graphs
//!   it compiles, whatever `TORCHINDUCTOR_CACHE_DIR` says, and Triton's unless
//!   `TRITON_CACHE_DIR` is set (`InductorAdaptor.initialize_cache` in
//!   `vllm/compilation/compiler_interface.py`, 0.32).
//! - `SGLANG_JIT_CACHE_ROOT` (SGLang, `docs/references/torch_compile_cache.md`;
//!   default `~/.cache/sglang`): its torch.compile and DeepGEMM caches.
//! - `TORCHINDUCTOR_CACHE_DIR` (PyTorch, `torch/_inductor/runtime/cache_dir_utils.py`;
//!   default `/tmp/torchinductor_<user>`, lost with a container's `/tmp`).
//! - `TRITON_CACHE_DIR` (Triton, `triton/knobs.py`; default `~/.triton/cache`).
//! - `FLASHINFER_WORKSPACE_BASE` (FlashInfer, `flashinfer/jit/env.py`; default `~`,
//!   under which it keeps `.cache/flashinfer/`).
//! - `TORCH_EXTENSIONS_DIR` (PyTorch's C++/CUDA extensions built at run time,
//!   `torch/utils/cpp_extension.py`; default `~/.cache/torch_extensions`).
//! - `CUDA_CACHE_PATH` (the CUDA driver's cache of PTX compiled for this GPU; default
//!   `~/.nv/ComputeCache`).
//!
//! TensorRT engines are not among them: TensorRT-LLM's `trtllm-serve` runs its PyTorch
//! backend (its default since 1.0), which builds none; what it compiles goes through
//! the caches above.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::recipe::EngineKind;

/// The directory under sous's cache that holds the kept caches.
pub const DIR: &str = "engines";

/// The file in each cache directory that says what it is keyed by.
pub const KEY_FILE: &str = "key.json";

/// What a kept cache directory is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheKey {
    /// The engine.
    pub engine: EngineKind,
    /// Its release: the installed one where sous could read it, else the recipe's
    /// `engine.version` or image tag, else the release sous renders for.
    pub release: String,
    /// The GPUs' names (`NVIDIA GB10`), or `cpu` where the engine runs on none.
    pub device: String,
}

impl CacheKey {
    /// The key of `engine` at `release` on the GPUs named `gpus` (none: the CPU).
    pub fn new(engine: EngineKind, release: &str, gpus: &[String]) -> CacheKey {
        let mut names: Vec<&str> = gpus.iter().map(String::as_str).collect();
        names.dedup();
        CacheKey {
            engine,
            release: release.to_owned(),
            device: if names.is_empty() {
                "cpu".to_owned()
            } else {
                names.join(" + ")
            },
        }
    }

    /// Its directory under `root` (the `engines/` directory of sous's cache, or of a
    /// deployment's data volume): `<engine>-<release>/<device>`, each part lower case
    /// with anything but letters, digits, `.` and `_` turned into `-`.
    pub fn dir_in(&self, root: &Path) -> PathBuf {
        root.join(format!("{}-{}", self.engine.as_str(), slug(&self.release)))
            .join(slug(&self.device))
    }
}

/// `NVIDIA RTX PRO 6000 Blackwell` → `nvidia-rtx-pro-6000-blackwell`.
fn slug(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    // No part may be `.` or `..`, or hidden.
    let trimmed = out.trim_matches(|c| c == '-' || c == '.');
    if trimmed.is_empty() {
        "unknown".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The variables that point `engine`'s caches into `dir`, in a stable order. None for
/// the native engine, which compiles nothing at start-up.
pub fn variables(engine: EngineKind, dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let own = match engine {
        EngineKind::Native => return Vec::new(),
        EngineKind::Vllm => Some(("VLLM_CACHE_ROOT", dir.join("vllm"))),
        EngineKind::Sglang => Some(("SGLANG_JIT_CACHE_ROOT", dir.join("sglang"))),
        EngineKind::Trtllm => None,
    };
    own.into_iter()
        .chain([
            ("TORCHINDUCTOR_CACHE_DIR", dir.join("inductor")),
            ("TRITON_CACHE_DIR", dir.join("triton")),
            ("FLASHINFER_WORKSPACE_BASE", dir.join("flashinfer")),
            ("TORCH_EXTENSIONS_DIR", dir.join("torch_extensions")),
            ("CUDA_CACHE_PATH", dir.join("cuda")),
        ])
        .collect()
}

/// What a kept cache directory holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contents {
    /// Regular files below it.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Contents {
    /// Whether an earlier start left anything to reuse.
    pub fn is_warm(&self) -> bool {
        self.files > 0
    }

    /// What is in `dir` (besides [`KEY_FILE`]); a directory that does not exist or
    /// cannot be read holds nothing.
    pub fn of(dir: &Path) -> Contents {
        let mut contents = Contents::default();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(at) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&at) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_dir() {
                    stack.push(entry.path());
                } else if kind.is_file() && !(at == dir && entry.file_name() == KEY_FILE) {
                    contents.files += 1;
                    contents.bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
                }
            }
        }
        contents
    }
}

/// Creates `dir` and writes its [`KEY_FILE`] (atomically), so that a directory found
/// later says what it was kept for.
pub fn prepare(dir: &Path, key: &CacheKey) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_vec_pretty(key).map_err(std::io::Error::other)?;
    crate::atomic::write_file(&dir.join(KEY_FILE), &json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_or_a_gpu_of_its_own_gets_a_directory_of_its_own() {
        let root = Path::new("/c/engines");
        let h100 = vec!["NVIDIA H100 80GB HBM3".to_owned()];
        let key = CacheKey::new(EngineKind::Vllm, "0.32.0", &h100);
        assert_eq!(
            key.dir_in(root),
            Path::new("/c/engines/vllm-0.32.0/nvidia-h100-80gb-hbm3")
        );
        let newer = CacheKey::new(EngineKind::Vllm, "0.33.0", &h100);
        let gb10 = CacheKey::new(EngineKind::Vllm, "0.32.0", &["NVIDIA GB10".to_owned()]);
        let sglang = CacheKey::new(EngineKind::Sglang, "0.32.0", &h100);
        let dirs = [&key, &newer, &gb10, &sglang].map(|k| k.dir_in(root));
        for (i, a) in dirs.iter().enumerate() {
            for b in &dirs[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            CacheKey::new(EngineKind::Trtllm, "1.3.0rc15", &[]).dir_in(root),
            Path::new("/c/engines/trtllm-1.3.0rc15/cpu")
        );
    }

    #[test]
    fn two_gpus_of_one_kind_key_as_one_and_a_mix_as_both() {
        let same = CacheKey::new(
            EngineKind::Vllm,
            "1",
            &["NVIDIA GB10".into(), "NVIDIA GB10".into()],
        );
        assert_eq!(same.device, "NVIDIA GB10");
        let mixed = CacheKey::new(EngineKind::Vllm, "1", &["NVIDIA A".into(), "NVIDIA B".into()]);
        assert_eq!(slug(&mixed.device), "nvidia-a-nvidia-b");
    }

    #[test]
    fn slugs_stay_inside_their_directory() {
        assert_eq!(slug("../.."), "unknown");
        assert_eq!(slug("a/../b"), "a-..-b");
        assert_eq!(slug(""), "unknown");
        assert_eq!(slug("vllm/vllm-openai:v0.32.0"), "vllm-vllm-openai-v0.32.0");
        assert_eq!(slug(".hidden."), "hidden");
        // `..` as a whole part would climb out.
        let dir = CacheKey::new(EngineKind::Vllm, "..", &["..".into()]).dir_in(Path::new("/r"));
        assert_eq!(dir, Path::new("/r/vllm-unknown/unknown"));
    }

    #[test]
    fn each_gpu_engine_points_every_cache_into_the_directory_and_native_none() {
        let dir = Path::new("/k");
        assert!(variables(EngineKind::Native, dir).is_empty());
        for engine in [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Trtllm] {
            let vars = variables(engine, dir);
            let names: Vec<&str> = vars.iter().map(|(n, _)| *n).collect();
            for common in [
                "TORCHINDUCTOR_CACHE_DIR",
                "TRITON_CACHE_DIR",
                "FLASHINFER_WORKSPACE_BASE",
            ] {
                assert!(names.contains(&common), "{engine:?}: {names:?}");
            }
            assert!(
                vars.iter().all(|(_, p)| p.starts_with(dir) && p != dir),
                "{vars:?}"
            );
        }
        assert_eq!(
            variables(EngineKind::Vllm, dir)[0],
            ("VLLM_CACHE_ROOT", dir.join("vllm"))
        );
    }

    #[test]
    fn contents_count_what_a_start_left_and_not_the_key() {
        let tmp = tempfile::tempdir().expect("test setup");
        let dir = tmp.path().join("vllm-1/cpu");
        assert_eq!(Contents::of(&dir), Contents::default());
        let key = CacheKey::new(EngineKind::Vllm, "1", &[]);
        prepare(&dir, &key).expect("test setup");
        assert!(!Contents::of(&dir).is_warm());
        let read: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(KEY_FILE)).expect("test setup"))
                .expect("test setup");
        assert_eq!(read["device"], "cpu");
        std::fs::create_dir_all(dir.join("vllm/torch_compile_cache/abc")).expect("test setup");
        std::fs::write(dir.join("vllm/torch_compile_cache/abc/graph"), [0u8; 100]).expect("test setup");
        std::fs::write(dir.join("triton.bin"), [0u8; 20]).expect("test setup");
        let c = Contents::of(&dir);
        assert_eq!((c.files, c.bytes), (2, 120));
        assert!(c.is_warm());
    }
}
