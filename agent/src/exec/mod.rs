//! The exec registry: every command the controller asked to run, live or
//! recently finished.
//!
//! [`Execs`] is the whole API the transport calls. It starts commands (each in
//! its own session, through the reaper), streams their output to attached
//! connections, replays it from a bounded ring on re-attach, feeds stdin,
//! interrupts, and keeps finished results for a while so a client that lost
//! its connection can still learn how a command ended. Nothing here knows
//! about HTTP or WebSockets.
//!
//! Two other kinds of exec go through the same registry, so attach, replay,
//! status, stdin and interrupt work the same for them: PTY execs (`tty`,
//! spawned here under a pseudo-terminal, see `pty`) and execs whose process
//! someone else runs (a shell session's runs): the registry *adopts* them,
//! see `adopt`, and routes their interrupts back to their [`Interrupter`],
//! because killing a process group is not how a shell's command is stopped
//! without losing the shell. Which kind a request is, is decided above this
//! module ([`crate::commands`]); the registry is a leaf.
//!
//! Bounds: at most [`MAX_CONCURRENT_EXECS`] unfinished execs (a semaphore
//! permit each); finished ones are kept for [`RETENTION`], at most
//! [`MAX_FINISHED_EXECS`] of them. Their output together stays within the
//! finished-output budget ([`DEFAULT_FINISHED_OUTPUT_BUDGET`], a share of
//! the memory limit at most, see [`crate::memory`]) besides the newest
//! one's: past it the oldest finished exec's output is dropped, but not its
//! record, so a client that
//! asks later learns how it ended and exactly how many bytes were lost.
//! Each unfinished exec holds at most `ring_bytes` of output, and all of
//! them together the output budget.

pub(crate) mod pty;

mod adopt;
mod blocks;
pub(crate) mod detach;
mod fanout;
mod record;
mod ring;
mod run;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::sys::signal::Signal;
use silo_protocol::exec::{ErrorKind, ExecId, ExecSpec, ExecState, ExecSummary, WindowSize};
use silo_protocol::limits::MAX_GRACE;
use tokio::sync::Semaphore;

use crate::process::{ProcessOps, kill};
use crate::reaper::Reaper;
pub use adopt::Adopted;
pub use fanout::{ConnId, Event, LagSignal, Subscriber};
pub use record::{Attachment, ExecRecord, Interrupter, ReplayFrom, StatusReport, What};
pub use run::LINGER;

/// Most execs that may be unfinished at once.
pub const MAX_CONCURRENT_EXECS: usize = 128;
/// Most finished execs whose result is kept.
pub const MAX_FINISHED_EXECS: usize = 256;
/// How long a finished exec's result is kept.
pub const RETENTION: Duration = Duration::from_secs(10 * 60);
/// Default output memory of all running execs together: what one exec may
/// hold, so several chatty commands cost no more than one (a sandbox with
/// `--memory 64m` must survive them).
pub const DEFAULT_OUTPUT_BUDGET: usize = silo_protocol::limits::DEFAULT_RING_BYTES;
/// Default output memory kept, across all finished execs, for a client that
/// re-attaches after the end: enough for one full ring.
pub const DEFAULT_FINISHED_OUTPUT_BUDGET: usize = silo_protocol::limits::DEFAULT_RING_BYTES;
/// Environment variable every exec's processes carry, so an interrupt can find
/// descendants that left its process group.
pub const EXEC_MARKER_VAR: &str = "SILO_EXEC_ID";

/// Settings from the command line.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// Working directory of an exec that names none, and base of relative ones.
    pub workdir: PathBuf,
    /// Output bytes each exec keeps for replay.
    pub ring_bytes: usize,
    /// Grace between SIGINT and SIGKILL when a request names none.
    pub default_grace: Duration,
    /// Detach timeout when a request names none (see [`detach`]).
    pub detach_timeout: Option<Duration>,
    /// Output memory all running execs' rings share (see [`ring`]).
    pub output_budget: usize,
    /// Output memory all finished execs' rings share.
    pub finished_output_budget: usize,
}

