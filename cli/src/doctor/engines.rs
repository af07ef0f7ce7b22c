//! The serving engines: vLLM, SGLang and TensorRT-LLM as installed on `PATH`, each
//! asked for its version (all at once: importing torch alone can take ten seconds),
//! and the native engine, which is part of sous and runs on this CPU.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use sous_engine::version::Version;

use super::exec::{self, Output, RunError, SearchPath};

/// How long an engine may take to say its version.
const VERSION_LIMIT: Duration = Duration::from_secs(30);

/// What `python3 -c` runs to find SGLang: the import `python3 -m sglang.launch_server`
/// (how sous starts it) depends on.
const SGLANG_VERSION: &str = "import sglang; print(sglang.__version__)";

/// TensorRT-LLM's version without importing it (which loads torch and the TensorRT
/// libraries): `trtllm-serve` has no `--version`, its `main` being a group that hands
/// unknown arguments to `serve` (`tensorrt_llm/commands/serve.py`, `DefaultGroup`).
const TRTLLM_VERSION: &str = "import importlib.metadata as m; print(m.version('tensorrt_llm'))";

/// The engines.
#[derive(Debug, Clone, Serialize)]
pub struct Engines {
    /// vLLM (`vllm`).
    pub vllm: Installed,
    /// SGLang (`python3 -m sglang.launch_server`).
    pub sglang: Installed,
    /// TensorRT-LLM (`trtllm-serve`).
    pub trtllm: Installed,
    /// The engine built into sous.
    pub native: Native,
}

/// An engine installed on this machine, or not.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Installed {
    /// Whether sous can start it here.
    pub available: bool,
    /// The program found: the engine's executable, or the Python that imports it.
    pub path: Option<String>,
    /// Its version, when it said.
    pub version: Option<String>,
    /// Why it is not available, or why its version is unknown.
    pub problem: Option<String>,
}

impl Installed {
    fn missing(problem: impl Into<String>) -> Installed {
        Installed {
            problem: Some(problem.into()),
            ..Installed::default()
        }
    }
}

/// The native engine and the CPU it runs on.
#[derive(Debug, Clone, Serialize)]
pub struct Native {
    /// Always: it is part of sous.
    pub available: bool,
    /// sous's version, which is the engine's.
    pub version: &'static str,
    /// The architectures it runs (`config.json`'s `architectures`).
    pub architectures: Vec<&'static str>,
    /// The CPU.
    pub cpu: Cpu,
}

/// The CPU, as the native engine sees it.
#[derive(Debug, Clone, Serialize)]
pub struct Cpu {
    /// e.g. `Intel(R) Xeon(R) Platinum 8480+`, from `/proc/cpuinfo`.
    pub model: String,
    /// `x86_64` or `aarch64`.
    pub arch: &'static str,
    /// Threads sous may use.
    pub threads: usize,
    /// RAM (`MemTotal`).
    pub memory_bytes: Option<u64>,
    /// The matrix kernels the native engine runs (`avx512`, `avx2`, `neon` or `portable`;
    /// `SOUS_KERNELS_ISA` narrows it).
    pub kernels: &'static str,
    /// Every kernel set this CPU can run, widest first.
    pub instruction_sets: Vec<&'static str>,
    /// Every kernel path this CPU can take, as far as results go (`avx512 + bf16 dot`,
    /// `avx512`, `avx2`, `neon`, `portable`): f32 results are the same bits on each, bf16
    /// results differ between the dot product and the others (docs/numerics.md).
    pub kernel_paths: Vec<String>,
    /// The kernel `sous quantize` uses on the CPU.
    pub quantize_kernel: &'static str,
    /// Transparent huge pages, where the native engine keeps its weights and KV cache.
    pub huge_pages: HugePages,
    /// The read bandwidth at the native engine's thread count, as the engine measures it
    /// at load (`SOUS_READ_BANDWIDTH`): what bounds single-stream decode.
    pub read_bandwidth: Option<ReadBandwidth>,
    /// The host's memory now (`/proc/meminfo`, `/proc/pressure/memory`): what
    /// `memory.host_floor` is kept against, and on unified memory the GPU's too.
    pub host_memory: Option<HostMemory>,
}

/// The host's memory now.
#[derive(Debug, Clone, Serialize)]
pub struct HostMemory {
    /// `MemTotal`, bytes.
    pub total_bytes: u64,
    /// `MemAvailable`, bytes.
    pub available_bytes: u64,
    /// `MemFree`, bytes.
    pub free_bytes: u64,
    /// `Cached`: the page cache, bytes.
    pub page_cache_bytes: u64,
    /// PSI's `some avg10` and `full avg10`, percent, where the kernel has PSI.
    pub pressure_some_percent: Option<f64>,
    /// See `pressure_some_percent`.
    pub pressure_full_percent: Option<f64>,
}

