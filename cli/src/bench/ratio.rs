//! The one ratio of two measured quantities (a prefix-cache hit rate, a speculative
//! acceptance rate), and the rule for a denominator of zero. Not here: which quantities
//! are divided; the figures that use it say.

/// What a ratio is when its denominator is zero (or below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenEmpty {
    /// The ratio is 0: over a run that sous sent the traffic of (`sous bench probe`, `sweep`,
    /// `prefix`, `agent`), an engine counter that is there but did not move means that
    /// nothing was found: a prefix cache that served no prompt token shows 0 %, which the
    /// level table and `compare` can put beside another run.
    Zero,
    /// There is no ratio: over a window watched without sending anything (`sous bench scrape`),
    /// nothing counted means nothing happened, and the rate of nothing is left out
    /// rather than reported as 0 %.
    Absent,
}

/// `num / den`; `None` when either is missing, and `when_empty` when `den` is not
/// positive.
pub fn ratio(num: Option<f64>, den: Option<f64>, when_empty: WhenEmpty) -> Option<f64> {
    match (num, den, when_empty) {
        (Some(n), Some(d), _) if d > 0.0 => Some(n / d),
        (Some(_), Some(_), WhenEmpty::Zero) => Some(0.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_denominator_follows_the_rule_given() {
        for rule in [WhenEmpty::Zero, WhenEmpty::Absent] {
            assert_eq!(ratio(Some(3.0), Some(4.0), rule), Some(0.75));
            assert_eq!(ratio(None, Some(4.0), rule), None);
            assert_eq!(ratio(Some(3.0), None, rule), None);
        }
        assert_eq!(ratio(Some(0.0), Some(0.0), WhenEmpty::Zero), Some(0.0));
        assert_eq!(ratio(Some(0.0), Some(0.0), WhenEmpty::Absent), None);
    }
}
