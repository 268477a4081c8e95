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
use silo_protocol::layers::kind;

use super::{AgentState, Body, auth, declared_length, error_response, json_response};
use crate::layers::{ApplyError, ApplyRequest};

/// Handles one layer apply.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Body> {
    let signed = match auth::admit(&req, &state.verifier) {
        Ok(signed) => signed,
        Err(err) => return err.response(),
    };
    // Counts as a session so a long upload never looks idle.
    let _busy = state.activity.session();
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
    let (status, what) = err.status();
    if matches!(what, kind::INTERNAL | kind::INCOMPLETE) {
        tracing::error!("layer apply failed: {}", error_chain(err));
    } else {
        tracing::info!("layer refused: {}", error_chain(err));
    }
    error_response(status, what, error_chain(err))
}
