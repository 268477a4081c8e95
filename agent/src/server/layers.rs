//! `POST /v1/layers`: admission and parsing only.
//!
//! The request is admitted like any other (version, then signature over the
//! claimed body hash), the claimed hash and declared length are read into
//! an [`ApplyRequest`], and `crate::layers` does the rest, including
//! checking the streamed body against the signed hash. With `?rewind=TOKEN`
//! the apply finishes that rewind, under its hold (`crate::rewind`).

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use silo_protocol::ErrorKind;
use silo_protocol::auth::is_sha256_hex;
use silo_protocol::http::error_chain;
use silo_protocol::query::Query;
use silo_protocol::rewind::{HOLD_SECS, QUERY_REWIND, QUERY_SETTLE};

use super::{AgentState, Body, auth, declared_length, error_response, json_response, log_failure};
use crate::layers::{ApplyError, ApplyRequest};

/// Handles one layer apply.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Body> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response(),
    };
    // Counts as busy so a long upload never looks idle.
    let _busy = state.activity.busy();
    if !is_sha256_hex(&signed.content_sha256) {
        return failure(&ApplyError::BadHash);
    }
    let rewind = match Query::parse(req.uri().query()).and_then(|q| {
        Ok((
            q.get(QUERY_REWIND)?.map(str::to_owned),
            q.flag(QUERY_SETTLE)?,
        ))
    }) {
        Ok(rewind) => rewind,
        Err(err) => return error_response(ErrorKind::Malformed, err.to_string()),
    };
    let request = ApplyRequest {
        sha256: signed.content_sha256,
        content_length: declared_length(req.headers()),
    };
    let applied = match rewind {
        (None, _) => {
            state
                .layers
                .apply(request, req.into_body(), &state.snapshots, &state.pusher)
                .await
        }
        (Some(token), settle) => {
            let Some(hold) = state.rewinder.take(&token) else {
                let reason = format!(
                    "no rewind {token:?} is waiting for its layer (a rewind waits {HOLD_SECS} s)"
                );
                log_failure("layer apply", &ErrorKind::NotFound, &reason);
                return error_response(ErrorKind::NotFound, reason);
            };
            state
                .layers
                .apply_held(request, req.into_body(), hold, settle)
                .await
        }
    };
    match applied {
        Ok(done) => json_response(StatusCode::OK, &done),
        Err(err) => failure(&err),
    }
}

fn failure(err: &ApplyError) -> Response<Body> {
    let (kind, reason) = (err.kind(), error_chain(err));
    log_failure("layer apply", &kind, &reason);
    error_response(kind, reason)
}
