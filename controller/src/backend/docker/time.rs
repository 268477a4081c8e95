//! Reading the engine's timestamps (RFC 3339, e.g. a container's
//! `FinishedAt`) as Unix milliseconds, the unit of every time silo stores,
//! or nanoseconds where a file's ctime is compared against one.
//! The engine writes UTC (`Z`); offsets are honoured anyway.

/// Unix milliseconds of an RFC 3339 timestamp; `None` if it is malformed or
/// is the engine's "never" (year 1).
pub fn rfc3339_to_unix_ms(text: &str) -> Option<i64> {
    rfc3339_to_unix_ns(text).map(|ns| ns.div_euclid(1_000_000))
}

/// Unix nanoseconds of an RFC 3339 timestamp, as [`rfc3339_to_unix_ms`].
pub fn rfc3339_to_unix_ns(text: &str) -> Option<i64> {
    let (date, rest) = text.split_once('T')?;
    let mut parts = date.splitn(3, '-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: i64 = parts.next()?.parse().ok()?;
    let day: i64 = parts.next()?.parse().ok()?;
    if year <= 1 || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // Split the clock from the zone: `Z`, `+hh:mm` or `-hh:mm`.
    let (clock, offset_secs) = if let Some(clock) = rest.strip_suffix('Z') {
        (clock, 0)
    } else {
        let at = rest.rfind(['+', '-'])?;
        let (clock, zone) = rest.split_at(at);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (h, m) = zone[1..].split_once(':')?;
        (
            clock,
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60),
        )
    };
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut hms = hms.splitn(3, ':');
    let hour: i64 = hms.next()?.parse().ok()?;
    let minute: i64 = hms.next()?.parse().ok()?;
    let second: i64 = hms.next()?.parse().ok()?;
    let nanos: i64 = format!("{:0<9}", fraction.get(..9).unwrap_or(fraction))
        .parse()
        .ok()?;
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// RFC 3339 text (UTC, milliseconds) of a Unix millisecond time, as image
/// configs carry their dates.
pub fn unix_ms_to_rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

/// The proleptic Gregorian date of a day count from 1970-01-01; the inverse
/// of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
