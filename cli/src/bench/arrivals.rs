//! When the requests of an open-loop level are sent (`sous bench sweep --request-rate R
//! --burstiness B --max-concurrency C`), and the traffic keys every level carries in
//! its JSON (`request_rate`, `burstiness`, `max_concurrency`).
//!
//! The schedule follows `vllm bench serve` (vllm-project/vllm vllm/benchmarks/serve.py
//! get_request), so that a level here and a run there offer the server the same load:
//!
//! - each request waits a gap drawn from a gamma distribution of shape B and scale
//!   `1 / (R × B)` (mean `1 / R`; B = 1 is a Poisson process, B < 1 burstier, B > 1
//!   more even), the first request too, so the first arrival is not at 0;
//! - the arrival times are the running sums of the gaps, then scaled so that the last
//!   one is exactly `N / R` seconds (vLLM does this when it does not ramp, to steady
//!   the throughput across seeds);
//! - at rate `inf` every request arrives at 0; at burstiness `inf` the gaps are all
//!   `1 / R`;
//! - there is no ramp-up: vLLM ramps only with `--ramp-up-strategy`, which sous does
//!   not offer;
//! - a cap on requests in flight is a semaphore taken after arrival, so a request that
//!   finds the cap reached waits (in order of arrival) and is timed from when it is
//!   sent, as in vLLM ([`super::client::run`]).
//!
//! The gaps are drawn with `rand_distr`'s [`Gamma`] (Marsaglia and Tsang's method, as
//! numpy's) from a ChaCha8 generator seeded by `--seed`, so the same seed gives the
//! same times; the values differ from numpy's, the distribution is the same
//! (`scripts/bench/arrivals.py` prints numpy's statistics for comparison).

use rand_distr::{Distribution, Gamma};

use super::BenchError;
use super::prompts;

/// The generator stream of the arrival gaps (the prompts use streams 1 to 7).
const STREAM: u64 = 8;

/// How a level's requests arrive: `vllm bench serve`'s traffic keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Requests per second; `f64::INFINITY`: all at once (`"inf"` in the JSON).
    pub request_rate: f64,
    /// The shape of the gamma distribution of the gaps (`f64::INFINITY`: even gaps).
    pub burstiness: f64,
    /// The most requests in flight; none: no cap (`null` in the JSON).
    pub max_concurrency: Option<usize>,
}

impl Traffic {
    /// A closed loop of `concurrency` streams: in vLLM's terms every request arrives at
    /// once and at most `concurrency` are in flight.
    pub fn closed(concurrency: usize) -> Traffic {
        Traffic {
            request_rate: f64::INFINITY,
            burstiness: 1.0,
            max_concurrency: Some(concurrency),
        }
    }

    /// Whether the level is described by its concurrency alone (every request at once,
    /// a cap in force), as the closed-loop levels always are.
    pub fn is_closed(&self) -> bool {
        self.request_rate.is_infinite() && self.max_concurrency.is_some()
    }

    /// The level in words: `concurrency 4`, `rate 20/s`, `rate 20/s, at most 4 in flight`.
    pub fn name(&self) -> String {
        match (self.is_closed(), self.max_concurrency) {
            (true, Some(c)) => format!("concurrency {c}"),
            (_, Some(c)) => format!("rate {}, at most {c} in flight", rate_text(self.request_rate)),
            (_, None) => format!("rate {}", rate_text(self.request_rate)),
        }
    }
}

/// `20/s`, `0.5/s`, `inf`.
pub fn rate_text(rate: f64) -> String {
    if rate.is_finite() {
        format!("{rate}/s")
    } else {
        "inf".to_owned()
    }
}

/// Parses `--request-rate`: a positive number of requests per second, or `inf`.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    positive_or_inf(text).ok_or_else(|| {
        format!("`{text}` is not a request rate: give a positive number of requests per second, or inf")
    })
}

/// Parses `--burstiness`: a positive number, or `inf` (evenly spaced arrivals).
pub fn parse_burstiness(text: &str) -> Result<f64, String> {
    positive_or_inf(text).ok_or_else(|| {
        format!(
            "`{text}` is not a burstiness: give a positive number (1: Poisson arrivals, below 1 \
             burstier, above 1 more even), or inf"
        )
    })
}

/// Parses `--max-concurrency`: a whole number of at least 1.
pub fn parse_max_concurrency(text: &str) -> Result<usize, String> {
    text.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| {
            format!("`{text}` is not a number of requests in flight: give a whole number of at least 1")
        })
}

fn positive_or_inf(text: &str) -> Option<f64> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("inf") {
        return Some(f64::INFINITY);
    }
    text.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0)
}

