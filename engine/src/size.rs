//! Byte sizes, the one place sous reads and writes them: as users write them in
//! recipes and flags (`15569256448`, `"14.5GiB"`, `"16GB"`), exactly, and as progress
//! and summaries show them ([`human`]: `269.1 MB`), rounded.
//!
//! Hand-written rather than taken from a crate because the rules are the recipe's
//! promise to its readers: decimal (`KB`, `MB`, `GB`, `TB`) and binary (`KiB` ...
//! `TiB`) units only, exact arithmetic (a size must come out as a whole number of
//! bytes), and a bare `G` refused because engines disagree on it (vLLM reads `8G` as
//! 2^33, most people as 8·10^9). Crates such as `bytesize` round through `f64`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A number of bytes, written in a recipe as an integer or a string with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// Why a byte size could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    /// The text is not a number followed by an optional unit.
    #[error("`{0}` is not a size: write bytes (`15569256448`) or a number with a unit (`14.5GiB`, `16GB`)")]
    Malformed(String),
    /// The unit is not one sous accepts.
    #[error(
        "unknown unit `{unit}` in `{text}`: use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
    )]
    UnknownUnit {
        /// The whole text.
        text: String,
        /// The unit as written.
        unit: String,
    },
    /// A one-letter unit, which engines read differently.
    #[error(
        "ambiguous unit `{unit}` in `{text}`: write `{unit}B` (powers of 1000) or `{unit}iB` (powers of 1024)"
    )]
    Ambiguous {
        /// The whole text.
        text: String,
        /// The unit as written.
        unit: String,
    },
    /// The size is not a whole number of bytes.
    #[error("`{0}` is not a whole number of bytes")]
    Fractional(String),
    /// The size does not fit in 64 bits.
    #[error("`{0}` is too large")]
    Overflow(String),
}

const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let number = number.replace('_', "");
        let unit = unit.trim();
        if number.is_empty() || number.matches('.').count() > 1 || number.ends_with('.') {
            return Err(ByteSizeError::Malformed(text.to_owned()));
        }
        let multiplier = if unit.is_empty() {
            1
        } else if let Some((_, m)) = UNITS
            .iter()
            .find(|(u, _)| u.eq_ignore_ascii_case(unit) && is_binary(u) == is_binary(unit))
        {
            *m
        } else if ["K", "M", "G", "T", "k", "m", "g", "t"].contains(&unit) {
            return Err(ByteSizeError::Ambiguous {
                text: text.to_owned(),
                unit: unit.to_uppercase(),
            });
        } else {
            return Err(ByteSizeError::UnknownUnit {
                text: text.to_owned(),
                unit: unit.to_owned(),
            });
        };

        // Exact: value = digits / 10^decimals * multiplier.
        let (int_part, frac_part) = number.split_once('.').unwrap_or((&number, ""));
        let digits: u128 = format!("{int_part}{frac_part}")
            .parse()
            .map_err(|_| ByteSizeError::Malformed(text.to_owned()))?;
        let scale = 10u128
            .checked_pow(frac_part.len() as u32)
            .ok_or_else(|| ByteSizeError::Malformed(text.to_owned()))?;
        let scaled = digits
            .checked_mul(u128::from(multiplier))
            .ok_or_else(|| ByteSizeError::Overflow(text.to_owned()))?;
        if scaled % scale != 0 {
            return Err(ByteSizeError::Fractional(text.to_owned()));
        }
        u64::try_from(scaled / scale)
            .map(ByteSize)
            .map_err(|_| ByteSizeError::Overflow(text.to_owned()))
    }
}

fn is_binary(unit: &str) -> bool {
    unit.to_ascii_lowercase().contains('i')
}

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// The size in GiB, as a float (for flags that take GiB).
    pub fn gib(self) -> f64 {
        self.0 as f64 / (1u64 << 30) as f64
    }
}

impl fmt::Display for ByteSize {
    /// Shortest exact spelling with a binary unit, else bytes: `14.5GiB`, `1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, m) in [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if self.0 >= m {
                // Up to three decimals, shown only when exact.
                for decimals in 0..=3u32 {
                    let scale = 10u64.pow(decimals);
                    if (u128::from(self.0) * u128::from(scale)) % u128::from(m) == 0 {
                        let value = self.0 as f64 / m as f64;
                        return write!(f, "{value:.prec$}{unit}", prec = decimals as usize);
                    }
                }
            }
        }
        write!(f, "{}", self.0)
    }
}

/// A size in GiB with two decimals, as the engines log memory: `14.50 GiB`.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A size for people to read, in decimal units with one or two decimals: `269.1 MB`,
/// `4.27 GB`. Lossy; never parse it back.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes as an integer, or a string such as \"14.5GiB\"")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative ({v})")))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl JsonSchema for ByteSize {
    fn schema_name() -> Cow<'static, str> {
        "ByteSize".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Bytes as an integer, or a number with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024).",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*[0-9][0-9_]*(\\.[0-9]+)?\\s*([KMGT]i?B|B)?\\s*$" }
            ]
        })
    }
}

impl crate::diagnose::Diagnose for ByteSizeError {
    /// A size the user wrote.
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_titan_budget() {
        assert_eq!("14.5GiB".parse::<ByteSize>(), Ok(ByteSize(15_569_256_448)));
        assert_eq!("15569256448".parse::<ByteSize>(), Ok(ByteSize(15_569_256_448)));
        assert_eq!(ByteSize(15_569_256_448).to_string(), "14.5GiB");
    }

    #[test]
    fn decimal_and_binary_units() {
        assert_eq!("16GB".parse::<ByteSize>(), Ok(ByteSize(16_000_000_000)));
        assert_eq!("512 MiB".parse::<ByteSize>(), Ok(ByteSize(512 << 20)));
        assert_eq!("1kb".parse::<ByteSize>(), Ok(ByteSize(1000)));
        assert_eq!("1_024B".parse::<ByteSize>(), Ok(ByteSize(1024)));
        assert_eq!(ByteSize(1000).to_string(), "1000");
        assert_eq!(ByteSize(1536).to_string(), "1.5KiB");
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        assert!(matches!(
            "8G".parse::<ByteSize>(),
            Err(ByteSizeError::Ambiguous { .. })
        ));
        assert!(matches!(
            "8 parsecs".parse::<ByteSize>(),
            Err(ByteSizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            "1.3KiB".parse::<ByteSize>(),
            Err(ByteSizeError::Fractional(_))
        ));
        assert!(matches!(
            "GiB".parse::<ByteSize>(),
            Err(ByteSizeError::Malformed(_))
        ));
        assert!(matches!(
            "1.2.3GB".parse::<ByteSize>(),
            Err(ByteSizeError::Malformed(_))
        ));
        assert!(matches!(
            "100000000TiB".parse::<ByteSize>(),
            Err(ByteSizeError::Overflow(_))
        ));
    }
}
