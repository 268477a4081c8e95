//! One exec channel to an agent: a signed WebSocket carrying many execs.
//!
//! A reader task routes what the agent sends: replies go to the request that
//! carries the same tag, output frames and exits go to the handle of their exec.
//! The socket's sending half is shared behind a lock, and each request is
//! written by the task that makes it: a writer task in between cost a
//! wake-up and a task switch on every request, on the path of every exec's
//! round trip (docs/benchmarks.md, exec-rtt). When the last
//! [`ExecConnection`] clone and every [`ExecHandle`] are dropped, the socket
//! is closed with a close frame and the reader ends: shutdown is explicit,
//! not left to a timeout on the agent's side.
//!
//! The reader registers an exec's event queue as soon as it reads `started`
//! or `attached`, before it reads the next message, so no frame of a new exec
//! can arrive before someone is there to take it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use silo_protocol::exec::{
    AgentMessage, Channel, ClientMessage, ExecId, ExecSpec, ExecState, ExecSummary, ExitInfo,
    Frame, FsEvent, StreamOffsets, WindowSize,
};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use super::transport::Stream;
use super::{ClientError, Spoken, lock};

/// Events queued per exec before the reader waits for the consumer.
const EXEC_EVENT_QUEUE: usize = 1024;
/// Batches of directory changes queued per watch.
const WATCH_EVENT_QUEUE: usize = 256;

type Sink = SplitSink<WebSocketStream<Box<dyn Stream>>, Message>;

/// Something that happened to an exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Output bytes; `offset` is where `data[0]` stands in the exec's
    /// output (both channels count; the wire frame's `seq`).
    Output {
        /// stdout or stderr.
        channel: Channel,
        /// Byte offset.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The exec ended; no event follows.
    Exit(ExitInfo),
}

/// What one exec printed and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub exit: ExitInfo,
}

/// What a directory watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// Changes, in the order the kernel reported them.
    Changes(Vec<FsEvent>),
    /// The watch ended on the agent's side (its directory went away);
    /// nothing follows.
    Ended(String),
}

/// A reply to a tagged request, with the event queue the reader registered for it.
pub(super) struct Reply {
    pub(super) message: AgentMessage,
    events: Option<mpsc::Receiver<ExecEvent>>,
    watch: Option<mpsc::Receiver<WatchEvent>>,
}

/// State the reader task and the request side share.
#[derive(Default)]
struct Routes {
    /// Requests waiting for their reply, by tag.
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    /// Event queues of the execs this connection follows.
    execs: HashMap<ExecId, mpsc::Sender<ExecEvent>>,
    /// Event queues of the directory watches this connection asked for.
    watches: HashMap<u64, mpsc::Sender<WatchEvent>>,
    /// Set once the socket is gone; later requests fail at once.
    closed: bool,
}

/// A live exec channel. Cheap to clone; every clone shares the socket.
#[derive(Clone)]
pub struct ExecConnection {
    /// The protocol version the channel speaks; a message that needs a
    /// feature it lacks is refused before it is sent.
    spoken: Arc<Spoken>,
    outgoing: Arc<Outgoing>,
    routes: Arc<Mutex<Routes>>,
    next_tag: Arc<AtomicU64>,
}

