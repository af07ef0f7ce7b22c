//! Times in vLLM's logs: its prefix writes `MM-DD HH:MM:SS` with no year and no zone
//! (vLLM 0.33 `vllm/logger.py` `_DATE_FORMAT`), so a file's times are placed on a
//! timeline that starts in a given year and turns to the next when the time jumps back
//! by more than four weeks; they are naive (the server's local clock, counted as if it
//! were UTC), since only differences and minutes matter. Civil dates with `chrono`. Not
//! here: finding the timestamp in a line ([`super::parse`]).

use std::fmt;

use serde::{Serialize, Serializer};

/// A backwards jump larger than this is the turn of a year, not a clock correction.
const ROLLOVER_S: i64 = 28 * 86_400;
/// A time from a log, in seconds since 1970-01-01 00:00:00 of the server's own clock.
/// Serialized as `YYYY-MM-DDTHH:MM:SS` (no zone: the log does not say which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogTime(pub i64);

impl LogTime {
    fn parts(self) -> (i64, u32, u32, i64, i64, i64) {
        let (y, m, d) = civil_from_days(self.0.div_euclid(86_400));
        let s = self.0.rem_euclid(86_400);
        (y, m, d, s / 3600, s % 3600 / 60, s % 60)
    }

    /// `YYYY-MM-DD HH:MM`, for minutes.
    pub(super) fn minute_text(self) -> String {
        let (y, mo, d, h, mi, _) = self.parts();
        format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}")
    }
}

impl fmt::Display for LogTime {
    /// `YYYY-MM-DD HH:MM:SS`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, mo, d, h, mi, s) = self.parts();
        write!(f, "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
    }
}

impl Serialize for LogTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (y, mo, d, h, mi, s) = self.parts();
        serializer.collect_str(&format_args!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}"))
    }
}

/// Places `MM-DD HH:MM:SS` on a timeline that starts in a given year and moves to the
/// next year when the time jumps backwards by more than [`ROLLOVER_S`].
pub(super) struct Timeline {
    pub(super) year: i64,
    pub(super) latest: Option<i64>,
}

impl Timeline {
    pub(super) fn place(&mut self, month: u32, day: u32, secs_of_day: i64) -> Option<i64> {
        let mut at = epoch_s(self.year, month, day, secs_of_day);
        if let (Some(latest), Some(t)) = (self.latest, at)
            && latest - t > ROLLOVER_S
        {
            self.year += 1;
            at = epoch_s(self.year, month, day, secs_of_day);
        }
        // A date that does not exist (02-29 in a common year) is not a time.
        let at = at?;
        self.latest = Some(self.latest.map_or(at, |l| l.max(at)));
        Some(at)
    }
}

/// Seconds since 1970-01-01 for a date and a second of the day; none for a date that does
/// not exist.
pub(super) fn epoch_s(year: i64, month: u32, day: u32, secs_of_day: i64) -> Option<i64> {
    let date = chrono::NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, month, day)?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp() + secs_of_day)
}

/// The date `days` after 1970-01-01.
pub(super) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    use chrono::Datelike;
    let date = chrono::DateTime::from_timestamp(days.saturating_mul(86_400), 0)
        .map_or(chrono::NaiveDate::MIN, |t| t.date_naive());
    (i64::from(date.year()), date.month(), date.day())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn civil_dates_match_date() {
        assert_eq!(epoch_s(1970, 1, 1, 0), Some(0));
        assert_eq!(epoch_s(1969, 12, 31, 0), Some(-86_400));
        // `date -u -d 2000-02-29 +%s` = 951782400.
        assert_eq!(epoch_s(2000, 2, 29, 0), Some(951_782_400));
        assert_eq!(epoch_s(2026, 1, 1, 0), Some(JAN_1_2026));
        assert_eq!(epoch_s(2026, 9, 6, 0), Some(SEP_6_2026));
        assert_eq!(civil_from_days(SEP_6_2026 / 86_400), (2026, 9, 6));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(epoch_s(2026, 2, 29, 0), None);
        assert_eq!(epoch_s(2100, 2, 29, 0), None);
        assert!(epoch_s(2024, 2, 29, 0).is_some());
        assert!(epoch_s(2000, 2, 29, 0).is_some());
        assert_eq!(epoch_s(2026, 9, 31, 0), None);
        assert_eq!(epoch_s(2026, 13, 1, 0), None);
        assert_eq!(sep6(10, 0, 5).to_string(), "2026-09-06 10:00:05");
        assert_eq!(
            serde_json::to_string(&sep6(23, 59, 59)).expect("json"),
            "\"2026-09-06T23:59:59\""
        );
    }

    #[test]
    fn year_rolls_over_within_a_file() {
        let text = [
            line("12-31 23:59:45", 100.0, 1),
            line("12-31 23:59:55", 110.0, 1),
            // Another process's line a few seconds late is not a new year.
            "(EngineCore pid=8) INFO 12-31 23:59:50 [core.py:1] late".to_owned(),
            line("01-01 00:00:05", 120.0, 1),
            line("01-01 00:00:15", 130.0, 2),
        ]
        .join("\n");
        let i = one(&text, 2025);
        assert_eq!(i.first, LogTime(JAN_1_2026 - 15));
        assert_eq!(i.last, LogTime(JAN_1_2026 + 15));
        assert_eq!(i.last.to_string(), "2026-01-01 00:00:15");
        assert_eq!((i.span_s, i.idle.gaps), (30, 0));
        assert_eq!(i.peak.at, LogTime(JAN_1_2026 + 15));

        // Without the turn of the year, January would come before December.
        let text = [line("12-31 23:59:55", 1.0, 1), line("12-31 23:59:50", 1.0, 1)].join("\n");
        let i = one(&text, 2025);
        assert_eq!(
            (i.first, i.last),
            (LogTime(JAN_1_2026 - 10), LogTime(JAN_1_2026 - 5))
        );
    }
}
