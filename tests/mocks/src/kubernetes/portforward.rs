//! The `portforward` subresource of a running pod: an upgraded connection
//! whose streams relay to `podIP:port`. Three ways in:
//!
//! - WebSocket with `v4.channel.k8s.io` (kube-rs and the Python client
//!   offer `v5.channel.k8s.io, v4.channel.k8s.io`, and port-forward is
//!   served on v4; also no subprotocol at all): the `ports` query lists the ports; port `i`
//!   has channel `2i` for data and `2i+1` for errors, every message starts
//!   with its channel byte, and the server's first message on each
//!   channel is the port, 2 bytes little-endian. A connection that fails
//!   writes its error on the error channel; when every port's pod side
//!   has ended, the WebSocket is closed.
//! - WebSocket with `SPDY/3.1+portforward.k8s.io` (kubectl since 1.31):
//!   the messages carry a SPDY session ([`super::spdy`]).
//! - `Upgrade: SPDY/3.1` with `X-Stream-Protocol-Version:
//!   portforward.k8s.io` (kubectl's fallback and older clients).
//!
//! Only ports the pod's container declares (`containerPort`) are
//! published on its address, so only those can be reached.

use std::net::Ipv4Addr;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::sync::CancellationToken;

use super::Cluster;
use super::model::Key;
use super::pods::PODS;
use super::spdy::{self, Target};
use super::status::{bad_request, not_found};
use super::upgrade::{
    CHANNEL_V4, Offer, negotiate_spdy, offer, switch_to_spdy, switch_to_websocket,
};
use crate::http::Body;

/// SPDY tunnelled over WebSocket, as kubectl asks for it.
pub const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
/// The port-forward protocol over SPDY.
pub const PORTFORWARD_V1: &str = "portforward.k8s.io";
/// Most ports one WebSocket forwards (each takes two channel bytes).
pub const MAX_PORTS: usize = 64;
/// Messages queued towards the client before readers wait.
const QUEUED: usize = 64;
/// Most bytes read from the pod per message.
const CHUNK: usize = 32 << 10;

/// How the client asked to be upgraded.
enum Protocol {
    Channels(Option<&'static str>),
    Tunnel,
    Spdy,
}

/// The ports of a `ports` query (repeated or comma-joined).
fn ports(pairs: &[(String, String)]) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (_, value) in pairs.iter().filter(|(k, _)| k == "ports") {
        for text in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match text.parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => return Err(format!("invalid port: {text}")),
            }
        }
    }
    Ok(ports)
}

/// Answers a port-forward request for the pod under `key`.
pub fn handle(
    cluster: &Arc<Cluster>,
    key: &Key,
    mut request: Request<Incoming>,
    pairs: &[(String, String)],
) -> Response<Body> {
    let Some(pod) = cluster.store.pod(key) else {
        return not_found(&PODS, &key.name);
    };
    let status = pod.status.clone().unwrap_or_default();
    let ip = status
        .pod_ip
        .as_deref()
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
    let (Some("Running"), Some(ip)) = (status.phase.as_deref(), ip) else {
        return bad_request(format!(
            "unable to upgrade connection: pod {} is not running (phase {})",
            key.name,
            status.phase.unwrap_or_default()
        ));
    };
    let target = Target {
        ip,
        name: key.name.clone(),
        namespace: key.namespace.clone(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
    };
    let protocol = match offer(&request) {
        Ok(Offer::WebSocket(offers)) => {
            match offers
                .iter()
                .find(|p| *p == SPDY_TUNNEL || *p == CHANNEL_V4)
            {
                Some(p) if p == SPDY_TUNNEL => Protocol::Tunnel,
                Some(_) => Protocol::Channels(Some(CHANNEL_V4)),
                None if offers.is_empty() => Protocol::Channels(None),
                None => {
                    return bad_request(format!(
                        "unable to upgrade: none of the offered subprotocols {offers:?} is served ({SPDY_TUNNEL}, {CHANNEL_V4})"
                    ));
                }
            }
        }
        Ok(Offer::Spdy(versions)) => match negotiate_spdy(&versions, &[PORTFORWARD_V1]) {
            Ok(_) => Protocol::Spdy,
            Err(refusal) => return refusal.answer(),
        },
        Err(refusal) => return refusal.answer(),
    };
    let upgrade = hyper::upgrade::on(&mut request);
    let cancel = cluster.cancel.clone();
    if let Protocol::Spdy = protocol {
        tokio::spawn(async move {
            match upgrade.await {
                Ok(upgraded) => spdy::serve(TokioIo::new(upgraded), target, cancel).await,
                Err(error) => tracing::debug!(%error, "a port-forward upgrade failed"),
            }
        });
        return switch_to_spdy(PORTFORWARD_V1);
    }
    let tunnel = matches!(protocol, Protocol::Tunnel);
    let chosen = match protocol {
        Protocol::Tunnel => Some(SPDY_TUNNEL),
        Protocol::Channels(p) => p,
        Protocol::Spdy => None,
    };
    let response = match switch_to_websocket(&request, chosen) {
        Ok(response) => response,
        Err(refusal) => return refusal.answer(),
    };
    let ports = match ports(pairs) {
        Ok(ports) if tunnel || !ports.is_empty() && ports.len() <= MAX_PORTS => ports,
        Ok(ports) if ports.is_empty() => {
            return bad_request("query parameter \"ports\" is required");
        }
        Ok(_) => {
            return bad_request(format!(
                "at most {MAX_PORTS} ports may be forwarded at once"
            ));
        }
        Err(message) => return bad_request(message),
    };
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "a port-forward upgrade failed");
                return;
            }
        };
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        if tunnel {
            tunnel_spdy(socket, target, cancel).await;
        } else {
            channels(socket, target, ports, cancel).await;
        }
    });
    response
}

