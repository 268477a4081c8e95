//! Defaults that both tiers need to know. The agent enforces them (and may be
//! configured otherwise); the controller uses them to explain what it saw.

use std::time::Duration;

/// Grace between SIGINT and SIGKILL when an interrupt names none.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);
/// Longest grace a request may ask for; a longer one is clamped.
pub const MAX_GRACE: Duration = Duration::from_secs(300);
/// Bytes of recent output each exec keeps for re-attach.
pub const DEFAULT_RING_BYTES: usize = 4 * 1024 * 1024;
/// How often the agent pings an idle exec connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// Largest payload of a single output frame.
pub const MAX_FRAME_PAYLOAD: usize = 64 * 1024;
/// Accepted difference between the signer's clock and the verifier's.
pub const SIGNATURE_SKEW: Duration = Duration::from_secs(300);
