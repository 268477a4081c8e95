//! One exec's shared state: output ring, attached connections, how it ended.
//!
//! The output pumps, the supervisor task and any number of connections touch
//! an exec at once. Everything mutable sits behind one briefly-held lock, so
//! numbering a chunk, storing it and handing it to subscribers is one step: a
//! re-attach (replay then subscribe, under the same lock) can neither miss
//! nor duplicate a chunk at the seam between replay and live output.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use silo_protocol::exec::{Channel, ExecId, ExecState, ExecSummary, ExitInfo, StreamOffsets};
use tokio::sync::{mpsc, watch};

use super::fanout::{ConnId, Event, Fanout, Subscriber};
use super::pty::Master;
use super::ring::{Replay, Ring};
use crate::process::Scope;
use crate::reaper::ProcessExit;

/// Where an exec is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// The leader process is alive.
    Running,
    /// The leader has been reaped; output may still be draining.
    Exited,
    /// The exit was reported; the result is kept for queries and replay.
    Finished(ExitInfo),
}

impl Phase {
    fn can_interrupt(&self) -> bool {
        !matches!(self, Self::Finished(_))
    }
}

struct Shared {
    ring: Ring,
    fanout: Fanout,
    phase: Phase,
    interrupted: bool,
    timed_out: bool,
    restored: bool,
    /// A rewind is ending it, back to this snapshot (`""`: unnamed).
    rewound_to: Option<String>,
}

/// Stops an exec whose processes the registry did not spawn itself (a run in
/// a session's shell), where SIGINT to a process group is not the whole story.
pub trait Interrupter: Send + Sync {
    /// An interrupt with this grace was asked for while the exec was running.
    fn interrupt(&self, grace: Duration);
}

/// Where an attach wants its replay to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayFrom {
    /// At this offset of the combined output.
    Seq(u64),
    /// Where either stream first lacks a byte, given how much of each the
    /// client has.
    Streams(StreamOffsets),
}

/// Answer to an attach: what to replay, and the exit if it has already happened.
#[derive(Debug)]
pub struct Attachment {
    /// Held output from the requested offset.
    pub replay: Replay,
    /// The bytes of each stream before the replay's first byte.
    pub streams: StreamOffsets,
    /// Set when the exec has finished (the connection was not subscribed).
    pub exit: Option<ExitInfo>,
}

/// Answer to a status query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusReport {
    /// Running, finished or unknown.
    pub state: ExecState,
    /// How it ended, once it has.
    pub exit: Option<ExitInfo>,
    /// Output bytes produced so far.
    pub output_bytes: u64,
}

/// What an exec runs, for listings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct What {
    /// The command as asked (a session run: the script's words).
    pub argv: Vec<String>,
    /// Its working directory (empty when the session's shell decides).
    pub cwd: String,
    /// The session it runs in.
    pub session: Option<String>,
    /// Under a pseudo-terminal.
    pub tty: bool,
}

/// One exec, live or finished.
pub struct ExecRecord {
    /// Its id.
    pub id: ExecId,
    /// Its leader's pid, which is also its session and process group id.
    pub pid: u32,
    /// When it was spawned.
    pub started: Instant,
    /// What an interrupt must kill.
    pub scope: Scope,
    shared: Mutex<Shared>,
    /// Turns true when the leader is reaped, so a kill in its grace wakes at once.
    leader_gone: watch::Sender<bool>,
    /// Turns true when the exit has been reported; the stdin writer stops on it.
    finished: watch::Sender<bool>,
    /// Number of attached connections; the detach timer watches it.
    attached: watch::Sender<usize>,
    /// The stdin queue; `None` when stdin was not asked for or has been closed.
    stdin: Mutex<Option<mpsc::Sender<Bytes>>>,
    /// Where interrupts go instead of the usual kill escalation.
    interrupter: Option<Arc<dyn Interrupter>>,
    /// The terminal of a PTY exec, for resizes; dropped when it finishes.
    pty: Mutex<Option<Arc<Master>>>,
    /// What it runs.
    what: What,
}

