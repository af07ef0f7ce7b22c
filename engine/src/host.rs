//! The host's memory as the Linux kernel reports it: `/proc/meminfo` (total, available,
//! free, page cache) and the memory pressure of `/proc/pressure/memory` (PSI). The
//! native engine sizes its KV cache from the total, `sous serve` keeps the available
//! memory above `memory.host_floor` with it, and `sous doctor` shows it. On a machine
//! whose GPU shares the host's memory (a DGX Spark's GB10) this is the GPU's memory too.
//!
//! The formats are the kernel's: `Documentation/filesystems/proc.rst` (meminfo, values
//! in KiB written `kB`) and `Documentation/accounting/psi.rst` (`some avg10=0.00
//! avg60=0.00 avg300=0.00 total=0`, then the same for `full`), in the Linux sources.

use std::path::Path;

/// Where the kernel reports memory.
const MEMINFO: &str = "/proc/meminfo";

/// Where the kernel reports memory pressure (Linux 4.20 and later, with PSI enabled).
const PRESSURE: &str = "/proc/pressure/memory";

/// What `/proc/meminfo` says, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meminfo {
    /// `MemTotal`: the RAM the kernel manages.
    pub total: u64,
    /// `MemAvailable`: what can be allocated without swapping, page cache that can be
    /// dropped included.
    pub available: u64,
    /// `MemFree`: not used for anything, page cache excluded.
    pub free: u64,
    /// `Cached`: the page cache (files read or written, the model's weights among them).
    pub cached: u64,
}

/// Why the host's memory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The file cannot be read (not Linux, or /proc not mounted).
    #[error("{path} cannot be read: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A field the kernel always writes is missing or not a number.
    #[error("{path} has no readable `{field}` line")]
    Field {
        /// The file.
        path: String,
        /// The field.
        field: &'static str,
    },
}

impl crate::diagnose::Diagnose for HostError {
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        Some("sous reads the host's memory from Linux's /proc; on another system, leave `memory.host_floor` unset".into())
    }
}

impl Meminfo {
    /// This machine's `/proc/meminfo`.
    pub fn read() -> Result<Meminfo, HostError> {
        Meminfo::read_from(Path::new(MEMINFO))
    }

    fn read_from(path: &Path) -> Result<Meminfo, HostError> {
        let text = std::fs::read_to_string(path).map_err(|source| HostError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Meminfo::parse(&text).map_err(|field| HostError::Field {
            path: path.display().to_string(),
            field,
        })
    }

    /// `text` in the format of `/proc/meminfo`; the error names the missing field.
    pub fn parse(text: &str) -> Result<Meminfo, &'static str> {
        let field = |name: &'static str| {
            text.lines()
                .find_map(|line| {
                    let rest = line.strip_prefix(name)?.strip_prefix(':')?;
                    let mut words = rest.split_whitespace();
                    let value: u64 = words.next()?.parse().ok()?;
                    match words.next() {
                        Some("kB") => value.checked_mul(1024),
                        None => Some(value),
                        Some(_) => None,
                    }
                })
                .ok_or(name)
        };
        Ok(Meminfo {
            total: field("MemTotal")?,
            available: field("MemAvailable")?,
            free: field("MemFree")?,
            cached: field("Cached")?,
        })
    }
}

/// Total host RAM in bytes (`MemTotal`), if it can be read.
pub fn total() -> Option<u64> {
    Meminfo::read().ok().map(|m| m.total)
}

/// The share of the last ten seconds during which tasks waited for memory (PSI's
/// `avg10`, in percent): `some` (at least one task), `full` (every non-idle task).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    /// `some avg10`.
    pub some: f64,
    /// `full avg10`.
    pub full: f64,
}

impl Pressure {
    /// This machine's `/proc/pressure/memory`, where the kernel has PSI.
    pub fn read() -> Option<Pressure> {
        Pressure::parse(&std::fs::read_to_string(PRESSURE).ok()?)
    }

    /// `text` in the format of `/proc/pressure/memory`.
    pub fn parse(text: &str) -> Option<Pressure> {
        let avg10 = |kind: &str| {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix(kind)?.strip_prefix(' ')?;
                rest.split_whitespace()
                    .find_map(|pair| pair.strip_prefix("avg10="))?
                    .parse::<f64>()
                    .ok()
            })
        };
        Some(Pressure {
            some: avg10("some")?,
            full: avg10("full")?,
        })
    }
}

/// The command that drops the clean page cache, which `MemAvailable` counts as
/// available but which an allocation of GPU memory on unified memory may not reclaim.
pub const DROP_CACHES: &str = "sync && echo 3 | sudo tee /proc/sys/vm/drop_caches";

#[cfg(test)]
mod tests {
    use super::*;

    /// The first lines of a `/proc/meminfo` as Linux 6.8 writes it.
    const MEMINFO_TEXT: &str = "MemTotal:       24570744 kB\nMemFree:         1193476 kB\nMemAvailable:   17861860 kB\nBuffers:          402884 kB\nCached:         15701752 kB\nSwapCached:            0 kB\nHugePages_Total:       0\n";

    #[test]
    fn meminfo_is_read_in_bytes() {
        let m = Meminfo::parse(MEMINFO_TEXT).expect("meminfo");
        assert_eq!(m.total, 24_570_744 * 1024);
        assert_eq!(m.free, 1_193_476 * 1024);
        assert_eq!(m.available, 17_861_860 * 1024);
        assert_eq!(m.cached, 15_701_752 * 1024);
        // `SwapCached` does not pass for `Cached`, nor a missing field for zero.
        let without = MEMINFO_TEXT.replace("Cached:         15701752 kB\n", "");
        assert_eq!(Meminfo::parse(&without), Err("Cached"));
        assert_eq!(
            Meminfo::parse("MemTotal: lots kB\n"),
            Err("MemTotal"),
            "not a number"
        );
    }

    #[test]
    fn this_machines_meminfo_reads_and_agrees_with_itself() {
        // Every Linux machine the suite runs on has /proc.
        let m = Meminfo::read().expect("/proc/meminfo");
        assert!(m.total > 0 && m.available <= m.total && m.free <= m.total);
        assert_eq!(total(), Some(m.total));
        let missing = Meminfo::read_from(Path::new("/proc/no-such-file"));
        assert!(matches!(missing, Err(HostError::Read { .. })));
    }

    #[test]
    fn pressure_is_the_ten_second_averages() {
        let text = "some avg10=1.53 avg60=0.87 avg300=0.20 total=123456\nfull avg10=0.25 avg60=0.10 avg300=0.02 total=2345\n";
        assert_eq!(
            Pressure::parse(text),
            Some(Pressure {
                some: 1.53,
                full: 0.25
            })
        );
        assert_eq!(Pressure::parse("some avg10=1.53\n"), None, "no `full` line");
        // Where the kernel has PSI, this machine's file reads too.
        if Path::new(PRESSURE).exists() {
            assert!(Pressure::read().is_some(), "{PRESSURE} did not parse");
        }
    }
}
