//! The machine's wall clock, as the protocol reports it. The controller's
//! clock may differ (a remote VM), so whatever the agent stamps with it is
//! compared only with other readings of this same clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix nanoseconds now; `None` if the clock reads before 1970.
pub fn unix_ns_now() -> Option<i64> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(since.as_nanos()).ok()
}

/// Unix milliseconds now; `None` if the clock reads before 1970.
pub fn unix_ms_now() -> Option<i64> {
    unix_ns_now().map(|ns| ns / 1_000_000)
}