/// Why an exec request failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The spec is malformed.
    #[error("invalid exec spec: {0}")]
    BadSpec(String),
    /// The working directory does not exist or is not a directory.
    #[error("working directory {} is not a directory", .0.display())]
    BadCwd(PathBuf),
    /// The program does not exist.
    #[error("{program}: command not found")]
    NotFound {
        /// `argv[0]`.
        program: String,
    },
    /// The program exists but the kernel will not run it.
    #[error("{program}: cannot execute")]
    NotExecutable {
        /// `argv[0]`.
        program: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The program could not be started.
    #[error("cannot start {program:?}")]
    Spawn {
        /// `argv[0]`.
        program: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The sandbox has no file descriptor left to open the program with:
    /// its processes hold too many files open. On an engine whose storage
    /// driver serves the sandbox's files from one process (fuse-overlayfs),
    /// that process's open-file limit is shared by the whole sandbox.
    #[error(
        "cannot start {program:?}: no file descriptor is left to open it (the sandbox's \
         processes hold too many files open; on fuse-overlayfs the storage driver's \
         open-file limit is shared by the whole sandbox, see `silo doctor`)"
    )]
    OutOfFiles {
        /// `argv[0]`.
        program: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The sandbox has no pid left for the program: its processes (and
    /// threads) hold every one its process limit allows.
    #[error(
        "cannot start {program:?}: the sandbox is at its process limit (its processes and \
         threads hold every pid the limit allows; end some, or give the sandbox a higher \
         pids limit)"
    )]
    OutOfProcesses {
        /// `argv[0]`.
        program: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Too many execs are unfinished.
    #[error("too many running execs (limit {0})")]
    LimitReached(usize),
    /// No such exec (never started, or its result was dropped).
    #[error("no exec {0} on this agent")]
    Unknown(ExecId),
    /// Stdin was not requested, or has been closed.
    #[error("exec {0} has no open stdin")]
    StdinClosed(ExecId),
    /// The output pipes could not be set up.
    #[error("cannot set up output pipes")]
    Pipes(#[source] io::Error),
    /// The exec is not a PTY exec (it has no window to resize).
    #[error("exec {0} has no terminal")]
    NoTerminal(ExecId),
    /// The terminal refused the new size.
    #[error("cannot resize the terminal of exec {id}")]
    Resize {
        /// The exec.
        id: ExecId,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

impl ExecError {
    /// A failed spawn of `program`, sorted the way a shell sorts it.
    pub fn spawn(program: &str, source: io::Error) -> Self {
        let program = program.to_owned();
        if source.kind() == io::ErrorKind::NotFound {
            Self::NotFound { program }
        } else if source.kind() == io::ErrorKind::PermissionDenied
            || source.raw_os_error() == Some(libc::ENOEXEC)
        {
            Self::NotExecutable { program, source }
        } else if matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            Self::OutOfFiles { program, source }
        } else if source.raw_os_error() == Some(libc::EAGAIN) {
            Self::OutOfProcesses { program, source }
        } else {
            Self::Spawn { program, source }
        }
    }

    /// The protocol's category for this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::BadSpec(_) | Self::StdinClosed(_) | Self::NoTerminal(_) => ErrorKind::BadRequest,
            // A working directory that is not one is the caller's argument,
            // not the machine failing.
            Self::BadCwd(_) => ErrorKind::NotADirectory,
            Self::Spawn { .. } | Self::OutOfFiles { .. } | Self::OutOfProcesses { .. } => {
                ErrorKind::SpawnFailed
            }
            Self::NotFound { .. } => ErrorKind::CommandNotFound,
            Self::NotExecutable { .. } => ErrorKind::NotExecutable,
            Self::LimitReached(_) => ErrorKind::LimitReached,
            Self::Unknown(_) => ErrorKind::UnknownExec,
            Self::Pipes(_) | Self::Resize { .. } => ErrorKind::Internal,
        }
    }
}

/// A started exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// Its id.
    pub exec_id: ExecId,
    /// Its pid (and process group id).
    pub pid: u32,
}

/// The registry. Cheap to clone.
#[derive(Clone)]
pub struct Execs {
    inner: Arc<Inner>,
}

struct Inner {
    config: ExecConfig,
    reaper: Reaper,
    ops: Arc<dyn ProcessOps>,
    table: Mutex<Table>,
    /// One permit per unfinished exec.
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
    /// What the running execs' rings hold together.
    output_budget: Arc<ring::Budget>,
}

impl Inner {
    /// An empty output ring for a new exec, charged to the shared budget.
    fn new_ring(&self) -> ring::Ring {
        ring::Ring::with_budget(self.config.ring_bytes, Arc::clone(&self.output_budget))
    }
}

/// A finished exec waiting for eviction.
struct Retired {
    id: ExecId,
    at: Instant,
    /// Memory its output takes; 0 once dropped.
    bytes: usize,
}

