//! The exec channel: one WebSocket per client connection, many execs on it.
//!
//! Control travels as JSON text messages ([`ClientMessage`] up, [`AgentMessage`]
//! down). Output and stdin travel as binary [`Frame`]s so bulk bytes are never
//! base64-encoded. Each frame names its exec and carries a sequence number
//! equal to the byte offset of its first byte in that exec's output stream
//! (stdout and stderr share one numbering, in the order the agent read them).
//! Because sequence numbers are byte offsets, a client that lost its
//! connection re-attaches with the offset it has seen up to, and the agent can
//! say exactly how many bytes its ring no longer holds.
//!
//! Requests carry a client-chosen `tag` that the agent echoes in its reply, so
//! a client can have several requests in flight on one connection.
//!
//! Two kinds of exec share this channel besides plain ones. A *PTY exec*
//! (`tty`) runs under a pseudo-terminal: its output arrives on
//! [`Channel::Stdout`], its stdin frames are raw terminal input (a `\x03` byte
//! is what the line discipline turns into SIGINT) and [`ClientMessage::Resize`]
//! changes its window. A *session run* (`session`) runs a script in a
//! long-lived shell that keeps its cwd, environment and variables between runs
//! (see [`crate::session`]); it is an exec like any other for attach, status,
//! stdin and interrupt.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::error::ErrorKind;
use crate::session::SessionInfo;
use crate::version::Feature;

/// Agent-assigned identifier of one exec, unique for the agent's lifetime.
pub type ExecId = u64;

/// A terminal window size, in character cells.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct WindowSize {
    /// Lines.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for WindowSize {
    /// The classic 24x80, for a PTY exec whose client has no terminal to measure.
    fn default() -> Self {
        Self { rows: 24, cols: 80 }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// What to run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecSpec {
    /// Program and arguments; `argv[0]` is looked up in `PATH`. For a session
    /// run, one word is a shell script as it stands (it may span lines), and
    /// several words are a command and its arguments, each quoted, so they
    /// mean what they mean outside a session. May be empty
    /// with `tty`: the agent then runs the sandbox's interactive shell.
    #[serde(default)]
    pub argv: Vec<String>,
    /// Working directory; the agent's default workdir when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables added to (or overriding) the agent's base environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Keep stdin open for [`Channel::Stdin`] frames; otherwise it reads EOF at once.
    #[serde(default)]
    pub stdin: bool,
    /// Interrupt the command (SIGINT, grace, SIGKILL) after this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Grace between SIGINT and SIGKILL for the timeout; the default grace when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
    /// Interrupt the command once no client has been attached for this long.
    /// Absent: the agent's default (60 s unless the agent was started with
    /// another `--detach-timeout-secs`), so a client that dies without a
    /// word never leaves its commands running. `0`: never, the command runs
    /// on as a background job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detach_timeout_ms: Option<u64>,
    /// Run under a pseudo-terminal (setsid + controlling terminal): output on
    /// [`Channel::Stdout`] only, stdin always open for raw terminal input.
    #[serde(default, skip_serializing_if = "is_false")]
    pub tty: bool,
    /// Initial window of the terminal (`tty` only); 24x80 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowSize>,
    /// Run in this shell session, creating it on first use. `cwd` and `env`
    /// are applied in the shell before the script, so they persist like a
    /// `cd` or `export` would. With `tty`, start an interactive shell from the
    /// session's last known cwd and environment instead (the session itself
    /// is not changed by what happens in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// With `session`: fail with [`ErrorKind::Busy`] instead of waiting while
    /// the session runs another command.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_wait: bool,
}

