//! One exec WebSocket connection after the upgrade.
//!
//! Two tasks share the socket. The reader decodes client messages and feeds
//! stdin itself, because stdin may wait on a command that reads slowly and
//! that must not hold up anything else. Everything that writes (replies,
//! live output, replay, keepalive) happens in the writer loop, so a `Started`
//! or `Attached` reply always precedes that exec's frames, and frames are
//! de-duplicated by offset in one place: per exec the writer remembers the
//! next offset it owes the client, which makes replay followed by live output,
//! and catching up after falling behind, seamless.
//!
//! When the client goes away the connection detaches from its execs, which
//! keep running; nothing waits on a dead peer (keepalive pings find silent
//! ones).

use silo_protocol::http::error_chain;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use silo_protocol::exec::{
    AgentMessage, Channel, ClientMessage, ErrorKind, ExecId, ExecSpec, ExitInfo, Frame,
};
use silo_protocol::files::FileQuery;
use silo_protocol::limits::KEEPALIVE_INTERVAL;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{self, Message};

use super::{AgentState, sessions};
use crate::commands::{CommandError, Commands};
use crate::exec::{Attachment, Event, LagSignal, ReplayFrom, Started, Subscriber};
use crate::files::Target;
use crate::shutdown::{self, Phase};
use crate::snapshot::StartGate;
use crate::watch::{Watch, Watched};

type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// Events (output, exits) queued per connection before slow-client handling kicks in.
const EVENT_QUEUE: usize = 256;
/// Client requests queued between the reader and the writer.
const COMMAND_QUEUE: usize = 64;
/// Batches of directory changes queued for the writer; past them a watch
/// waits, and the kernel's own queue (which reports its overflow) fills.
const WATCH_QUEUE: usize = 64;
/// A peer silent for this many keepalive intervals is considered gone.
const DEAD_PEER_INTERVALS: u32 = 3;
/// Longest a single write may wait for the peer to read; past it the peer is
/// considered gone, so one that stops reading cannot pin a connection forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// From the reader to the writer.
enum Cmd {
    /// A request whose reply must be ordered with output.
    Request(ClientMessage),
    /// A ready reply (errors found while decoding, stdin failures).
    Reply(AgentMessage),
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("websocket write failed")]
    Write(#[from] tungstenite::Error),
    #[error("peer silent for {0:?}")]
    Silent(Duration),
    #[error("peer stopped reading for {0:?}")]
    Stalled(Duration),
}

/// When the client was last heard from (any message, pongs included).
struct Heard {
    last: Mutex<Instant>,
    /// The reader is waiting for stdin room, so it reads nothing, pongs
    /// included; that silence is backpressure, not a dead peer.
    waiting: AtomicBool,
}

impl Heard {
    fn new() -> Self {
        Self {
            last: Mutex::new(Instant::now()),
            waiting: AtomicBool::new(false),
        }
    }

