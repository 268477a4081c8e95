//! `POST /v1/rewind`: admission and parsing only.
//!
//! The request is admitted like any other, its JSON body (a snapshot
//! request: what counts as changed) read whole and checked against the
//! signed hash (`json_body`), and `crate::rewind` does the rest. The answer
//! is the change list, whole, with the rewind's token; the layer apply
//! that finishes the rewind is `server/layers.rs`'s.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use silo_protocol::http::HEADER_PROTOCOL;
use silo_protocol::http::error_chain;
use silo_protocol::rewind::{CHANGES_CONTENT_TYPE, HEADER_REWIND, as_spoken};
use silo_protocol::snapshot::{HEADER_STOPPED, HEADER_UNSETTLED, SnapshotRequest};

use super::json_body::{JsonBodyError, read_json};
use super::snapshot::MAX_REQUEST_BYTES;
use super::{AgentState, Body, auth, error_response, log_failure};
use crate::body::BodyError;
use crate::rewind::RewindError;

/// Handles the first half of one rewind.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Body> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response(),
    };
    let _busy = state.activity.busy();
    // Admitted, so announced and in range.
    let version = req
        .headers()
        .get(HEADER_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let request: SnapshotRequest = match read_json(
        req,
        &signed.content_sha256,
        MAX_REQUEST_BYTES,
        "a rewind request",
    )
    .await
    {
        Ok(request) => request,
        Err(JsonBodyError::TooLarge { limit }) => {
            return failure(&RewindError::from(BodyError::over(limit)));
        }
        Err(JsonBodyError::Malformed(message)) => {
            return failure(&RewindError::Malformed(message));
        }
    };
    match state.rewinder.begin(request, &state.snapshots).await {
        Ok(begun) => {
            let changes = as_spoken(begun.changes, version);
            let mut response = Response::new(Full::new(Bytes::from(changes)));
            *response.status_mut() = StatusCode::OK;
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(CHANGES_CONTENT_TYPE));
            headers.insert(HEADER_STOPPED, HeaderValue::from(begun.ended.killed));
            headers.insert(HEADER_UNSETTLED, HeaderValue::from(begun.ended.left));
            if let Ok(token) = HeaderValue::from_str(&begun.token) {
                headers.insert(HEADER_REWIND, token);
            }
            response
        }
        Err(err) => failure(&err),
    }
}

fn failure(err: &RewindError) -> Response<Body> {
    let (kind, reason) = (err.kind(), error_chain(err));
    log_failure("rewind", &kind, &reason);
    error_response(kind, reason)
}
