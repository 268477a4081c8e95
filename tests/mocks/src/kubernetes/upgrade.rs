//! The HTTP upgrade that the streaming subresources (`portforward`, `exec`)
//! share: reading what the client offers (a WebSocket with its
//! `Sec-WebSocket-Protocol` list, or `Upgrade: SPDY/3.1` with its
//! `X-Stream-Protocol-Version` list) and the `101 Switching Protocols`
//! answer naming the protocol chosen. What runs on the upgraded
//! connection belongs to each subresource.

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode};

use super::status::{bad_request, failure};
use crate::http::{Body, empty};

/// The channel protocol with the stream-close signal (exec).
pub const CHANNEL_V5: &str = "v5.channel.k8s.io";
/// The binary channel protocol: port-forward's, and exec's whose error
/// stream carries a `Status`.
pub const CHANNEL_V4: &str = "v4.channel.k8s.io";
/// The first channel protocol: exec's errors as plain text.
pub const CHANNEL_V1: &str = "channel.k8s.io";

/// How a client asks to be upgraded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// `Upgrade: websocket`, with the subprotocols offered, in order.
    WebSocket(Vec<String>),
    /// `Upgrade: SPDY/3.1`, with the stream protocol versions offered, in order.
    Spdy(Vec<String>),
}

/// The comma-separated values of every `name` header, in order.
fn listed<B>(request: &Request<B>, name: &str) -> Vec<String> {
    request
        .headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Why an upgrade is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    /// Neither a WebSocket nor a SPDY upgrade.
    #[error("Upgrade request required")]
    NotAnUpgrade,
    /// A WebSocket upgrade without its key.
    #[error("missing Sec-WebSocket-Key")]
    NoKey,
    /// No SPDY stream protocol both sides speak.
    #[error(
        "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {served:?}"
    )]
    NoProtocol {
        /// What the client offered.
        offered: Vec<String>,
        /// What the server serves.
        served: &'static [&'static str],
    },
}

impl UpgradeError {
    /// The API's answer: `403` for a protocol mismatch (as the kubelet's
    /// handshake answers), else `400`.
    pub fn answer(&self) -> Response<Body> {
        match self {
            Self::NoProtocol { .. } => {
                failure(StatusCode::FORBIDDEN, "Forbidden", self.to_string(), None)
            }
            Self::NotAnUpgrade | Self::NoKey => bad_request(self.to_string()),
        }
    }
}

/// What the request offers.
pub fn offer<B>(request: &Request<B>) -> Result<Offer, UpgradeError> {
    let upgrade = request
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    match upgrade.as_deref() {
        Some("websocket") => Ok(Offer::WebSocket(listed(request, "sec-websocket-protocol"))),
        Some(upgrade) if upgrade.starts_with("spdy/3.1") => {
            Ok(Offer::Spdy(listed(request, "x-stream-protocol-version")))
        }
        _ => Err(UpgradeError::NotAnUpgrade),
    }
}

/// The first of the client's SPDY stream protocols that the server
/// serves (the client's order wins, as in the kubelet's handshake).
pub fn negotiate_spdy(
    offered: &[String],
    served: &'static [&'static str],
) -> Result<&'static str, UpgradeError> {
    offered
        .iter()
        .find_map(|o| served.iter().find(|s| **s == o.as_str()).copied())
        .ok_or_else(|| UpgradeError::NoProtocol {
            offered: offered.to_vec(),
            served,
        })
}

/// `101` for a SPDY/3.1 upgrade with the stream protocol chosen.
pub fn switch_to_spdy(version: &'static str) -> Response<Body> {
    let mut response = switching();
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    headers.insert(
        "x-stream-protocol-version",
        HeaderValue::from_static(version),
    );
    response
}

/// `101` for a WebSocket upgrade, with the subprotocol chosen (none: the
/// header is left out).
pub fn switch_to_websocket<B>(
    request: &Request<B>,
    subprotocol: Option<&'static str>,
) -> Result<Response<Body>, UpgradeError> {
    let Some(key) = request.headers().get("sec-websocket-key") else {
        return Err(UpgradeError::NoKey);
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut response = switching();
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert("sec-websocket-accept", accept);
    }
    if let Some(chosen) = subprotocol {
        headers.insert("sec-websocket-protocol", HeaderValue::from_static(chosen));
    }
    Ok(response)
}

fn switching() -> Response<Body> {
    let mut response = Response::new(empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::get("/");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn offers_are_read_in_order() {
        let ws = request(&[
            ("upgrade", "websocket"),
            (
                "sec-websocket-protocol",
                "v5.channel.k8s.io, v4.channel.k8s.io",
            ),
        ]);
        assert_eq!(
            offer(&ws).unwrap(),
            Offer::WebSocket(vec!["v5.channel.k8s.io".into(), "v4.channel.k8s.io".into()])
        );
        let spdy = request(&[
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v5.channel.k8s.io"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
        ]);
        let Ok(Offer::Spdy(versions)) = offer(&spdy) else {
            panic!("not spdy")
        };
        assert_eq!(
            negotiate_spdy(&versions, &["v4.channel.k8s.io", "v5.channel.k8s.io"]).unwrap(),
            "v5.channel.k8s.io"
        );
        assert_eq!(
            negotiate_spdy(&versions, &["portforward.k8s.io"])
                .unwrap_err()
                .answer()
                .status(),
            StatusCode::FORBIDDEN
        );
        assert!(offer(&request(&[])).is_err());
    }
}
