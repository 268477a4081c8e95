//! `POST /v1/index`: admission and parsing only.
//!
//! The request is admitted like any other (version, then signature over the
//! claimed body hash), its JSON body read into an [`IndexRequest`]
//! (`json_body`), and `crate::snapshot` walks the machine; the answer is
//! the paths, streamed.

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;
use silo_protocol::http::error_chain;
use silo_protocol::index::{INDEX_CONTENT_TYPE, IndexRequest};

use super::json_body::{JsonBodyError, read_json};
use super::{AgentState, Reply, auth, error_response, log_failure};
use crate::body::BodyError;
use crate::snapshot::IndexError;

/// Largest request body: a list of exclusions.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Handles one index request.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Reply> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response().map(Either::Left),
    };
    // Counts as busy until the paths are sent, so it never looks idle.
    let busy = state.activity.busy();
    let request: IndexRequest = match read_json(
        req,
        &signed.content_sha256,
        MAX_REQUEST_BYTES,
        "an index request",
    )
    .await
    {
        Ok(request) => request,
        Err(JsonBodyError::TooLarge { limit }) => {
            return failure(&IndexError::from(BodyError::over(limit)));
        }
        Err(JsonBodyError::Malformed(message)) => {
            return failure(&IndexError::Malformed(message));
        }
    };
    match state.snapshots.index(request).await {
        Ok(paths) => {
            let mut response = Response::new(Either::Right(paths.hold(busy)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(INDEX_CONTENT_TYPE));
            response
        }
        Err(err) => failure(&err),
    }
}

fn failure(err: &IndexError) -> Response<Reply> {
    let (kind, reason) = (err.kind(), error_chain(err));
    log_failure("path index", &kind, &reason);
    error_response(kind, reason).map(Either::Left)
}
