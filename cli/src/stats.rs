//! Statistics shared by the benchmarks and the evals: a summary of one quantity (mean,
//! median, spread, percentiles) and numpy's default percentile. Not here: what the
//! quantities are (`bench::stats` for requests, `eval::quality` for divergences).

use serde::Serialize;

/// Mean, median, standard deviation and percentiles of one quantity, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Number of values.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// Population standard deviation.
    pub std: f64,
    /// `(percentile, value)` pairs.
    pub percentiles: Vec<(f64, f64)>,
}

impl Summary {
    /// Summarizes `values` (seconds) in milliseconds; all zeros when empty, as vLLM reports.
    pub fn of(values: &[f64], percentiles: &[f64]) -> Summary {
        let mut sorted: Vec<f64> = values.iter().map(|v| v * 1000.0).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let mean = if n == 0 {
            0.0
        } else {
            sorted.iter().sum::<f64>() / n as f64
        };
        let std = if n == 0 {
            0.0
        } else {
            (sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64).sqrt()
        };
        Summary {
            count: n,
            mean,
            median: percentile(&sorted, 50.0),
            std,
            percentiles: percentiles
                .iter()
                .map(|p| (*p, percentile(&sorted, *p)))
                .collect(),
        }
    }

    /// The value at percentile `p`, if it was computed.
    pub fn at(&self, p: f64) -> Option<f64> {
        self.percentiles.iter().find(|(q, _)| *q == p).map(|(_, v)| *v)
    }
}

/// numpy's default percentile of sorted values: linear interpolation between the values
/// at ranks `floor(p/100 * (n-1))` and the next; 0 for no values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (p / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
            let low = rank.floor() as usize;
            let high = (low + 1).min(n - 1);
            sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        // np.percentile([1, 2, 3, 4], [50, 90, 99]) == [2.5, 3.7, 3.97]
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 90.0) - 3.7).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 4.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn summary_is_in_milliseconds_with_population_std() {
        // values 0.001..0.004 s: mean 2.5 ms, np.std = sqrt(1.25) ms
        let s = Summary::of(&[0.004, 0.001, 0.003, 0.002], &[99.0]);
        assert_eq!(s.count, 4);
        assert!((s.mean - 2.5).abs() < 1e-9);
        assert!((s.median - 2.5).abs() < 1e-9);
        assert!((s.std - 1.25f64.sqrt()).abs() < 1e-9);
        assert!((s.at(99.0).expect("p99") - 3.97).abs() < 1e-9);
    }
}