/// What goes to the client, or that a port's pod side has ended.
enum Towards {
    Message(Message),
    Ended,
}

/// The channel protocol: relays each port's data channel to the pod.
async fn channels<S>(
    socket: WebSocketStream<S>,
    target: Target,
    ports: Vec<u16>,
    cancel: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = socket.split();
    let done = cancel.child_token();
    for (i, port) in ports.iter().enumerate() {
        let [lo, hi] = port.to_le_bytes();
        let channel = u8::try_from(2 * i).unwrap_or(u8::MAX);
        for first in [vec![channel, lo, hi], vec![channel + 1, lo, hi]] {
            if sink.send(Message::binary(first)).await.is_err() {
                return;
            }
        }
    }
    let (towards, mut queued) = mpsc::channel::<Towards>(QUEUED);
    let mut writers: Vec<Option<OwnedWriteHalf>> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let channel = u8::try_from(2 * i).unwrap_or(u8::MAX);
        match target.connect(*port).await {
            Ok(tcp) => {
                let (mut from_pod, to_pod) = tcp.into_split();
                writers.push(Some(to_pod));
                let towards = towards.clone();
                let done = done.clone();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; CHUNK + 1];
                    buffer[0] = channel;
                    loop {
                        let read = tokio::select! {
                            () = done.cancelled() => return,
                            read = from_pod.read(&mut buffer[1..]) => read,
                        };
                        match read {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let message = Message::binary(buffer[..=n].to_vec());
                                if towards.send(Towards::Message(message)).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = towards.send(Towards::Ended).await;
                });
            }
            Err(error) => {
                writers.push(None);
                let mut message = vec![channel + 1];
                message.extend_from_slice(target.refusal(*port, &error).as_bytes());
                let _ = towards
                    .send(Towards::Message(Message::binary(message)))
                    .await;
                let _ = towards.send(Towards::Ended).await;
            }
        }
    }
    drop(towards);
    let mut ended = 0;
    loop {
        tokio::select! {
            () = done.cancelled() => break,
            next = queued.recv() => match next {
                Some(Towards::Message(message)) => {
                    if sink.send(message).await.is_err() {
                        break;
                    }
                }
                Some(Towards::Ended) => {
                    ended += 1;
                    if ended == ports.len() {
                        let _ = sink.send(Message::Close(None)).await;
                        break;
                    }
                }
                None => break,
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Binary(bytes))) => {
                    let Some((&channel, data)) = bytes.split_first() else { continue };
                    let index = usize::from(channel / 2);
                    if channel % 2 == 0 && !data.is_empty() {
                        if let Some(Some(writer)) = writers.get_mut(index) {
                            if writer.write_all(data).await.is_err() {
                                writers[index] = None;
                            }
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    done.cancel();
}

/// SPDY carried in binary messages: the session sees one byte stream.
async fn tunnel_spdy<S>(socket: WebSocketStream<S>, target: Target, cancel: CancellationToken)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let session = cancel.child_token();
    let serving = tokio::spawn(spdy::serve(theirs, target, session.clone()));
    let (mut sink, mut stream) = socket.split();
    let (mut from_session, mut to_session) = tokio::io::split(ours);
    let mut buffer = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            () = session.cancelled() => break,
            read = from_session.read(&mut buffer) => match read {
                Ok(0) | Err(_) => {
                    let _ = sink.send(Message::Close(None)).await;
                    break;
                }
                Ok(n) => {
                    if sink.send(Message::binary(Bytes::copy_from_slice(&buffer[..n]))).await.is_err() {
                        break;
                    }
                }
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Binary(bytes))) => {
                    if to_session.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    session.cancel();
    serving.await.ok();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_may_repeat_or_be_joined() {
        let pairs = vec![
            ("ports".to_owned(), "80,443".to_owned()),
            ("ports".to_owned(), "8080".to_owned()),
        ];
        assert_eq!(ports(&pairs).unwrap(), [80, 443, 8080]);
        assert!(ports(&[("ports".to_owned(), "x".to_owned())]).is_err());
        assert!(ports(&[("ports".to_owned(), "0".to_owned())]).is_err());
    }
}
