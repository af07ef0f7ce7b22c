//! NVFP4 on NVIDIA GPUs: the kernels of `nvfp4.cu`, compiled at run time by NVRTC for
//! the device in hand and launched through `cudarc`, which opens `libcuda` and
//! `libnvrtc` when [`Gpu::open`] is called. A `sous` built on a machine with no CUDA
//! runs them wherever a driver is installed; where none is, [`Gpu::open`] says which
//! library is missing.
//!
//! The numbers are the CPU's: every kernel repeats the arithmetic of
//! [`crate::scale`] and [`crate::formats`] with IEEE rounding written out and no fused
//! multiply-add, so [`Gpu::quantize`] gives the bytes of [`crate::fast::quantize`] (the
//! tests and `sous kernels check` hold it to that). Error statistics are summed in
//! another order, so they agree to rounding, as the CPU's fast path and reference do.
//!
//! NVRTC runs once per architecture and source: the PTX is kept in the cache directory
//! the caller names (`<cache>/kernels/`), and later processes load it from there.
//!
//! Not here: choosing tensors, reading files or overlapping transfers with work across
//! tensors (`sous quantize --device cuda` does that, with [`Pinned`] buffers on two
//! streams).

#![allow(unsafe_code)] // Kernel launches and pinned memory are unsafe in cudarc.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr,
    DevicePtrMut, DeviceRepr, DriverError, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::reference::Quantized;
use crate::scale::{Flavor, TensorScale};
use crate::stats::{BlockCounts, ErrorStats};
use crate::{BLOCK, Dtype, Matrix};

/// The kernels' source, compiled at run time.
pub const SOURCE: &str = include_str!("nvfp4.cu");

/// Threads per CUDA block.
const THREADS: u32 = 256;

/// Words of the bf16 kernel's threshold table: 8 for each of the 256 scale bytes.
const THRESHOLD_WORDS: usize = 256 * 8;

/// Why the GPU path cannot run.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library on this machine.
    #[error("no CUDA driver found (libcuda.so could not be loaded)")]
    NoDriver,
    /// The driver is there, NVRTC is not.
    #[error("the CUDA driver is installed but NVRTC is not (libnvrtc.so could not be loaded)")]
    NoNvrtc,
    /// No device with that index.
    #[error("there is no CUDA device {ordinal} (this machine has {count})")]
    NoDevice {
        /// The index asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// A driver call failed.
    #[error("CUDA {what} failed: {message}")]
    Driver {
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        message: String,
    },
    /// NVRTC rejected the kernels.
    #[error("NVRTC could not compile the NVFP4 kernels for {arch}: {log}")]
    Compile {
        /// The target architecture.
        arch: String,
        /// The compiler's log.
        log: String,
    },
    /// The input cannot be quantized on the GPU.
    #[error("{0}")]
    Input(String),
}

impl GpuError {
    /// A failed driver call: `what` was being done.
    pub fn driver(what: &'static str, error: DriverError) -> GpuError {
        GpuError::Driver {
            what,
            message: error.to_string(),
        }
    }
}

fn driver(what: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| GpuError::driver(what, e)
}

/// What [`Gpu::open`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// Device index.
    pub ordinal: usize,
    /// The device's name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability, e.g. `(9, 0)`.
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub memory_bytes: usize,
    /// The architecture the kernels were compiled for, e.g. `compute_90`.
    pub arch: String,
    /// Milliseconds NVRTC took, or `None` when the kernels came from the cache.
    pub compile_ms: Option<f64>,
}

impl std::fmt::Display for GpuInfo {
    /// `NVIDIA H200 (cuda:0, compute capability 9.0, 140 GiB, kernels compiled for
    /// compute_90 in 410 ms)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (cuda:{}, compute capability {}.{}, {:.0} GiB, kernels ",
            self.name,
            self.ordinal,
            self.compute_capability.0,
            self.compute_capability.1,
            self.memory_bytes as f64 / (1u64 << 30) as f64
        )?;
        match self.compile_ms {
            Some(ms) => write!(f, "compiled for {} in {ms:.0} ms)", self.arch),
            None => write!(f, "for {} from the cache)", self.arch),
        }
    }
}

