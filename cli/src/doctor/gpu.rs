//! The NVIDIA GPUs of this machine and their driver: from `nvidia-smi` where it is on
//! `PATH`, else from the CUDA driver library (`libcuda.so`) when it loads.
//!
//! `nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version
//! --format=csv,noheader,nounits` prints one line per GPU (field names from
//! `nvidia-smi --help-query-gpu`; `compute_cap` exists since driver 510). An H200 with
//! driver 580 prints `0, NVIDIA H200, 143771, 9.0, 580.159.04`. On a DGX Spark (GB10,
//! unified memory) NVML cannot report the memory and the field reads `[N/A]`
//! (NVIDIA's DGX Spark known issues: "nvidia-smi reports memory usage not
//! supported"). The CUDA version the driver supports is not a query field:
//! `nvidia-smi --version` prints `CUDA Version        : 13.0`, and the plain table's
//! header `CUDA Version: 13.0` on drivers without `--version`.

use std::time::Duration;

use serde::{Serialize, Serializer};

use super::exec::{self, SearchPath};

/// How long `nvidia-smi` may take.
const NVIDIA_SMI_LIMIT: Duration = Duration::from_secs(10);

/// The query `sous doctor` runs.
pub const QUERY: &str = "--query-gpu=index,name,memory.total,compute_cap,driver_version";

