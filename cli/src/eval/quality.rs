//! The figures of `sous eval`, computed from the log-probabilities a server returns for
//! each scored position: perplexity with its standard error, and, against a baseline
//! scored over the same tokens, the change in perplexity, the KL divergence of the
//! candidate's next-token distribution from the baseline's, and how often their most
//! likely tokens agree. The statistics are those `llama-perplexity --kl-divergence`
//! prints (`ggml-org/llama.cpp:tools/perplexity/perplexity.cpp`): a mean with its
//! standard error (± one standard error, not a 95 % interval), and percentiles of the
//! per-position KL divergence.
//!
//! A server returns the top k log-probabilities of each position, not the whole
//! distribution, so the KL divergence is computed over the tokens both servers returned
//! plus one bucket for everything else (`coarse_kl`). Merging outcomes never increases
//! a KL divergence (the log-sum inequality), so the figure is a lower bound of the true
//! one, and equal to it when the returned tokens hold all the probability.

use serde::{Deserialize, Serialize};

/// One scored position: the token that came next in the text, its log-probability, and
/// the k most likely tokens with theirs (most likely first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// The text's next token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f64,
    /// The most likely tokens, most likely first.
    pub top: Vec<(u32, f64)>,
}

impl Position {
    /// The log-probability of `token` if this position returned it.
    fn logprob_of(&self, token: u32) -> Option<f64> {
        if token == self.token {
            return Some(self.logprob);
        }
        self.top.iter().find(|(t, _)| *t == token).map(|(_, l)| *l)
    }

    /// The most likely token, when the server returned any.
    pub fn argmax(&self) -> Option<u32> {
        self.top.first().map(|(t, _)| *t)
    }
}

/// A mean and its standard error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The value.
    pub value: f64,
    /// One standard error.
    pub stderr: f64,
}

/// Mean and standard error of the mean of `values` (0 with fewer than two).
fn mean_stderr(values: impl Iterator<Item = f64> + Clone) -> (f64, f64, usize) {
    let n = values.clone().count();
    if n == 0 {
        return (f64::NAN, f64::NAN, 0);
    }
    let mean = values.clone().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0, n);
    }
    let var = values.map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64;
    (mean, (var / n as f64).sqrt(), n)
}

/// Perplexity over scored positions: `exp(mean negative log-likelihood)`, with
/// llama.cpp's error `ppl × stderr(nll)` ("Final estimate: PPL = … +/- …").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Perplexity {
    /// The perplexity and its standard error.
    pub perplexity: Estimate,
    /// Mean negative log-likelihood per token (nats).
    pub mean_nll: f64,
    /// Positions scored.
    pub tokens: usize,
}

/// The perplexity of `positions`.
pub fn perplexity(positions: &[Position]) -> Perplexity {
    let (nll, se, n) = mean_stderr(positions.iter().map(|p| -p.logprob));
    let ppl = nll.exp();
    Perplexity {
        perplexity: Estimate {
            value: ppl,
            stderr: ppl * se,
        },
        mean_nll: nll,
        tokens: n,
    }
}

/// A candidate against a baseline over the same positions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Positions compared.
    pub tokens: usize,
    /// The k of the top-k log-probabilities the figures come from.
    pub top_k: usize,
    /// PPL(candidate) − PPL(baseline), from the paired per-token differences of the
    /// log-likelihood: `PPL(base) × (exp(mean d) − 1)`, its error `PPL(base) × exp(mean
    /// d) × stderr(d)`.
    pub delta_perplexity: Estimate,
    /// PPL(candidate) / PPL(baseline) = exp(mean d).
    pub perplexity_ratio: Estimate,
    /// Mean KL divergence (nats) of the candidate from the baseline, per position.
    pub kld_mean: Estimate,
    /// Percentiles of the per-position KL divergence.
    pub kld_p90: f64,
    /// 99th percentile.
    pub kld_p99: f64,
    /// The largest.
    pub kld_max: f64,
    /// Share of positions whose most likely token is the same (0–1).
    pub top1_agreement: Estimate,
    /// Probability mass of the baseline outside the tokens both servers returned, mean
    /// over positions: what the top-k approximation merged into one bucket.
    pub unseen_mass_mean: f64,
}

