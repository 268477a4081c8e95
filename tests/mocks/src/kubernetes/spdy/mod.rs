//! The server side of SPDY/3.1 for port-forward, what kubectl speaks: over
//! a plain `Upgrade: SPDY/3.1` connection, or tunnelled in WebSocket
//! binary messages (`SPDY/3.1+portforward.k8s.io`, kubectl's default).
//!
//! For every local connection the client opens two streams (SYN_STREAM)
//! carrying `streamtype` (`error` or `data`), `port` and `requestid`; the
//! server answers each (SYN_REPLY) and, once both of a request are there,
//! connects to `podIP:port` and relays: the data stream both ways, the
//! client's FIN closing the pod connection's write side, the pod's EOF a
//! FIN on the data stream. The error stream carries a message if the
//! connection fails, and is closed (FIN) when the request is done, which
//! is what the client waits for. PINGs are echoed; a GOAWAY, a broken
//! frame or the connection's end ends the session.
//!
//! Not modelled: flow control (the client does not enforce windows, so no
//! WINDOW_UPDATE is sent and those received are ignored), SETTINGS,
//! HEADERS after the first, server-initiated streams and pings.

pub mod frame;
pub mod zlib;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::frame::{CANCEL, FLAG_FIN, Frame, GOAWAY, PING, RST_STREAM, SYN_REPLY, SYN_STREAM};
use self::zlib::{Deflater, Inflater, decode_pairs, encode_pairs};

/// Frames waiting for the writer before senders wait.
const OUTGOING_QUEUE: usize = 64;
/// Inbound data frames buffered per stream before the reader waits.
const INBOUND_QUEUE: usize = 16;
/// Most bytes one outbound data frame carries.
const CHUNK: usize = 32 << 10;
/// Longest wait to reach the pod's port.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most streams one session may hold open (two per forwarded connection).
pub const MAX_STREAMS: usize = 1024;

/// Where the forwarded connections go, and how errors name the pod.
#[derive(Debug, Clone)]
pub struct Target {
    /// The pod's address.
    pub ip: Ipv4Addr,
    /// The pod's name.
    pub name: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's uid.
    pub uid: String,
}

impl Target {
    /// The message the error stream (or channel) carries when `port` cannot be reached.
    pub fn refusal(&self, port: u16, error: &dyn std::fmt::Display) -> String {
        format!(
            "error forwarding port {port} to pod {}_{}, uid {}: dial tcp4 {}:{port}: {error}",
            self.name, self.namespace, self.uid, self.ip
        )
    }

    /// Connects to `port` on the pod's address.
    pub async fn connect(&self, port: u16) -> std::io::Result<TcpStream> {
        let address = SocketAddr::from((self.ip, port));
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                Ok(tcp)
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "i/o timeout",
            )),
        }
    }
}

/// What the writer sends.
enum Outgoing {
    Reply(u32),
    Data {
        stream: u32,
        bytes: Bytes,
        fin: bool,
    },
    Ping(Bytes),
    Reset(u32),
}

/// What a data stream's relay gets from the client.
enum Inbound {
    Data(Bytes),
    Fin,
    Reset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data,
    Error,
}

/// One request's streams while the client opens them.
#[derive(Default)]
struct Pending {
    data: Option<(u32, mpsc::Receiver<Inbound>)>,
    error: Option<u32>,
    port: Option<u16>,
}

