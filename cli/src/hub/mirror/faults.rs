//! Faults the mirror can inject, for tests of clients (`sous hub serve --fault ...`):
//! a connection dropped after N bytes, an error status, wrong bytes, a stall, a slow
//! link. Each fault counts per path, so "once" means once for each file.
//!
//! Spec syntax, one per `--fault`: `drop-after=SIZE[@TIMES]`, `status=CODE[@TIMES]`,
//! `corrupt[@TIMES]`, `stall-after=SIZE,SECONDS[@TIMES]`, `rate=SIZE` (per second),
//! `expire-after=SIZE[@TIMES]` (a signed CDN link answers 403 once SIZE bytes went
//! through it, as a link that outlived its expiry does; needs `--cdn-host`).
//! `@TIMES` defaults to 1; sizes are written like recipe sizes (`1MiB`, `1048576`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sous_engine::recipe::ByteSize;

/// One fault.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Close the connection after this many body bytes.
    DropAfter(u64),
    /// Answer with this status instead.
    Status(u16),
    /// Flip the first byte of the body.
    Corrupt,
    /// Pause the body after this many bytes.
    StallAfter(u64, Duration),
    /// Send the body at this many bytes per second (every response).
    Rate(u64),
    /// Expire a signed link once this many bytes were served through it.
    ExpireAfter(u64),
}

#[derive(Debug, Clone, PartialEq)]
struct Rule {
    fault: Fault,
    /// How many responses per path it applies to; `None` for all.
    times: Option<u32>,
}

/// Parses one `--fault` argument.
pub fn parse(spec: &str) -> Result<(Fault, Option<u32>), String> {
    let (body, times) = match spec.rsplit_once('@') {
        Some((body, times)) => (
            body,
            Some(
                times
                    .parse::<u32>()
                    .map_err(|_| format!("`{times}` is not a count"))?,
            ),
        ),
        None => (spec, None),
    };
    let (kind, value) = body.split_once('=').unwrap_or((body, ""));
    let size = |v: &str| {
        v.parse::<ByteSize>()
            .map(ByteSize::bytes)
            .map_err(|e| e.to_string())
    };
    let fault = match kind {
        "drop-after" => Fault::DropAfter(size(value)?),
        "status" => Fault::Status(
            value
                .parse::<u16>()
                .ok()
                .filter(|c| (400..600).contains(c))
                .ok_or_else(|| format!("`{value}` is not an HTTP error status"))?,
        ),
        "corrupt" if value.is_empty() => Fault::Corrupt,
        "stall-after" => {
            let (at, secs) = value.split_once(',').ok_or("stall-after needs `SIZE,SECONDS`")?;
            let secs: f64 = secs
                .parse()
                .map_err(|_| format!("`{secs}` is not a number of seconds"))?;
            Fault::StallAfter(size(at)?, Duration::from_secs_f64(secs))
        }
        "rate" => Fault::Rate(size(value)?.max(1)),
        "expire-after" => Fault::ExpireAfter(size(value)?),
        _ => {
            return Err(format!(
                "unknown fault `{spec}`: use drop-after=SIZE, status=CODE, corrupt, stall-after=SIZE,SECONDS, rate=SIZE or expire-after=SIZE, each with an optional @TIMES"
            ));
        }
    };
    // Rate applies to every response unless limited; the others default to once.
    let times = match (&fault, times) {
        (Fault::Rate(_), t) => t,
        (_, t) => Some(t.unwrap_or(1)),
    };
    Ok((fault, times))
}

/// The faults of a mirror, with their per-path counters.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Vec<Rule>,
    used: Mutex<HashMap<(usize, String), u32>>,
}

/// What to do to one response body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BodyPlan {
    /// Drop after this many bytes.
    pub drop_after: Option<u64>,
    /// Flip the first byte.
    pub corrupt: bool,
    /// Stall once after this many bytes.
    pub stall: Option<(u64, Duration)>,
    /// Bytes per second.
    pub rate: Option<u64>,
}