/// Why two runs cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    /// Different numbers of positions.
    #[error("the baseline scored {baseline} positions and the candidate {candidate}")]
    Length {
        /// Baseline positions.
        baseline: usize,
        /// Candidate positions.
        candidate: usize,
    },
    /// The same position holds different tokens: the servers tokenized differently.
    #[error("position {index} holds token {baseline} for the baseline and {candidate} for the candidate")]
    Token {
        /// The position.
        index: usize,
        /// The baseline's token.
        baseline: u32,
        /// The candidate's.
        candidate: u32,
    },
    /// No top-k log-probabilities to compare distributions with.
    #[error("the servers returned no top log-probabilities (k = 0)")]
    NoTop,
}

/// KL(P ‖ Q) over the tokens whose log-probabilities both `p` and `q` returned, the rest
/// of each distribution merged into one outcome; and the baseline's merged mass.
pub fn coarse_kl(p: &Position, q: &Position) -> (f64, f64) {
    let mut tokens: Vec<u32> = p.top.iter().map(|(t, _)| *t).collect();
    tokens.push(p.token);
    tokens.sort_unstable();
    tokens.dedup();
    let (mut kl, mut p_seen, mut q_seen) = (0.0, 0.0, 0.0);
    for t in tokens {
        let (Some(lp), Some(lq)) = (p.logprob_of(t), q.logprob_of(t)) else {
            continue;
        };
        let pp = lp.exp();
        kl += pp * (lp - lq);
        p_seen += pp;
        q_seen += lq.exp();
    }
    let p_rest = (1.0 - p_seen).max(0.0);
    let q_rest = (1.0 - q_seen).max(0.0);
    // Below f32's resolution of a sum near 1 the bucket is rounding, not probability.
    if p_rest > 1e-6 {
        kl += p_rest * (p_rest / q_rest.max(1e-12)).ln();
    }
    (kl.max(0.0), p_rest)
}