/// Serves one SPDY session on `io` until it ends or `cancel` fires.
pub async fn serve<IO>(io: IO, target: Target, cancel: CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (reader, writer) = tokio::io::split(io);
    let mut reader = BufReader::new(reader);
    let (out, queued) = mpsc::channel(OUTGOING_QUEUE);
    let session = cancel.child_token();
    let writing = tokio::spawn(write_frames(writer, queued, session.clone()));
    let mut inflater = Inflater::default();
    let mut inbound: HashMap<u32, mpsc::Sender<Inbound>> = HashMap::new();
    let mut pending: HashMap<String, Pending> = HashMap::new();
    loop {
        let next = tokio::select! {
            () = session.cancelled() => break,
            next = frame::read(&mut reader) => next,
        };
        let frame = match next {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%error, "a spdy session ended");
                break;
            }
        };
        match frame {
            Frame::Control {
                kind: SYN_STREAM,
                payload,
                ..
            } => {
                let Some(stream) = frame::stream_id(&payload) else {
                    break;
                };
                // Stream id, associated stream id, priority and slot: 10 bytes.
                let pairs = match payload.get(10..).map(|block| inflater.block(block)) {
                    Some(Ok(raw)) => decode_pairs(&raw).unwrap_or_default(),
                    _ => break,
                };
                if out.send(Outgoing::Reply(stream)).await.is_err() {
                    break;
                }
                let header = |name: &str| {
                    pairs
                        .iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.clone())
                };
                let kind = match header("streamtype").as_deref() {
                    Some("data") => Kind::Data,
                    Some("error") => Kind::Error,
                    _ => {
                        let _ = out.send(Outgoing::Reset(stream)).await;
                        continue;
                    }
                };
                if inbound.len() + pending.len() >= MAX_STREAMS {
                    let _ = out.send(Outgoing::Reset(stream)).await;
                    continue;
                }
                let request = header("requestid").unwrap_or_default();
                let port = header("port")
                    .and_then(|p| p.parse::<u16>().ok())
                    .filter(|p| *p > 0);
                let entry = pending.entry(request.clone()).or_default();
                entry.port = entry.port.or(port);
                match kind {
                    Kind::Data => {
                        let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
                        inbound.insert(stream, tx);
                        entry.data = Some((stream, rx));
                    }
                    Kind::Error => entry.error = Some(stream),
                }
                if entry.data.is_some() && entry.error.is_some() {
                    if let Some(Pending {
                        data: Some((data, rx)),
                        error: Some(error),
                        port,
                    }) = pending.remove(&request)
                    {
                        tokio::spawn(relay(
                            target.clone(),
                            port,
                            data,
                            error,
                            rx,
                            out.clone(),
                            session.clone(),
                        ));
                    }
                }
            }
            Frame::Data {
                stream,
                flags,
                payload,
            } => {
                if let Some(tx) = inbound.get(&stream) {
                    if !payload.is_empty() {
                        // A relay that is gone no longer wants it.
                        let _ = tx.send(Inbound::Data(payload)).await;
                    }
                    if flags & FLAG_FIN != 0 {
                        let _ = tx.send(Inbound::Fin).await;
                        inbound.remove(&stream);
                    }
                }
            }
            Frame::Control {
                kind: RST_STREAM,
                payload,
                ..
            } => {
                if let Some(stream) = frame::stream_id(&payload) {
                    if let Some(tx) = inbound.remove(&stream) {
                        let _ = tx.try_send(Inbound::Reset);
                    }
                }
            }
            Frame::Control {
                kind: PING,
                payload,
                ..
            } => {
                if out.send(Outgoing::Ping(payload)).await.is_err() {
                    break;
                }
            }
            Frame::Control { kind: GOAWAY, .. } => break,
            // SETTINGS, WINDOW_UPDATE, HEADERS: nothing the server needs.
            Frame::Control { .. } => {}
        }
    }
    session.cancel();
    drop(out);
    drop(inbound);
    writing.await.ok();
}

async fn write_frames<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut queued: mpsc::Receiver<Outgoing>,
    session: CancellationToken,
) {
    let mut deflater = Deflater::default();
    loop {
        let next = tokio::select! {
            next = queued.recv() => next,
            () = session.cancelled() => None,
        };
        let Some(outgoing) = next else { break };
        let bytes = match outgoing {
            Outgoing::Reply(stream) => {
                let mut payload = stream.to_be_bytes().to_vec();
                payload.extend(deflater.block(&encode_pairs(&[])));
                frame::control(SYN_REPLY, 0, &payload)
            }
            Outgoing::Data { stream, bytes, fin } => {
                frame::data(stream, if fin { FLAG_FIN } else { 0 }, &bytes)
            }
            Outgoing::Ping(payload) => frame::control(PING, 0, &payload),
            Outgoing::Reset(stream) => {
                let mut payload = stream.to_be_bytes().to_vec();
                payload.extend_from_slice(&CANCEL.to_be_bytes());
                frame::control(RST_STREAM, 0, &payload)
            }
        };
        if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
            session.cancel();
            break;
        }
    }
    let _ = writer.shutdown().await;
}

