//! A quantile estimated from a histogram's buckets exactly as Prometheus's
//! `histogram_quantile` estimates it (`bucketQuantile` in prometheus
//! `promql/quantile.go`): rank = q × count, the first bucket whose cumulative count
//! reaches the rank, linear interpolation within it, and the largest finite bound for a
//! rank in the `+Inf` bucket. Not here: which buckets (the analysis sums them).
//!
//! `bench scrape --prometheus` takes the Prometheus server's own figures instead; they
//! agree with these step for step. Releases before `correctPrecisionErrors` (Debian
//! bookworm's 2.42 among them) skip that step, which only evens out bucket counts
//! within 1e-12 of each other.

/// A quantile estimated from buckets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantile {
    /// The estimate, in the histogram's unit.
    pub value: f64,
    /// It fell in the `+Inf` bucket: `value` is the largest finite bound.
    pub beyond_last_bucket: bool,
}

/// Prometheus's `bucketQuantile` (`promql/quantile.go`) over `(le, cumulative count)`
/// pairs: `None` where it returns NaN (no observations, no `+Inf` bucket, fewer than two
/// buckets, q outside 0..=1).
pub fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<Quantile> {
    if !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut sorted = buckets.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    if !sorted.last().is_some_and(|b| b.0 == f64::INFINITY) {
        return None;
    }
    // coalesceBuckets: equal bounds (`0.1` and `0.10`) add up.
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
    for (le, count) in sorted {
        match merged.last_mut() {
            Some(last) if last.0 == le => last.1 += count,
            _ => merged.push((le, count)),
        }
    }
    // correctPrecisionErrors (tolerance 1e-12), then ensureMonotonic.
    let mut prev = merged[0].1;
    for b in merged.iter_mut().skip(1) {
        let delta = (b.1 - prev).abs();
        if delta == 0.0 {
            continue;
        }
        if delta / b.1 <= 1e-12 {
            b.1 = prev;
        } else {
            prev = b.1;
        }
    }
    let mut max = merged[0].1;
    for b in merged.iter_mut().skip(1) {
        if b.1 > max {
            max = b.1;
        } else {
            b.1 = max;
        }
    }
    let n = merged.len();
    if n < 2 {
        return None;
    }
    let observations = merged[n - 1].1;
    if observations == 0.0 {
        return None;
    }
    let rank = q * observations;
    // sort.Search over all but the +Inf bucket.
    let b = merged[..n - 1].partition_point(|b| b.1 < rank);
    if b == n - 1 {
        return Some(Quantile {
            value: merged[n - 2].0,
            beyond_last_bucket: true,
        });
    }
    if b == 0 && merged[0].0 <= 0.0 {
        return Some(Quantile {
            value: merged[0].0,
            beyond_last_bucket: false,
        });
    }
    let (start, end) = (if b > 0 { merged[b - 1].0 } else { 0.0 }, merged[b].0);
    let (below, count) = if b > 0 {
        (merged[b - 1].1, merged[b].1 - merged[b - 1].1)
    } else {
        (0.0, merged[b].1)
    };
    Some(Quantile {
        value: start + (end - start) * ((rank - below) / count),
        beyond_last_bucket: false,
    })
}