impl ExecRecord {
    /// A running exec whose output is followed by `first` from its first byte.
    pub fn new(
        id: ExecId,
        pid: u32,
        scope: Scope,
        ring: Ring,
        first: Subscriber,
        stdin: Option<mpsc::Sender<Bytes>>,
    ) -> Self {
        let mut fanout = Fanout::default();
        fanout.add(first);
        Self {
            id,
            pid,
            started: Instant::now(),
            scope,
            shared: Mutex::new(Shared {
                ring,
                fanout,
                phase: Phase::Running,
                interrupted: false,
                rewound_to: None,
                timed_out: false,
                restored: false,
            }),
            leader_gone: watch::channel(false).0,
            finished: watch::channel(false).0,
            attached: watch::channel(1).0,
            stdin: Mutex::new(stdin),
            interrupter: None,
            pty: Mutex::new(None),
            what: What::default(),
        }
    }

    /// Records what it runs, for listings.
    pub fn with_what(mut self, what: What) -> Self {
        self.what = what;
        self
    }

    /// The exec as a listing shows it.
    pub fn summary(&self) -> ExecSummary {
        let status = self.status();
        ExecSummary {
            exec_id: self.id,
            pid: self.pid,
            argv: self.what.argv.clone(),
            cwd: self.what.cwd.clone(),
            session: self.what.session.clone(),
            tty: self.what.tty,
            state: status.state,
            age_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            output_bytes: status.output_bytes,
        }
    }

    /// Sends interrupts to `interrupter` rather than escalating on `scope`.
    pub fn with_interrupter(mut self, interrupter: Arc<dyn Interrupter>) -> Self {
        self.interrupter = Some(interrupter);
        self
    }

    /// Keeps the terminal of a PTY exec for resizes.
    pub fn with_pty(self, master: Arc<Master>) -> Self {
        *self.pty.lock().unwrap_or_else(PoisonError::into_inner) = Some(master);
        self
    }

    /// Where interrupts go, when not to the usual escalation.
    pub fn interrupter(&self) -> Option<&Arc<dyn Interrupter>> {
        self.interrupter.as_ref()
    }