#[derive(Default)]
struct Table {
    execs: HashMap<ExecId, Arc<ExecRecord>>,
    /// Finished execs, oldest first.
    retired: VecDeque<Retired>,
    /// Sum of `retired[..].bytes`.
    retired_bytes: usize,
}

impl Table {
    /// Forgets finished execs past the count or the age, then drops the
    /// output of the oldest while their output is over `budget`. The newest
    /// keeps its output whatever its size (at most what the running budget
    /// let it hold), so the client of a command that just ended can still
    /// read its tail: finished output is at most `budget` plus one ring.
    fn evict(&mut self, now: Instant, budget: usize) {
        while let Some(oldest) = self.retired.front() {
            let over = self.retired.len() > MAX_FINISHED_EXECS
                || now.duration_since(oldest.at) >= RETENTION;
            if !over {
                break;
            }
            self.retired_bytes -= oldest.bytes;
            self.execs.remove(&oldest.id);
            self.retired.pop_front();
        }
        let older = self.retired.len().saturating_sub(1);
        for retired in self.retired.iter_mut().take(older) {
            if self.retired_bytes <= budget {
                break;
            }
            if retired.bytes == 0 {
                continue;
            }
            if let Some(record) = self.execs.get(&retired.id) {
                record.discard_output();
            }
            self.retired_bytes -= retired.bytes;
            retired.bytes = 0;
        }
    }
}

/// The terminal's end-of-file character (^D in the default termios).
const EOF_CHAR: u8 = 0x04;

/// Random bits of the first exec id above the per-boot counter's 32 (21 + 32 = 53).
const ID_EPOCH_MASK: u32 = (1 << 21) - 1;