/// What the read-bandwidth probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReadBandwidth {
    /// The median pass, GB/s (10⁹ bytes per second).
    pub median_gb_per_s: f64,
    /// The fastest pass, GB/s.
    pub best_gb_per_s: f64,
    /// Threads that read.
    pub threads: usize,
}

/// Transparent huge pages on this machine, as the native engine uses them.
#[derive(Debug, Clone, Serialize)]
pub struct HugePages {
    /// The kernel's mode (`always`, `madvise`, `never`), or `null` where it does not say.
    pub mode: Option<String>,
    /// Whether the weights and KV cache go into huge pages: the mode allows it and
    /// `SOUS_HUGE_PAGES` is not `off`.
    pub used: bool,
}

impl std::fmt::Display for HugePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.used, self.mode.as_deref()) {
            (true, Some(mode)) => write!(f, "huge pages (THP {mode})"),
            (false, Some("never")) => write!(f, "no huge pages (THP never: decode is slower)"),
            (false, None) => write!(f, "no huge pages (THP not available)"),
            (false, Some(_)) => write!(f, "no huge pages (SOUS_HUGE_PAGES=off)"),
            (true, None) => write!(f, "huge pages"),
        }
    }
}

/// The engines, probed concurrently.
pub async fn probe(search: &SearchPath) -> Engines {
    let (vllm, sglang, trtllm) = tokio::join!(vllm(search), sglang(search), trtllm(search));
    Engines {
        vllm,
        sglang,
        trtllm,
        native: native(),
    }
}

async fn vllm(search: &SearchPath) -> Installed {
    let Some(program) = search.which("vllm") else {
        return Installed::missing("`vllm` not on PATH");
    };
    let out = exec::run(&program, &["--version"], VERSION_LIMIT).await;
    answer(&program, "vllm --version", out, true)
}

async fn sglang(search: &SearchPath) -> Installed {
    let Some(python) = search.which("python3") else {
        return Installed::missing("python3 not on PATH (SGLang runs as `python3 -m sglang.launch_server`)");
    };
    let out = exec::run(&python, &["-c", SGLANG_VERSION], VERSION_LIMIT).await;
    if let Ok(out) = &out
        && !out.success()
        && out.stderr.contains("No module named 'sglang'")
    {
        return Installed {
            path: Some(python.display().to_string()),
            ..Installed::missing(format!("{} cannot import sglang", python.display()))
        };
    }
    answer(&python, "import sglang", out, true)
}

async fn trtllm(search: &SearchPath) -> Installed {
    let Some(program) = search.which("trtllm-serve") else {
        return Installed::missing("`trtllm-serve` not on PATH");
    };
    // The Python the entry point runs with, which is the one that has the package.
    let python = std::fs::read(&program)
        .ok()
        .and_then(|bytes| shebang_python(&String::from_utf8_lossy(&bytes[..bytes.len().min(512)])))
        .and_then(|p| search.which(&p))
        .or_else(|| search.which("python3"));
    let Some(python) = python else {
        return Installed {
            available: true,
            path: Some(program.display().to_string()),
            version: None,
            problem: Some("version unknown: no Python found to ask".into()),
        };
    };
    let out = exec::run(&python, &["-c", TRTLLM_VERSION], VERSION_LIMIT).await;
    let mut installed = answer(&program, "tensorrt_llm's version", out, false);
    // The entry point is there: sous can start it, whatever its Python said.
    installed.available = true;
    installed
}

/// An engine from its version command's outcome; `must_answer`: whether a failing
/// version command means the engine cannot run.
fn answer(program: &Path, what: &str, out: Result<Output, RunError>, must_answer: bool) -> Installed {
    let path = Some(program.display().to_string());
    match out {
        Ok(out) if out.success() => match version_in(&out.stdout) {
            Some(version) => Installed {
                available: true,
                path,
                version: Some(version),
                problem: None,
            },
            None => Installed {
                available: true,
                path,
                version: None,
                problem: Some(format!("`{what}` printed no version")),
            },
        },
        Ok(out) => Installed {
            available: !must_answer,
            path,
            version: None,
            problem: Some(format!("`{what}` failed ({})", out.failure())),
        },
        // Slow, not broken: the engine is there.
        Err(e @ RunError::TimedOut { .. }) => Installed {
            available: true,
            path,
            version: None,
            problem: Some(format!("version unknown: {e}")),
        },
        Err(e) => Installed {
            available: false,
            path,
            version: None,
            problem: Some(e.to_string()),
        },
    }
}