    /// The terminal, while a PTY exec runs.
    pub fn pty(&self) -> Option<Arc<Master>> {
        self.pty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish_attached(&self, shared: &Shared) {
        let count = shared.fanout.len();
        self.attached.send_if_modified(|old| {
            let changed = *old != count;
            *old = count;
            changed
        });
    }

    /// Numbers, stores and broadcasts a chunk of output.
    pub fn append(&self, channel: Channel, data: Bytes) {
        let mut shared = self.lock();
        let seq = shared.ring.push(channel, &data);
        let event = Event::Output {
            exec_id: self.id,
            seq,
            channel,
            data,
        };
        shared.fanout.send(self.id, &event);
        self.publish_attached(&shared);
    }

    /// Replays from `from` and, unless finished, subscribes `sub` to what follows.
    pub fn attach(&self, from: ReplayFrom, sub: Subscriber) -> Attachment {
        let mut shared = self.lock();
        let replay = match from {
            ReplayFrom::Seq(seq) => shared.ring.replay(seq),
            ReplayFrom::Streams(have) => {
                let (seq, lost_bytes) = shared.ring.seq_of(have);
                Replay {
                    lost_bytes,
                    ..shared.ring.replay(seq)
                }
            }
        };
        let streams = shared.ring.streams_at(replay.next_seq);
        let exit = match &shared.phase {
            Phase::Finished(exit) => Some(exit.clone()),
            Phase::Running | Phase::Exited => {
                shared.fanout.add(sub);
                None
            }
        };
        self.publish_attached(&shared);
        Attachment {
            replay,
            streams,
            exit,
        }
    }

    /// Stops sending to a connection.
    pub fn detach(&self, conn: ConnId) {
        let mut shared = self.lock();
        shared.fanout.remove(conn);
        self.publish_attached(&shared);
    }

    /// Running (leader alive or output draining) or finished, with the exit.
    pub fn status(&self) -> StatusReport {
        let shared = self.lock();
        let (state, exit) = match &shared.phase {
            Phase::Finished(exit) => (ExecState::Finished, Some(exit.clone())),
            Phase::Running | Phase::Exited => (ExecState::Running, None),
        };
        StatusReport {
            state,
            exit,
            output_bytes: shared.ring.end(),
        }
    }

    /// Records an interrupt request. Returns the state it found; only
    /// `Running` means the caller should go on to signal.
    pub fn begin_interrupt(&self) -> ExecState {
        let mut shared = self.lock();
        if !shared.phase.can_interrupt() {
            return ExecState::Finished;
        }
        // Once the leader is gone its status is already decided; the kill only
        // clears what it left behind, so the exit does not claim it was interrupted.
        if shared.phase == Phase::Running {
            shared.interrupted = true;
        }
        ExecState::Running
    }

    /// Records that the timeout fired.
    pub fn mark_timed_out(&self) {
        let mut shared = self.lock();
        if shared.phase == Phase::Running {
            shared.timed_out = true;
        }
    }

    /// Records that a rewind to `snapshot` is ending it.
    pub fn mark_rewound(&self, snapshot: &str) {
        let mut shared = self.lock();
        if shared.phase == Phase::Running {
            shared.rewound_to = Some(snapshot.to_owned());
        }
    }

    /// Records that a session run's shell was restarted with its last state.
    pub fn mark_restored(&self) {
        self.lock().restored = true;
    }

    /// The leader has been reaped.
    pub fn leader_exited(&self) {
        let mut shared = self.lock();
        if shared.phase == Phase::Running {
            shared.phase = Phase::Exited;
        }
        drop(shared);
        self.leader_gone.send_replace(true);
    }

    /// Ends the exec: builds its exit, reports it to subscribers, forgets them.
    pub fn finish(&self, status: Option<ProcessExit>, duration: Duration) -> ExitInfo {
        let mut shared = self.lock();
        let exit = ExitInfo {
            code: match status {
                Some(ProcessExit::Code(code)) => Some(code),
                _ => None,
            },
            signal: match status {
                Some(ProcessExit::Signal(signal)) => Some(signal),
                _ => None,
            },
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            interrupted: shared.interrupted,
            timed_out: shared.timed_out,
            output_bytes: shared.ring.end(),
            restored: shared.restored,
            ended_by_rewind: shared.rewound_to.clone(),
        };
        shared.phase = Phase::Finished(exit.clone());
        shared.ring.release();
        let event = Event::Exit {
            exec_id: self.id,
            exit: exit.clone(),
        };
        shared.fanout.send(self.id, &event);
        shared.fanout.clear();
        self.publish_attached(&shared);
        drop(shared);
        self.close_stdin();
        self.pty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.finished.send_replace(true);
        exit
    }

    /// Whether the exit has been reported.
    pub fn is_finished(&self) -> bool {
        matches!(self.lock().phase, Phase::Finished(_))
    }

    /// Memory the ring's output takes.
    pub fn output_memory(&self) -> usize {
        self.lock().ring.memory()
    }

    /// Drops the held output; later replays report it as lost.
    pub fn discard_output(&self) {
        self.lock().ring.discard();
    }

    /// Watches the leader being reaped.
    pub fn leader_gone(&self) -> watch::Receiver<bool> {
        self.leader_gone.subscribe()
    }

    /// Watches the exit being reported.
    pub fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }

    /// Watches the number of attached connections.
    pub fn attached(&self) -> watch::Receiver<usize> {
        self.attached.subscribe()
    }

    /// The stdin queue, while stdin is open.
    pub fn stdin(&self) -> Option<mpsc::Sender<Bytes>> {
        self.stdin
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Closes stdin (EOF once queued bytes are written). False if it was not open.
    pub fn close_stdin(&self) -> bool {
        self.stdin
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some()
    }
}
