//! What the kernels refuse.

/// A tensor the kernels cannot quantize as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The last dimension is not a multiple of the 16-element block.
    #[error("the input dimension is {cols}, which is not a multiple of 16 (NVFP4 blocks are 16 wide)")]
    NotBlockAligned {
        /// The offending dimension.
        cols: usize,
    },
    /// The last dimension is not a multiple of Q8_0's 32-element block.
    #[error("the input dimension is {cols}, which is not a multiple of 32 (Q8_0 blocks are 32 wide)")]
    NotQ8Aligned {
        /// The offending dimension.
        cols: usize,
    },
    /// The byte buffer does not hold `rows * cols` elements of the dtype.
    #[error("{rows} x {cols} {dtype} elements need {expected} bytes, the buffer has {actual}")]
    WrongLength {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Element type.
        dtype: &'static str,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
}