/// Requests from the client (JSON text messages).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    /// Start a command; answered by [`AgentMessage::Started`] or [`AgentMessage::Error`].
    /// The connection is attached to the new exec from its first byte.
    Exec {
        /// Echoed in the reply.
        tag: u64,
        /// What to run.
        spec: ExecSpec,
    },
    /// Attach this connection to an exec (possibly started on another connection)
    /// and replay its output from byte offset `from_seq`. Answered by
    /// [`AgentMessage::Attached`]; replayed frames, live frames and the exit follow.
    Attach {
        /// Echoed in the reply.
        tag: u64,
        /// The exec to follow.
        exec_id: ExecId,
        /// First output byte offset wanted (0 for everything still held).
        from_seq: u64,
        /// Where stdout and stderr each continue, counted per stream (new in
        /// protocol 8, [`crate::version::Feature::StreamOffsets`]); when
        /// set, it replaces `from_seq`: the replay starts at the first byte
        /// either stream still wants, and the client drops what it has.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_streams: Option<StreamOffsets>,
    },
    /// SIGINT the exec's process group, wait `grace_ms`, then SIGKILL the group
    /// and any descendant that escaped it. Answered by [`AgentMessage::InterruptAck`];
    /// attached connections then see the exit.
    Interrupt {
        /// Echoed in the reply.
        tag: u64,
        /// The exec to stop.
        exec_id: ExecId,
        /// Grace before SIGKILL; the default grace when absent, 0 to kill at once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_ms: Option<u64>,
    },
    /// Close the exec's stdin (EOF). Stdin bytes themselves travel as frames.
    CloseStdin {
        /// The exec whose stdin to close.
        exec_id: ExecId,
    },
    /// Ask for an exec's state without attaching. Answered by [`AgentMessage::Status`].
    Status {
        /// Echoed in the reply.
        tag: u64,
        /// The exec to describe.
        exec_id: ExecId,
    },
    /// Change a PTY exec's window (the program sees SIGWINCH). Unanswered
    /// unless it fails.
    Resize {
        /// The PTY exec.
        exec_id: ExecId,
        /// Its new size.
        window: WindowSize,
    },
    /// Create a shell session, or find the one with this id. Answered by
    /// [`AgentMessage::SessionOpened`].
    SessionOpen {
        /// Echoed in the reply.
        tag: u64,
        /// Client-chosen id (see [`crate::session::check_id`]).
        session: String,
        /// Shell program (default: `bash` if the sandbox has it, else `sh`);
        /// only used when the session is created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shell: Option<String>,
        /// Initial working directory (default: the agent's workdir); only used when created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Variables added to the shell's initial environment; only used when created.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<String, String>,
    },
    /// List the execs the agent holds, running and finished. Answered by
    /// [`AgentMessage::ExecList`].
    List {
        /// Echoed in the reply.
        tag: u64,
    },
    /// Watch a directory for changes (new in protocol 8,
    /// [`crate::version::Feature::Watch`]). Answered by
    /// [`AgentMessage::Watching`]; [`AgentMessage::FsEvents`] follow on this
    /// connection until [`ClientMessage::Unwatch`], the end of the
    /// connection, or [`AgentMessage::WatchEnded`].
    Watch {
        /// Echoed in the reply.
        tag: u64,
        /// The directory: absolute, or relative to the agent's workdir.
        path: String,
        /// Its subdirectories too, those made later included.
        #[serde(default, skip_serializing_if = "is_false")]
        recursive: bool,
    },
    /// Stop a watch. Answered by [`AgentMessage::Unwatched`].
    Unwatch {
        /// Echoed in the reply.
        tag: u64,
        /// The watch.
        watch_id: u64,
    },
    /// List the sessions. Answered by [`AgentMessage::SessionList`].
    SessionList {
        /// Echoed in the reply.
        tag: u64,
    },
    /// Close a session: its running command is killed, then its shell and
    /// everything started from it. Answered by [`AgentMessage::SessionClosed`].
    SessionClose {
        /// Echoed in the reply.
        tag: u64,
        /// The session.
        session: String,
    },
    /// Interrupt whatever the session is running (like [`ClientMessage::Interrupt`]
    /// on that exec); a no-op when it is idle. Answered by
    /// [`AgentMessage::SessionInterrupted`].
    SessionInterrupt {
        /// Echoed in the reply.
        tag: u64,
        /// The session.
        session: String,
        /// Grace before SIGKILL; the default grace when absent, 0 to kill at once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_ms: Option<u64>,
    },
}

