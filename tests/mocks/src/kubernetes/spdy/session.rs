//! One SPDY/3.1 session, server side, for whichever subresource runs on it
//! (port-forward, exec): frames read and written, header blocks inflated
//! and deflated, every SYN_STREAM answered with a SYN_REPLY before the
//! stream is handed on, PINGs echoed. What the streams mean is the
//! caller's: it takes [`Event`]s from [`Session::next`] and writes through
//! a [`Writer`].
//!
//! The session ends when the client closes the connection, sends GOAWAY or
//! a frame that cannot be read, or when the caller closes it. A caller
//! done with the session writes its last frames and a GOAWAY, then waits
//! for the client to hang up, so nothing it wrote is cut off.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::frame::{
    self, CANCEL, FLAG_FIN, Frame, GOAWAY, PING, RST_STREAM, SYN_REPLY, SYN_STREAM,
};
use super::zlib::{Deflater, Inflater, decode_pairs, encode_pairs};

/// Frames waiting for the writer before senders wait.
const OUTGOING_QUEUE: usize = 64;
/// Events waiting for the caller before the reader stops reading.
const EVENT_QUEUE: usize = 16;

/// What the client did.
#[derive(Debug)]
pub enum Event {
    /// It opened a stream (already answered), with these headers.
    Opened {
        /// The stream's id.
        stream: u32,
        /// Its headers, names as sent (lowercase in SPDY/3).
        headers: Vec<(String, String)>,
    },
    /// Bytes on a stream; `fin`: the client's last on it.
    Data {
        /// The stream.
        stream: u32,
        /// The bytes (empty for a bare FIN).
        bytes: Bytes,
        /// The client half-closed the stream.
        fin: bool,
    },
    /// It reset a stream.
    Reset(u32),
}

impl Event {
    /// A header of an opened stream, by name, ignoring case.
    pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the writer task sends.
enum Outgoing {
    Reply(u32),
    Data {
        stream: u32,
        bytes: Bytes,
        fin: bool,
    },
    Ping(Bytes),
    Reset(u32),
    GoAway,
}

/// Writes frames into the session; clones share one connection.
#[derive(Clone)]
pub struct Writer {
    out: mpsc::Sender<Outgoing>,
}

impl Writer {
    /// Sends bytes on a stream (`fin`: the server's last on it); false once
    /// the session is gone.
    pub async fn data(&self, stream: u32, bytes: Bytes, fin: bool) -> bool {
        self.out
            .send(Outgoing::Data { stream, bytes, fin })
            .await
            .is_ok()
    }

    /// Closes the server's half of a stream.
    pub async fn finish(&self, stream: u32) -> bool {
        self.data(stream, Bytes::new(), true).await
    }

    /// Resets a stream the server does not want.
    pub async fn reset(&self, stream: u32) -> bool {
        self.out.send(Outgoing::Reset(stream)).await.is_ok()
    }

    /// Tells the client no more streams are taken (the connection stays
    /// open for it to read what was written and hang up).
    pub async fn go_away(&self) -> bool {
        self.out.send(Outgoing::GoAway).await.is_ok()
    }
}

/// A running session.
pub struct Session {
    events: mpsc::Receiver<Event>,
    writer: Writer,
    token: CancellationToken,
    reading: JoinHandle<()>,
    writing: JoinHandle<()>,
}

impl Session {
    /// Starts reading and writing `io`; `cancel` (the mock's) ends it too.
    pub fn start<IO>(io: IO, cancel: &CancellationToken) -> Self
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = tokio::io::split(io);
        let (out, queued) = mpsc::channel(OUTGOING_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let token = cancel.child_token();
        let writing = tokio::spawn(write_frames(writer, queued, token.clone()));
        let reading = tokio::spawn(read_frames(
            BufReader::new(reader),
            out.clone(),
            events_tx,
            token.clone(),
        ));
        Self {
            events,
            writer: Writer { out },
            token,
            reading,
            writing,
        }
    }

    /// The next thing the client did; `None` once the session has ended.
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// A writer into the session.
    pub fn writer(&self) -> Writer {
        self.writer.clone()
    }

    /// Fires when the session ends (tasks working for it stop then).
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Ends the session: stops reading, writes what is queued, closes the
    /// connection.
    pub async fn close(self) {
        self.token.cancel();
        drop(self.events);
        drop(self.writer);
        self.reading.await.ok();
        self.writing.await.ok();
    }
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut reader: R,
    out: mpsc::Sender<Outgoing>,
    events: mpsc::Sender<Event>,
    token: CancellationToken,
) {
    let mut inflater = Inflater::default();
    loop {
        let next = tokio::select! {
            () = token.cancelled() => break,
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
        let event = match frame {
            Frame::Control {
                kind: SYN_STREAM,
                payload,
                ..
            } => {
                let Some(stream) = frame::stream_id(&payload) else {
                    break;
                };
                // Stream id, associated stream id, priority and slot: 10 bytes.
                let headers = match payload.get(10..).map(|block| inflater.block(block)) {
                    Some(Ok(raw)) => decode_pairs(&raw).unwrap_or_default(),
                    _ => break,
                };
                if out.send(Outgoing::Reply(stream)).await.is_err() {
                    break;
                }
                Event::Opened { stream, headers }
            }
            Frame::Data {
                stream,
                flags,
                payload,
            } => Event::Data {
                stream,
                bytes: payload,
                fin: flags & FLAG_FIN != 0,
            },
            Frame::Control {
                kind: RST_STREAM,
                payload,
                ..
            } => match frame::stream_id(&payload) {
                Some(stream) => Event::Reset(stream),
                None => continue,
            },
            Frame::Control {
                kind: PING,
                payload,
                ..
            } => {
                if out.send(Outgoing::Ping(payload)).await.is_err() {
                    break;
                }
                continue;
            }
            Frame::Control { kind: GOAWAY, .. } => break,
            // SETTINGS, WINDOW_UPDATE, HEADERS: nothing the server needs.
            Frame::Control { .. } => continue,
        };
        let delivered = tokio::select! {
            () = token.cancelled() => false,
            sent = events.send(event) => sent.is_ok(),
        };
        if !delivered {
            break;
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut queued: mpsc::Receiver<Outgoing>,
    token: CancellationToken,
) {
    let mut deflater = Deflater::default();
    loop {
        // What is queued goes out before an end is noticed, so a caller's
        // last frames are not dropped by its own close.
        let next = tokio::select! {
            biased;
            next = queued.recv() => next,
            () = token.cancelled() => None,
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
            Outgoing::GoAway => {
                // Last stream id 0 (the server accepted none of its own), status OK.
                frame::control(GOAWAY, 0, &[0; 8])
            }
        };
        if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
            token.cancel();
            break;
        }
    }
    let _ = writer.shutdown().await;
}
