//! `/v1/deadline`: `GET` reads the lifetime deadline, `PUT` sets or clears
//! it (see `crate::deadline`). Admitted and signed like every request.

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use silo_protocol::ErrorKind;
use silo_protocol::http::{Deadline, DeadlineState};

use super::json_body::{JsonBodyError, read_json};
use super::{AgentState, Body, auth, error_response, json_response};

/// A deadline request's body is one small JSON object.
const MAX_REQUEST_BYTES: usize = 1024;

/// Handles one deadline request.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Body> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response(),
    };
    state.activity.touch();
    if req.method() == Method::PUT {
        let sha256 = signed.content_sha256;
        match read_json::<Deadline>(req, &sha256, MAX_REQUEST_BYTES, "a deadline").await {
            Ok(deadline) => {
                tracing::info!(seconds = ?deadline.seconds, "lifetime deadline set");
                state.lifetime.set(deadline.seconds);
            }
            Err(JsonBodyError::TooLarge { limit }) => {
                return error_response(
                    ErrorKind::TooLarge,
                    format!("a deadline request is at most {limit} bytes"),
                );
            }
            Err(JsonBodyError::Malformed(message)) => {
                return error_response(ErrorKind::Malformed, message);
            }
        }
    }
    let remaining_ms = state
        .lifetime
        .remaining()
        .map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    json_response(StatusCode::OK, &DeadlineState { remaining_ms })
}