impl ClientMessage {
    /// The features this message uses; a client checks them against the
    /// protocol version it speaks before sending it.
    pub fn features(&self) -> Vec<Feature> {
        match self {
            Self::Exec { spec, .. } => {
                let mut features = vec![Feature::Exec];
                if spec.tty {
                    features.push(Feature::Tty);
                }
                if spec.session.is_some() {
                    features.push(Feature::Sessions);
                }
                features
            }
            Self::Resize { .. } => vec![Feature::Tty],
            Self::List { .. } => vec![Feature::ExecList],
            Self::Watch { .. } | Self::Unwatch { .. } => vec![Feature::Watch],
            Self::Attach {
                from_streams: Some(_),
                ..
            } => vec![Feature::Exec, Feature::StreamOffsets],
            Self::SessionOpen { .. }
            | Self::SessionList { .. }
            | Self::SessionClose { .. }
            | Self::SessionInterrupt { .. } => vec![Feature::Sessions],
            Self::Attach { .. }
            | Self::Interrupt { .. }
            | Self::CloseStdin { .. }
            | Self::Status { .. } => vec![Feature::Exec],
        }
    }
}

/// Replies and events from the agent (JSON text messages).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMessage {
    /// The command is running.
    Started {
        /// The request's tag.
        tag: u64,
        /// Its id, for attach, interrupt and stdin frames.
        exec_id: ExecId,
        /// Its pid (and process group id) in the sandbox.
        pid: u32,
    },
    /// This connection now follows the exec.
    Attached {
        /// The request's tag.
        tag: u64,
        /// The exec followed.
        exec_id: ExecId,
        /// Offset of the first byte that will be replayed.
        next_seq: u64,
        /// Bytes between the requested offset and `next_seq` that the ring no longer holds.
        lost_bytes: u64,
        /// Where each stream stands at `next_seq`: the stdout and stderr
        /// bytes produced before it (agents of protocol 8 and later).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        streams: Option<StreamOffsets>,
    },
    /// The exec ended. Sent after its last output frame.
    Exit {
        /// The exec that ended.
        exec_id: ExecId,
        /// How it ended.
        exit: ExitInfo,
    },
    /// Reply to an interrupt.
    InterruptAck {
        /// The request's tag.
        tag: u64,
        /// The exec named.
        exec_id: ExecId,
        /// Its state when the interrupt arrived; only `Running` means a signal was sent.
        state: ExecState,
    },
    /// Reply to a status request.
    Status {
        /// The request's tag.
        tag: u64,
        /// The exec named.
        exec_id: ExecId,
        /// Its state.
        state: ExecState,
        /// How it ended, when it has.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit: Option<ExitInfo>,
        /// Output bytes produced so far (the next sequence number).
        output_bytes: u64,
    },
    /// A request failed, or an exec-level problem occurred.
    Error {
        /// The failed request's tag, when it was a request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<u64>,
        /// The exec concerned, when there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exec_id: Option<ExecId>,
        /// Category (one list for the whole protocol: [`crate::error`]).
        kind: ErrorKind,
        /// Human-readable explanation.
        message: String,
    },
    /// Reply to [`ClientMessage::List`].
    ExecList {
        /// The request's tag.
        tag: u64,
        /// Every exec the agent holds, by id.
        execs: Vec<ExecSummary>,
    },
    /// Reply to [`ClientMessage::Watch`]: the directory is watched.
    Watching {
        /// The request's tag.
        tag: u64,
        /// The watch, named by the events and by an unwatch.
        watch_id: u64,
    },
    /// Changes in a watched directory, in the order the kernel reported
    /// them (several at once when they came together).
    FsEvents {
        /// The watch.
        watch_id: u64,
        /// What changed.
        events: Vec<FsEvent>,
    },
    /// A watch ended on its own: its directory was removed or moved, or
    /// could no longer be watched. Nothing follows for it.
    WatchEnded {
        /// The watch.
        watch_id: u64,
        /// Why.
        reason: String,
    },
    /// Reply to [`ClientMessage::Unwatch`].
    Unwatched {
        /// The request's tag.
        tag: u64,
        /// The watch named.
        watch_id: u64,
        /// False when there was no such watch on this connection.
        existed: bool,
    },
    /// Reply to [`ClientMessage::SessionOpen`].
    SessionOpened {
        /// The request's tag.
        tag: u64,
        /// The session as it is now.
        session: SessionInfo,
        /// Whether this request created it.
        created: bool,
    },
    /// Reply to [`ClientMessage::SessionList`].
    SessionList {
        /// The request's tag.
        tag: u64,
        /// Every session, ordered by id.
        sessions: Vec<SessionInfo>,
    },
    /// Reply to [`ClientMessage::SessionClose`].
    SessionClosed {
        /// The request's tag.
        tag: u64,
        /// The session named.
        session: String,
        /// False when there was no such session (nothing was done).
        existed: bool,
    },
    /// Reply to [`ClientMessage::SessionInterrupt`].
    SessionInterrupted {
        /// The request's tag.
        tag: u64,
        /// The session named.
        session: String,
        /// The run that was interrupted; absent when the session was idle.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exec_id: Option<ExecId>,
    },
}

