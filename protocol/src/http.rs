//! HTTP surface of the agent: paths, header names and the error body.
//!
//! The agent speaks HTTP/1.1. Exec is a WebSocket upgrade on [`PATH_EXEC`];
//! everything else is a plain request. Every request but [`PATH_HEALTHZ`] is
//! signed (see [`crate::auth`]).

use serde::{Deserialize, Serialize};

use crate::error::ErrorKind;

/// Unauthenticated liveness and version probe.
pub const PATH_HEALTHZ: &str = "/healthz";
/// WebSocket upgrade for the exec channel.
pub const PATH_EXEC: &str = "/v1/exec";
/// File push endpoint (`POST`, tar.gz body, `?mount=ABS_PATH`).
pub const PATH_PUSH: &str = "/v1/push";
/// Snapshot endpoint (`POST`, JSON body; answers with an image layer).
pub const PATH_SNAPSHOT: &str = "/v1/snapshot";
/// Layer apply endpoint (`POST`, image layer tar body; answers JSON). New
/// with remote backends: see [`crate::layers`].
pub const PATH_LAYERS: &str = "/v1/layers";
/// Path index endpoint (`POST`, JSON body; answers NUL-terminated paths).
/// New with remote backends: see [`crate::index`].
pub const PATH_INDEX: &str = "/v1/index";
/// In-place rewind endpoint (`POST`, JSON body; answers with the change
/// list). New in protocol 3: see [`crate::rewind`].
pub const PATH_REWIND: &str = "/v1/rewind";
/// The sandbox's lifetime deadline: `GET` reads it, `PUT` sets or clears it
/// ([`Deadline`] body; answers [`DeadlineState`]). New in protocol 8.
pub const PATH_DEADLINE: &str = "/v1/deadline";
/// Suspend for a memory checkpoint (`POST`, [`crate::suspend::SuspendRequest`]
/// body; answers [`crate::suspend::Suspended`]). New in protocol 11.
pub const PATH_SUSPEND: &str = "/v1/suspend";
/// Continue what a suspend stopped (`POST`, empty body; answers
/// [`crate::suspend::Resumed`]). New in protocol 11.
pub const PATH_RESUME: &str = "/v1/resume";

/// On a request: the protocol version the client speaks (one the agent
/// accepts, see [`crate::version`]). On every answer: the newest version
/// the agent speaks.
pub const HEADER_PROTOCOL: &str = "x-silo-protocol";
/// On every answer: the oldest protocol version the agent speaks (absent
/// from agents before version 2, which spoke only their own).
pub const HEADER_PROTOCOL_MIN: &str = "x-silo-protocol-min";
/// Unix seconds at which the request was signed.
pub const HEADER_TIMESTAMP: &str = "x-silo-timestamp";
/// Random hex string, unique per request; defeats replay.
pub const HEADER_NONCE: &str = "x-silo-nonce";
/// Lowercase hex SHA-256 of the request body (of the empty string when there is none).
pub const HEADER_CONTENT_SHA256: &str = "x-silo-content-sha256";
/// Lowercase hex HMAC-SHA256 over the canonical request.
pub const HEADER_SIGNATURE: &str = "x-silo-signature";

/// JSON body of every non-2xx answer from the agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    /// Stable machine-readable category; it fixes the answer's status.
    pub kind: ErrorKind,
    /// Human-readable explanation; never contains key material.
    pub message: String,
}

/// An error and its causes on one line, `outer: inner: root`.
///
/// This is how both tiers render an error into [`ErrorBody::message`] and
/// into their own reports, so a client sees the whole reason, not just the
/// outermost layer.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chain_joins_every_cause() {
        let err = Outer(std::io::Error::other("root cause"));
        assert_eq!(error_chain(&err), "outer: root cause");
    }
}

/// Body of `PUT` [`PATH_DEADLINE`]: the agent stops the sandbox (as its idle
/// timeout does: a clean exit, files kept) `seconds` from now, whatever
/// runs; `None` clears the deadline. A later request replaces an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deadline {
    /// Seconds from now; `None` for no deadline.
    pub seconds: Option<u64>,
}

/// Answer of [`PATH_DEADLINE`]: where the deadline stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadlineState {
    /// Milliseconds until the agent stops the sandbox; `None` when no
    /// deadline is set.
    pub remaining_ms: Option<u64>,
}