/// The kernels of one device.
struct Kernels {
    quantize: [CudaFunction; 3],
    quantize_stats: [CudaFunction; 3],
    amax: [CudaFunction; 3],
    dequantize: CudaFunction,
    thresholds_bf16: CudaFunction,
}

/// One CUDA device with the NVFP4 kernels loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    info: GpuInfo,
    /// Blocks per launch: enough to fill every multiprocessor several times over.
    grid: u32,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Whether a CUDA driver library can be loaded here (without touching a device).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library; no CUDA call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The virtual architecture to compile for: the device's own (`compute_121` for a GB10,
/// compute capability 12.1) where this NVRTC compiles for it, else the newest it does
/// below the device, whose PTX the driver compiles forward. `supported` is NVRTC's own
/// list ([`nvrtc_archs`], SM numbers such as 75, 90, 121), so a chip newer than this
/// build of sous is served by whatever the installed NVRTC knows. An NVRTC that lists
/// nothing gets the device's own; one that lists nothing old enough, its oldest (and
/// its compile error then says why).
fn virtual_arch(cc: (i32, i32), supported: &[i32]) -> String {
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
fn nvrtc_archs() -> Vec<i32> {
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

fn dtype_index(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bf16 => 0,
        Dtype::F16 => 1,
        Dtype::F32 => 2,
    }
}

/// The flavor and arithmetic flags the kernels take.
fn scale_args(scale: &TensorScale) -> (i32, i32, f32) {
    let flavor = match scale.flavor() {
        Flavor::CompressedTensors => 0,
        Flavor::ModelOptGpu | Flavor::ModelOptCpu => 1,
    };
    (flavor, i32::from(scale.rounds_to_bf16()), scale.value())
}

impl Gpu {
    /// Opens device `ordinal` and loads the kernels: from `cache` (a directory;
    /// `kernels/` under it) if they were compiled before for this architecture, else
    /// through NVRTC, keeping the result there.
    pub fn open(ordinal: usize, cache: Option<&Path>) -> Result<Gpu, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count()
            .map_err(driver("device count"))?
            .max(0) as usize;
        if ordinal >= count {
            return Err(GpuError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("context creation"))?;
        let name = ctx.name().map_err(driver("device query"))?;
        let compute_capability = ctx.compute_capability().map_err(driver("device query"))?;
        let memory_bytes = ctx.total_mem().map_err(driver("device query"))?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("device query"))?
            .max(1) as u32;
        let arch = virtual_arch(compute_capability, &nvrtc_archs());
        let (ptx, compile_ms) = load_or_compile(&arch, cache)?;
        let module = ctx.load_module(ptx).map_err(driver("module load"))?;
        let load = |name: &str| module.load_function(name).map_err(driver("kernel lookup"));
        let kernels = Kernels {
            quantize: [
                load("nvfp4_quantize_bf16")?,
                load("nvfp4_quantize_f16")?,
                load("nvfp4_quantize_f32")?,
            ],
            quantize_stats: [
                load("nvfp4_quantize_bf16_stats")?,
                load("nvfp4_quantize_f16_stats")?,
                load("nvfp4_quantize_f32_stats")?,
            ],
            amax: [
                load("nvfp4_amax_bf16")?,
                load("nvfp4_amax_f16")?,
                load("nvfp4_amax_f32")?,
            ],
            dequantize: load("nvfp4_dequantize")?,
            thresholds_bf16: load("nvfp4_thresholds_bf16")?,
        };
        let stream = ctx.default_stream();
        Ok(Gpu {
            stream,
            kernels,
            info: GpuInfo {
                ordinal,
                name,
                compute_capability,
                memory_bytes,
                arch,
                compile_ms,
            },
            // Blocks of 256 threads, 32 per multiprocessor: the tail of the last wave
            // is shorter than with 8, which measured faster on an H200
            // (BENCHMARKS.md, "Figures that were in code comments").
            grid: sms * 32,
            ctx,
        })
    }

    /// The device.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// Free and total device memory, in bytes.
    pub fn memory(&self) -> Result<(usize, usize), GpuError> {
        self.ctx.mem_get_info().map_err(driver("memory query"))
    }

    fn config(&self, lanes: u64) -> LaunchConfig {
        let blocks = lanes.div_ceil(u64::from(THREADS)).clamp(1, u64::from(self.grid)) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Copies `bytes` to a new device buffer.
    pub fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, GpuError> {
        self.stream
            .clone_htod(bytes)
            .map_err(driver("host-to-device copy"))
    }

    /// A new stream of this device, for work that overlaps.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, GpuError> {
        self.ctx.new_stream().map_err(driver("stream creation"))
    }

    /// Launches the amax of `input` (elements of `dtype`) on `stream`, into `out` (as
    /// the bits of the magnitude; NaN above infinity). `out` must be zeroed first.
    pub fn launch_amax(
        &self,
        stream: &Arc<CudaStream>,
        dtype: Dtype,
        input: &CudaView<'_, u8>,
        bytes: usize,
        out: &mut CudaViewMut<'_, u32>,
    ) -> Result<(), GpuError> {
        let lanes = check_lanes(dtype, bytes, input.len())?;
        if lanes == 0 {
            return Ok(());
        }
        let f = &self.kernels.amax[dtype_index(dtype)];
        let mut launch = stream.launch_builder(f);
        launch.arg(input).arg(&lanes).arg(out);
        // SAFETY: the arguments match `nvfp4_amax_*` in nvfp4.cu; `input` holds
        // `lanes * 16` bytes and `out` one u32.
        unsafe { launch.launch(self.config(lanes)) }.map_err(driver("amax kernel"))?;
        Ok(())
    }

    /// Launches the quantization of the first `bytes` of `input` on `stream` into
    /// `out`; with `out.stats`, the error statistics too.
    pub fn launch_quantize(
        &self,
        stream: &Arc<CudaStream>,
        dtype: Dtype,
        input: &CudaView<'_, u8>,
        bytes: usize,
        scale: &TensorScale,
        out: &mut DeviceOutput,
    ) -> Result<(), GpuError> {
        let lanes = check_lanes(dtype, bytes, input.len())?;
        let elements = bytes / dtype.size();
        if out.packed.len() < elements / 2 || out.scales.len() < elements / BLOCK {
            return Err(GpuError::Input(format!(
                "output buffers of {} and {} bytes for {elements} elements",
                out.packed.len(),
                out.scales.len()
            )));
        }
        if lanes == 0 {
            return Ok(());
        }
        let (flavor, arith_bf16, value) = scale_args(scale);
        if dtype == Dtype::Bf16 {
            // The bf16 kernel compares against thresholds that depend on the tensor's
            // scale: 256 scale bytes x 8, one thread each, on the same stream first.
            let mut launch = stream.launch_builder(&self.kernels.thresholds_bf16);
            launch
                .arg(&flavor)
                .arg(&arith_bf16)
                .arg(&value)
                .arg(&mut out.thresholds);
            let config = LaunchConfig {
                grid_dim: (THRESHOLD_WORDS as u32 / THREADS, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match `nvfp4_thresholds_bf16`; `out.thresholds`
            // holds THRESHOLD_WORDS words, one per thread launched.
            unsafe { launch.launch(config) }.map_err(driver("threshold kernel"))?;
        }
        let f = match out.stats {
            Some(_) => &self.kernels.quantize_stats[dtype_index(dtype)],
            None => &self.kernels.quantize[dtype_index(dtype)],
        };
        let mut launch = stream.launch_builder(f);
        launch
            .arg(input)
            .arg(&lanes)
            .arg(&mut out.packed)
            .arg(&mut out.scales)
            .arg(&flavor)
            .arg(&arith_bf16)
            .arg(&value)
            .arg(&out.thresholds);
        match &mut out.stats {
            Some((sums, counts)) => launch.arg(sums).arg(counts),
            None => launch.arg(&0u64).arg(&0u64),
        };
        // SAFETY: the arguments match `nvfp4_quantize_*` in nvfp4.cu (null statistics
        // pointers for the kernels that do not read them); the buffers were checked
        // against the element count above.
        unsafe { launch.launch(self.config(lanes)) }.map_err(driver("quantize kernel"))?;
        Ok(())
    }

    /// The largest magnitude of `matrix`; NaN if it holds one. Same as
    /// [`crate::fast::amax`].
    pub fn amax(&self, matrix: &Matrix) -> Result<f32, GpuError> {
        let input = self.upload(matrix.data())?;
        let mut out = self.stream.alloc_zeros::<u32>(1).map_err(driver("allocation"))?;
        self.launch_amax(
            &self.stream,
            matrix.dtype(),
            &input.as_view(),
            matrix.data().len(),
            &mut out.as_view_mut(),
        )?;
        let bits = self
            .stream
            .clone_dtoh(&out)
            .map_err(driver("device-to-host copy"))?;
        Ok(amax_of_bits(bits[0]))
    }

    /// Quantizes `matrix` with `scale`: the bytes of [`crate::fast::quantize_with_stats`],
    /// and the same statistics up to summation order.
    pub fn quantize(
        &self,
        matrix: &Matrix,
        scale: &TensorScale,
    ) -> Result<(Quantized, ErrorStats), GpuError> {
        let input = self.upload(matrix.data())?;
        let elements = matrix.rows() * matrix.cols();
        let mut out = DeviceOutput::new(&self.stream, elements, true)?;
        self.launch_quantize(
            &self.stream,
            matrix.dtype(),
            &input.as_view(),
            matrix.data().len(),
            scale,
            &mut out,
        )?;
        out.download(&self.stream, elements)
    }

    /// The f32 values `packed`/`scales` stand for: [`crate::fast::dequantize`]'s.
    pub fn dequantize(
        &self,
        packed: &[u8],
        scales: &[u8],
        scale: &TensorScale,
    ) -> Result<Vec<f32>, GpuError> {
        if scales.len() * BLOCK / 2 != packed.len() {
            return Err(GpuError::Input(format!(
                "{} packed bytes with {} block scales",
                packed.len(),
                scales.len()
            )));
        }
        if packed.is_empty() {
            return Ok(Vec::new());
        }
        let packed_dev = self.upload(packed)?;
        let scales_dev = self.upload(scales)?;
        let mut out = self
            .stream
            .alloc_zeros::<f32>(packed.len() * 2)
            .map_err(driver("allocation"))?;
        let (flavor, _, value) = scale_args(scale);
        let bytes = packed.len() as u64;
        let mut launch = self.stream.launch_builder(&self.kernels.dequantize);
        launch
            .arg(&packed_dev)
            .arg(&bytes)
            .arg(&scales_dev)
            .arg(&flavor)
            .arg(&value)
            .arg(&mut out);
        // SAFETY: the arguments match `nvfp4_dequantize`; `out` holds two floats per
        // packed byte and `scales_dev` one byte per 8 packed bytes (checked above).
        unsafe { launch.launch(self.config(bytes)) }.map_err(driver("dequantize kernel"))?;
        self.stream
            .clone_dtoh(&out)
            .map_err(driver("device-to-host copy"))
    }

    /// Times the kernels on `bytes` of random-looking `dtype` data already on the
    /// device, beside a device-to-device copy of the same bytes: the median of
    /// `repeats` runs of each, after a warm-up.
    pub fn bench(&self, dtype: Dtype, bytes: usize, repeats: usize) -> Result<Bench, GpuError> {
        let bytes = bytes / (BLOCK * dtype.size()) * (BLOCK * dtype.size());
        let elements = bytes / dtype.size();
        let host = bench_data(dtype, elements);
        let input = self.upload(&host)?;
        drop(host);
        let mut copy = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(driver("allocation"))?;
        let mut amax = self.stream.alloc_zeros::<u32>(1).map_err(driver("allocation"))?;
        let mut plain = DeviceOutput::new(&self.stream, elements, false)?;
        let mut stats = DeviceOutput::new(&self.stream, elements, true)?;
        self.launch_amax(
            &self.stream,
            dtype,
            &input.as_view(),
            bytes,
            &mut amax.as_view_mut(),
        )?;
        let bits = self
            .stream
            .clone_dtoh(&amax)
            .map_err(driver("device-to-host copy"))?;
        let scale = TensorScale::from_amax(Flavor::CompressedTensors, dtype, amax_of_bits(bits[0]));
        let time = |run: &mut dyn FnMut() -> Result<(), GpuError>| -> Result<f64, GpuError> {
            run()?;
            let mut times = Vec::with_capacity(repeats.max(1));
            for _ in 0..repeats.max(1) {
                let start = self
                    .stream
                    .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("event"))?;
                run()?;
                let end = self
                    .stream
                    .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("event"))?;
                end.synchronize().map_err(driver("synchronize"))?;
                times.push(f64::from(start.elapsed_ms(&end).map_err(driver("event timing"))?) / 1e3);
            }
            times.sort_by(f64::total_cmp);
            Ok(times[times.len() / 2])
        };
        let copy_s = time(&mut || {
            self.stream
                .memcpy_dtod(&input, &mut copy)
                .map_err(driver("device-to-device copy"))
        })?;
        let mut pinned = Pinned::new(self, bytes)?;
        pinned.bytes_mut()?.fill(0x3c);
        let mut target = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(driver("allocation"))?;
        let upload_s = time(&mut || pinned.upload(&self.stream, 0, &mut target.as_view_mut()))?;
        drop(target);
        let view = input.as_view();
        let amax_s =
            time(&mut || self.launch_amax(&self.stream, dtype, &view, bytes, &mut amax.as_view_mut()))?;
        let quantize_s =
            time(&mut || self.launch_quantize(&self.stream, dtype, &view, bytes, &scale, &mut plain))?;
        let quantize_stats_s =
            time(&mut || self.launch_quantize(&self.stream, dtype, &view, bytes, &scale, &mut stats))?;
        Ok(Bench {
            bytes,
            elements,
            upload_s,
            copy_s,
            amax_s,
            quantize_s,
            quantize_stats_s,
        })
    }
}

