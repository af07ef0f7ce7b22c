//! Page-locked host buffers ([`Pinned`]) and the asynchronous copies between them and
//! the device, each waited for before its bytes are handed out.

use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PinnedHostSlice,
};

use super::error::driver;
use super::{Gpu, GpuError};

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
