//! A borrowed weight matrix: raw little-endian bytes (straight from a memory-mapped
//! safetensors file, so with no alignment promise), an element type and a shape.

use crate::BLOCK;
use crate::KernelError;
use crate::formats::bf16::{bf16_to_f32, f16_to_f32};

/// The 16- and 32-bit float element types of a checkpoint: what `sous quantize` reads
/// and `sous import` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }

    /// The safetensors name (`BF16`, `F16`, `F32`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
        }
    }

    /// The name transformers writes in `config.json` (`torch_dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bfloat16",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
        }
    }
}

/// `rows x cols` weights, row-major, `cols` a multiple of 16.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    dtype: Dtype,
    rows: usize,
    cols: usize,
    data: &'a [u8],
}

impl<'a> Matrix<'a> {
    /// Checks the shape against the buffer and the block size.
    pub fn new(dtype: Dtype, rows: usize, cols: usize, data: &'a [u8]) -> Result<Matrix<'a>, KernelError> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(KernelError::NotBlockAligned { cols });
        }
        let expected = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(dtype.size()))
            .unwrap_or(usize::MAX);
        if data.len() != expected {
            return Err(KernelError::WrongLength {
                rows,
                cols,
                dtype: dtype.name(),
                expected,
                actual: data.len(),
            });
        }
        Ok(Matrix {
            dtype,
            rows,
            cols,
            data,
        })
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features, the packing dimension).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The raw bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The raw bytes of rows `first..first + count`.
    pub fn rows_data(&self, first: usize, count: usize) -> &'a [u8] {
        let width = self.cols * self.dtype.size();
        &self.data[first * width..(first + count) * width]
    }

    /// Element `index` (row-major), exactly as f32.
    pub fn get(&self, index: usize) -> f32 {
        element(self.dtype, self.data, index)
    }
}

/// Element `index` of little-endian `data` of type `dtype`, exactly as f32.
pub(crate) fn element(dtype: Dtype, data: &[u8], index: usize) -> f32 {
    match dtype {
        Dtype::Bf16 => bf16_to_f32(u16::from_le_bytes([data[2 * index], data[2 * index + 1]])),
        Dtype::F16 => f16_to_f32(u16::from_le_bytes([data[2 * index], data[2 * index + 1]])),
        Dtype::F32 => f32::from_le_bytes([
            data[4 * index],
            data[4 * index + 1],
            data[4 * index + 2],
            data[4 * index + 3],
        ]),
    }
}