/// One change in a watched directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FsEvent {
    /// What happened.
    pub kind: FsEventKind,
    /// The path changed, relative to the watched directory (empty for
    /// the directory itself).
    pub name: String,
    /// The path is a directory.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dir: bool,
}

/// What happened to a watched path (E2B's event types, and one more).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    /// Made, or moved in.
    Create,
    /// Its contents changed.
    Write,
    /// Removed.
    Remove,
    /// Moved away (its new name, if inside, arrives as a `create`).
    Rename,
    /// Its mode, owner or times changed.
    Chmod,
    /// The kernel's queue overflowed: changes were missed, and a client
    /// that must know the tree has to look at it again.
    Overflow,
}

/// Output offsets counted per stream: bytes of stdout and of stderr.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamOffsets {
    /// Stdout bytes.
    pub stdout: u64,
    /// Stderr bytes.
    pub stderr: u64,
}

/// One exec as [`AgentMessage::ExecList`] describes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecSummary {
    /// Its id.
    pub exec_id: ExecId,
    /// Its pid (and process group id).
    pub pid: u32,
    /// What it runs, as asked (a session run: the script's words).
    pub argv: Vec<String>,
    /// Its working directory.
    pub cwd: String,
    /// The session it runs in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Whether it runs under a pseudo-terminal.
    #[serde(default, skip_serializing_if = "is_false")]
    pub tty: bool,
    /// Running or finished.
    pub state: ExecState,
    /// Milliseconds since it started.
    pub age_ms: u64,
    /// Output bytes produced so far.
    pub output_bytes: u64,
}

/// Where an exec is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecState {
    /// Still running (or being killed).
    Running,
    /// Ended; its result is still held.
    Finished,
    /// Never existed, or its result was dropped.
    Unknown,
}

/// How an exec ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, when the process exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Signal number, when a signal killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Wall time from spawn to exit.
    pub duration_ms: u64,
    /// An interrupt request ended it.
    #[serde(default)]
    pub interrupted: bool,
    /// Its timeout ended it.
    #[serde(default)]
    pub timed_out: bool,
    /// Total output bytes it produced (stdout and stderr).
    #[serde(default)]
    pub output_bytes: u64,
    /// Session runs only: the session's shell had died (or had to be killed)
    /// and was restarted, before or during this run, with its last known cwd
    /// and environment. Shell variables and functions did not survive.
    #[serde(default, skip_serializing_if = "is_false")]
    pub restored: bool,
    /// A rewind of the sandbox ended it: the snapshot it went back to (an
    /// empty string when the rewind did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by_rewind: Option<String>,
}

impl ExecSpec {
    /// A command and its arguments, every other setting at its default.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// A shell line, run by `sh -c`.
    pub fn shell(line: &str) -> Self {
        Self::argv(["sh", "-c", line])
    }
}

impl ExitInfo {
    /// The shell convention: the exit code, or 128 + signal.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 255,
        }
    }
}

