//! The time window of a passive measurement (`--since`, `--until`): absolute times as
//! RFC 3339 (`2026-09-06T10:00:00Z`, `2026-09-06T12:00:00+02:00`), as naive times
//! (`2026-09-06T10:00:00`, `2026-09-06 10:00`, a date alone meaning its midnight, as
//! `journalctl --since` reads it), or relative durations (`5d`, `12h`, `1h30m`) counted
//! back from a reference the caller chooses: from `--until` when it is given, else from
//! the end of the logs (`bench logs`) or from now (`bench scrape --prometheus`).
//!
//! Times are seconds since 1970-01-01 00:00:00 UTC. A naive time is read as UTC, which is
//! also how `bench logs` reads vLLM's zone-less timestamps (a container's clock is UTC
//! unless it was told otherwise), so a naive `--since` compares with a log's own clock
//! whatever its zone. The window holds `since <= t < until`.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveDateTime};

/// One end of a window as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeArg {
    /// Seconds since the epoch, UTC.
    At(i64),
    /// This long before the reference.
    Ago(Duration),
}

impl fmt::Display for TimeArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeArg::At(t) => f.write_str(&format_utc(*t)),
            TimeArg::Ago(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

/// Reads `--since`/`--until`: an RFC 3339 time, a naive date and time, a date, or a
/// duration before the reference.
pub fn parse_time(text: &str) -> Result<TimeArg, String> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(TimeArg::At(t.timestamp()));
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(TimeArg::At(t.and_utc().timestamp()));
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d")
        && let Some(t) = d.and_hms_opt(0, 0, 0)
    {
        return Ok(TimeArg::At(t.and_utc().timestamp()));
    }
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(TimeArg::Ago(d)),
        _ => Err(format!(
            "`{text}` is neither a time (2026-09-06T10:00:00Z, 2026-09-06 10:00, 2026-09-06) \
             nor a duration back from --until or the end (5d, 12h, 1h30m)"
        )),
    }
}

/// `--since` and `--until` as given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// The first second in the window.
    pub since: Option<TimeArg>,
    /// The first second after it.
    pub until: Option<TimeArg>,
}

/// A window placed on the timeline: either end open when not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The first second in the window.
    pub since: Option<i64>,
    /// The first second after it.
    pub until: Option<i64>,
}

impl Bounds {
    /// No bounds: everything.
    pub const ALL: Bounds = Bounds {
        since: None,
        until: None,
    };

    /// Whether `t` falls in the window.
    pub fn contains(&self, t: i64) -> bool {
        self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t < u)
    }
}

impl Window {
    /// Whether neither end was given.
    pub fn is_open(&self) -> bool {
        self.since.is_none() && self.until.is_none()
    }

    /// Places the window, durations counted back from `reference` (for `--until`) and
    /// from the placed `--until` (else `reference`) for `--since`. Refuses a window that
    /// ends before it starts.
    pub fn place(&self, reference: i64) -> Result<Bounds, String> {
        let back = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let until = self.until.map(|u| match u {
            TimeArg::At(t) => t,
            TimeArg::Ago(d) => reference.saturating_sub(back(d)),
        });
        let since = self.since.map(|s| match s {
            TimeArg::At(t) => t,
            TimeArg::Ago(d) => until.unwrap_or(reference).saturating_sub(back(d)),
        });
        if let (Some(s), Some(u)) = (since, until)
            && s >= u
        {
            return Err(format!(
                "the window is empty: --since is {} and --until is {}",
                format_utc(s),
                format_utc(u)
            ));
        }
        Ok(Bounds { since, until })
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_utc(t: i64) -> String {
    DateTime::from_timestamp(t, 0)
        .map_or_else(|| t.to_string(), |d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `date -u -d 2026-09-06T10:00:00 +%s`.
    const SEP_6_10H: i64 = 1_788_688_800;

    #[test]
    fn times_and_durations_parse() {
        let at = TimeArg::At(SEP_6_10H);
        for text in [
            "2026-09-06T10:00:00Z",
            "2026-09-06T12:00:00+02:00",
            "2026-09-06T10:00:00",
            "2026-09-06 10:00:00",
            "2026-09-06 10:00",
            "2026-09-06T10:00",
            " 2026-09-06T10:00:00.000Z ",
        ] {
            assert_eq!(parse_time(text), Ok(at), "{text}");
        }
        assert_eq!(parse_time("2026-09-06"), Ok(TimeArg::At(SEP_6_10H - 36_000)));
        assert_eq!(
            parse_time("5d"),
            Ok(TimeArg::Ago(Duration::from_secs(5 * 86_400)))
        );
        assert_eq!(parse_time("1h30m"), Ok(TimeArg::Ago(Duration::from_secs(5400))));
        for bad in ["", "0s", "yesterday", "2026-13-01", "2026-02-30", "-5d"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        assert!(parse_time("soon").expect_err("bad").contains("`soon`"));
        assert_eq!(format_utc(SEP_6_10H), "2026-09-06T10:00:00Z");
        assert_eq!(at.to_string(), "2026-09-06T10:00:00Z");
    }

    #[test]
    fn windows_are_placed_from_the_reference() {
        let end = SEP_6_10H;
        let w = |since: Option<&str>, until: Option<&str>| Window {
            since: since.map(|s| parse_time(s).expect("since")),
            until: until.map(|u| parse_time(u).expect("until")),
        };
        assert_eq!(w(None, None).place(end), Ok(Bounds::ALL));
        assert!(w(None, None).is_open());
        // Relative --since counts back from the reference...
        let b = w(Some("1h"), None).place(end).expect("window");
        assert_eq!((b.since, b.until), (Some(end - 3600), None));
        // ...or from --until.
        let b = w(Some("1h"), Some("30m")).place(end).expect("window");
        assert_eq!((b.since, b.until), (Some(end - 5400), Some(end - 1800)));
        let b = w(Some("1h"), Some("2026-09-06T09:00:00Z"))
            .place(end)
            .expect("window");
        assert_eq!((b.since, b.until), (Some(end - 7200), Some(end - 3600)));
        assert!(b.contains(end - 7200) && b.contains(end - 3601));
        assert!(!b.contains(end - 3600) && !b.contains(end - 7201));
        let err = w(Some("2026-09-06T10:00:00Z"), Some("2026-09-06"))
            .place(end)
            .expect_err("empty");
        assert!(err.contains("2026-09-06T00:00:00Z"), "{err}");
    }
}