/// The candidate's positions against the baseline's, position by position.
pub fn compare(
    baseline: &[Position],
    candidate: &[Position],
    top_k: usize,
) -> Result<Comparison, CompareError> {
    if baseline.len() != candidate.len() {
        return Err(CompareError::Length {
            baseline: baseline.len(),
            candidate: candidate.len(),
        });
    }
    if top_k == 0 {
        return Err(CompareError::NoTop);
    }
    let mut kls = Vec::with_capacity(baseline.len());
    let mut unseen = 0.0;
    let mut same = Vec::with_capacity(baseline.len());
    let mut d = Vec::with_capacity(baseline.len());
    for (index, (p, q)) in baseline.iter().zip(candidate).enumerate() {
        if p.token != q.token {
            return Err(CompareError::Token {
                index,
                baseline: p.token,
                candidate: q.token,
            });
        }
        let (kl, rest) = coarse_kl(p, q);
        kls.push(kl);
        unseen += rest;
        same.push(if p.argmax().is_some() && p.argmax() == q.argmax() {
            1.0
        } else {
            0.0
        });
        d.push(p.logprob - q.logprob);
    }
    let n = baseline.len();
    let base = perplexity(baseline).perplexity.value;
    let (mean_d, se_d, _) = mean_stderr(d.iter().copied());
    let ratio = mean_d.exp();
    let (kl_mean, kl_se, _) = mean_stderr(kls.iter().copied());
    let (agree, _, _) = mean_stderr(same.iter().copied());
    kls.sort_by(f64::total_cmp);
    let pct = |p: f64| crate::stats::percentile(&kls, p);
    Ok(Comparison {
        tokens: n,
        top_k,
        delta_perplexity: Estimate {
            value: base * (ratio - 1.0),
            stderr: base * ratio * se_d,
        },
        perplexity_ratio: Estimate {
            value: ratio,
            stderr: ratio * se_d,
        },
        kld_mean: Estimate {
            value: kl_mean,
            stderr: kl_se,
        },
        kld_p90: pct(90.0),
        kld_p99: pct(99.0),
        kld_max: kls.last().copied().unwrap_or(0.0),
        // The binomial standard error, as llama.cpp gives "Same top p".
        top1_agreement: Estimate {
            value: agree,
            stderr: (agree * (1.0 - agree) / n as f64).sqrt(),
        },
        unseen_mass_mean: unseen / n as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(token: u32, dist: &[(u32, f64)]) -> Position {
        let logprob = dist
            .iter()
            .find(|(t, _)| *t == token)
            .map_or(-30.0, |(_, p)| p.ln());
        let mut top: Vec<(u32, f64)> = dist.iter().map(|(t, p)| (*t, p.ln())).collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        Position { token, logprob, top }
    }

    #[test]
    fn perplexity_is_exp_of_the_mean_nll() {
        let ps = [pos(1, &[(1, 0.5)]), pos(1, &[(1, 0.25)])];
        let r = perplexity(&ps);
        // mean nll = (ln 2 + ln 4) / 2 = 1.5 ln 2; ppl = 2^1.5.
        assert!((r.perplexity.value - 2f64.powf(1.5)).abs() < 1e-12);
        assert_eq!(r.tokens, 2);
        assert!(r.perplexity.stderr > 0.0);
    }

    #[test]
    fn a_model_against_itself_has_no_divergence() {
        let ps = vec![pos(1, &[(1, 0.6), (2, 0.3), (3, 0.1)]); 10];
        let c = compare(&ps, &ps, 3).expect("compare");
        assert_eq!(c.kld_mean.value, 0.0);
        assert_eq!(c.kld_max, 0.0);
        assert_eq!(c.top1_agreement.value, 1.0);
        assert_eq!(c.delta_perplexity.value, 0.0);
    }

    #[test]
    fn full_distributions_give_the_exact_kl() {
        let p = pos(1, &[(1, 0.6), (2, 0.3), (3, 0.1)]);
        let q = pos(1, &[(1, 0.3), (2, 0.5), (3, 0.2)]);
        let exact = 0.6 * (0.6f64 / 0.3).ln() + 0.3 * (0.3f64 / 0.5).ln() + 0.1 * (0.1f64 / 0.2).ln();
        let (kl, rest) = coarse_kl(&p, &q);
        assert!((kl - exact).abs() < 1e-12, "{kl} vs {exact}");
        assert!(rest < 1e-12);
        let c = compare(&[p], &[q], 3).expect("compare");
        assert_eq!(c.top1_agreement.value, 0.0);
    }

    #[test]
    fn top_k_merges_the_rest_into_a_lower_bound() {
        // Four outcomes; each side returns its top two only.
        let full_p: [(u32, f64); 4] = [(1, 0.5), (2, 0.3), (3, 0.15), (4, 0.05)];
        let full_q: [(u32, f64); 4] = [(1, 0.4), (2, 0.2), (3, 0.05), (4, 0.35)];
        let exact: f64 = full_p
            .iter()
            .zip(&full_q)
            .map(|((_, p), (_, q))| p * (p / q).ln())
            .sum();
        let p = pos(1, &full_p[..2]);
        let q = pos(1, &full_q[..2]);
        let (kl, rest) = coarse_kl(&p, &q);
        // Tokens 1 and 2 seen; 3 and 4 merged: 0.2 against 0.4.
        let merged = 0.5 * (0.5f64 / 0.4).ln() + 0.3 * (0.3f64 / 0.2).ln() + 0.2 * (0.2f64 / 0.4).ln();
        assert!((kl - merged).abs() < 1e-12);
        assert!((rest - 0.2).abs() < 1e-12);
        assert!(kl <= exact);
    }

    #[test]
    fn a_token_only_one_side_returned_goes_to_the_bucket() {
        let p = pos(1, &[(1, 0.5), (2, 0.4)]);
        let q = pos(1, &[(1, 0.5), (3, 0.4)]);
        let (kl, rest) = coarse_kl(&p, &q);
        // Seen: token 1 only. Rest 0.5 vs 0.5.
        assert!(kl.abs() < 1e-12);
        assert!((rest - 0.5).abs() < 1e-12);
    }

    #[test]
    fn different_tokens_are_refused() {
        let a = [pos(1, &[(1, 1.0)])];
        let b = [pos(2, &[(2, 1.0)])];
        assert!(matches!(
            compare(&a, &b, 1),
            Err(CompareError::Token { index: 0, .. })
        ));
        assert!(matches!(compare(&a, &[], 1), Err(CompareError::Length { .. })));
    }
}
