//! A signed request's JSON body, read whole: the snapshot and index
//! requests. The body is capped before and while it is read, must arrive
//! within [`BODY_TIMEOUT`] and must hash to the signed
//! `x-silo-content-sha256` before it is parsed.

use std::time::Duration;

use http::Request;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use silo_protocol::auth::body_sha256;

use super::declared_length;

/// Longest time the client may take to send the whole request body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a JSON body was not taken.
#[derive(Debug, thiserror::Error)]
pub enum JsonBodyError {
    /// Over the cap, declared or sent.
    #[error("request body is over the limit of {limit} bytes")]
    TooLarge {
        /// The cap.
        limit: u64,
    },
    /// Cut off, late, not what was signed, or not the expected JSON.
    #[error("{0}")]
    Malformed(String),
}

/// Reads `req`'s body (at most `limit` bytes), checks it against the signed
/// `sha256` and parses it as a `what`.
pub async fn read_json<T: DeserializeOwned>(
    req: Request<Incoming>,
    sha256: &str,
    limit: usize,
    what: &str,
) -> Result<T, JsonBodyError> {
    let cap = limit as u64;
    if declared_length(req.headers()).is_some_and(|len| len > cap) {
        return Err(JsonBodyError::TooLarge { limit: cap });
    }
    let body = Limited::new(req.into_body(), limit);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(JsonBodyError::TooLarge { limit: cap });
        }
        Ok(Err(err)) => {
            return Err(JsonBodyError::Malformed(format!(
                "request body was cut off: {err}"
            )));
        }
        Err(_) => {
            return Err(JsonBodyError::Malformed(format!(
                "request body took longer than {BODY_TIMEOUT:?}"
            )));
        }
    };
    if body_sha256(&bytes) != sha256 {
        return Err(JsonBodyError::Malformed(
            "request body does not match its signed x-silo-content-sha256".into(),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| JsonBodyError::Malformed(format!("not {what}: {e}")))
}