/// Device buffers for one quantized tensor (or window).
pub struct DeviceOutput {
    /// Packed FP4 codes.
    pub packed: CudaSlice<u8>,
    /// E4M3 block scales.
    pub scales: CudaSlice<u8>,
    /// Error sums and counts, when asked for.
    pub stats: Option<(CudaSlice<f64>, CudaSlice<u64>)>,
    /// The bf16 kernel's thresholds for the tensor in hand (8 words per scale byte),
    /// written before each bf16 launch; per output so that streams do not share them.
    thresholds: CudaSlice<u32>,
}

impl DeviceOutput {
    /// Buffers for `elements` elements (zeroed statistics), on `stream`.
    pub fn new(stream: &Arc<CudaStream>, elements: usize, stats: bool) -> Result<DeviceOutput, GpuError> {
        let alloc = driver("allocation");
        Ok(DeviceOutput {
            packed: stream.alloc_zeros::<u8>((elements / 2).max(1)).map_err(&alloc)?,
            scales: stream
                .alloc_zeros::<u8>((elements / BLOCK).max(1))
                .map_err(&alloc)?,
            stats: if stats {
                Some((
                    stream.alloc_zeros::<f64>(2).map_err(&alloc)?,
                    stream.alloc_zeros::<u64>(4).map_err(&alloc)?,
                ))
            } else {
                None
            },
            thresholds: stream.alloc_zeros::<u32>(THRESHOLD_WORDS).map_err(&alloc)?,
        })
    }