    fn touch(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn silent_for(&self) -> Duration {
        if self.waiting.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }
}

/// Serves a connection until the client leaves, the peer dies or the agent closes.
pub async fn run(ws: Ws, state: Arc<AgentState>, phase: watch::Receiver<Phase>) {
    let conn = state.next_conn_id();
    let _open = state.activity.busy();
    let (sink, stream) = ws.split();
    let (event_tx, event_rx) = mpsc::channel(EVENT_QUEUE);
    let lag = Arc::new(LagSignal::default());
    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
    let (watch_tx, watch_rx) = mpsc::channel(WATCH_QUEUE);
    let heard = Arc::new(Heard::new());
    let reader = tokio::spawn(read_loop(
        stream,
        Arc::clone(&state),
        cmd_tx,
        Arc::clone(&heard),
    ));
    let mut writer = Writer {
        sink,
        commands: state.commands.clone(),
        starts: state.snapshots.start_gate(),
        sub: Subscriber {
            conn,
            tx: event_tx,
            lag: Arc::clone(&lag),
        },
        follows: HashMap::new(),
        watches: Watches {
            workdir: state.files.config.workdir.clone(),
            running: HashMap::new(),
            next_id: 1,
            tx: watch_tx,
        },
        wrote: false,
    };
    tracing::debug!(conn, "exec connection opened");
    let ended = writer
        .run(cmd_rx, event_rx, watch_rx, &lag, &heard, phase)
        .await;
    reader.abort();
    writer.detach_all();
    match ended {
        Ok(()) => tracing::debug!(conn, "exec connection closed"),
        Err(err) => tracing::debug!(conn, %err, "exec connection ended"),
    }
}

struct Writer {
    sink: SplitSink<Ws, Message>,
    commands: Commands,
    /// Passed before anything that may spawn, so nothing starts mid-snapshot.
    starts: StartGate,
    sub: Subscriber,
    /// Execs this connection follows → next output offset owed to the client.
    follows: HashMap<ExecId, u64>,
    /// The directory watches this connection asked for.
    watches: Watches,
    /// Something was written since the last keepalive tick.
    wrote: bool,
}

/// A connection's directory watches: they end with it.
struct Watches {
    /// Where relative paths start.
    workdir: std::path::PathBuf,
    running: HashMap<u64, Watch>,
    next_id: u64,
    /// Where the watches send what they see.
    tx: mpsc::Sender<(u64, Watched)>,
}

impl Watches {
    /// Starts watching `path`; answers the watch's id, or why not.
    fn start(&mut self, path: &str, recursive: bool) -> Result<u64, (ErrorKind, String)> {
        let target = Target::resolve(&FileQuery::new(path), &self.workdir)
            .map_err(|e| (e.kind(), error_chain(&e)))?;
        let id = self.next_id;
        let watch = Watch::start(id, &target.path, recursive, self.tx.clone())
            .map_err(|e| (e.kind(), error_chain(&e)))?;
        self.next_id += 1;
        self.running.insert(id, watch);
        Ok(id)
    }
}

impl Writer {
    async fn run(
        &mut self,
        mut cmd_rx: mpsc::Receiver<Cmd>,
        mut event_rx: mpsc::Receiver<Event>,
        mut watch_rx: mpsc::Receiver<(u64, Watched)>,
        lag: &LagSignal,
        heard: &Heard,
        mut phase: watch::Receiver<Phase>,
    ) -> Result<(), ConnectionError> {
        let start = tokio::time::Instant::now() + KEEPALIVE_INTERVAL;
        let mut keepalive = tokio::time::interval_at(start, KEEPALIVE_INTERVAL);
        // After a long blocked write, one ping is enough; a burst is noise.
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown::reached(&mut phase, Phase::Closing) => {
                    let _ = self.sink.send(Message::Close(None)).await;
                    return Ok(());
                }
                cmd = cmd_rx.recv() => match cmd {
                    Some(cmd) => self.command(cmd).await?,
                    // The reader ended: the client left.
                    None => return Ok(()),
                },
                Some(event) = event_rx.recv() => self.event(event).await?,
                Some((watch_id, watched)) = watch_rx.recv() => self.watched(watch_id, watched).await?,
                () = lag.notified() => self.catch_up(lag).await?,
                _ = keepalive.tick() => self.keepalive(heard).await?,
            }
        }
    }

    async fn command(&mut self, cmd: Cmd) -> Result<(), ConnectionError> {
        let request = match cmd {
            Cmd::Reply(reply) => return self.send_json(&reply).await,
            Cmd::Request(request) => request,
        };
        match request {
            ClientMessage::Exec { tag, spec } => match self.start(spec).await {
                Ok(started) => {
                    self.follows.insert(started.exec_id, 0);
                    self.send_json(&AgentMessage::Started {
                        tag,
                        exec_id: started.exec_id,
                        pid: started.pid,
                    })
                    .await
                }
                Err(err) => self.send_json(&error_reply(Some(tag), None, err)).await,
            },
            ClientMessage::Attach {
                tag,
                exec_id,
                from_seq,
                from_streams,
            } => {
                let from = from_streams.map_or(ReplayFrom::Seq(from_seq), ReplayFrom::Streams);
                self.attach(tag, exec_id, from).await
            }
            ClientMessage::Watch {
                tag,
                path,
                recursive,
            } => {
                let reply = match self.watches.start(&path, recursive) {
                    Ok(watch_id) => AgentMessage::Watching { tag, watch_id },
                    Err((kind, message)) => AgentMessage::Error {
                        tag: Some(tag),
                        exec_id: None,
                        kind,
                        message,
                    },
                };
                self.send_json(&reply).await
            }
            ClientMessage::Unwatch { tag, watch_id } => {
                let existed = self.watches.running.remove(&watch_id).is_some();
                self.send_json(&AgentMessage::Unwatched {
                    tag,
                    watch_id,
                    existed,
                })
                .await
            }
            ClientMessage::List { tag } => {
                let execs = self.commands.execs().list();
                self.send_json(&AgentMessage::ExecList { tag, execs }).await
            }
            ClientMessage::Interrupt {
                tag,
                exec_id,
                grace_ms,
            } => {
                let state = self
                    .commands
                    .execs()
                    .interrupt(exec_id, grace_ms.map(Duration::from_millis));
                self.send_json(&AgentMessage::InterruptAck {
                    tag,
                    exec_id,
                    state,
                })
                .await
            }
            ClientMessage::Status { tag, exec_id } => {
                let report = self.commands.execs().status(exec_id);
                self.send_json(&AgentMessage::Status {
                    tag,
                    exec_id,
                    state: report.state,
                    exit: report.exit,
                    output_bytes: report.output_bytes,
                })
                .await
            }
            // The reader handles these itself; kept correct if one arrives here.
            ClientMessage::CloseStdin { exec_id } => {
                match self.commands.execs().close_stdin(exec_id) {
                    Ok(()) => Ok(()),
                    Err(err) => self.send_json(&error_reply(None, Some(exec_id), err)).await,
                }
            }
            ClientMessage::Resize { exec_id, window } => {
                match self.commands.execs().resize(exec_id, window) {
                    Ok(()) => Ok(()),
                    Err(err) => self.send_json(&error_reply(None, Some(exec_id), err)).await,
                }
            }
            request => match self.session_request(request).await {
                Some(reply) => self.send_json(&reply).await,
                None => Ok(()),
            },
        }
    }

    /// Sends what a watch saw; an ended watch leaves the table.
    async fn watched(&mut self, watch_id: u64, watched: Watched) -> Result<(), ConnectionError> {
        if !self.watches.running.contains_key(&watch_id) {
            // Unwatched meanwhile: what it saw last is no longer wanted.
            return Ok(());
        }
        match watched {
            Watched::Events(events) => {
                self.send_json(&AgentMessage::FsEvents { watch_id, events })
                    .await
            }
            Watched::Ended(reason) => {
                self.watches.running.remove(&watch_id);
                self.send_json(&AgentMessage::WatchEnded { watch_id, reason })
                    .await
            }
        }
    }

    /// Attaches this connection to an exec and replays what it holds.
    async fn attach(
        &mut self,
        tag: u64,
        exec_id: ExecId,
        from: ReplayFrom,
    ) -> Result<(), ConnectionError> {
        match self
            .commands
            .execs()
            .attach(exec_id, from, self.sub.clone())
        {
            Ok(attachment) => {
                self.send_json(&AgentMessage::Attached {
                    tag,
                    exec_id,
                    next_seq: attachment.replay.next_seq,
                    lost_bytes: attachment.replay.lost_bytes,
                    streams: Some(attachment.streams),
                })
                .await?;
                self.replay(exec_id, attachment).await
            }
            Err(err) => {
                let reply = error_reply(Some(tag), Some(exec_id), err);
                self.send_json(&reply).await
            }
        }
    }

    /// Starts an exec once no snapshot is reading.
    async fn start(&self, spec: ExecSpec) -> Result<Started, CommandError> {
        let _pass = self.starts.pass().await;
        self.commands.start(spec, self.sub.clone())
    }

    /// Answers a session request once no snapshot is reading (opening one
    /// starts its shell).
    async fn session_request(&self, request: ClientMessage) -> Option<AgentMessage> {
        let _pass = self.starts.pass().await;
        sessions::handle(&self.commands, request)
    }

    async fn event(&mut self, event: Event) -> Result<(), ConnectionError> {
        match event {
            Event::Output {
                exec_id,
                seq,
                channel,
                data,
            } => self.output(exec_id, seq, channel, data).await,
            Event::Exit { exec_id, exit } => self.exit(exec_id, exit).await,
        }
    }

    /// Sends the replayed chunks (de-duplicated like live ones), then the exit if known.
    async fn replay(
        &mut self,
        exec_id: ExecId,
        attachment: Attachment,
    ) -> Result<(), ConnectionError> {
        self.follows.insert(exec_id, attachment.replay.next_seq);
        for chunk in attachment.replay.chunks {
            self.output(exec_id, chunk.seq, chunk.channel, chunk.data)
                .await?;
        }
        match attachment.exit {
            Some(exit) => self.exit(exec_id, exit).await,
            None => Ok(()),
        }
    }

    /// Sends what the client has not had yet of a chunk.
    async fn output(
        &mut self,
        exec_id: ExecId,
        seq: u64,
        channel: Channel,
        data: Bytes,
    ) -> Result<(), ConnectionError> {
        let Some(next) = self.follows.get_mut(&exec_id) else {
            return Ok(());
        };
        let end = seq + data.len() as u64;
        if end <= *next {
            return Ok(());
        }
        let skip = usize::try_from(next.saturating_sub(seq)).unwrap_or(data.len());
        *next = end;
        let frame = Frame {
            channel,
            exec_id,
            seq: seq + skip as u64,
            payload: data[skip..].to_vec(),
        };
        self.send(Message::binary(frame.encode())).await
    }

    async fn exit(&mut self, exec_id: ExecId, exit: ExitInfo) -> Result<(), ConnectionError> {
        if self.follows.remove(&exec_id).is_some() {
            self.send_json(&AgentMessage::Exit { exec_id, exit }).await
        } else {
            Ok(())
        }
    }

    /// Re-attaches to the execs that dropped this connection for being slow,
    /// from the offset the client has reached.
    async fn catch_up(&mut self, lag: &LagSignal) -> Result<(), ConnectionError> {
        for exec_id in lag.take() {
            let Some(&from) = self.follows.get(&exec_id) else {
                continue;
            };
            match self
                .commands
                .execs()
                .attach(exec_id, ReplayFrom::Seq(from), self.sub.clone())
            {
                Ok(attachment) => {
                    let lost = attachment.replay.lost_bytes;
                    if lost > 0 {
                        self.send_json(&AgentMessage::Error {
                            tag: None,
                            exec_id: Some(exec_id),
                            kind: ErrorKind::LimitReached,
                            message: format!(
                                "this connection fell behind; {lost} bytes of output were dropped"
                            ),
                        })
                        .await?;
                    }
                    self.replay(exec_id, attachment).await?;
                }
                Err(err) => {
                    self.follows.remove(&exec_id);
                    self.send_json(&error_reply(None, Some(exec_id), err))
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn keepalive(&mut self, heard: &Heard) -> Result<(), ConnectionError> {
        let silent = heard.silent_for();
        if silent > KEEPALIVE_INTERVAL * DEAD_PEER_INTERVALS {
            return Err(ConnectionError::Silent(silent));
        }
        if !self.wrote || silent >= KEEPALIVE_INTERVAL {
            self.send(Message::Ping(Bytes::new())).await?;
        }
        self.wrote = false;
        Ok(())
    }

    async fn send_json(&mut self, message: &AgentMessage) -> Result<(), ConnectionError> {
        match serde_json::to_string(message) {
            Ok(text) => self.send(Message::text(text)).await,
            Err(err) => {
                tracing::error!(%err, "cannot encode a reply");
                Ok(())
            }
        }
    }

    async fn send(&mut self, message: Message) -> Result<(), ConnectionError> {
        self.wrote = true;
        match tokio::time::timeout(WRITE_TIMEOUT, self.sink.send(message)).await {
            Ok(sent) => Ok(sent?),
            Err(_) => Err(ConnectionError::Stalled(WRITE_TIMEOUT)),
        }
    }

    fn detach_all(&mut self) {
        for exec_id in self.follows.keys() {
            self.commands.execs().detach(*exec_id, self.sub.conn);
        }
    }
}

async fn read_loop(
    mut stream: SplitStream<Ws>,
    state: Arc<AgentState>,
    cmd_tx: mpsc::Sender<Cmd>,
    heard: Arc<Heard>,
) {
    while let Some(message) = stream.next().await {
        let message = match message {
            Ok(message) => message,
            Err(err) => {
                tracing::debug!(%err, "websocket read failed");
                break;
            }
        };
        heard.touch();
        state.activity.touch();
        let reply = match message {
            Message::Text(text) => match serde_json::from_str::<ClientMessage>(text.as_str()) {
                Ok(ClientMessage::CloseStdin { exec_id }) => state
                    .commands
                    .execs()
                    .close_stdin(exec_id)
                    .err()
                    .map(|err| error_reply(None, Some(exec_id), err)),
                // Handled here rather than queued for the writer, so a
                // resize is not held up behind output being sent.
                Ok(ClientMessage::Resize { exec_id, window }) => state
                    .commands
                    .execs()
                    .resize(exec_id, window)
                    .err()
                    .map(|err| error_reply(None, Some(exec_id), err)),
                Ok(request) => {
                    if cmd_tx.send(Cmd::Request(request)).await.is_err() {
                        break;
                    }
                    None
                }
                Err(err) => Some(bad_request(
                    tag_of(text.as_str()),
                    None,
                    format!("unreadable message: {err}"),
                )),
            },
            Message::Binary(bytes) => match Frame::decode(&bytes) {
                Ok(frame) if frame.channel == Channel::Stdin => {
                    if frame.payload.is_empty() {
                        None
                    } else {
                        let exec_id = frame.exec_id;
                        heard.waiting.store(true, Ordering::Relaxed);
                        let written = state
                            .commands
                            .execs()
                            .write_stdin(exec_id, Bytes::from(frame.payload))
                            .await;
                        heard.waiting.store(false, Ordering::Relaxed);
                        heard.touch();
                        written
                            .err()
                            .map(|err| error_reply(None, Some(exec_id), err))
                    }
                }
                Ok(frame) => Some(bad_request(
                    None,
                    Some(frame.exec_id),
                    "clients may only send stdin frames".into(),
                )),
                Err(err) => Some(bad_request(None, None, err.to_string())),
            },
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => None,
        };
        if let Some(reply) = reply
            && cmd_tx.send(Cmd::Reply(reply)).await.is_err()
        {
            break;
        }
    }
}

/// The tag of a message that failed to parse, when it has one, so the client
/// can match the error to its request.
fn tag_of(text: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()?
        .get("tag")?
        .as_u64()
}

fn bad_request(tag: Option<u64>, exec_id: Option<ExecId>, message: String) -> AgentMessage {
    AgentMessage::Error {
        tag,
        exec_id,
        kind: ErrorKind::BadRequest,
        message,
    }
}

fn error_reply(
    tag: Option<u64>,
    exec_id: Option<ExecId>,
    err: impl Into<CommandError>,
) -> AgentMessage {
    let err = err.into();
    AgentMessage::Error {
        tag,
        exec_id,
        kind: err.kind(),
        message: error_chain(&err),
    }
}