/// The release number in a version command's output: the last line that is one, or
/// whose last word is one (`[TensorRT-LLM] TensorRT-LLM version: 1.0.0`). vLLM logs to
/// stdout, so `vllm --version` may print log lines before the number.
pub fn version_in(stdout: &str) -> Option<String> {
    stdout.lines().rev().map(str::trim).find_map(|line| {
        [Some(line), line.split_whitespace().last()]
            .into_iter()
            .flatten()
            .find(|word| word.parse::<Version>().is_ok())
            .map(str::to_owned)
    })
}

/// The Python of a script's `#!` line: `#!/opt/venv/bin/python3` or
/// `#!/usr/bin/env python3`; `None` for a script of another interpreter.
pub fn shebang_python(head: &str) -> Option<String> {
    let line = head.lines().next()?.strip_prefix("#!")?;
    let mut words = line.split_whitespace();
    let mut interpreter = words.next()?;
    if Path::new(interpreter).file_name().is_some_and(|n| n == "env") {
        interpreter = words.find(|w| !w.starts_with('-'))?;
    }
    let name = Path::new(interpreter).file_name()?.to_string_lossy();
    name.starts_with("python").then(|| interpreter.to_owned())
}

/// The native engine: always there, on this CPU.
pub fn native() -> Native {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let arch = std::env::consts::ARCH;
    Native {
        available: true,
        version: env!("CARGO_PKG_VERSION"),
        architectures: sous_engine::native::config::ARCHITECTURES.to_vec(),
        cpu: Cpu {
            model: cpu_model(&cpuinfo).unwrap_or_else(|| format!("{arch} CPU")),
            arch,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes: sous_engine::host::total(),
            kernels: sous_engine::native::kernel_isa().name(),
            instruction_sets: sous_kernels::gemm::Isa::available()
                .into_iter()
                .map(|isa| isa.name())
                .collect(),
            kernel_paths: sous_kernels::gemm::KernelPath::available()
                .iter()
                .map(ToString::to_string)
                .collect(),
            quantize_kernel: sous_kernels::fast::Kernel::detect().name(),
            huge_pages: {
                let mode = sous_kernels::pages::system_mode();
                HugePages {
                    used: sous_engine::native::huge_pages() && sous_kernels::pages::in_use(mode.as_deref()),
                    mode,
                }
            },
            host_memory: sous_engine::host::Meminfo::read().ok().map(|m| {
                let pressure = sous_engine::host::Pressure::read();
                HostMemory {
                    total_bytes: m.total,
                    available_bytes: m.available,
                    free_bytes: m.free,
                    page_cache_bytes: m.cached,
                    pressure_some_percent: pressure.map(|p| p.some),
                    pressure_full_percent: pressure.map(|p| p.full),
                }
            }),
            read_bandwidth: sous_engine::native::read_bandwidth().map(|b| ReadBandwidth {
                median_gb_per_s: b.median_gb_per_s,
                best_gb_per_s: b.best_gb_per_s,
                threads: b.threads,
            }),
        },
    }
}

/// The CPU's name in `/proc/cpuinfo`: `model name` on x86, `Model` or `Hardware` on
/// some Arm kernels; elsewhere on Arm, its cores named from their implementer and part
/// numbers and counted, in the order listed (a GB10: `10× Arm Cortex-X925 + 10× Arm
/// Cortex-A725`).
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Model", "Hardware"]
        .iter()
        .find_map(|key| {
            cpuinfo.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_owned())
            })
        })
        .or_else(|| arm_cores(cpuinfo))
}

/// Arm cores by `CPU implementer` and `CPU part`, in order of first appearance, each
/// with its count.
fn arm_cores(cpuinfo: &str) -> Option<String> {
    let mut cores: Vec<(String, usize)> = Vec::new();
    let mut implementer = None;
    for line in cpuinfo.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let number = || u32::from_str_radix(value.trim().trim_start_matches("0x"), 16).ok();
        match key.trim() {
            "CPU implementer" => implementer = number(),
            "CPU part" => {
                let (Some(imp), Some(part)) = (implementer, number()) else {
                    continue;
                };
                let name = arm_core_name(imp, part);
                match cores.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, count)) => *count += 1,
                    None => cores.push((name, 1)),
                }
            }
            _ => {}
        }
    }
    let named: Vec<String> = cores
        .iter()
        .map(|(name, count)| format!("{count}× {name}"))
        .collect();
    (!named.is_empty()).then(|| named.join(" + "))
}

