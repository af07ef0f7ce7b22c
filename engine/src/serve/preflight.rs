//! Before a start: the memory a recipe's memory fraction is checked against, as the
//! machine has it now, by the engine's rule ([`crate::device`]). The supervisor starts
//! at the first fraction that fits; `sous plan` shows the same check.

use super::error::ServeError;
use crate::device::{DeviceMemory, FractionOf, Pool, Preflight};
use crate::host::Meminfo;
use crate::recipe::Recipe;

/// The memory `recipe`'s fractions are checked against before its engine starts, with
/// the engine's own fraction when the recipe sets none: the host's for the native
/// engine (when the recipe sets a fraction), the GPU of `devices` with the least free
/// memory for vLLM; `None` for engines whose fraction always fits, and for vLLM where
/// no GPU was reported (its CPU backend, a machine without a driver).
pub fn pool_for(
    recipe: &Recipe,
    devices: &[DeviceMemory],
) -> Result<Option<(Pool, Option<f64>)>, ServeError> {
    Ok(match FractionOf::of(recipe.engine.kind) {
        FractionOf::HostTotal if recipe.memory.gpu_utilization.is_some() => {
            let meminfo = Meminfo::read().map_err(ServeError::Host)?;
            Some((Pool::host(&meminfo), None))
        }
        FractionOf::DeviceTotal => {
            let host = Meminfo::read().ok();
            let default = crate::launch::memory::resolve(recipe)?.map(|m| m.vllm_default_utilization());
            Pool::device(devices, host.as_ref()).map(|pool| (pool, default))
        }
        _ => None,
    })
}

/// `recipe`'s fraction (or its engine's default) against the memory it would start
/// against now ([`pool_for`]); `None` where there is nothing to check.
pub fn preflight(recipe: &Recipe, devices: &[DeviceMemory]) -> Result<Option<Preflight>, ServeError> {
    let Some((pool, default)) = pool_for(recipe, devices)? else {
        return Ok(None);
    };
    Ok(recipe
        .memory
        .gpu_utilization
        .or(default)
        .map(|fraction| Preflight::check(pool, fraction, &recipe.memory.oom_fallback)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn recipe(engine: &str, memory: &str) -> Recipe {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.toml");
        let text =
            format!("name = \"r\"\n[model]\nrepo = \"org/model\"\n[engine]\n{engine}\n[memory]\n{memory}\n");
        std::fs::write(&path, text).expect("write");
        crate::recipe::load(&path, &crate::recipe::Overrides::new())
            .expect("a valid recipe")
            .recipe
    }

    fn spark() -> DeviceMemory {
        DeviceMemory {
            ordinal: 0,
            name: "NVIDIA GB10".into(),
            free_bytes: 85 * GIB,
            total_bytes: 121 * GIB,
            unified: true,
        }
    }

    #[test]
    fn vllm_is_checked_against_the_gpu_with_its_release_default() {
        let new = recipe("kind = \"vllm\"\nversion = \"0.33.0\"", "");
        let check = preflight(&new, &[spark()]).expect("resolves").expect("a check");
        assert_eq!(check.fraction, 0.92, "vLLM 0.20 and later");
        assert!(!check.fits && check.fallback.is_none());
        let old = recipe("kind = \"vllm\"\nversion = \"0.17.0\"", "");
        let check = preflight(&old, &[spark()]).expect("resolves").expect("a check");
        assert_eq!(check.fraction, 0.9);
        let set = recipe(
            "kind = \"vllm\"\nversion = \"0.33.0\"",
            "gpu_utilization = 0.9\noom_fallback = [0.8, 0.6]",
        );
        let check = preflight(&set, &[spark()]).expect("resolves").expect("a check");
        assert_eq!((check.fraction, check.fallback), (0.9, Some(0.6)));
        // No GPU reported: vLLM's CPU backend, or no driver; nothing to check.
        assert_eq!(preflight(&set, &[]).expect("resolves"), None);
    }

    #[test]
    fn engines_whose_fraction_is_of_free_memory_are_not_checked() {
        for engine in ["kind = \"sglang\"", "kind = \"trtllm\""] {
            let r = recipe(engine, "gpu_utilization = 0.95");
            assert_eq!(preflight(&r, &[spark()]).expect("resolves"), None, "{engine}");
        }
    }

    #[test]
    fn the_native_engine_is_checked_against_the_host() {
        let r = recipe("kind = \"native\"", "gpu_utilization = 0.5");
        let check = preflight(&r, &[]).expect("resolves").expect("a check");
        assert!(!check.pool.device && check.pool.whose == "this host's");
        // Without a fraction the native engine sizes its cache itself.
        let r = recipe("kind = \"native\"", "");
        assert_eq!(preflight(&r, &[]).expect("resolves"), None);
    }
}
