//! The memory of the GPUs an engine is about to use, as the CUDA driver reports it
//! now: `cuMemGetInfo` through cudarc, the driver library opened at run time, so that
//! the same binary runs where there is none. `nvidia-smi` is not asked: on a GB10 it
//! prints `[N/A]` for memory. What the numbers mean for a recipe is
//! [`sous_engine::device`]'s.
//!
//! Asking costs a CUDA context on each device (a fraction of a second, and its few
//! hundred MiB counted as used while it lives); the engine creates its own before it
//! measures, so the free memory seen here is close to what the engine will see.

use sous_engine::device::DeviceMemory;
use sous_engine::recipe::{EngineKind, Recipe};

/// The variable that selects and orders the GPUs a CUDA process sees.
const VISIBLE: &str = "CUDA_VISIBLE_DEVICES";

/// Every GPU the driver lists to this process, with its memory now. An error says why
/// none could be asked (no driver library, a driver call that failed).
pub fn all() -> Result<Vec<DeviceMemory>, String> {
    let count = count()?;
    (0..count).map(one).collect()
}

/// The GPUs `recipe`'s engine will use: the first `tensor_parallel × pipeline_parallel`
/// of those the engine sees, which the recipe's `[env]` may choose by
/// `CUDA_VISIBLE_DEVICES` (indices; sous's own environment is the engine's too). Empty
/// for the native engine. An error says why they could not be asked.
pub fn for_recipe(recipe: &Recipe) -> Result<Vec<DeviceMemory>, String> {
    if recipe.engine.kind == EngineKind::Native {
        return Ok(Vec::new());
    }
    let wanted = (recipe.serving.tensor_parallel.unwrap_or(1) * recipe.serving.pipeline_parallel.unwrap_or(1))
        .max(1) as usize;
    let ordinals: Vec<u32> = match recipe.env.get(VISIBLE) {
        None => (0..wanted as u32).collect(),
        Some(list) => {
            if sous_engine::env::lookup_os(sous_engine::env::CUDA_VISIBLE_DEVICES.name).is_some() {
                return Err(format!(
                    "both sous's environment and the recipe's `[env]` set {VISIBLE}: which GPUs the engine gets cannot be told here"
                ));
            }
            visible(list)
                .ok_or_else(|| format!("the recipe's {VISIBLE} (`{list}`) is not a list of GPU indices"))?
                .into_iter()
                .take(wanted)
                .collect()
        }
    };
    let count = count()?;
    ordinals
        .into_iter()
        .filter(|&o| (o as usize) < count)
        .map(|o| one(o as usize))
        .collect()
}

/// `0,1` or `2` as indices; `None` for UUIDs (`GPU-…`, `MIG-…`) and anything else.
fn visible(list: &str) -> Option<Vec<u32>> {
    list.split(',').map(|s| s.trim().parse().ok()).collect()
}

fn count() -> Result<usize, String> {
    if !sous_kernels::cuda::driver_present() {
        return Err("no CUDA driver (libcuda.so) on this machine".into());
    }
    let n =
        cudarc::driver::CudaContext::device_count().map_err(|e| format!("CUDA device count failed: {e}"))?;
    Ok(n.max(0) as usize)
}

fn one(ordinal: usize) -> Result<DeviceMemory, String> {
    use cudarc::driver::CudaContext;
    use cudarc::driver::sys::CUdevice_attribute;
    let failed =
        |what: &str, e: cudarc::driver::DriverError| format!("CUDA {what} on cuda:{ordinal} failed: {e}");
    let ctx = CudaContext::new(ordinal).map_err(|e| failed("context creation", e))?;
    let name = ctx.name().map_err(|e| failed("device query", e))?;
    let (free, total) = ctx.mem_get_info().map_err(|e| failed("memory query", e))?;
    let integrated = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
        .is_ok_and(|v| v != 0);
    Ok(DeviceMemory {
        ordinal: ordinal as u32,
        name,
        free_bytes: free as u64,
        total_bytes: total as u64,
        unified: integrated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_are_indices_or_nothing() {
        assert_eq!(visible("0"), Some(vec![0]));
        assert_eq!(visible("2, 3"), Some(vec![2, 3]));
        assert_eq!(visible("GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5"), None);
        assert_eq!(visible(""), None);
    }

    #[test]
    fn the_driver_answers_or_its_absence_is_named() {
        match all() {
            Ok(devices) => {
                assert!(sous_kernels::cuda::driver_present());
                for d in devices {
                    assert!(d.free_bytes <= d.total_bytes && d.total_bytes > 0, "{d:?}");
                }
            }
            Err(why) => {
                if !sous_kernels::cuda::driver_present() {
                    assert!(why.contains("libcuda.so"), "{why}");
                }
            }
        }
    }
}
