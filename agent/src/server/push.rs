//! `POST /v1/push?mount=ABS_PATH`: admission and parsing only.
//!
//! The request is admitted like any other (version, then signature over the
//! claimed body hash), its query and headers are read into a
//! [`PushRequest`], and `crate::push` does the rest, including checking the
//! streamed body against the signed hash.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use silo_protocol::auth::is_sha256_hex;
use silo_protocol::http::error_chain;
use silo_protocol::push::{parse_declared, parse_query};

use super::{AgentState, Body, auth, declared_length, error_response, json_response, log_failure};
use crate::push::{PushError, PushRequest};

/// Handles one push request.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Body> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response(),
    };
    // Counts as a session so a long upload never looks idle.
    let _busy = state.activity.busy();
    let request = match parse(&req, signed.content_sha256) {
        Ok(request) => request,
        Err(err) => return failure(&err),
    };
    match state.pusher.push(request, req.into_body()).await {
        Ok(done) => json_response(StatusCode::OK, &done),
        Err(err) => failure(&err),
    }
}

fn parse<B>(req: &Request<B>, sha256: String) -> Result<PushRequest, PushError> {
    let mount = parse_query(req.uri().query())?;
    let declared = parse_declared(req.uri().query())?;
    if !is_sha256_hex(&sha256) {
        return Err(PushError::BadHash);
    }
    Ok(PushRequest {
        mount,
        sha256,
        content_length: declared_length(req.headers()),
        declared,
    })
}

fn failure(err: &PushError) -> Response<Body> {
    let (kind, reason) = (err.kind(), error_chain(err));
    log_failure("push", &kind, &reason);
    error_response(kind, reason)
}
