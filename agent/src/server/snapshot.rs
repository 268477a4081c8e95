//! `POST /v1/snapshot`: admission and parsing only.
//!
//! The request is admitted like any other (version, then signature over the
//! claimed body hash); its JSON body is read whole, up to
//! [`MAX_REQUEST_BYTES`], checked against the signed hash and parsed into a
//! [`SnapshotRequest`], and `crate::snapshot` does the rest. The answer to a
//! started snapshot is the layer, streamed.

use std::time::Duration;

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};
use http_body_util::{BodyExt, Either, LengthLimitError, Limited};
use hyper::body::Incoming;
use silo_protocol::auth::body_sha256;
use silo_protocol::http::error_chain;
use silo_protocol::snapshot::{
    HEADER_STOPPED, HEADER_UNSETTLED, LAYER_CONTENT_TYPE, SnapshotRequest,
};

use super::{AgentState, Reply, auth, declared_length, error_response, log_failure};
use crate::snapshot::SnapshotError;

/// Largest request body: the baseline of a big image is most of it.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;
/// Longest time the client may take to send the whole request body.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Handles one snapshot request.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Reply> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response().map(Either::Left),
    };
    // Counts as a session until the layer is sent, so it never looks idle.
    let busy = state.activity.busy();
    let request = match read(req, &signed.content_sha256).await {
        Ok(request) => request,
        Err(err) => return failure(&err),
    };
    let hold_pushes = async {
        state
            .pusher
            .hold_off()
            .await
            .map_err(|err| SnapshotError::Internal(error_chain(&err)))
    };
    match state.snapshots.start(request, hold_pushes).await {
        Ok((layer, stopped)) => {
            let mut response = Response::new(Either::Right(layer.hold(busy)));
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(LAYER_CONTENT_TYPE));
            headers.insert(HEADER_STOPPED, HeaderValue::from(stopped.processes));
            headers.insert(HEADER_UNSETTLED, HeaderValue::from(stopped.unsettled));
            response
        }
        Err(err) => failure(&err),
    }
}

/// Reads, checks and parses the body.
async fn read(req: Request<Incoming>, sha256: &str) -> Result<SnapshotRequest, SnapshotError> {
    let limit = MAX_REQUEST_BYTES as u64;
    if declared_length(req.headers()).is_some_and(|len| len > limit) {
        return Err(SnapshotError::TooLarge { limit });
    }
    let body = Limited::new(req.into_body(), MAX_REQUEST_BYTES);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(SnapshotError::TooLarge { limit });
        }
        Ok(Err(err)) => {
            return Err(SnapshotError::Malformed(format!(
                "request body was cut off: {err}"
            )));
        }
        Err(_) => {
            return Err(SnapshotError::Malformed(format!(
                "request body took longer than {BODY_TIMEOUT:?}"
            )));
        }
    };
    if body_sha256(&bytes) != sha256 {
        return Err(SnapshotError::Malformed(
            "request body does not match its signed x-silo-content-sha256".into(),
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| SnapshotError::Malformed(format!("not a snapshot request: {e}")))
}

fn failure(err: &SnapshotError) -> Response<Reply> {
    let (kind, reason) = (err.kind(), error_chain(err));
    log_failure("snapshot", &kind, &reason);
    error_response(kind, reason).map(Either::Left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn refusals_carry_their_status() {
        let response = failure(&SnapshotError::Busy);
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let response = failure(&SnapshotError::TooLarge {
            limit: MAX_REQUEST_BYTES as u64,
        });
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}
