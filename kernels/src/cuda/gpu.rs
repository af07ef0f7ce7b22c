//! One CUDA device with the NVFP4 kernels loaded ([`Gpu`]): opening it, and launching
//! the amax, quantize and dequantize kernels on device buffers or whole matrices. Not
//! here: compiling the kernels (`compile`), the result buffers (`output`), pinned host
//! memory (`pinned`) or the kernels' timings (`bench`).

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};

use super::compile::{load_or_compile, nvrtc_archs, virtual_arch};
use super::error::driver;
use super::{DeviceOutput, GpuError, THREADS, THRESHOLD_WORDS, amax_of_bits};
use crate::reference::Quantized;
use crate::scale::{Flavor, TensorScale};
use crate::stats::ErrorStats;
use crate::{BLOCK, Dtype, Matrix};

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
    /// compute_90 in N ms)`, N the milliseconds NVRTC took.
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
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
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
            // (benchmarks/native.md, "Figures that were in code comments").
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