/// Which byte stream a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Channel {
    /// Client to agent: bytes for the exec's stdin.
    Stdin = 0,
    /// Agent to client: the exec's stdout.
    Stdout = 1,
    /// Agent to client: the exec's stderr.
    Stderr = 2,
}

/// A binary WebSocket message: `[channel u8][exec_id u64 BE][seq u64 BE][payload]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The stream.
    pub channel: Channel,
    /// The exec.
    pub exec_id: ExecId,
    /// Byte offset of `payload[0]` in the exec's output (0 for stdin frames).
    pub seq: u64,
    /// The bytes.
    pub payload: Vec<u8>,
}

/// Size of the fixed frame header.
pub const FRAME_HEADER_LEN: usize = 17;

impl Frame {
    /// Serializes the frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FRAME_HEADER_LEN + self.payload.len());
        out.push(self.channel as u8);
        out.extend_from_slice(&self.exec_id.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// Parses a frame, refusing short input and unknown channels.
    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        if bytes.len() < FRAME_HEADER_LEN {
            return Err(FrameError::Short(bytes.len()));
        }
        let channel = match bytes[0] {
            0 => Channel::Stdin,
            1 => Channel::Stdout,
            2 => Channel::Stderr,
            other => return Err(FrameError::UnknownChannel(other)),
        };
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[1..9]);
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&bytes[9..17]);
        Ok(Self {
            channel,
            exec_id: u64::from_be_bytes(id),
            seq: u64::from_be_bytes(seq),
            payload: bytes[FRAME_HEADER_LEN..].to_vec(),
        })
    }
}

/// Why a binary message is not a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the header.
    #[error("frame of {0} bytes is shorter than its {FRAME_HEADER_LEN}-byte header")]
    Short(usize),
    /// The channel byte is not 0, 1 or 2.
    #[error("frame names unknown channel {0}")]
    UnknownChannel(u8),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let f = Frame {
            channel: Channel::Stderr,
            exec_id: 7,
            seq: 1 << 40,
            payload: b"hi".to_vec(),
        };
        assert_eq!(Frame::decode(&f.encode()), Ok(f));
        assert_eq!(Frame::decode(&[1, 2]), Err(FrameError::Short(2)));
        assert_eq!(Frame::decode(&[9; 17]), Err(FrameError::UnknownChannel(9)));
    }

    #[test]
    fn messages_use_a_type_tag_and_tolerate_absent_optionals() {
        let msg: ClientMessage =
            serde_json::from_str(r#"{"type":"exec","tag":1,"spec":{"argv":["true"]}}"#).unwrap();
        assert_eq!(
            msg,
            ClientMessage::Exec {
                tag: 1,
                spec: ExecSpec {
                    argv: vec!["true".into()],
                    ..Default::default()
                }
            }
        );
        let text = serde_json::to_string(&AgentMessage::InterruptAck {
            tag: 2,
            exec_id: 3,
            state: ExecState::Unknown,
        })
        .unwrap();
        assert!(
            text.contains(r#""type":"interrupt_ack""#) && text.contains(r#""state":"unknown""#),
            "{text}"
        );
    }

    #[test]
    fn messages_name_the_features_they_use() {
        let plain = ClientMessage::Exec {
            tag: 1,
            spec: ExecSpec::argv(["true"]),
        };
        assert_eq!(plain.features(), [Feature::Exec]);
        let spec = ExecSpec {
            tty: true,
            session: Some("s".into()),
            ..ExecSpec::default()
        };
        let both = ClientMessage::Exec { tag: 1, spec };
        assert_eq!(
            both.features(),
            [Feature::Exec, Feature::Tty, Feature::Sessions]
        );
        let list = ClientMessage::SessionList { tag: 2 };
        assert_eq!(list.features(), [Feature::Sessions]);
    }

    #[test]
    fn shell_code_follows_the_shell_convention() {
        assert_eq!(
            ExitInfo {
                code: Some(3),
                ..Default::default()
            }
            .shell_code(),
            3
        );
        assert_eq!(
            ExitInfo {
                signal: Some(9),
                ..Default::default()
            }
            .shell_code(),
            137
        );
    }
}
