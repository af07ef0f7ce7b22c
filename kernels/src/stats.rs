//! What quantization did to a tensor: how many blocks needed a placeholder or a clamped
//! scale, and how far the dequantized weights are from the originals.

use crate::scale::BlockKind;

/// Blocks by what happened to their scale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounts {
    /// All blocks.
    pub total: u64,
    /// All-zero blocks.
    pub zero: u64,
    /// Blocks whose scale was clamped at the FP8 maximum (their largest weights clip).
    pub saturated: u64,
    /// Non-zero blocks whose scale was below FP8's range.
    pub underflow: u64,
}

impl BlockCounts {
    /// Counts one block.
    pub fn add(&mut self, kind: BlockKind) {
        self.total += 1;
        match kind {
            BlockKind::Normal => {}
            BlockKind::Zero => self.zero += 1,
            BlockKind::Saturated => self.saturated += 1,
            BlockKind::Underflow => self.underflow += 1,
        }
    }

    /// The sum of two counts.
    pub fn merge(self, other: BlockCounts) -> BlockCounts {
        BlockCounts {
            total: self.total + other.total,
            zero: self.zero + other.zero,
            saturated: self.saturated + other.saturated,
            underflow: self.underflow + other.underflow,
        }
    }
}

/// Dequantized vs. original weights.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ErrorStats {
    /// Elements compared.
    pub count: u64,
    /// Sum of squared errors.
    pub sum_sq_error: f64,
    /// Sum of squared original weights.
    pub sum_sq_weight: f64,
    /// Largest absolute error.
    pub max_abs_error: f64,
}

impl ErrorStats {
    /// Adds one element: the original `weight` and its dequantized value.
    pub fn add(&mut self, weight: f32, dequantized: f32) {
        let error = f64::from(dequantized) - f64::from(weight);
        self.count += 1;
        self.sum_sq_error += error * error;
        self.sum_sq_weight += f64::from(weight) * f64::from(weight);
        // NaN compares false, so a NaN error must be let through explicitly.
        if error.abs() > self.max_abs_error || error.is_nan() {
            self.max_abs_error = error.abs();
        }
    }

    /// The combination of two partial results.
    pub fn merge(self, other: ErrorStats) -> ErrorStats {
        ErrorStats {
            count: self.count + other.count,
            sum_sq_error: self.sum_sq_error + other.sum_sq_error,
            sum_sq_weight: self.sum_sq_weight + other.sum_sq_weight,
            max_abs_error: if other.max_abs_error > self.max_abs_error || other.max_abs_error.is_nan() {
                other.max_abs_error
            } else {
                self.max_abs_error
            },
        }
    }

    /// `||dequantized - original|| / ||original||`; 0 for an all-zero tensor
    /// reproduced exactly.
    pub fn relative_rms_error(&self) -> f64 {
        if self.sum_sq_weight == 0.0 {
            if self.sum_sq_error == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (self.sum_sq_error / self.sum_sq_weight).sqrt()
        }
    }
}