impl Execs {
    /// An empty registry. Ids start at a random multiple of 2^32, so ids a
    /// client remembers from an earlier boot do not name a new exec, and stay
    /// below 2^53 so a JSON client in any language reads them exactly.
    pub fn new(config: ExecConfig, reaper: Reaper, ops: Arc<dyn ProcessOps>) -> io::Result<Self> {
        let mut seed = [0u8; 4];
        getrandom::fill(&mut seed).map_err(|err| io::Error::other(err.to_string()))?;
        let first_id = u64::from(u32::from_le_bytes(seed) & ID_EPOCH_MASK) << 32;
        let output_budget = ring::Budget::new(config.output_budget);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                reaper,
                ops,
                table: Mutex::default(),
                slots: Arc::new(Semaphore::new(MAX_CONCURRENT_EXECS)),
                next_id: AtomicU64::new(first_id.max(1)),
                output_budget,
            }),
        })
    }

    /// The detach timeout of an exec whose request asked for `requested_ms`.
    pub fn detach_after(&self, requested_ms: Option<u64>) -> Option<Duration> {
        detach::resolve(requested_ms, self.inner.config.detach_timeout)
    }

    /// Spawns a command (under a pseudo-terminal with `tty`); `sub` follows
    /// its output from the first byte.
    pub fn start(&self, spec: ExecSpec, sub: Subscriber) -> Result<Started, ExecError> {
        validate(&spec)?;
        let cwd = self.resolve_cwd(spec.cwd.as_deref())?;
        let permit = Arc::clone(&self.inner.slots)
            .try_acquire_owned()
            .map_err(|_| ExecError::LimitReached(MAX_CONCURRENT_EXECS))?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let record = run::launch(&self.inner, id, &spec, &cwd, sub, permit)?;
        Ok(Started {
            exec_id: id,
            pid: record.pid,
        })
    }

    /// Replays from `from` and follows what comes next (unless it has finished).
    pub fn attach(
        &self,
        id: ExecId,
        from: ReplayFrom,
        sub: Subscriber,
    ) -> Result<Attachment, ExecError> {
        Ok(self.get(id)?.attach(from, sub))
    }

    /// Every exec held, running and finished, by id.
    pub fn list(&self) -> Vec<ExecSummary> {
        let records: Vec<Arc<ExecRecord>> = {
            let mut table = self.inner.lock();
            table.evict(Instant::now(), self.inner.config.finished_output_budget);
            table.execs.values().cloned().collect()
        };
        let mut execs: Vec<ExecSummary> = records.iter().map(|r| r.summary()).collect();
        execs.sort_by_key(|e| e.exec_id);
        execs
    }

    /// Stops sending an exec's output to a connection.
    pub fn detach(&self, id: ExecId, conn: ConnId) {
        if let Ok(record) = self.get(id) {
            record.detach(conn);
        }
    }

    /// SIGINT, grace (`grace`, else the default; clamped), then SIGKILL of
    /// everything the exec started. Returns the state found; harmless on
    /// finished and unknown execs.
    pub fn interrupt(&self, id: ExecId, grace: Option<Duration>) -> ExecState {
        let Ok(record) = self.get(id) else {
            return ExecState::Unknown;
        };
        let state = record.begin_interrupt();
        if state == ExecState::Running {
            let grace = grace
                .unwrap_or(self.inner.config.default_grace)
                .min(MAX_GRACE);
            tracing::debug!(exec_id = id, ?grace, "interrupting");
            match record.interrupter() {
                Some(interrupter) => interrupter.interrupt(grace),
                None => self.inner.kill(&record, Signal::SIGINT, grace),
            }
        }
        state
    }

    /// Changes the window of a PTY exec.
    pub fn resize(&self, id: ExecId, window: WindowSize) -> Result<(), ExecError> {
        let master = self.get(id)?.pty().ok_or(ExecError::NoTerminal(id))?;
        master
            .resize(window)
            .map_err(|source| ExecError::Resize { id, source })
    }

    /// State, exit and output size, without attaching.
    pub fn status(&self, id: ExecId) -> StatusReport {
        match self.get(id) {
            Ok(record) => record.status(),
            Err(_) => StatusReport {
                state: ExecState::Unknown,
                exit: None,
                output_bytes: 0,
            },
        }
    }

    /// Queues bytes for the exec's stdin, waiting while its queue is full.
    pub async fn write_stdin(&self, id: ExecId, data: Bytes) -> Result<(), ExecError> {
        let tx = self.get(id)?.stdin().ok_or(ExecError::StdinClosed(id))?;
        tx.send(data).await.map_err(|_| ExecError::StdinClosed(id))
    }

    /// Closes the exec's stdin once queued bytes are written. A terminal has
    /// no end of input, so a PTY exec gets what a user would type for it: the
    /// EOF character (^D) as its last input.
    pub fn close_stdin(&self, id: ExecId) -> Result<(), ExecError> {
        let record = self.get(id)?;
        if let (Some(_), Some(tx)) = (record.pty(), record.stdin()) {
            // A full queue means input is still flowing; the ^D is then lost,
            // as a keystroke would be that arrived while the program was busy.
            let _ = tx.try_send(Bytes::from_static(&[EOF_CHAR]));
        }
        if record.close_stdin() {
            Ok(())
        } else {
            Err(ExecError::StdinClosed(id))
        }
    }

    /// Unfinished execs.
    pub fn running(&self) -> usize {
        MAX_CONCURRENT_EXECS - self.inner.slots.available_permits()
    }

    /// Shutdown: SIGTERM every unfinished exec, SIGKILL what is left after
    /// `grace`.
    pub async fn terminate_all(&self, grace: Duration) {
        self.end_all(grace, None).await;
    }

    /// As [`Execs::terminate_all`], for a rewind to `snapshot`: each exit
    /// says that a rewind ended it, and to what.
    pub async fn end_for_rewind(&self, grace: Duration, snapshot: &str) {
        self.end_all(grace, Some(snapshot)).await;
    }

    async fn end_all(&self, grace: Duration, rewind: Option<&str>) {
        let running: Vec<Arc<ExecRecord>> = self
            .inner
            .lock()
            .execs
            .values()
            .filter(|record| !record.is_finished())
            .cloned()
            .collect();
        if let Some(snapshot) = rewind {
            for record in &running {
                record.mark_rewound(snapshot);
            }
        }
        let kills = running.iter().map(|record| {
            kill::escalate(
                Arc::clone(&self.inner.ops),
                record.scope.clone(),
                Signal::SIGTERM,
                grace,
                record.leader_gone(),
            )
        });
        futures_util::future::join_all(kills).await;
    }

    /// Gives unfinished execs' exits a moment (bounded) to reach clients.
    pub async fn settle(&self) {
        let deadline = Instant::now() + run::LINGER * 3;
        while self.running() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn get(&self, id: ExecId) -> Result<Arc<ExecRecord>, ExecError> {
        let mut table = self.inner.lock();
        table.evict(Instant::now(), self.inner.config.finished_output_budget);
        table.execs.get(&id).cloned().ok_or(ExecError::Unknown(id))
    }

    /// The directory an exec's `cwd` names, relative ones under the workdir.
    pub fn resolve_cwd(&self, cwd: Option<&str>) -> Result<PathBuf, ExecError> {
        let workdir = &self.inner.config.workdir;
        let dir = match cwd {
            None => workdir.clone(),
            Some(dir) => workdir.join(Path::new(dir)),
        };
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(ExecError::BadCwd(dir))
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, record: Arc<ExecRecord>) {
        let mut table = self.lock();
        table.evict(Instant::now(), self.config.finished_output_budget);
        table.execs.insert(record.id, record);
    }

    fn retire(&self, id: ExecId, bytes: usize) {
        let mut table = self.lock();
        table.retired.push_back(Retired {
            id,
            at: Instant::now(),
            bytes,
        });
        table.retired_bytes += bytes;
        table.evict(Instant::now(), self.config.finished_output_budget);
    }

    /// Starts an escalation in the background; the exit reaches clients the usual way.
    fn kill(&self, record: &ExecRecord, first: Signal, grace: Duration) {
        tokio::spawn(kill::escalate(
            Arc::clone(&self.ops),
            record.scope.clone(),
            first,
            grace,
            record.leader_gone(),
        ));
    }
}

