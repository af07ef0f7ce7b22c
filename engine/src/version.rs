//! Engine release numbers, compared the way the adapters need: `0.27.1` < `0.33.0`.
//!
//! Engines version like Python packages (PEP 440: `0.10.1.1`, `0.11.0rc1`,
//! `1.3.0rc15`, `0.9.2+cu130`), not like semver, so the `semver` crate refuses some of
//! them; and a full PEP 440 implementation would be more than the adapters use. What
//! they need is "is this release at least X.Y.Z": three numeric components, and a
//! pre-release sorting before its release.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// An engine release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Major, minor, patch and a fourth component (`0.10.1.1`).
    numbers: [u32; 4],
    /// `rc1`, `a2`, `dev3`: sorts before the release it precedes.
    pre_release: bool,
    raw: String,
}

/// A version string that is not a release number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a release number such as `0.27.1` or `1.3.0rc15`")]
pub struct VersionError(pub String);

impl Version {
    /// A release from its numbers.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            numbers: [major, minor, patch, 0],
            pre_release: false,
            raw: String::new(),
        }
    }

    /// `self >= major.minor.patch`.
    pub fn at_least(&self, major: u32, minor: u32, patch: u32) -> bool {
        *self >= Version::new(major, minor, patch)
    }
}

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || VersionError(text.to_owned());
        let trimmed = text.trim().trim_start_matches('v');
        let trimmed = trimmed.split('+').next().unwrap_or_default();
        let numeric_end = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (numbers, suffix) = trimmed.split_at(numeric_end);
        let numbers = numbers.trim_end_matches('.');
        if numbers.is_empty() {
            return Err(err());
        }
        let mut parsed = [0u32; 4];
        for (i, part) in numbers.split('.').enumerate() {
            let slot = parsed.get_mut(i).ok_or_else(err)?;
            *slot = part.parse().map_err(|_| err())?;
        }
        let suffix = suffix.trim_start_matches(['.', '-', '_']).to_ascii_lowercase();
        let pre_release = ["rc", "a", "b", "alpha", "beta", "dev", "pre"]
            .iter()
            .any(|p| suffix.starts_with(p));
        if !(suffix.is_empty() || pre_release || suffix.starts_with("post")) {
            return Err(err());
        }
        Ok(Version {
            numbers: parsed,
            pre_release,
            raw: text.trim().to_owned(),
        })
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.numbers, !self.pre_release).cmp(&(other.numbers, !other.pre_release))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.raw.is_empty() {
            let [major, minor, patch, _] = self.numbers;
            write!(f, "{major}.{minor}.{patch}")
        } else {
            f.write_str(&self.raw)
        }
    }
}

impl crate::diagnose::Diagnose for VersionError {
    /// A release number the user wrote.
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().expect("valid version")
    }

    #[test]
    fn orders_engine_releases() {
        assert!(v("0.27.1") < v("0.33.0"));
        assert!(v("0.10.1.1") > v("0.10.1"));
        assert!(v("0.11.0rc1") < v("0.11.0"));
        assert!(v("v0.9.2+cu130").at_least(0, 9, 2));
        assert!(v("1.3.0rc15").at_least(1, 2, 0));
        assert_eq!(v("0.27.1").to_string(), "0.27.1");
    }

    #[test]
    fn refuses_words() {
        assert!("latest".parse::<Version>().is_err());
        assert!("0.27.1-nightly".parse::<Version>().is_err());
        assert!("".parse::<Version>().is_err());
    }
}
