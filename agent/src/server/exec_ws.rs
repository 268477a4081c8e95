//! `GET /v1/exec`: admits the request and performs the WebSocket handshake.
//!
//! The handshake is done by hand on top of hyper's upgrade so the same
//! version and signature checks as every other route run first, and a
//! rejection is an ordinary JSON error response the client can read.

use std::sync::Arc;

use http::header::{
    CONNECTION, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION,
    UPGRADE,
};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use silo_protocol::ErrorKind;
use silo_protocol::auth::EMPTY_BODY_SHA256;
use silo_protocol::exec::FRAME_HEADER_LEN;
use silo_protocol::limits::MAX_FRAME_PAYLOAD;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use super::{AgentState, Body, ConnGuard, auth, connection, error_response};

/// Largest message a client may send: a stdin frame of up to 16 maximal
/// payloads, or a control message of the same size.
const MAX_CLIENT_MESSAGE: usize = FRAME_HEADER_LEN + 16 * MAX_FRAME_PAYLOAD;

/// Checks the request and, if it passes, answers 101 and hands the upgraded
/// connection to [`connection::run`].
pub fn upgrade(
    mut req: Request<Incoming>,
    state: &Arc<AgentState>,
    guard: &Arc<ConnGuard>,
) -> Response<Body> {
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return err.response(),
    };
    if signed.content_sha256 != EMPTY_BODY_SHA256 {
        return error_response(
            ErrorKind::BadRequest,
            "an exec upgrade has no body; sign the empty body's hash",
        );
    }
    let Some(key) = websocket_key(&req) else {
        return error_response(
            ErrorKind::BadRequest,
            "expected a WebSocket upgrade (Connection: upgrade, Upgrade: websocket, \
             Sec-WebSocket-Version: 13, Sec-WebSocket-Key)",
        );
    };
    let accept = derive_accept_key(key.as_bytes());
    let Ok(accept) = HeaderValue::from_str(&accept) else {
        return error_response(ErrorKind::Internal, "bad accept key");
    };
    state.activity.touch();

    let on_upgrade = hyper::upgrade::on(&mut req);
    let state = Arc::clone(state);
    let guard = Arc::clone(guard);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(MAX_CLIENT_MESSAGE))
                    .max_frame_size(Some(MAX_CLIENT_MESSAGE));
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                connection::run(ws, state, guard.phase.clone()).await;
            }
            Err(err) => tracing::debug!(%err, "websocket upgrade failed"),
        }
        drop(guard);
    });

    let mut response = Response::new(Full::default());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
    response
}

/// The client's `Sec-WebSocket-Key`, if this is a well-formed upgrade request.
fn websocket_key<B>(req: &Request<B>) -> Option<&str> {
    let headers = req.headers();
    let has_token = |name, token: &str| {
        headers.get_all(name).iter().any(|value| {
            value
                .to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    let version_ok = headers
        .get(SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v.as_bytes() == b"13");
    if has_token(CONNECTION, "upgrade") && has_token(UPGRADE, "websocket") && version_ok {
        headers.get(SEC_WEBSOCKET_KEY)?.to_str().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_headers_are_required() {
        let req = Request::get("/v1/exec")
            .header(CONNECTION, "keep-alive, Upgrade")
            .header(UPGRADE, "WebSocket")
            .header(SEC_WEBSOCKET_VERSION, "13")
            .header(SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
            .body(())
            .unwrap();
        assert_eq!(websocket_key(&req), Some("dGhlIHNhbXBsZSBub25jZQ=="));
        // The RFC 6455 example.
        assert_eq!(
            derive_accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let plain = Request::get("/v1/exec").body(()).unwrap();
        assert_eq!(websocket_key(&plain), None);
    }
}