    /// Copies the first `elements`' results back (waits for `stream`).
    pub fn download(
        &self,
        stream: &Arc<CudaStream>,
        elements: usize,
    ) -> Result<(Quantized, ErrorStats), GpuError> {
        let copy = driver("device-to-host copy");
        let mut packed = stream.clone_dtoh(&self.packed).map_err(&copy)?;
        let mut scales = stream.clone_dtoh(&self.scales).map_err(&copy)?;
        packed.truncate(elements / 2);
        scales.truncate(elements / BLOCK);
        let (blocks, errors) = match &self.stats {
            Some((sums, counts)) => {
                let sums = stream.clone_dtoh(sums).map_err(&copy)?;
                let counts = stream.clone_dtoh(counts).map_err(&copy)?;
                stats_of(elements, &sums, &counts)
            }
            None => (
                BlockCounts {
                    total: (elements / BLOCK) as u64,
                    ..BlockCounts::default()
                },
                ErrorStats::default(),
            ),
        };
        Ok((
            Quantized {
                packed,
                scales,
                blocks,
            },
            errors,
        ))
    }
}

/// The block counts and error statistics from the kernels' sums and counts.
pub fn stats_of(elements: usize, sums: &[f64], counts: &[u64]) -> (BlockCounts, ErrorStats) {
    (
        BlockCounts {
            total: (elements / BLOCK) as u64,
            zero: counts[1],
            saturated: counts[2],
            underflow: counts[3],
        },
        ErrorStats {
            count: elements as u64,
            sum_sq_error: sums[0],
            sum_sq_weight: sums[1],
            max_abs_error: f64::from_bits(counts[0]),
        },
    )
}