/// `count` gaps between arrivals at `rate` requests per second, in seconds, drawn from
/// `seed` before any scaling: gamma of shape `burstiness` and scale
/// `1 / (rate × burstiness)`; all 0 at rate `inf`, all `1 / rate` at burstiness `inf`.
pub fn gaps(seed: u64, count: usize, rate: f64, burstiness: f64) -> Result<Vec<f64>, BenchError> {
    let bad = || BenchError::Traffic { rate, burstiness };
    if rate.is_nan() || rate <= 0.0 || burstiness.is_nan() || burstiness <= 0.0 {
        return Err(bad());
    }
    if rate.is_infinite() {
        return Ok(vec![0.0; count]);
    }
    if burstiness.is_infinite() {
        return Ok(vec![1.0 / rate; count]);
    }
    let gamma = Gamma::new(burstiness, 1.0 / (rate * burstiness)).map_err(|_| bad())?;
    let mut rng = prompts::rng(seed, STREAM);
    Ok((0..count).map(|_| gamma.sample(&mut rng)).collect())
}

/// When each of `count` requests is sent, seconds from the level's start: the running
/// sums of [`gaps`], scaled so that the last is `count / rate` (at a finite rate).
pub fn schedule(seed: u64, count: usize, rate: f64, burstiness: f64) -> Result<Vec<f64>, BenchError> {
    let mut times = gaps(seed, count, rate, burstiness)?;
    let mut sum = 0.0;
    for t in &mut times {
        sum += *t;
        *t = sum;
    }
    if let Some(&last) = times.last()
        && last > 0.0
        && rate.is_finite()
    {
        let factor = count as f64 / rate / last;
        for t in &mut times {
            *t *= factor;
        }
    }
    Ok(times)
}

#[cfg(test)]
#[allow(
    clippy::print_stderr,
    reason = "the statistics are printed for benchmarks/bench.md"
)]
mod tests {
    use super::*;

    const N: usize = 20_000;
    const RATE: f64 = 20.0;

    /// The regularized lower incomplete gamma function P(a, x) by its power series
    /// (Abramowitz and Stegun 6.5.29), with `gamma_a1` = Γ(a + 1) given: enough for the
    /// shapes tested, whose Γ are known in closed form.
    fn lower_gamma(a: f64, gamma_a1: f64, x: f64) -> f64 {
        if x <= 0.0 {
            return 0.0;
        }
        let (mut term, mut sum) = (1.0, 1.0);
        for n in 1..2000 {
            term *= x / (a + n as f64);
            sum += term;
            if term < sum * 1e-17 {
                break;
            }
        }
        (x.powf(a) * (-x).exp() / gamma_a1 * sum).min(1.0)
    }

    /// The gamma CDF of shape `k` (0.5, 1 or 2) and scale `theta`.
    fn gamma_cdf(k: f64, theta: f64, x: f64) -> f64 {
        let gamma_k1 = match k {
            0.5 => std::f64::consts::PI.sqrt() / 2.0,
            1.0 => 1.0,
            2.0 => 2.0,
            _ => panic!("no Γ({k} + 1) here"),
        };
        lower_gamma(k, gamma_k1, x / theta)
    }