/// Relays one forwarded connection between its streams and the pod's port.
async fn relay(
    target: Target,
    port: Option<u16>,
    data: u32,
    error: u32,
    mut inbound: mpsc::Receiver<Inbound>,
    out: mpsc::Sender<Outgoing>,
    session: CancellationToken,
) {
    let close = |stream| Outgoing::Data {
        stream,
        bytes: Bytes::new(),
        fin: true,
    };
    let Some(port) = port else {
        let message = "unable to parse port: the port header is missing or invalid";
        let _ = out
            .send(Outgoing::Data {
                stream: error,
                bytes: Bytes::from(message),
                fin: false,
            })
            .await;
        let _ = out.send(close(data)).await;
        let _ = out.send(close(error)).await;
        return;
    };
    let tcp = match target.connect(port).await {
        Ok(tcp) => tcp,
        Err(cause) => {
            let message = target.refusal(port, &cause);
            let _ = out
                .send(Outgoing::Data {
                    stream: error,
                    bytes: Bytes::from(message),
                    fin: false,
                })
                .await;
            let _ = out.send(close(data)).await;
            let _ = out.send(close(error)).await;
            return;
        }
    };
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let upstream = async {
        let mut buffer = vec![0u8; CHUNK];
        loop {
            match from_pod.read(&mut buffer).await {
                Ok(0) | Err(_) => {
                    let _ = out.send(close(data)).await;
                    return;
                }
                Ok(n) => {
                    let bytes = Bytes::copy_from_slice(&buffer[..n]);
                    let frame = Outgoing::Data {
                        stream: data,
                        bytes,
                        fin: false,
                    };
                    if out.send(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let downstream = async {
        while let Some(message) = inbound.recv().await {
            match message {
                Inbound::Data(bytes) => {
                    if to_pod.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Inbound::Fin => {
                    let _ = to_pod.shutdown().await;
                }
                Inbound::Reset => return,
            }
        }
        // The session ended, or writing failed: wait for the pod's side.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
        () = session.cancelled() => return,
    }
    let _ = out.send(close(error)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A client side of the session, as kubectl's would be, for one request.
    struct Client {
        deflater: Deflater,
        inflater: Inflater,
    }

    impl Client {
        fn syn(&mut self, stream: u32, pairs: &[(&str, &str)]) -> Vec<u8> {
            let mut payload = stream.to_be_bytes().to_vec();
            payload.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            payload.extend(self.deflater.block(&encode_pairs(pairs)));
            frame::control(SYN_STREAM, 0, &payload)
        }
    }

    #[tokio::test]
    async fn a_forwarded_connection_relays_both_ways() {
        let pod = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = pod.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut tcp, _) = pod.accept().await.unwrap();
            let mut asked = Vec::new();
            tcp.read_to_end(&mut asked).await.unwrap();
            tcp.write_all(&[b"echo:".as_slice(), &asked].concat())
                .await
                .unwrap();
        });
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let target = Target {
            ip: Ipv4Addr::LOCALHOST,
            name: "p".into(),
            namespace: "default".into(),
            uid: "u".into(),
        };
        let cancel = CancellationToken::new();
        tokio::spawn(serve(server_io, target, cancel.clone()));
        let (mut reading, mut writing) = tokio::io::split(client_io);
        let mut client = Client {
            deflater: Deflater::default(),
            inflater: Inflater::default(),
        };
        let port_text = port.to_string();
        let headers = |kind| {
            [
                ("streamtype", kind),
                ("port", port_text.as_str()),
                ("requestid", "0"),
            ]
        };
        writing
            .write_all(&client.syn(1, &headers("error")))
            .await
            .unwrap();
        writing
            .write_all(&client.syn(3, &headers("data")))
            .await
            .unwrap();
        writing.write_all(&frame::data(3, 0, b"hi")).await.unwrap();
        writing
            .write_all(&frame::data(3, FLAG_FIN, b""))
            .await
            .unwrap();
        writing
            .write_all(&frame::control(PING, 0, &1u32.to_be_bytes()))
            .await
            .unwrap();
        let mut replies = Vec::new();
        let mut received = Vec::new();
        let mut finished = Vec::new();
        let mut pinged = false;
        while finished.len() < 2 || !pinged {
            match frame::read(&mut reading).await.unwrap().unwrap() {
                Frame::Control {
                    kind: SYN_REPLY,
                    payload,
                    ..
                } => {
                    replies.push(frame::stream_id(&payload).unwrap());
                    let block = client.inflater.block(&payload[4..]).unwrap();
                    assert!(decode_pairs(&block).unwrap().is_empty());
                }
                Frame::Control {
                    kind: PING,
                    payload,
                    ..
                } => {
                    assert_eq!(payload.as_ref(), &[0, 0, 0, 1]);
                    pinged = true;
                }
                Frame::Data {
                    stream,
                    flags,
                    payload,
                } => {
                    if stream == 3 {
                        received.extend_from_slice(&payload);
                    }
                    if flags & FLAG_FIN != 0 {
                        finished.push(stream);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(replies, [1, 3]);
        assert_eq!(received, b"echo:hi");
        assert_eq!(finished, [3, 1]);
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_closed_port_is_reported_on_the_error_stream() {
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let target = Target {
            ip: Ipv4Addr::LOCALHOST,
            name: "p".into(),
            namespace: "default".into(),
            uid: "u".into(),
        };
        tokio::spawn(serve(server_io, target, CancellationToken::new()));
        let (mut reading, mut writing) = tokio::io::split(client_io);
        let mut client = Client {
            deflater: Deflater::default(),
            inflater: Inflater::default(),
        };
        let port_text = port.to_string();
        let headers = |kind| {
            [
                ("streamtype", kind),
                ("port", port_text.as_str()),
                ("requestid", "7"),
            ]
        };
        writing
            .write_all(&client.syn(1, &headers("error")))
            .await
            .unwrap();
        writing
            .write_all(&client.syn(3, &headers("data")))
            .await
            .unwrap();
        let mut message = Vec::new();
        loop {
            if let Frame::Data {
                stream: 1,
                flags,
                payload,
            } = frame::read(&mut reading).await.unwrap().unwrap()
            {
                message.extend_from_slice(&payload);
                if flags & FLAG_FIN != 0 {
                    break;
                }
            }
        }
        let message = String::from_utf8(message).unwrap();
        assert!(
            message.starts_with(&format!("error forwarding port {port} to pod p_default")),
            "{message}"
        );
    }
}