/// A CUDA compute capability, e.g. 9.0 (Hopper) or 12.1 (GB10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Capability {
    /// Major version: 9 Hopper, 10 and 12 Blackwell.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl Capability {
    /// Parses `9.0` or `12.1`.
    pub fn parse(text: &str) -> Option<Capability> {
        let (major, minor) = text.trim().split_once('.')?;
        Some(Capability {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }

    /// Whether the tensor cores run FP4: Blackwell, compute capability 10.0 and later
    /// (sm_100 B200, sm_103 B300, sm_110 Thor, sm_120 RTX 50 / RTX PRO, sm_121 GB10);
    /// Hopper (9.0) and older have none. vLLM draws the same line:
    /// `cutlass_scaled_mm_supports_fp4` (`csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu`)
    /// is `cuda_device_capability >= 100`.
    pub fn native_fp4(self) -> bool {
        self.major >= 10
    }

    /// Whether devices of this capability are integrated with the CPU and share its
    /// memory: 8.7 (Jetson Orin), 11.0 (Jetson Thor), 12.1 (GB10, DGX Spark).
    pub fn integrated(self) -> bool {
        matches!((self.major, self.minor), (8, 7) | (11, 0) | (12, 1))
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for Capability {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    /// Its index (`cuda:N`).
    pub index: u32,
    /// e.g. `NVIDIA H200`.
    pub name: String,
    /// Device memory; `None` where the driver does not report it (unified memory).
    pub memory_bytes: Option<u64>,
    /// Free memory now as the CUDA driver reports it (`cuMemGetInfo`, which answers on
    /// unified memory too); `None` where it was not asked or did not answer.
    pub memory_free_bytes: Option<u64>,
    /// e.g. `9.0`.
    pub compute_capability: Capability,
    /// FP4 tensor cores (compute capability 10.0 or later).
    pub native_fp4: bool,
    /// The GPU shares the CPU's memory (GB10, Jetson).
    pub unified_memory: bool,
}

impl Gpu {
    fn new(index: u32, name: String, memory_bytes: Option<u64>, cc: Capability, integrated: bool) -> Gpu {
        Gpu {
            index,
            name,
            memory_bytes,
            memory_free_bytes: None,
            compute_capability: cc,
            native_fp4: cc.native_fp4(),
            unified_memory: integrated || memory_bytes.is_none() || cc.integrated(),
        }
    }
}

/// The driver, and how the GPUs were found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Driver {
    /// `nvidia-smi` or `libcuda`; `None` when neither answered.
    pub source: Option<&'static str>,
    /// The driver's version, e.g. `580.159.04`.
    pub version: Option<String>,
    /// The newest CUDA the driver supports, e.g. `13.0`.
    pub cuda: Option<String>,
    /// Why no GPU was found, or what went wrong on the way.
    pub problem: Option<String>,
}

/// A line of the query that is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected nvidia-smi line `{0}`")]
pub struct BadLine(pub String);

/// GPUs and the driver version from the output of `nvidia-smi QUERY
/// --format=csv,noheader,nounits`.
pub fn parse_query(csv: &str) -> Result<(Vec<Gpu>, Option<String>), BadLine> {
    let mut gpus = Vec::new();
    let mut driver = None;
    for line in csv.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || BadLine(line.to_owned());
        // index, name, memory, capability, driver; a name with a comma in it spans
        // several fields.
        let [index, .., memory, cc, version] = fields.as_slice() else {
            return Err(bad());
        };
        if fields.len() < 5 {
            return Err(bad());
        }
        let name = fields[1..fields.len() - 3].join(", ");
        let index: u32 = index.parse().map_err(|_| bad())?;
        let cc = Capability::parse(cc).ok_or_else(bad)?;
        // `[N/A]` (or `[Not Supported]` on older drivers): not reported.
        let memory = memory.parse::<u64>().ok().map(|mib| mib * 1024 * 1024);
        gpus.push(Gpu::new(index, name, memory, cc, false));
        driver.get_or_insert_with(|| (*version).to_owned());
    }
    Ok((gpus, driver))
}

/// The CUDA version in `nvidia-smi --version` (`CUDA Version        : 13.0`) or in
/// the header of the plain `nvidia-smi` table (`CUDA Version: 13.0`).
pub fn parse_cuda_version(text: &str) -> Option<String> {
    let rest = &text[text.find("CUDA Version")? + "CUDA Version".len()..];
    let rest = rest.trim_start_matches([' ', '\t', ':']);
    let version: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (!version.is_empty()).then_some(version)
}

/// The driver version in `/proc/driver/nvidia/version`:
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...`.
pub fn parse_proc_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|word| word.contains('.') && word.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_owned)
}

/// The GPUs and the driver, by `nvidia-smi` on `search`, else the driver library; each
/// GPU's free memory from the driver where it answers.
pub async fn probe(search: &SearchPath) -> (Vec<Gpu>, Driver) {
    let (mut gpus, driver) = listed(search).await;
    if !gpus.is_empty() && sous_kernels::cuda::driver_present() {
        let free = tokio::task::spawn_blocking(crate::devices::all).await;
        if let Ok(Ok(devices)) = free {
            with_free_memory(&mut gpus, &devices);
        }
    }
    (gpus, driver)
}

/// Sets each GPU's free memory from the driver's device of the same ordinal, when the
/// names agree (`nvidia-smi` orders GPUs by bus, CUDA by default fastest first).
pub fn with_free_memory(gpus: &mut [Gpu], devices: &[sous_engine::device::DeviceMemory]) {
    for gpu in gpus {
        gpu.memory_free_bytes = devices
            .iter()
            .find(|d| d.ordinal == gpu.index && d.name == gpu.name)
            .map(|d| d.free_bytes);
    }
}

async fn listed(search: &SearchPath) -> (Vec<Gpu>, Driver) {
    let mut notes = Vec::new();
    if let Some(smi) = search.which("nvidia-smi") {
        match from_nvidia_smi(&smi).await {
            Ok((gpus, driver)) if !gpus.is_empty() => return (gpus, driver),
            Ok(_) => notes.push("nvidia-smi lists no GPU".to_owned()),
            Err(why) => notes.push(why),
        }
    } else {
        notes.push("nvidia-smi not on PATH".to_owned());
    }
    let driver = tokio::task::spawn_blocking(from_driver)
        .await
        .unwrap_or_else(|e| Err(format!("CUDA driver query failed: {e}")));
    match driver {
        Ok((gpus, driver)) if !gpus.is_empty() => {
            let problem = (!notes.is_empty()).then(|| notes.join(", "));
            return (gpus, Driver { problem, ..driver });
        }
        Ok(_) => notes.push("the CUDA driver sees no device".to_owned()),
        Err(why) => notes.push(why),
    }
    let problem = format!("no NVIDIA GPU found ({})", notes.join(", "));
    (
        Vec::new(),
        Driver {
            problem: Some(problem),
            ..Driver::default()
        },
    )
}

async fn from_nvidia_smi(smi: &std::path::Path) -> Result<(Vec<Gpu>, Driver), String> {
    let query = [QUERY, "--format=csv,noheader,nounits"];
    let (listed, version) = tokio::join!(
        exec::run(smi, &query, NVIDIA_SMI_LIMIT),
        exec::run(smi, &["--version"], NVIDIA_SMI_LIMIT)
    );
    let listed = listed.map_err(|e| format!("nvidia-smi: {e}"))?;
    if !listed.success() {
        return Err(format!("nvidia-smi failed ({})", listed.failure()));
    }
    let (gpus, driver_version) = parse_query(&listed.stdout).map_err(|e| e.to_string())?;
    let mut cuda = version.ok().and_then(|out| parse_cuda_version(&out.stdout));
    if cuda.is_none() {
        // Drivers older than `--version`: the table's header has it.
        cuda = exec::run(smi, &[], NVIDIA_SMI_LIMIT)
            .await
            .ok()
            .and_then(|out| parse_cuda_version(&out.stdout));
    }
    Ok((
        gpus,
        Driver {
            source: Some("nvidia-smi"),
            version: driver_version,
            cuda,
            problem: None,
        },
    ))
}

/// The devices as the CUDA driver API sees them (cudarc, library opened at run time).
fn from_driver() -> Result<(Vec<Gpu>, Driver), String> {
    use cudarc::driver::CudaContext;
    use cudarc::driver::sys::CUdevice_attribute;

    if !sous_kernels::cuda::driver_present() {
        return Err("libcuda.so not loadable".to_owned());
    }
    let failed = |what: &str, e: cudarc::driver::DriverError| format!("CUDA {what} failed: {e}");
    let count = CudaContext::device_count().map_err(|e| failed("device count", e))?;
    let mut gpus = Vec::new();
    for ordinal in 0..count.max(0) as usize {
        let ctx = CudaContext::new(ordinal).map_err(|e| failed("context creation", e))?;
        let name = ctx.name().map_err(|e| failed("device query", e))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| failed("device query", e))?;
        let memory = ctx.total_mem().map_err(|e| failed("device query", e))?;
        let integrated = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
            .is_ok_and(|v| v != 0);
        let cc = Capability {
            major: major.max(0) as u32,
            minor: minor.max(0) as u32,
        };
        gpus.push(Gpu::new(
            ordinal as u32,
            name,
            Some(memory as u64),
            cc,
            integrated,
        ));
    }
    let version = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|text| parse_proc_version(&text));
    Ok((
        gpus,
        Driver {
            source: Some("libcuda"),
            version,
            cuda: driver_cuda_version(),
            problem: None,
        },
    ))
}

/// `cuDriverGetVersion`: 13000 → `13.0`.
#[allow(unsafe_code)]
fn driver_cuda_version() -> Option<String> {
    let mut version: std::ffi::c_int = 0;
    // SAFETY: called only after `driver_present()` found the library; the function
    // writes one int through the pointer, which outlives the call.
    let result = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    (result == cudarc::driver::sys::CUresult::CUDA_SUCCESS && version > 0)
        .then(|| format!("{}.{}", version / 1000, (version % 1000) / 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version
    /// --format=csv,noheader,nounits` on an H200 (driver 580.159.04).
    const H200: &str = "0, NVIDIA H200, 143771, 9.0, 580.159.04\n";
    /// The same on a DGX Spark: NVML reports no memory for the GB10.
    const GB10: &str = "0, NVIDIA GB10, [N/A], 12.1, 580.95.05\n";

    #[test]
    fn parses_an_h200_line() {
        let (gpus, driver) = parse_query(H200).expect("parses");
        assert_eq!(driver.as_deref(), Some("580.159.04"));
        assert_eq!(
            gpus,
            [Gpu {
                index: 0,
                name: "NVIDIA H200".into(),
                memory_bytes: Some(143_771 * 1024 * 1024),
                memory_free_bytes: None,
                compute_capability: Capability { major: 9, minor: 0 },
                native_fp4: false,
                unified_memory: false,
            }]
        );
    }

    #[test]
    fn a_gb10_has_fp4_and_unified_memory_and_no_memory_figure() {
        let (gpus, _) = parse_query(GB10).expect("parses");
        let gpu = &gpus[0];
        assert_eq!(gpu.name, "NVIDIA GB10");
        assert_eq!(gpu.memory_bytes, None);
        assert!(gpu.native_fp4 && gpu.unified_memory);
        assert_eq!(gpu.compute_capability.to_string(), "12.1");
        let json = serde_json::to_value(gpu).expect("serializes");
        assert_eq!(json["compute_capability"], "12.1");
        assert!(json["memory_bytes"].is_null());
    }

    #[test]
    fn free_memory_is_taken_from_the_driver_device_of_the_same_name() {
        let (mut gpus, _) = parse_query(GB10).expect("parses");
        let device = |name: &str| sous_engine::device::DeviceMemory {
            ordinal: 0,
            name: name.into(),
            free_bytes: 109_000_000_000,
            total_bytes: 130_662_109_184,
            unified: true,
        };
        with_free_memory(&mut gpus, &[device("NVIDIA H100 80GB HBM3")]);
        assert_eq!(gpus[0].memory_free_bytes, None, "another GPU at the same ordinal");
        with_free_memory(&mut gpus, &[device("NVIDIA GB10")]);
        assert_eq!(gpus[0].memory_free_bytes, Some(109_000_000_000));
    }

    #[test]
    fn several_gpus_and_odd_names() {
        let csv = "0, NVIDIA B200, 183359, 10.0, 580.95.05\n1, NVIDIA RTX PRO 6000, Blackwell, 97887, 12.0, 580.95.05\n";
        let (gpus, _) = parse_query(csv).expect("parses");
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].name, "NVIDIA RTX PRO 6000, Blackwell");
        assert_eq!(gpus[1].index, 1);
        assert!(gpus.iter().all(|g| g.native_fp4 && !g.unified_memory));
        assert!(parse_query("0, NVIDIA H200, 143771").is_err());
        assert!(parse_query("x, NVIDIA H200, 143771, 9.0, 580").is_err());
        assert!(parse_query("0, NVIDIA H200, 143771, nine, 580").is_err());
        assert_eq!(parse_query("\n").expect("empty").0, []);
    }

    #[test]
    fn fp4_starts_at_blackwell() {
        let cc = |text: &str| Capability::parse(text).expect("capability");
        for hopper_or_older in ["7.5", "8.0", "8.6", "8.9", "9.0"] {
            assert!(!cc(hopper_or_older).native_fp4(), "{hopper_or_older}");
        }
        for blackwell in ["10.0", "10.3", "11.0", "12.0", "12.1"] {
            assert!(cc(blackwell).native_fp4(), "{blackwell}");
        }
        assert!(cc("12.1").integrated() && !cc("12.0").integrated());
        assert_eq!(Capability::parse("9"), None);
    }

    #[test]
    fn finds_the_cuda_version_in_both_outputs() {
        // `nvidia-smi --version`, driver 580.159.04.
        let version = "NVIDIA-SMI version  : 580.159.04\nNVML version        : 580.159\nDRIVER version      : 580.159.04\nCUDA Version        : 13.0\n";
        assert_eq!(parse_cuda_version(version).as_deref(), Some("13.0"));
        // The plain table's header.
        let table = "+-----+\n| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |\n";
        assert_eq!(parse_cuda_version(table).as_deref(), Some("13.0"));
        assert_eq!(parse_cuda_version("no such line"), None);
    }

    #[test]
    fn finds_the_driver_version_in_proc() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";
        assert_eq!(parse_proc_version(text).as_deref(), Some("580.159.04"));
        assert_eq!(parse_proc_version("GCC version: 15.3.0"), None);
    }
}