/// The name of an Arm core, from the implementer and part numbers of its MIDR_EL1 (the
/// Linux kernel's `arch/arm64/include/asm/cputype.h`; Arm's Trusted Firmware-A
/// `include/lib/cpus/aarch64/*.h` for the newest): the server and DGX cores, and a few
/// boards'. Any other is named by its numbers.
fn arm_core_name(implementer: u32, part: u32) -> String {
    let known = match (implementer, part) {
        (0x41, 0xD03) => "Arm Cortex-A53",
        (0x41, 0xD05) => "Arm Cortex-A55",
        (0x41, 0xD08) => "Arm Cortex-A72",
        (0x41, 0xD0B) => "Arm Cortex-A76",
        (0x41, 0xD0C) => "Arm Neoverse N1",
        (0x41, 0xD40) => "Arm Neoverse V1",
        (0x41, 0xD41) => "Arm Cortex-A78",
        (0x41, 0xD44) => "Arm Cortex-X1",
        (0x41, 0xD49) => "Arm Neoverse N2",
        (0x41, 0xD4F) => "Arm Neoverse V2",
        (0x41, 0xD84) => "Arm Neoverse V3",
        (0x41, 0xD85) => "Arm Cortex-X925",
        (0x41, 0xD87) => "Arm Cortex-A725",
        (0x41, 0xD8E) => "Arm Neoverse N3",
        (0x4E, 0x004) => "NVIDIA Carmel",
        (0xC0, 0xAC3) => "Ampere-1",
        _ => return format!("Arm core (implementer {implementer:#04x}, part {part:#05x})"),
    };
    known.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_whether_the_native_engine_gets_huge_pages_and_why_not() {
        let say = |mode: Option<&str>, used| {
            HugePages {
                mode: mode.map(str::to_owned),
                used,
            }
            .to_string()
        };
        assert_eq!(say(Some("madvise"), true), "huge pages (THP madvise)");
        assert_eq!(
            say(Some("never"), false),
            "no huge pages (THP never: decode is slower)"
        );
        assert_eq!(say(Some("always"), false), "no huge pages (SOUS_HUGE_PAGES=off)");
        assert_eq!(say(None, false), "no huge pages (THP not available)");
    }

    #[test]
    fn finds_the_version_after_log_lines() {
        assert_eq!(version_in("0.11.0\n").as_deref(), Some("0.11.0"));
        let logged =
            "INFO 10-02 09:12:01 [__init__.py:216] Automatically detected platform cuda.\n0.10.1.1\n";
        assert_eq!(version_in(logged).as_deref(), Some("0.10.1.1"));
        assert_eq!(
            version_in("[TensorRT-LLM] TensorRT-LLM version: 1.2.0rc1\n").as_deref(),
            Some("1.2.0rc1")
        );
        assert_eq!(version_in("0.5.3.post1\n").as_deref(), Some("0.5.3.post1"));
        assert_eq!(version_in("usage: vllm [-h]\n"), None);
    }

    #[test]
    fn reads_the_python_of_an_entry_point() {
        assert_eq!(
            shebang_python("#!/opt/venv/bin/python3.12\n# -*- coding: utf-8 -*-\n").as_deref(),
            Some("/opt/venv/bin/python3.12")
        );
        assert_eq!(
            shebang_python("#!/usr/bin/env python3\n").as_deref(),
            Some("python3")
        );
        assert_eq!(shebang_python("#!/bin/sh\nexec python3 \"$@\"\n"), None);
        assert_eq!(shebang_python("import sys\n"), None);
    }

    #[test]
    fn names_the_cpu() {
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n";
        assert_eq!(cpu_model(x86).as_deref(), Some("Intel(R) Xeon(R) Platinum 8480+"));
        // Arm kernels list implementer and part numbers, and no name: a GB10's ten
        // Cortex-X925 and ten Cortex-A725 cores, named and counted in the order listed.
        let core = |n: usize, part: &str| {
            format!(
                "processor\t: {n}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd sha2 bf16\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: {part}\nCPU revision\t: 1\n\n"
            )
        };
        let gb10: String = (0..20)
            .map(|n| core(n, if n < 10 { "0xd87" } else { "0xd85" }))
            .collect();
        assert_eq!(
            cpu_model(&gb10).as_deref(),
            Some("10× Arm Cortex-A725 + 10× Arm Cortex-X925")
        );
        assert_eq!(
            cpu_model(&core(0, "0xd4f")).as_deref(),
            Some("1× Arm Neoverse V2")
        );
        assert_eq!(
            cpu_model(&core(0, "0xabc")).as_deref(),
            Some("1× Arm core (implementer 0x41, part 0xabc)")
        );
        assert_eq!(cpu_model("processor\t: 0\n"), None);
        assert_eq!(cpu_model("Hardware\t: BCM2835\n").as_deref(), Some("BCM2835"));
    }

    #[test]
    fn the_native_engine_is_always_there() {
        let native = native();
        assert!(native.available);
        assert!(native.cpu.instruction_sets.contains(&"portable"));
        assert!(native.cpu.instruction_sets.contains(&native.cpu.kernels));
        assert_eq!(
            native.cpu.kernel_paths.last().map(String::as_str),
            Some("portable")
        );
    }
}
