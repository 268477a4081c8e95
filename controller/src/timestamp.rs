//! Times as text: reading RFC 3339 timestamps (an engine's, e.g. a
//! container's `FinishedAt`) as Unix milliseconds, the unit of every time
//! silo stores, or nanoseconds where a file's ctime is compared against one,
//! and writing times the way image configs carry them (and people read
//! them). Engines write UTC (`Z`); offsets are honoured anyway.

use time::format_description::BorrowedFormatItem;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

/// UTC with milliseconds, as image configs carry their dates.
const MILLIS_UTC: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// Unix milliseconds of an RFC 3339 timestamp; `None` if it is malformed or
/// is the engine's "never" (year 1).
pub fn rfc3339_to_unix_ms(text: &str) -> Option<i64> {
    rfc3339_to_unix_ns(text).map(|ns| ns.div_euclid(1_000_000))
}

/// Unix nanoseconds of an RFC 3339 timestamp, as [`rfc3339_to_unix_ms`].
pub fn rfc3339_to_unix_ns(text: &str) -> Option<i64> {
    let at = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    if at.year() <= 1 {
        return None;
    }
    i64::try_from(at.unix_timestamp_nanos()).ok()
}

/// RFC 3339 text (UTC, milliseconds) of a Unix millisecond time, as image
/// configs carry their dates; the Unix epoch for a time `time` cannot
/// represent (beyond year 9999).
pub fn unix_ms_to_rfc3339(ms: i64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
        .to_offset(UtcOffset::UTC);
    at.format(MILLIS_UTC).unwrap_or_default()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_timestamps() {
        assert_eq!(rfc3339_to_unix_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_to_unix_ms("2000-02-29T00:00:00.5Z"),
            Some(951_782_400_500)
        );
        assert_eq!(
            rfc3339_to_unix_ms("2025-11-22T01:53:00.123456789Z"),
            Some(1_763_776_380_123)
        );
        assert_eq!(
            rfc3339_to_unix_ms("2025-11-22T03:53:00.123+02:00"),
            Some(1_763_776_380_123)
        );
        assert_eq!(
            rfc3339_to_unix_ns("2025-11-22T01:53:00.123456789Z"),
            Some(1_763_776_380_123_456_789)
        );
        assert_eq!(rfc3339_to_unix_ms("0001-01-01T00:00:00Z"), None);
        for ms in [0, 951_782_400_500, 1_763_776_380_123] {
            assert_eq!(rfc3339_to_unix_ms(&unix_ms_to_rfc3339(ms)), Some(ms));
        }
        assert_eq!(
            unix_ms_to_rfc3339(951_782_400_500),
            "2000-02-29T00:00:00.500Z"
        );
        assert_eq!(rfc3339_to_unix_ms("yesterday"), None);
    }
}