/// Refuses what `execve` would refuse less clearly.
pub(crate) fn validate(spec: &ExecSpec) -> Result<(), ExecError> {
    let bad = |why: &str| Err(ExecError::BadSpec(why.to_owned()));
    match spec.argv.first() {
        None => return bad("argv is empty"),
        Some(program) if program.is_empty() => return bad("argv[0] is empty"),
        Some(_) => {}
    }
    if spec.argv.iter().any(|arg| arg.contains('\0')) {
        return bad("argv contains a NUL byte");
    }
    for (name, value) in &spec.env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(ExecError::BadSpec(format!(
                "environment variable {name:?} is not a valid NAME=value pair"
            )));
        }
    }
    if spec.cwd.as_deref().is_some_and(|cwd| cwd.contains('\0')) {
        return bad("cwd contains a NUL byte");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_at_the_process_limit_says_so() {
        let err = ExecError::spawn("true", io::Error::from_raw_os_error(libc::EAGAIN));
        assert!(matches!(err, ExecError::OutOfProcesses { .. }), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::SpawnFailed);
        assert!(err.to_string().contains("process limit"), "{err}");
    }

    #[test]
    fn a_spawn_out_of_file_descriptors_says_so_and_points_at_doctor() {
        let err = ExecError::spawn("true", io::Error::from_raw_os_error(libc::EMFILE));
        assert!(matches!(err, ExecError::OutOfFiles { .. }), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::SpawnFailed);
        let text = err.to_string();
        assert!(
            text.contains("too many files open") && text.contains("silo doctor"),
            "{text}"
        );
        let missing = ExecError::spawn("nope", io::Error::from_raw_os_error(libc::ENOENT));
        assert!(matches!(missing, ExecError::NotFound { .. }));
    }

    #[test]
    fn specs_execve_would_choke_on_are_refused() {
        let spec = |argv: &[&str]| ExecSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert!(validate(&spec(&["true"])).is_ok());
        assert!(validate(&spec(&[])).is_err());
        assert!(validate(&spec(&[""])).is_err());
        assert!(validate(&spec(&["a\0b"])).is_err());
        let mut with_env = spec(&["true"]);
        with_env.env.insert("A=B".into(), "x".into());
        let err = validate(&with_env).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest);
    }

    #[test]
    fn eviction_honours_count_and_age() {
        let mut table = Table::default();
        let now = Instant::now();
        for id in 0..(MAX_FINISHED_EXECS as u64 + 5) {
            table.retired.push_back(Retired {
                id,
                at: now,
                bytes: 1,
            });
            table.retired_bytes += 1;
        }
        table.evict(now, usize::MAX);
        assert_eq!(table.retired.len(), MAX_FINISHED_EXECS);
        assert_eq!(table.retired.front().map(|r| r.id), Some(5));

        table.evict(now, 10);
        assert_eq!(
            table.retired.len(),
            MAX_FINISHED_EXECS,
            "records outlive their output"
        );
        assert_eq!(
            table.retired_bytes, 10,
            "the oldest outputs are dropped first"
        );
        assert_eq!(table.retired.back().map(|r| r.bytes), Some(1));

        table.evict(now + RETENTION, 10);
        assert!(table.retired.is_empty());
        assert_eq!(table.retired_bytes, 0);
    }
}