impl ExecConnection {
    /// Takes over an upgraded WebSocket and starts its reader task.
    pub(crate) fn start(socket: WebSocketStream<Box<dyn Stream>>, spoken: Spoken) -> Self {
        let (sink, stream) = socket.split();
        let routes = Arc::new(Mutex::new(Routes::default()));
        tokio::spawn(read_loop(stream, routes.clone()));
        Self {
            spoken: Arc::new(spoken),
            outgoing: Arc::new(Outgoing {
                sink: tokio::sync::Mutex::new(Some(sink)),
                runtime: tokio::runtime::Handle::current(),
            }),
            routes,
            next_tag: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Starts a command and follows it from its first byte.
    pub async fn exec(&self, spec: ExecSpec) -> Result<ExecHandle, ClientError> {
        let tag = self.tag();
        let reply = self.call(tag, ClientMessage::Exec { tag, spec }).await?;
        match reply.message {
            AgentMessage::Started { exec_id, pid, .. } => {
                Ok(self.handle(exec_id, pid, reply.events)?)
            }
            other => Err(unexpected(other)),
        }
    }

    /// Follows an exec started on any connection, replaying output from byte
    /// offset `from_offset`. Also returns how many requested bytes the agent no
    /// longer held.
    pub async fn attach(
        &self,
        exec_id: ExecId,
        from_offset: u64,
    ) -> Result<(ExecHandle, u64), ClientError> {
        let attached = self.attach_from(exec_id, from_offset, None).await?;
        Ok((attached.handle, attached.lost_bytes))
    }

    /// Follows an exec from byte offset `from_offset`, or, with `streams`,
    /// from the first byte either stream lacks (the caller drops what it
    /// has of the other); answers where the replay starts.
    pub async fn attach_from(
        &self,
        exec_id: ExecId,
        from_offset: u64,
        streams: Option<StreamOffsets>,
    ) -> Result<Attached, ClientError> {
        let tag = self.tag();
        let request = ClientMessage::Attach {
            tag,
            exec_id,
            from_seq: from_offset,
            from_streams: streams,
        };
        let reply = self.call(tag, request).await?;
        match reply.message {
            AgentMessage::Attached {
                next_seq,
                lost_bytes,
                streams,
                ..
            } => Ok(Attached {
                handle: self.handle(exec_id, 0, reply.events)?,
                next_offset: next_seq,
                lost_bytes,
                streams,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Sends bytes to an exec's stdin (started with `stdin: true`, or a PTY
    /// exec), whichever connection follows it.
    pub async fn write_stdin(&self, exec_id: ExecId, data: &[u8]) -> Result<(), ClientError> {
        for chunk in data.chunks(silo_protocol::limits::MAX_FRAME_PAYLOAD) {
            let frame = Frame {
                channel: Channel::Stdin,
                exec_id,
                seq: 0,
                payload: chunk.to_vec(),
            };
            self.send_frame(frame).await?;
        }
        Ok(())
    }

    /// Changes the window of a PTY exec (the program sees SIGWINCH).
    pub async fn resize(&self, exec_id: ExecId, window: WindowSize) -> Result<(), ClientError> {
        self.send(ClientMessage::Resize { exec_id, window }).await
    }

    /// Closes an exec's stdin, so it reads EOF (a PTY exec gets ^D).
    pub async fn close_stdin(&self, exec_id: ExecId) -> Result<(), ClientError> {
        self.send(ClientMessage::CloseStdin { exec_id }).await
    }

    /// Watches the directory `path` (its subdirectories too with
    /// `recursive`) for as long as the answer and this connection live.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<DirWatch, ClientError> {
        let tag = self.tag();
        let request = ClientMessage::Watch {
            tag,
            path: path.to_owned(),
            recursive,
        };
        let reply = self.call(tag, request).await?;
        match (reply.message, reply.watch) {
            (AgentMessage::Watching { watch_id, .. }, Some(events)) => Ok(DirWatch {
                connection: self.clone(),
                watch_id,
                events,
            }),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Every exec the agent holds, running and finished, by id.
    pub async fn list(&self) -> Result<Vec<ExecSummary>, ClientError> {
        let tag = self.tag();
        let reply = self.call(tag, ClientMessage::List { tag }).await?;
        match reply.message {
            AgentMessage::ExecList { execs, .. } => Ok(execs),
            other => Err(unexpected(other)),
        }
    }

    /// Interrupts an exec: SIGINT, `grace` (the agent's default when `None`),
    /// then SIGKILL. Returns the exec's state when the request arrived.
    pub async fn interrupt(
        &self,
        exec_id: ExecId,
        grace: Option<Duration>,
    ) -> Result<ExecState, ClientError> {
        let tag = self.tag();
        let grace_ms = grace.map(|g| u64::try_from(g.as_millis()).unwrap_or(u64::MAX));
        let reply = self
            .call(
                tag,
                ClientMessage::Interrupt {
                    tag,
                    exec_id,
                    grace_ms,
                },
            )
            .await?;
        match reply.message {
            AgentMessage::InterruptAck { state, .. } => Ok(state),
            other => Err(unexpected(other)),
        }
    }

    /// An exec's state, its exit when finished, and its output byte count.
    pub async fn status(
        &self,
        exec_id: ExecId,
    ) -> Result<(ExecState, Option<ExitInfo>, u64), ClientError> {
        let tag = self.tag();
        let reply = self
            .call(tag, ClientMessage::Status { tag, exec_id })
            .await?;
        match reply.message {
            AgentMessage::Status {
                state,
                exit,
                output_bytes,
                ..
            } => Ok((state, exit, output_bytes)),
            other => Err(unexpected(other)),
        }
    }

    /// Runs a command to completion and collects its output.
    pub async fn run(&self, spec: ExecSpec) -> Result<ExecOutput, ClientError> {
        self.exec(spec).await?.collect().await
    }

    /// The protocol version this channel speaks, and the agent's versions.
    pub fn protocol(&self) -> &Spoken {
        &self.spoken
    }

    pub(super) fn tag(&self) -> u64 {
        self.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    fn handle(
        &self,
        exec_id: ExecId,
        pid: u32,
        events: Option<mpsc::Receiver<ExecEvent>>,
    ) -> Result<ExecHandle, ClientError> {
        let events = events.ok_or_else(|| ClientError::Protocol("reply carried no exec".into()))?;
        Ok(ExecHandle {
            exec_id,
            pid,
            events,
            connection: self.clone(),
        })
    }

    pub(super) async fn call(
        &self,
        tag: u64,
        message: ClientMessage,
    ) -> Result<Reply, ClientError> {
        self.check(&message)?;
        let (reply_tx, reply_rx) = oneshot::channel();
        {
            let mut routes = lock(&self.routes);
            if routes.closed {
                return Err(ClientError::Disconnected);
            }
            routes.pending.insert(tag, reply_tx);
        }
        let text = serde_json::to_string(&message)
            .map_err(|e| ClientError::Protocol(format!("encoding request: {e}")))?;
        if let Err(error) = self.outgoing.send(Message::text(text)).await {
            lock(&self.routes).pending.remove(&tag);
            return Err(error);
        }
        let reply = reply_rx.await.map_err(|_| ClientError::Disconnected)?;
        match reply.message {
            AgentMessage::Error { kind, message, .. } => Err(ClientError::Agent { kind, message }),
            _ => Ok(reply),
        }
    }

    async fn send_frame(&self, frame: Frame) -> Result<(), ClientError> {
        self.outgoing.send(Message::binary(frame.encode())).await
    }

    /// Refuses a message the spoken version lacks a feature for.
    fn check(&self, message: &ClientMessage) -> Result<(), ClientError> {
        message
            .features()
            .into_iter()
            .try_for_each(|feature| self.spoken.require(feature))
    }

    async fn send(&self, message: ClientMessage) -> Result<(), ClientError> {
        self.check(&message)?;
        let text = serde_json::to_string(&message)
            .map_err(|e| ClientError::Protocol(format!("encoding request: {e}")))?;
        self.outgoing.send(Message::text(text)).await
    }
}

/// The socket's sending half, shared by every clone of a connection.
struct Outgoing {
    /// `None` once a write failed: the socket is gone for every sender.
    sink: tokio::sync::Mutex<Option<Sink>>,
    /// The runtime the reader runs on, where the close is sent from: the
    /// last clone may be dropped on a thread outside it (a binding's).
    runtime: tokio::runtime::Handle,
}

impl Outgoing {
    /// Writes one message from the caller's own task.
    async fn send(&self, message: Message) -> Result<(), ClientError> {
        let mut sink = self.sink.lock().await;
        let Some(open) = sink.as_mut() else {
            return Err(ClientError::Disconnected);
        };
        if open.send(message).await.is_err() {
            *sink = None;
            return Err(ClientError::Disconnected);
        }
        Ok(())
    }
}

impl Drop for Outgoing {
    /// Nobody can use the connection any more: close it properly, from a
    /// task, since a close frame is a write that may wait.
    fn drop(&mut self) {
        let Some(mut sink) = self.sink.get_mut().take() else {
            return;
        };
        self.runtime.spawn(async move {
            let _ = sink.send(Message::Close(None)).await;
            let _ = sink.close().await;
        });
    }
}

/// A directory watched through an exec connection
/// ([`ExecConnection::watch`]); dropping it leaves the agent's watch to
/// end with the connection, [`DirWatch::stop`] ends it at once.
pub struct DirWatch {
    connection: ExecConnection,
    watch_id: u64,
    events: mpsc::Receiver<WatchEvent>,
}

impl DirWatch {
    /// The next batch of changes, or the watch's end; `None` when the
    /// connection is gone (changes after that are not seen).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.events.recv().await
    }

    /// A batch already received, without waiting.
    pub fn try_next(&mut self) -> Option<WatchEvent> {
        self.events.try_recv().ok()
    }

    /// Ends the watch on the agent.
    pub async fn stop(self) -> Result<(), ClientError> {
        let tag = self.connection.tag();
        let request = ClientMessage::Unwatch {
            tag,
            watch_id: self.watch_id,
        };
        self.connection.call(tag, request).await.map(drop)
    }
}

/// An attach's answer: the followed exec and where its replay starts.
pub struct Attached {
    /// The exec, followed from `next_offset`.
    pub handle: ExecHandle,
    /// Offset of the first replayed byte.
    pub next_offset: u64,
    /// Requested bytes the agent no longer held.
    pub lost_bytes: u64,
    /// Each stream's bytes before `next_offset` (agents of protocol 8 on).
    pub streams: Option<StreamOffsets>,
}

/// One exec followed on a connection.
pub struct ExecHandle {
    exec_id: ExecId,
    pid: u32,
    events: mpsc::Receiver<ExecEvent>,
    connection: ExecConnection,
}

impl ExecHandle {
    /// The agent's id for this exec.
    pub fn id(&self) -> ExecId {
        self.exec_id
    }

    /// The exec's pid in the sandbox (0 when attached rather than started here).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The next output or exit; `None` when the connection died first.
    pub async fn next_event(&mut self) -> Option<ExecEvent> {
        self.events.recv().await
    }

    /// Sends bytes to the exec's stdin, in frames of at most the protocol's size.
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), ClientError> {
        self.connection.write_stdin(self.exec_id, data).await
    }

    /// Changes the window of a PTY exec (it sees SIGWINCH).
    pub async fn resize(&self, window: WindowSize) -> Result<(), ClientError> {
        self.connection.resize(self.exec_id, window).await
    }

    /// Closes the exec's stdin, so it reads EOF (a PTY exec gets ^D).
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        self.connection.close_stdin(self.exec_id).await
    }

    /// Interrupts this exec; see [`ExecConnection::interrupt`].
    pub async fn interrupt(&self, grace: Option<Duration>) -> Result<ExecState, ClientError> {
        self.connection.interrupt(self.exec_id, grace).await
    }

    /// A clone of the connection this exec is followed on, e.g. to interrupt it
    /// from another task while this handle is being read.
    pub fn connection(&self) -> ExecConnection {
        self.connection.clone()
    }

    /// Reads events to the exit and returns everything printed.
    pub async fn collect(mut self) -> Result<ExecOutput, ClientError> {
        let mut out = ExecOutput::default();
        while let Some(event) = self.next_event().await {
            match event {
                ExecEvent::Output {
                    channel: Channel::Stderr,
                    data,
                    ..
                } => out.stderr.extend(data),
                ExecEvent::Output { data, .. } => out.stdout.extend(data),
                ExecEvent::Exit(exit) => {
                    out.exit = exit;
                    return Ok(out);
                }
            }
        }
        Err(ClientError::Disconnected)
    }
}

impl Drop for ExecHandle {
    fn drop(&mut self) {
        lock(&self.connection.routes).execs.remove(&self.exec_id);
    }
}

fn unexpected(message: AgentMessage) -> ClientError {
    ClientError::Protocol(format!("unexpected reply from agent: {message:?}"))
}

async fn read_loop(
    mut stream: futures_util::stream::SplitStream<WebSocketStream<Box<dyn Stream>>>,
    routes: Arc<Mutex<Routes>>,
) {
    while let Some(Ok(message)) = stream.next().await {
        match message {
            Message::Text(text) => match serde_json::from_str::<AgentMessage>(&text) {
                Ok(message) => route_message(&routes, message).await,
                Err(error) => tracing::warn!(%error, "agent sent an unreadable message"),
            },
            Message::Binary(bytes) => match Frame::decode(&bytes) {
                Ok(frame) => {
                    let event = ExecEvent::Output {
                        channel: frame.channel,
                        offset: frame.seq,
                        data: frame.payload,
                    };
                    deliver(&routes, execs, frame.exec_id, event, false).await;
                }
                Err(error) => tracing::warn!(%error, "agent sent an unreadable frame"),
            },
            Message::Close(_) => break,
            // Pings are answered by the socket itself.
            _ => {}
        }
    }
    let mut routes = lock(&routes);
    routes.closed = true;
    routes.pending.clear();
    routes.execs.clear();
    routes.watches.clear();
}

async fn route_message(routes: &Mutex<Routes>, message: AgentMessage) {
    let message = match message {
        AgentMessage::Exit { exec_id, exit } => {
            return deliver(routes, execs, exec_id, ExecEvent::Exit(exit), true).await;
        }
        AgentMessage::FsEvents { watch_id, events } => {
            let event = WatchEvent::Changes(events);
            return deliver(routes, watches, watch_id, event, false).await;
        }
        AgentMessage::WatchEnded { watch_id, reason } => {
            let event = WatchEvent::Ended(reason);
            return deliver(routes, watches, watch_id, event, true).await;
        }
        other => other,
    };
    let tag = match &message {
        AgentMessage::Started { tag, .. }
        | AgentMessage::Attached { tag, .. }
        | AgentMessage::InterruptAck { tag, .. }
        | AgentMessage::Status { tag, .. }
        | AgentMessage::ExecList { tag, .. }
        | AgentMessage::Watching { tag, .. }
        | AgentMessage::Unwatched { tag, .. }
        | AgentMessage::SessionOpened { tag, .. }
        | AgentMessage::SessionList { tag, .. }
        | AgentMessage::SessionClosed { tag, .. }
        | AgentMessage::SessionInterrupted { tag, .. } => Some(*tag),
        AgentMessage::Error { tag, .. } => *tag,
        // Events, not replies: delivered by value below.
        AgentMessage::Exit { .. }
        | AgentMessage::FsEvents { .. }
        | AgentMessage::WatchEnded { .. } => None,
    };
    let Some(tag) = tag else {
        if matches!(
            message,
            AgentMessage::Error {
                exec_id: Some(_),
                ..
            }
        ) {
            // An exec's output dropped because this connection fell behind:
            // the gap reaches the exec's events as lost bytes, which is
            // where a caller (and the CLI's one notice) learns of it.
            tracing::debug!(?message, "agent reported lost output");
        } else {
            tracing::warn!(?message, "agent reported an error outside any request");
        }
        return;
    };
    let mut guard = lock(routes);
    let Some(waiter) = guard.pending.remove(&tag) else {
        return;
    };
    let (mut events, mut watch) = (None, None);
    match &message {
        AgentMessage::Started { exec_id, .. } | AgentMessage::Attached { exec_id, .. } => {
            let (tx, rx) = mpsc::channel(EXEC_EVENT_QUEUE);
            guard.execs.insert(*exec_id, tx);
            events = Some(rx);
        }
        AgentMessage::Watching { watch_id, .. } => {
            let (tx, rx) = mpsc::channel(WATCH_EVENT_QUEUE);
            guard.watches.insert(*watch_id, tx);
            watch = Some(rx);
        }
        AgentMessage::Unwatched { watch_id, .. } => {
            guard.watches.remove(watch_id);
        }
        _ => {}
    }
    drop(guard);
    let _ = waiter.send(Reply {
        message,
        events,
        watch,
    });
}

/// The exec queues of [`Routes`], for [`deliver`].
fn execs(routes: &mut Routes) -> &mut HashMap<ExecId, mpsc::Sender<ExecEvent>> {
    &mut routes.execs
}

/// The watch queues of [`Routes`], for [`deliver`].
fn watches(routes: &mut Routes) -> &mut HashMap<u64, mpsc::Sender<WatchEvent>> {
    &mut routes.watches
}

/// Hands an event to its queue among `queues` (the exec's, or the
/// watch's), taken out with the last event, waiting if the consumer is
/// behind (the agent's queue, and a watch's kernel queue, fill meanwhile).
async fn deliver<K: Eq + std::hash::Hash, E>(
    routes: &Mutex<Routes>,
    queues: fn(&mut Routes) -> &mut HashMap<K, mpsc::Sender<E>>,
    key: K,
    event: E,
    last: bool,
) {
    let queue = {
        let mut guard = lock(routes);
        let queues = queues(&mut guard);
        if last {
            queues.remove(&key)
        } else {
            queues.get(&key).cloned()
        }
    };
    if let Some(queue) = queue {
        // A dropped handle just means nobody wants the rest.
        let _ = queue.send(event).await;
    }
}
