//! The host-memory floor (`memory.host_floor`): while the engine starts and runs, the
//! supervisor reads the host's available memory every [`POLL`] and stops the engine
//! when it falls below the floor, before the host itself runs out. On unified memory
//! (a DGX Spark) an engine that overshoots its budget takes the whole machine's memory,
//! and vLLM's users there report hosts that had to be power-cycled; the kernel's own
//! OOM killer comes too late for them. The memory pressure (PSI) is read at the same
//! moment and reported beside the numbers.

use std::time::Duration;

use super::error::ServeError;
use crate::host::{Meminfo, Pressure};
use crate::size::gib;

/// How often the available memory is read while the floor is watched: reading
/// `/proc/meminfo` costs microseconds, and an engine allocating at several GB/s
/// moves a few hundred MB in this time.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// The moment the available memory fell below the floor.
#[derive(Debug, Clone)]
pub(super) struct Crossing {
    /// The floor, in bytes.
    pub floor: u64,
    /// What `/proc/meminfo` said.
    pub meminfo: Meminfo,
    /// What `/proc/pressure/memory` said, where the kernel has it.
    pub pressure: Option<Pressure>,
}

impl Crossing {
    /// `the host's available memory fell to 3.21 GiB, below memory.host_floor (4.00 GiB; ...)`.
    pub fn describe(&self) -> String {
        let pressure = self.pressure.map_or(String::new(), |p| {
            format!(
                "; memory pressure over the last 10 s: some {:.1} %, full {:.1} %",
                p.some, p.full
            )
        });
        format!(
            "the host's available memory fell to {}, below `memory.host_floor` ({}; page cache {}{pressure})",
            gib(self.meminfo.available),
            gib(self.floor),
            gib(self.meminfo.cached)
        )
    }
}

/// Resolves when the host's available memory is below `floor`; never without one (or
/// where `/proc/meminfo` cannot be read, which [`check`] refused before the start).
pub(super) async fn crossed(floor: Option<u64>) -> Crossing {
    let Some(floor) = floor else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Ok(meminfo) = Meminfo::read()
            && meminfo.available < floor
        {
            return Crossing {
                floor,
                meminfo,
                pressure: Pressure::read(),
            };
        }
    }
}

/// Before a start: a floor the host cannot keep is refused, naming the numbers. One at
/// or above the machine's memory can never hold; one above what is available now
/// would stop the engine as it starts.
pub fn check(floor: Option<u64>) -> Result<(), ServeError> {
    let Some(floor) = floor else {
        return Ok(());
    };
    let meminfo = Meminfo::read().map_err(ServeError::Host)?;
    if floor >= meminfo.total || floor >= meminfo.available {
        return Err(ServeError::HostFloor {
            floor,
            total: meminfo.total,
            available: meminfo.available,
            cached: meminfo.cached,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_the_host_cannot_keep_are_refused_before_the_start() {
        let m = Meminfo::read().expect("/proc/meminfo");
        assert!(check(None).is_ok());
        assert!(check(Some(1)).is_ok(), "one byte is always left");
        for floor in [m.total, m.total + 1] {
            let err = check(Some(floor)).expect_err("at or above the machine's memory");
            assert!(err.to_string().contains("`memory.host_floor`"), "{err}");
        }
    }

    #[tokio::test]
    async fn a_crossing_is_seen_within_a_poll_and_names_the_numbers() {
        let m = Meminfo::read().expect("/proc/meminfo");
        // A floor above what is available is crossed at the first reading.
        let started = std::time::Instant::now();
        let crossing = crossed(Some(m.total)).await;
        assert!(started.elapsed() < POLL * 5, "{:?}", started.elapsed());
        assert_eq!(crossing.floor, m.total);
        let text = crossing.describe();
        assert!(text.contains("below `memory.host_floor`"), "{text}");
        // None is never crossed.
        let never = tokio::time::timeout(POLL * 3, crossed(None)).await;
        assert!(never.is_err());
    }
}
