//! The choice of architecture, the amax bits, the PTX cache's names, and (opt-in)
//! NVRTC compiling the kernels for every architecture.

use super::compile::{cache_name, load_or_compile, nvrtc_archs, virtual_arch};
use super::*;

#[test]
fn the_device_gets_its_own_architecture_or_the_newest_below_it() {
    // What the NVRTC of CUDA 13.5 lists (the test environment's nvidia-cuda-nvrtc
    // wheel, `nvrtcGetSupportedArchs`).
    let cuda13 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 107, 110, 120, 121];
    for (cc, want) in [
        ((12, 1), "compute_121"), // GB10 (DGX Spark)
        ((12, 0), "compute_120"), // RTX 50
        ((10, 0), "compute_100"), // B200
        ((9, 0), "compute_90"),   // H100, H200
        ((8, 9), "compute_89"),
        ((8, 0), "compute_80"),
        ((8, 5), "compute_80"),   // not listed: the newest below
        ((13, 0), "compute_121"), // newer than this NVRTC
    ] {
        assert_eq!(virtual_arch(cc, &cuda13), want, "{cc:?}");
    }
    // A later NVRTC that knows a later chip serves it with no change to sous.
    assert_eq!(virtual_arch((13, 0), &[90, 121, 130]), "compute_130");
    // Older than everything listed: the oldest, whose compile error says why.
    assert_eq!(virtual_arch((7, 0), &cuda13), "compute_75");
    // No list: the device's own.
    assert_eq!(virtual_arch((12, 1), &[]), "compute_121");
}

#[test]
fn amax_bits_let_nan_win() {
    assert_eq!(amax_of_bits(0x3F80_0000), 1.0);
    assert_eq!(amax_of_bits(0x7F80_0000), f32::INFINITY);
    assert!(amax_of_bits(0x7FC0_0000).is_nan());
}

/// NVRTC compiles the kernels for every architecture sous names. Opt-in
/// (`SOUS_TEST_NVRTC=1`): it needs `libnvrtc` (the `nvidia-cuda-nvrtc` wheel's
/// will do, on `LD_LIBRARY_PATH`), not a GPU.
#[test]
fn the_kernels_compile_for_every_architecture() {
    if std::env::var_os("SOUS_TEST_NVRTC").is_none() {
        return;
    }
    let cache = std::env::temp_dir().join(format!("sous-nvrtc-test-{}", std::process::id()));
    // The installed NVRTC's own list gives a GB10 its architecture.
    let archs = nvrtc_archs();
    assert!(archs.contains(&90), "NVRTC lists {archs:?}");
    if archs.contains(&121) {
        assert_eq!(virtual_arch((12, 1), &archs), "compute_121");
    }
    for arch in [
        "compute_75",
        "compute_80",
        "compute_90",
        "compute_100",
        "compute_120",
        "compute_121",
    ] {
        let (ptx, compiled) = load_or_compile(arch, Some(&cache)).expect("NVRTC compiles the kernels");
        assert!(compiled.is_some(), "{arch}: compiled, not cached");
        let src = ptx.to_src();
        for name in [
            "nvfp4_quantize_bf16",
            "nvfp4_quantize_f32_stats",
            "nvfp4_amax_f16",
            "nvfp4_dequantize",
        ] {
            assert!(src.contains(name), "{arch}: {name} in the PTX");
        }
        // The second time it comes from the cache.
        let (_, again) = load_or_compile(arch, Some(&cache)).expect("cached");
        assert!(again.is_none(), "{arch}: from the cache");
    }
    std::fs::remove_dir_all(&cache).expect("cleanup");
}

#[test]
fn the_cache_name_follows_the_architecture() {
    assert_ne!(cache_name("compute_90"), cache_name("compute_100"));
    assert!(cache_name("compute_90").starts_with("nvfp4-compute_90-"));
}
