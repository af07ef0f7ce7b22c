//! Why the GPU path cannot run ([`GpuError`]), and the mapping of a failed driver call
//! into it.

use cudarc::driver::DriverError;

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

pub(super) fn driver(what: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| GpuError::driver(what, e)
}