impl BodyPlan {
    /// Whether the body is served untouched.
    pub fn is_clean(&self) -> bool {
        *self == BodyPlan::default()
    }
}

impl Faults {
    /// From `--fault` arguments.
    pub fn new(specs: &[String]) -> Result<Faults, String> {
        let rules = specs
            .iter()
            .map(|s| parse(s).map(|(fault, times)| Rule { fault, times }))
            .collect::<Result<_, _>>()?;
        Ok(Faults {
            rules,
            used: Mutex::new(HashMap::new()),
        })
    }

    /// Takes one use of rule `index` for `path`, if any is left.
    fn take(&self, index: usize, path: &str) -> bool {
        let Some(rule) = self.rules.get(index) else {
            return false;
        };
        let Some(times) = rule.times else { return true };
        let Ok(mut used) = self.used.lock() else {
            return false;
        };
        let count = used.entry((index, path.to_owned())).or_insert(0);
        if *count < times {
            *count += 1;
            true
        } else {
            false
        }
    }

    /// A status to answer with instead of the real response.
    pub fn status(&self, path: &str) -> Option<u16> {
        (0..self.rules.len()).find_map(|i| match self.rules[i].fault {
            Fault::Status(code) if self.take(i, path) => Some(code),
            _ => None,
        })
    }

    /// Whether a signed link that has served `served` bytes of `path` expires now
    /// (taking one use of the rule).
    pub fn expires(&self, path: &str, served: u64) -> bool {
        (0..self.rules.len()).any(|i| match self.rules[i].fault {
            Fault::ExpireAfter(limit) => served >= limit && self.take(i, path),
            _ => false,
        })
    }

    /// Whether any rule expires links (which needs the mirror to sign them).
    pub fn expire_links(&self) -> bool {
        self.rules
            .iter()
            .any(|r| matches!(r.fault, Fault::ExpireAfter(_)))
    }

    /// What to do to the body of a file response.
    pub fn body(&self, path: &str) -> BodyPlan {
        let mut plan = BodyPlan::default();
        for (i, rule) in self.rules.iter().enumerate() {
            match rule.fault {
                Fault::DropAfter(n) if self.take(i, path) => plan.drop_after = Some(n),
                Fault::Corrupt if self.take(i, path) => plan.corrupt = true,
                Fault::StallAfter(n, d) if self.take(i, path) => plan.stall = Some((n, d)),
                Fault::Rate(r) if self.take(i, path) => plan.rate = Some(r),
                _ => {}
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs_and_counts_per_path() {
        assert_eq!(parse("drop-after=1MiB"), Ok((Fault::DropAfter(1 << 20), Some(1))));
        assert_eq!(parse("status=503@3"), Ok((Fault::Status(503), Some(3))));
        assert_eq!(parse("rate=10MB"), Ok((Fault::Rate(10_000_000), None)));
        assert_eq!(
            parse("expire-after=64MiB@2"),
            Ok((Fault::ExpireAfter(64 << 20), Some(2)))
        );
        assert!(parse("status=200").is_err());
        assert!(parse("explode").is_err());
        let faults = Faults::new(&["status=500".into(), "corrupt@2".into()]).expect("valid");
        assert_eq!(faults.status("a"), Some(500));
        assert_eq!(faults.status("a"), None);
        assert_eq!(faults.status("b"), Some(500));
        assert!(faults.body("a").corrupt);
        assert!(faults.body("a").corrupt);
        assert!(!faults.body("a").corrupt);
        let faults = Faults::new(&["expire-after=10".into()]).expect("valid");
        assert!(faults.expire_links());
        assert!(!faults.expires("a", 9));
        assert!(faults.expires("a", 10));
        assert!(!faults.expires("a", 20), "once per path");
        assert!(faults.expires("b", 10));
    }
}
