//! Compiling `nvfp4.cu` with NVRTC: which virtual architecture a device gets, the
//! compile options that keep the CPU's rounding, and the PTX cache on disk. Not here:
//! loading the PTX into a device (`gpu`).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::{CompileOptions, Ptx};

use super::{GpuError, SOURCE};

/// The virtual architecture to compile for: the device's own (`compute_121` for a GB10,
/// compute capability 12.1) where this NVRTC compiles for it, else the newest it does
/// below the device, whose PTX the driver compiles forward. `supported` is NVRTC's own
/// list ([`nvrtc_archs`], SM numbers such as 75, 90, 121), so a chip newer than this
/// build of sous is served by whatever the installed NVRTC knows. An NVRTC that lists
/// nothing gets the device's own; one that lists nothing old enough, its oldest (and
/// its compile error then says why).
pub(super) fn virtual_arch(cc: (i32, i32), supported: &[i32]) -> String {
    let own = cc.0 * 10 + cc.1;
    let pick = supported
        .iter()
        .copied()
        .filter(|&sm| sm <= own)
        .max()
        .or_else(|| supported.iter().copied().min())
        .unwrap_or(own);
    format!("compute_{pick}")
}

/// The architectures the NVRTC library compiles for (`nvrtcGetSupportedArchs`, CUDA 11.2
/// and later), as SM numbers; empty without NVRTC or when it cannot say.
pub(super) fn nvrtc_archs() -> Vec<i32> {
    use cudarc::nvrtc::sys;
    // SAFETY: the library is checked first; both calls write at most `count` integers
    // into a buffer of that size.
    unsafe {
        if !sys::is_culib_present() {
            return Vec::new();
        }
        let mut count = 0;
        if sys::nvrtcGetNumSupportedArchs(&mut count) != sys::nvrtcResult::NVRTC_SUCCESS || count <= 0 {
            return Vec::new();
        }
        let mut archs = vec![0; count as usize];
        if sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) != sys::nvrtcResult::NVRTC_SUCCESS {
            return Vec::new();
        }
        archs
    }
}

/// The PTX for `arch`: from the cache if it is there, else compiled (and cached).
pub(super) fn load_or_compile(arch: &str, cache: Option<&Path>) -> Result<(Ptx, Option<f64>), GpuError> {
    let file = cache.map(|dir| dir.join("kernels").join(cache_name(arch)));
    if let Some(path) = &file
        && let Ok(src) = std::fs::read_to_string(path)
    {
        return Ok((Ptx::from_src(src), None));
    }
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    let started = Instant::now();
    let options = CompileOptions {
        // The CPU's rounding: no contraction into fused multiply-adds, IEEE division
        // and square root, subnormals kept.
        fmad: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        use_fast_math: Some(false),
        // As an option, not `arch`, which takes only a `&'static str`.
        options: vec!["--std=c++17".into(), format!("--gpu-architecture={arch}")],
        ..CompileOptions::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options).map_err(|e| GpuError::Compile {
        arch: arch.to_owned(),
        log: e.to_string(),
    })?;
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let src = ptx.to_src();
    if let Some(path) = &file {
        // A cache that cannot be written only costs the next process a compile.
        let _ = write_atomically(path, src.as_bytes());
    }
    Ok((Ptx::from_src(src), Some(compile_ms)))
}

/// `nvfp4-<arch>-<hash of the source and options>.ptx`.
pub(super) fn cache_name(arch: &str) -> String {
    // A hash only has to tell sources apart across the versions that share a cache.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    SOURCE.hash(&mut hasher);
    env!("CARGO_PKG_VERSION").hash(&mut hasher);
    "fmad=false prec_div prec_sqrt ftz=false c++17".hash(&mut hasher);
    format!("nvfp4-{arch}-{:016x}.ptx", hasher.finish())
}

fn write_atomically(path: &PathBuf, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}",
        std::process::id(),
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
