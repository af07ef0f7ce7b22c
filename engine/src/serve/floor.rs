//! The host-memory floor (`memory.host_floor`): while the engine starts and runs, the
//! supervisor reads the host's available memory every [`POLL`] and stops the engine
//! when it falls below the floor, before the host itself runs out. On unified memory
//! (a DGX Spark) an engine that overshoots its budget takes the whole machine's memory,
//! and vLLM's users there report hosts that had to be power-cycled; the kernel's own
//! OOM killer comes too late for them. The memory pressure (PSI) is read at the same
//! moment and reported beside the numbers.
//!
//! Before the first start, [`fitting`] chooses the first memory fraction whose budget
//! can be had now (the host's available memory for the native engine, the GPU's free
//! memory for vLLM: [`crate::device`]), instead of learning it from an engine that died.

use std::time::Duration;

use super::error::ServeError;
use crate::device::Pool;
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

/// Where the first start begins: the index of the first of `fractions` (the recipe's
/// `memory.gpu_utilization`, then its `memory.oom_fallback`) whose share of `pool` can
/// be had now, with the warning to give when it is not the first. `None` stands for
/// `default`, the engine's own fraction; with no default to check it always fits. An
/// error names the numbers when none fits.
pub(super) fn fitting(
    fractions: &[Option<f64>],
    default: Option<f64>,
    pool: &Pool,
) -> Result<(usize, Option<String>), ServeError> {
    let fits = |f: &Option<f64>| f.or(default).is_none_or(|f| pool.fits(f));
    let asks = |f: f64| gib(pool.asks(f));
    let name = |f: &Option<f64>| match f {
        Some(f) => f.to_string(),
        None => default.map_or("the engine's default".to_owned(), |d| {
            format!("the engine's default ({d})")
        }),
    };
    match fractions.iter().position(fits) {
        Some(0) => Ok((0, None)),
        Some(i) => {
            let first = fractions[0].or(default).unwrap_or(1.0);
            let cache = pool
                .page_cache_bytes
                .map_or(String::new(), |c| format!(" (page cache {})", gib(c)));
            Ok((
                i,
                Some(format!(
                    "`memory.gpu_utilization = {first}` asks for {} of {} {}, and {} is {}{cache}: starting at {} from `memory.oom_fallback`",
                    asks(first),
                    pool.whose,
                    gib(pool.total_bytes),
                    gib(pool.available_bytes),
                    pool.free_word(),
                    name(&fractions[i]),
                )),
            ))
        }
        None => Err(ServeError::NoFractionFits {
            asked: fractions
                .iter()
                .filter_map(|f| f.or(default).map(|v| format!("{} ({})", name(f), asks(v))))
                .collect::<Vec<_>>()
                .join(", "),
            pool: Box::new(pool.clone()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_fraction_the_host_has_available_is_chosen_up_front() {
        const GIB: u64 = 1 << 30;
        let host = Meminfo {
            total: 100 * GIB,
            available: 60 * GIB,
            free: 10 * GIB,
            cached: 40 * GIB,
        };
        let host = Pool::host(&host);
        assert_eq!(fitting(&[Some(0.5)], None, &host).expect("fits").0, 0);
        assert_eq!(fitting(&[None], None, &host).expect("default").0, 0);
        let (i, warning) =
            fitting(&[Some(0.9), Some(0.7), Some(0.6), Some(0.5)], None, &host).expect("0.6 fits");
        assert_eq!(i, 2);
        let warning = warning.expect("a warning");
        assert!(
            warning.starts_with("`memory.gpu_utilization = 0.9` asks for 90.00 GiB of this host's 100.00 GiB, and 60.00 GiB is available (page cache 40.00 GiB): starting at 0.6"),
            "{warning}"
        );
        let err = fitting(&[Some(0.9), Some(0.8)], None, &host).expect_err("none fits");
        let text = err.to_string();
        assert!(
            text.contains("0.9 (90.00 GiB), 0.8 (80.00 GiB)") && text.contains("60.00 GiB"),
            "{text}"
        );
    }

    #[test]
    fn an_engine_default_that_does_not_fit_a_gpu_is_named() {
        const GIB: u64 = 1 << 30;
        let spark = crate::device::DeviceMemory {
            ordinal: 0,
            name: "NVIDIA GB10".into(),
            free_bytes: 85 * GIB,
            total_bytes: 121 * GIB,
            unified: true,
        };
        let pool = Pool::device(&[spark], None).expect("a pool");
        let err = fitting(&[None], Some(0.92), &pool).expect_err("0.92 of 121 GiB is more than 85");
        assert_eq!(
            err.to_string(),
            "every memory fraction asks for more memory than is free: the engine's default (0.92) (111.32 GiB); cuda:0's (NVIDIA GB10, unified memory) 121.00 GiB, 85.00 GiB free"
        );
        let (i, warning) = fitting(&[None, Some(0.6)], Some(0.92), &pool).expect("0.6 fits");
        assert_eq!(i, 1);
        assert!(
            warning
                .expect("a warning")
                .contains("asks for 111.32 GiB of cuda:0's")
        );
        // Without a default to check, the engine's own fraction is left to it.
        assert_eq!(fitting(&[None], None, &pool).expect("unchecked").0, 0);
    }

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
