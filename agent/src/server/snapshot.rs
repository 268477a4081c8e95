//! `POST /v1/snapshot`: admission and parsing only.
//!
//! The request is admitted like any other (version, then signature over the
//! claimed body hash); its JSON body is read whole, up to
//! [`MAX_REQUEST_BYTES`], checked against the signed hash and parsed into a
//! [`SnapshotRequest`] (`json_body`), and `crate::snapshot` does the rest. The answer to a
//! started snapshot is the layer, streamed.

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;
use silo_protocol::http::error_chain;
use silo_protocol::snapshot::{
    HEADER_STOPPED, HEADER_STOPPED_AT, HEADER_UNSETTLED, LAYER_CONTENT_TYPE, SnapshotRequest,
};

use super::json_body::{JsonBodyError, read_json};
use super::{AgentState, Reply, auth, error_response, log_failure};
use crate::body::BodyError;
use crate::snapshot::SnapshotError;

/// Largest request body: the baseline of a big image is most of it.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

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
            if let Some(at_ns) = stopped.at_ns {
                headers.insert(HEADER_STOPPED_AT, HeaderValue::from(at_ns));
            }
            response
        }
        Err(err) => failure(&err),
    }
}

/// Reads, checks and parses the body.
async fn read(req: Request<Incoming>, sha256: &str) -> Result<SnapshotRequest, SnapshotError> {
    read_json(req, sha256, MAX_REQUEST_BYTES, "a snapshot request")
        .await
        .map_err(|err| match err {
            JsonBodyError::TooLarge { limit } => BodyError::over(limit).into(),
            JsonBodyError::Malformed(message) => SnapshotError::Malformed(message),
        })
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
        let response = failure(&SnapshotError::from(BodyError::over(
            MAX_REQUEST_BYTES as u64,
        )));
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}