    /// The Kolmogorov–Smirnov statistic of `values` against `cdf`.
    fn ks(values: &[f64], cdf: impl Fn(f64) -> f64) -> f64 {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        sorted
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let f = cdf(*x);
                (f - i as f64 / n).abs().max(((i + 1) as f64 / n - f).abs())
            })
            .fold(0.0, f64::max)
    }

    fn mean_and_cv(values: &[f64]) -> (f64, f64) {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt() / mean)
    }

    /// The gaps of a schedule: its first time, then the differences.
    fn intervals(times: &[f64]) -> Vec<f64> {
        let mut previous = 0.0;
        times
            .iter()
            .map(|t| {
                let gap = t - previous;
                previous = *t;
                gap
            })
            .collect()
    }

    #[test]
    fn the_reference_cdf_is_right() {
        // Shape 1: exponential; shape 2: 1 - e^-x (1 + x); shape 0.5: erf(sqrt(x)),
        // erf(1) = 0.8427007929497149.
        for x in [0.01, 0.3, 1.0, 2.5, 7.0, 30.0] {
            assert!((gamma_cdf(1.0, 1.0, x) - (1.0 - (-x).exp())).abs() < 1e-12, "{x}");
            assert!(
                (gamma_cdf(2.0, 1.0, x) - (1.0 - (-x).exp() * (1.0 + x))).abs() < 1e-12,
                "{x}"
            );
        }
        assert!((gamma_cdf(0.5, 1.0, 1.0) - 0.842_700_792_949_714_9).abs() < 1e-12);
        assert!((gamma_cdf(0.5, 2.0, 2.0) - 0.842_700_792_949_714_9).abs() < 1e-12);
    }

    #[test]
    fn gaps_have_the_mean_rate_and_the_gamma_shape() {
        // 1.95 / sqrt(n): the KS statistic a right sampler stays under with 99.9 %.
        let bound = 1.95 / (N as f64).sqrt();
        eprintln!(
            "shape  mean gap ms (want 50)  CV (want 1/sqrt(shape))  KS raw  KS scheduled  (bound {bound:.4})"
        );
        for shape in [0.5, 1.0, 2.0] {
            let theta = 1.0 / (RATE * shape);
            let raw = gaps(0, N, RATE, shape).expect("gaps");
            let (mean, cv) = mean_and_cv(&raw);
            let want_cv = 1.0 / shape.sqrt();
            let d_raw = ks(&raw, |x| gamma_cdf(shape, theta, x));
            let times = schedule(0, N, RATE, shape).expect("schedule");
            let scheduled = intervals(&times);
            let (_, cv_scheduled) = mean_and_cv(&scheduled);
            let d_scheduled = ks(&scheduled, |x| gamma_cdf(shape, theta, x));
            eprintln!(
                "{shape:<5}  {:<22.3}  {cv:.4} ({want_cv:.4})         {d_raw:.4}  {d_scheduled:.4}",
                mean * 1000.0
            );
            // Within 3 standard errors of the mean (CV / sqrt(n)): 3.0 %, 2.1 % and 1.5 %
            // for shapes 0.5, 1 and 2.
            let tolerance = 3.0 * want_cv / (N as f64).sqrt();
            assert!(
                (mean * RATE - 1.0).abs() < tolerance,
                "shape {shape}: mean gap {mean}"
            );
            // About 3 standard errors of the sample CV at shape 0.5 (kurtosis 15).
            assert!(
                (cv / want_cv - 1.0).abs() < 0.04,
                "shape {shape}: CV {cv}, want {want_cv}"
            );
            assert!(
                (cv_scheduled / want_cv - 1.0).abs() < 0.04,
                "shape {shape}: CV {cv_scheduled}"
            );
            assert!(
                d_raw < bound,
                "shape {shape}: KS {d_raw} against gamma({shape}, {theta})"
            );
            assert!(
                d_scheduled < bound,
                "shape {shape}: KS {d_scheduled} after scaling"
            );
            // The scaling puts the last arrival at exactly N / rate, as vLLM does.
            let last = times.last().copied().expect("times");
            assert!((last - N as f64 / RATE).abs() < 1e-9, "{last}");
            assert!(times.windows(2).all(|w| w[0] <= w[1]) && times[0] > 0.0);
            // The test can tell shapes apart: the same draws against the exponential
            // of the same mean (a sampler that ignored the burstiness) are far off.
            if shape != 1.0 {
                let d_wrong = ks(&raw, |x| gamma_cdf(1.0, 1.0 / RATE, x));
                assert!(d_wrong > 5.0 * bound, "shape {shape} vs exponential: {d_wrong}");
            }
        }
        // A scale of 1/rate instead of 1/(rate × burstiness) moves the mean: caught.
        let raw = gaps(0, N, RATE, 2.0).expect("gaps");
        let d_wrong_scale = ks(&raw, |x| gamma_cdf(2.0, 1.0 / RATE, x));
        assert!(d_wrong_scale > 5.0 * bound, "{d_wrong_scale}");
    }

    #[test]
    fn the_seed_fixes_the_times_and_inf_sends_at_once() {
        let a = schedule(7, 100, 5.0, 0.5).expect("schedule");
        assert_eq!(a, schedule(7, 100, 5.0, 0.5).expect("schedule"));
        assert_ne!(a, schedule(8, 100, 5.0, 0.5).expect("schedule"));
        // Another rate with the same seed and burstiness: the same pattern, rescaled.
        let b = schedule(7, 100, 10.0, 0.5).expect("schedule");
        assert!(a.iter().zip(&b).all(|(x, y)| (x - 2.0 * y).abs() < 1e-9));
        assert_eq!(schedule(7, 4, f64::INFINITY, 0.5).expect("inf"), vec![0.0; 4]);
        let even = schedule(7, 4, 4.0, f64::INFINITY).expect("even");
        assert!(
            even.iter()
                .zip([0.25, 0.5, 0.75, 1.0])
                .all(|(x, y)| (x - y).abs() < 1e-12)
        );
        assert!(schedule(7, 0, 4.0, 1.0).expect("none").is_empty());
        assert!(gaps(7, 4, 0.0, 1.0).is_err() && gaps(7, 4, 1.0, -1.0).is_err());
    }

    #[test]
    fn flags_parse_and_name_what_is_wrong() {
        assert_eq!(parse_rate("20"), Ok(20.0));
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        assert_eq!(parse_rate("inf"), Ok(f64::INFINITY));
        for bad in ["0", "-1", "nan", "x", "", "1e999"] {
            assert!(
                parse_rate(bad).expect_err(bad).contains("is not a request rate"),
                "{bad}"
            );
        }
        assert_eq!(parse_burstiness("inf"), Ok(f64::INFINITY));
        assert!(
            parse_burstiness("0")
                .expect_err("0")
                .contains("is not a burstiness")
        );
        assert_eq!(parse_max_concurrency("4"), Ok(4));
        assert!(parse_max_concurrency("0").is_err() && parse_max_concurrency("-2").is_err());
        assert_eq!(Traffic::closed(4).name(), "concurrency 4");
        let open = Traffic {
            request_rate: 20.0,
            burstiness: 1.0,
            max_concurrency: None,
        };
        assert_eq!(open.name(), "rate 20/s");
        assert!(!open.is_closed());
        let capped = Traffic {
            max_concurrency: Some(2),
            ..open
        };
        assert_eq!(capped.name(), "rate 20/s, at most 2 in flight");
    }
}
