//! `POST /v1/layers`: admission and parsing only.
//!
//! The request is admitted like any other (version, then signature over the
//! claimed body hash), the claimed hash and declared length are read into
//! an [`ApplyRequest`], and `crate::layers` does the rest, including
//! checking the streamed body against the signed hash.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use silo_protocol::auth::is_sha256_hex;
use silo_protocol::http::error_chain;

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
    let request = ApplyRequest {
        sha256: signed.content_sha256,
        content_length: declared_length(req.headers()),
    };
    let applied = state
        .layers
        .apply(request, req.into_body(), &state.snapshots, &state.pusher)
        .await;
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
