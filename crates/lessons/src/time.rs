//! The clock and day arithmetic: where the library reads the time, and which UTC day a time is.
//!
//! **Invariant:** the library reads the time only through a [`Clock`] (tests pass a fake one);
//! a day is a UTC day, numbered from 1970-01-01.

use std::sync::Arc;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// Where a store reads the time; tests pass a fake one.
pub type Clock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// Milliseconds in a day.
pub const DAY_MS: Millis = 86_400_000;

/// The wall clock.
pub fn system_clock() -> Clock {
    Arc::new(now)
}

/// The wall clock's time now.
pub(crate) fn now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

/// The UTC day (days since the epoch) of a time.
pub fn day_of(ms: Millis) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// `YYYY-MM-DD` of a day number (days since 1970-01-01, proleptic Gregorian).
pub fn format_day(day: i64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_format_as_utc_dates() {
        assert_eq!(format_day(0), "1970-01-01");
        assert_eq!(format_day(day_of(1_795_996_800_000)), "2026-11-30");
        assert_eq!(format_day(-1), "1969-12-31");
        assert_eq!(format_day(day_of(951_782_400_000)), "2000-02-29");
    }
}
