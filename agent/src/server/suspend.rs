//! `POST /v1/suspend` and `POST /v1/resume`: admission and parsing; the
//! stopping and continuing is `crate::suspend`'s, and the letting go of
//! every connection and the listener is [`super::run`]'s, told through
//! [`Suspends`] once the answer is on its way.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use silo_protocol::http::error_chain;
use silo_protocol::suspend::{Resumed, SuspendRequest, Suspended};
use tokio::sync::watch;

use super::json_body::{JsonBodyError, read_json};
use super::{AgentState, Body, auth, error_response, json_response, log_failure};
use silo_protocol::ErrorKind;

/// Largest suspend request body.
const MAX_REQUEST_BYTES: usize = 4096;
/// Longest wake timeout a client may ask for.
pub const MAX_WAKE_AFTER: Duration = Duration::from_secs(600);

/// Tells the serving loop that a suspend was answered, with how long to
/// wait for the wake.
#[derive(Debug)]
pub struct Suspends {
    tx: watch::Sender<Option<Duration>>,
}

impl Default for Suspends {
    fn default() -> Self {
        Self {
            tx: watch::channel(None).0,
        }
    }
}

impl Suspends {
    /// A receiver for the serving loop.
    pub fn subscribe(&self) -> watch::Receiver<Option<Duration>> {
        self.tx.subscribe()
    }

    fn request(&self, wake_after: Duration) {
        self.tx.send_replace(Some(wake_after));
    }

    /// Marks the suspend as taken up (the loop has let everything go).
    pub fn taken(&self) {
        self.tx.send_replace(None);
    }
}

/// Handles `POST /v1/suspend`.
pub async fn suspend(req: Request<Incoming>, state: &AgentState) -> Response<Body> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response(),
    };
    let request: SuspendRequest = match read_json(
        req,
        &signed.content_sha256,
        MAX_REQUEST_BYTES,
        "a suspend request",
    )
    .await
    {
        Ok(request) => request,
        Err(err @ JsonBodyError::TooLarge { .. }) => {
            return failure(ErrorKind::TooLarge, &err.to_string());
        }
        Err(JsonBodyError::Malformed(message)) => {
            return failure(ErrorKind::Malformed, &message);
        }
    };
    let wake_after = Duration::from_millis(request.wake_after_ms).min(MAX_WAKE_AFTER);
    match state.suspender.suspend() {
        Ok(stopped) => {
            tracing::info!(stopped, "suspended for a checkpoint");
            state.suspends.request(wake_after);
            json_response(StatusCode::OK, &Suspended { stopped })
        }
        Err(err) => failure(err.kind(), &error_chain(&err)),
    }
}

/// Handles `POST /v1/resume`.
pub async fn resume(req: Request<Incoming>, state: &AgentState) -> Response<Body> {
    if let Err(err) = auth::admit(&req, &state.verifier, state.protocols) {
        return err.response();
    }
    let continued = state.suspender.resume();
    json_response(StatusCode::OK, &Resumed { continued })
}

fn failure(kind: ErrorKind, reason: &str) -> Response<Body> {
    log_failure("suspend", &kind, reason);
    error_response(kind, reason)
}