/// The amax kernel's bits as the CPU's value: NaN for any NaN.
pub fn amax_of_bits(bits: u32) -> f32 {
    if bits > 0x7F80_0000 {
        f32::NAN
    } else {
        f32::from_bits(bits)
    }
}

/// A page-locked host buffer, which the GPU copies from and to at full speed and
/// asynchronously. Copies are queued on a stream; the bytes are handed out only once
/// the last copy queued on them has finished.
pub struct Pinned {
    /// Owns the allocation (freed on drop).
    _slice: PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
    pending: Option<CudaEvent>,
}

// SAFETY: the buffer is plain host memory owned by this value; every access goes
// through `&mut self` after waiting for the copies queued on it.
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` bytes of pinned memory.
    pub fn new(gpu: &Gpu, len: usize) -> Result<Pinned, GpuError> {
        let len = len.max(1);
        // SAFETY: the bytes are written before they are read (callers fill them, or
        // the GPU copies into them); flags 0 keeps them cached for the CPU's reads.
        let mut slice =
            unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(len, 0) }.map_err(driver("pinned allocation"))?;
        let ptr = slice.as_mut_ptr().map_err(driver("pinned allocation"))?;
        Ok(Pinned {
            _slice: slice,
            ptr,
            len,
            pending: None,
        })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (never: at least one is allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn wait(&mut self) -> Result<(), GpuError> {
        if let Some(event) = self.pending.take() {
            event.synchronize().map_err(driver("synchronize"))?;
        }
        Ok(())
    }

    /// The bytes, once the copies queued on them are done.
    pub fn bytes(&mut self) -> Result<&[u8], GpuError> {
        self.wait()?;
        // SAFETY: `ptr` holds `len` bytes for as long as `_slice` lives, and no copy
        // is pending on them.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// The bytes, to fill, once the copies queued on them are done.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], GpuError> {
        self.wait()?;
        // SAFETY: as in `bytes`, and `&mut self` makes this the only reference.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// Queues a copy of `dst.len()` bytes from offset `at` of this buffer to `dst` on
    /// `stream`.
    pub fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        at: usize,
        dst: &mut CudaViewMut<'_, u8>,
    ) -> Result<(), GpuError> {
        let len = dst.len();
        self.check(at, len)?;
        self.wait()?;
        let (to, _written) = dst.device_ptr_mut(stream);
        // SAFETY: `at + len` is within the buffer (checked); the host bytes stay
        // untouched until `pending` has been waited for.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                to,
                std::slice::from_raw_parts(self.ptr.add(at), len),
                stream.cu_stream(),
            )
        }
        .map_err(driver("host-to-device copy"))?;
        self.pending = Some(stream.record_event(None).map_err(driver("event"))?);
        Ok(())
    }

    /// Queues a copy of `src` into this buffer at byte offset `at` on `stream`.
    pub fn download<T: DeviceRepr>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, T>,
        at: usize,
    ) -> Result<(), GpuError> {
        let len = src.len() * std::mem::size_of::<T>();
        self.check(at, len)?;
        if !at.is_multiple_of(std::mem::align_of::<T>()) {
            return Err(GpuError::Input(format!(
                "a copy to offset {at}, misaligned for its type"
            )));
        }
        // Copies queued on one stream run in order; only a copy on another stream
        // must be waited for.
        if let Some(event) = &self.pending {
            stream.wait(event).map_err(driver("stream wait"))?;
        }
        let (from, _read) = src.device_ptr(stream);
        // SAFETY: `at + len` is within the buffer and aligned for `T` (checked), and
        // `T: DeviceRepr` is plain data; nothing reads the host bytes until `pending`
        // is done.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.ptr.add(at).cast::<T>(), src.len()),
                from,
                stream.cu_stream(),
            )
        }
        .map_err(driver("device-to-host copy"))?;
        self.pending = Some(stream.record_event(None).map_err(driver("event"))?);
        Ok(())
    }

    fn check(&self, at: usize, len: usize) -> Result<(), GpuError> {
        if at.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(GpuError::Input(format!(
                "a copy of {len} bytes at offset {at} of a pinned buffer of {}",
                self.len
            )));
        }
        Ok(())
    }
}

/// Kernel timings from [`Gpu::bench`], in seconds (medians).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bench {
    /// Input bytes.
    pub bytes: usize,
    /// Input elements.
    pub elements: usize,
    /// A host-to-device copy of the input from pinned memory.
    pub upload_s: f64,
    /// A device-to-device copy of the input.
    pub copy_s: f64,
    /// The amax pass.
    pub amax_s: f64,
    /// Quantization (block scales and packed FP4), without statistics.
    pub quantize_s: f64,
    /// Quantization with error statistics.
    pub quantize_stats_s: f64,
}

impl Bench {
    /// Bytes the quantization reads and writes per element of `dtype`.
    pub fn quantize_bytes(&self) -> f64 {
        self.bytes as f64 + self.elements as f64 * (0.5 + 1.0 / BLOCK as f64)
    }
}

fn check_lanes(dtype: Dtype, bytes: usize, capacity: usize) -> Result<u64, GpuError> {
    if bytes > capacity || !bytes.is_multiple_of(BLOCK * dtype.size()) {
        return Err(GpuError::Input(format!(
            "{bytes} bytes of {} in a buffer of {capacity}: not whole blocks of {BLOCK}",
            dtype.name()
        )));
    }
    Ok((bytes / 16) as u64)
}

/// Deterministic data for [`Gpu::bench`]: weights of a few magnitudes, some blocks zero.
fn bench_data(dtype: Dtype, elements: usize) -> Vec<u8> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut out = Vec::with_capacity(elements * dtype.size());
    for i in 0..elements {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let v = if (i / BLOCK).is_multiple_of(97) {
            0.0
        } else {
            unit * 0.1
        };
        match dtype {
            Dtype::Bf16 => out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&half_bits(v).to_le_bytes()),
            Dtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// f32 to f16 bits, truncating (bench data only: any f16 will do).
fn half_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xFF) as i32 - 127 + 15;
    if exponent <= 0 {
        return sign;
    }
    sign | ((exponent as u16) << 10) | ((bits >> 13) & 0x3FF) as u16
}

/// The PTX for `arch`: from the cache if it is there, else compiled (and cached).
fn load_or_compile(arch: &str, cache: Option<&Path>) -> Result<(Ptx, Option<f64>), GpuError> {
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
fn cache_name(arch: &str) -> String {
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

#[cfg(test)]
mod tests {
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
}
