//! SPDY/3.1, the server side, as kubectl speaks it: the framing
//! ([`frame`]), header compression ([`zlib`]) and one session's plumbing
//! ([`session`]), shared by exec and port-forward; and port-forward's
//! streams ([`serve`]), over a plain `Upgrade: SPDY/3.1` connection or
//! tunnelled in WebSocket binary messages (`SPDY/3.1+portforward.k8s.io`,
//! kubectl's default).
//!
//! For every forwarded connection the client opens two streams
//! (SYN_STREAM) carrying `streamtype` (`error` or `data`), `port` and
//! `requestid`; once both of a request are there, the server connects to
//! `podIP:port` and relays: the data stream both ways, the client's FIN
//! closing the pod connection's write side, the pod's EOF a FIN on the
//! data stream. The error stream carries a message if the connection
//! fails, and is closed (FIN) when the request is done, which is what the
//! client waits for.
//!
//! Not modelled: flow control (the client does not enforce windows, so no
//! WINDOW_UPDATE is sent and those received are ignored), SETTINGS,
//! HEADERS after the first, server-initiated streams and pings.

pub mod frame;
pub mod session;
pub mod zlib;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::session::{Event, Session, Writer};

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

/// Serves one port-forward SPDY session on `io` until it ends or `cancel` fires.
pub async fn serve<IO>(io: IO, target: Target, cancel: CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut session = Session::start(io, &cancel);
    let writer = session.writer();
    let token = session.token();
    let mut inbound: HashMap<u32, mpsc::Sender<Inbound>> = HashMap::new();
    let mut pending: HashMap<String, Pending> = HashMap::new();
    while let Some(event) = session.next().await {
        match event {
            Event::Opened { stream, headers } => {
                let header = |name: &str| Event::header(&headers, name).map(str::to_owned);
                let kind = match header("streamtype").as_deref() {
                    Some("data") => Kind::Data,
                    Some("error") => Kind::Error,
                    _ => {
                        writer.reset(stream).await;
                        continue;
                    }
                };
                if inbound.len() + pending.len() >= MAX_STREAMS {
                    writer.reset(stream).await;
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
                            writer.clone(),
                            token.clone(),
                        ));
                    }
                }
            }
            Event::Data { stream, bytes, fin } => {
                if let Some(tx) = inbound.get(&stream) {
                    if !bytes.is_empty() {
                        // A relay that is gone no longer wants it.
                        let _ = tx.send(Inbound::Data(bytes)).await;
                    }
                    if fin {
                        let _ = tx.send(Inbound::Fin).await;
                        inbound.remove(&stream);
                    }
                }
            }
            Event::Reset(stream) => {
                if let Some(tx) = inbound.remove(&stream) {
                    let _ = tx.try_send(Inbound::Reset);
                }
            }
        }
    }
    drop(inbound);
    session.close().await;
}

/// Relays one forwarded connection between its streams and the pod's port.
async fn relay(
    target: Target,
    port: Option<u16>,
    data: u32,
    error: u32,
    mut inbound: mpsc::Receiver<Inbound>,
    out: Writer,
    session: CancellationToken,
) {
    let Some(port) = port else {
        let message = "unable to parse port: the port header is missing or invalid";
        out.data(error, Bytes::from(message), false).await;
        out.finish(data).await;
        out.finish(error).await;
        return;
    };
    let tcp = match target.connect(port).await {
        Ok(tcp) => tcp,
        Err(cause) => {
            let message = target.refusal(port, &cause);
            out.data(error, Bytes::from(message), false).await;
            out.finish(data).await;
            out.finish(error).await;
            return;
        }
    };
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let upstream = async {
        let mut buffer = vec![0u8; CHUNK];
        loop {
            match from_pod.read(&mut buffer).await {
                Ok(0) | Err(_) => {
                    out.finish(data).await;
                    return;
                }
                Ok(n) => {
                    let bytes = Bytes::copy_from_slice(&buffer[..n]);
                    if !out.data(data, bytes, false).await {
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
    out.finish(error).await;
}

#[cfg(test)]
mod tests {
    use super::frame::{FLAG_FIN, Frame, PING, SYN_REPLY, SYN_STREAM};
    use super::zlib::{Deflater, Inflater, decode_pairs, encode_pairs};
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
