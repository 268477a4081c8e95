//! The provider's port proxy, the shared half: TLS with a test CA
//! ([`tls`]), and [`forward`], which relays one request to a sandbox's
//! published port on 127.0.0.1 and, when the upstream switches protocols
//! (a WebSocket), splices the two upgraded connections byte for byte.
//!
//! Which upstream a request goes to, who may use it, and what a refusal
//! looks like are the provider's rules; each mock's gateway decides them
//! and calls [`forward`]. Requests go on with the headers the gateway
//! leaves them (E2B's keeps `Host`, Daytona's rewrites it as its proxy does).

pub mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use http_body_util::BodyExt;

use crate::http::{Body, relay};

/// Longest wait to reach a published port.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Headers that describe one hop, not the message; never relayed.
const HOP_HEADERS: [&str; 5] = [
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Why a request could not be relayed; the gateway turns every kind into
/// its provider's "port is not open" answer.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Nothing accepted the connection.
    #[error("connecting to {upstream} failed")]
    Connect {
        /// The published address.
        upstream: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The connection was not answered in time.
    #[error("connecting to {upstream} timed out")]
    ConnectTimeout {
        /// The published address.
        upstream: SocketAddr,
    },
    /// The upstream closed or broke the exchange before answering (Docker's
    /// port forwarder accepts and then closes when nothing listens inside).
    #[error("the upstream {upstream} did not answer")]
    Exchange {
        /// The published address.
        upstream: SocketAddr,
        /// hyper's reason.
        #[source]
        source: hyper::Error,
    },
}

/// Relays `request` to `upstream` and returns its answer; an upgrade on
/// both sides is spliced until either end closes or `cancel` fires.
/// `hold` is kept until the exchange is over (the answer's body read, or
/// the spliced connection closed), so a gateway can count open connections
/// by what it passes.
pub async fn forward<G: Send + 'static>(
    mut request: Request<Incoming>,
    upstream: SocketAddr,
    cancel: &CancellationToken,
    hold: G,
) -> Result<Response<Body>, ForwardError> {
    let upgrading = wants_upgrade(request.headers());
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut request));
    strip_hop_headers(request.headers_mut(), upgrading);

    let tcp =
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                tcp
            }
            Ok(Err(source)) => return Err(ForwardError::Connect { upstream, source }),
            Err(_) => return Err(ForwardError::ConnectTimeout { upstream }),
        };
    let exchange = |source| ForwardError::Exchange { upstream, source };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(exchange)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "upstream connection ended with an error");
        }
    });

    let mut response = sender.send_request(request).await.map_err(exchange)?;
    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    strip_hop_headers(response.headers_mut(), switched);
    if let (true, Some(client_upgrade)) = (switched, client_upgrade) {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let _hold = hold;
            let (client, server) = match tokio::join!(client_upgrade, upstream_upgrade) {
                (Ok(client), Ok(server)) => (client, server),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::debug!(%error, "an upgrade did not complete");
                    return;
                }
            };
            let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
            tokio::select! {
                result = tokio::io::copy_bidirectional(&mut client, &mut server) => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "spliced connection ended with an error");
                    }
                }
                () = cancel.cancelled() => {}
            }
        });
        let (parts, body) = response.into_parts();
        return Ok(Response::from_parts(parts, relay(body)));
    }
    let (parts, body) = response.into_parts();
    // The closure owns `hold`, so it lives exactly as long as the body does.
    let body = relay(body)
        .map_frame(move |frame| {
            let _ = &hold;
            frame
        })
        .boxed_unsync();
    Ok(Response::from_parts(parts, body))
}

/// Whether a request asks to switch protocols (`Connection: upgrade`).
fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes per-hop headers; `Connection` and `Upgrade` stay on an upgrade,
/// since they are what asks for it.
fn strip_hop_headers(headers: &mut HeaderMap, upgrading: bool) {
    for name in HOP_HEADERS {
        headers.remove(name);
    }
    if !upgrading {
        headers.remove(CONNECTION);
        headers.remove(UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_needs_both_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(!wants_upgrade(&headers));
        headers.insert(UPGRADE, "websocket".parse().unwrap());
        assert!(wants_upgrade(&headers));
        headers.insert(CONNECTION, "keep-alive".parse().unwrap());
        assert!(!wants_upgrade(&headers));
    }
}
