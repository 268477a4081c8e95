//! The local backend: the agent as a plain host process.
//!
//! **No isolation.** Commands run as the invoking user, on the host's file
//! system, network and process table; the sandbox directory is only a default
//! working directory. This backend exists for development, tests and
//! benchmarks, and to run the same agent code path as every other backend.
//!
//! Each sandbox owns `$SILO_HOME/sandboxes/<id>/`:
//! - `root/`: the agent's working directory, and the `/` of pushed mount
//!   paths (`--push-base`): mount `/workspace/managed/app` lands in
//!   `root/workspace/managed/app`;
//! - `agent.sock`: where the agent listens;
//! - `agent.key`: the sandbox key (0600), passed by path so it never appears
//!   in a command line or environment;
//! - `agent.log`: the agent's stdout and stderr;
//! - `agent.pid`: the running agent's pid, the truth every `silo` process
//!   consults (the database's `backend_ref` mirrors it for display);
//! - `lock`: an flock held while starting or stopping, so two processes never
//!   spawn two agents on one socket.
//!
//! The agent runs in a session of its own, so it survives the `silo` process
//! that started it and never receives that terminal's signals.

mod process;

use silo_protocol::http::error_chain;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{
    Backend, BackendError, LastExit, Machine, MachineStarted, MachineState, PortUrl, SnapshotWay,
};
use crate::agent_binary::{AgentBinaryError, AgentLocator};
use crate::client::{AgentClient, Endpoint};
use crate::fsutil::{remove_if_present, tail, write_atomic};
use crate::home::{Home, create_private_dir};
use crate::retry::Deadline;
use crate::spec::BackendKind;

pub use process::TerminateError;

/// How long a freshly spawned agent has to answer its health check.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a single health probe may take before the agent counts as hung.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long to wait for another `silo` process to finish starting or stopping.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between readiness probes and lock attempts.
const POLL: Duration = Duration::from_millis(5);
/// Longest socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Lines of `agent.log` quoted in startup errors.
const LOG_TAIL_LINES: usize = 20;
/// Where the host reaches a port of the local backend's processes.
const LOOPBACK: &str = "127.0.0.1";

/// Runs sandboxes as agent processes on this host.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    home: Home,
    agent: Arc<AgentLocator>,
}

/// The local backend's `backend_ref`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LocalRef {
    dir: PathBuf,
    socket: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
}

/// The files of one sandbox.
struct Paths {
    dir: PathBuf,
    root: PathBuf,
    socket: PathBuf,
    key: PathBuf,
    log: PathBuf,
    pid: PathBuf,
    lock: PathBuf,
}

impl Paths {
    fn new(home: &Home, id: &str) -> Self {
        let dir = home.sandbox_dir(id);
        Self {
            root: dir.join("root"),
            socket: dir.join("agent.sock"),
            key: dir.join("agent.key"),
            log: dir.join("agent.log"),
            pid: dir.join("agent.pid"),
            lock: dir.join("lock"),
            dir,
        }
    }

    fn to_ref(&self, pid: Option<u32>) -> serde_json::Value {
        let local = LocalRef {
            dir: self.dir.clone(),
            socket: self.socket.clone(),
            pid,
        };
        serde_json::to_value(local).unwrap_or_default()
    }
}

impl LocalBackend {
    /// A local backend keeping sandboxes under `home`, running the agent `agent` finds.
    pub fn new(home: Home, agent: Arc<AgentLocator>) -> Self {
        Self { home, agent }
    }

    /// The local backend of a home.
    pub(crate) fn open(setup: &super::BackendSetup) -> Self {
        Self::new(setup.home.clone(), Arc::clone(&setup.agent))
    }

    fn paths(&self, machine: &Machine<'_>) -> Paths {
        Paths::new(&self.home, machine.id)
    }

    /// The agent's pid as recorded, if one is recorded and still ours.
    fn live_pid(paths: &Paths) -> Option<u32> {
        let pid: u32 = fs::read_to_string(&paths.pid).ok()?.trim().parse().ok()?;
        process::is_our_agent(pid, &paths.socket).then_some(pid)
    }

    /// Whether the agent `pid` answers, and is the one answering on the socket.
    async fn healthy(client: &AgentClient, pid: u32) -> bool {
        matches!(
            tokio::time::timeout(PROBE_TIMEOUT, client.healthz()).await,
            Ok(Ok(health)) if health.pid == pid
        )
    }

    fn client(paths: &Paths, machine: &Machine<'_>) -> AgentClient {
        AgentClient::new(Endpoint::Unix(paths.socket.clone()), machine.key.clone())
    }

    /// Stops the recorded agent, if any, and clears its pid file and socket.
    /// The caller holds the lock.
    async fn stop_locked(paths: &Paths) -> Result<bool, LocalError> {
        let running = Self::live_pid(paths);
        if let Some(pid) = running {
            process::terminate(pid).await?;
        }
        remove_if_present(&paths.pid).map_err(io_err("remove", &paths.pid))?;
        remove_if_present(&paths.socket).map_err(io_err("remove", &paths.socket))?;
        Ok(running.is_some())
    }

    async fn start_locked(
        &self,
        paths: &Paths,
        machine: &Machine<'_>,
    ) -> Result<MachineStarted, LocalError> {
        let client = Self::client(paths, machine);
        if let Some(pid) = Self::live_pid(paths) {
            if Self::healthy(&client, pid).await {
                return Ok(MachineStarted {
                    backend_ref: paths.to_ref(Some(pid)),
                    was_running: true,
                });
            }
            tracing::warn!(
                pid,
                sandbox = machine.name,
                "agent is not answering; restarting it"
            );
        }
        Self::stop_locked(paths).await?;

        let agent = self.agent.get()?;
        fs::create_dir_all(&paths.root).map_err(io_err("create", &paths.root))?;
        write_atomic(
            &paths.key,
            format!("{}\n", machine.key.to_hex()).as_bytes(),
            0o600,
        )
        .map_err(io_err("write", &paths.key))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&paths.log)
            .map_err(io_err("open", &paths.log))?;
        let mut child = process::spawn_agent(
            &agent.path,
            machine.spec,
            &paths.socket,
            &paths.key,
            &paths.root,
            log,
        )
        .map_err(|source| LocalError::Spawn {
            agent: agent.path.clone(),
            source,
        })?;
        let pid = child.id().ok_or_else(|| exited(paths, "at once".into()))?;
        write_atomic(&paths.pid, format!("{pid}\n").as_bytes(), 0o600)
            .map_err(io_err("write", &paths.pid))?;

        let deadline = Deadline::after(READY_TIMEOUT, POLL);
        let mut last: String;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let _ = remove_if_present(&paths.pid);
                return Err(exited(paths, status.to_string()));
            }
            match tokio::time::timeout(PROBE_TIMEOUT, client.healthz()).await {
                Ok(Ok(health)) if health.pid == pid => {
                    return Ok(MachineStarted {
                        backend_ref: paths.to_ref(Some(pid)),
                        was_running: false,
                    });
                }
                Ok(Ok(health)) => {
                    last = format!("another agent (pid {}) answers on the socket", health.pid);
                }
                Ok(Err(error)) => last = error_chain(&error),
                Err(_) => last = format!("no answer within {PROBE_TIMEOUT:?}"),
            }
            if !deadline.pause().await {
                // Leave nothing half-started behind.
                let _ = process::terminate(pid).await;
                let _ = remove_if_present(&paths.pid);
                return Err(LocalError::NotReady {
                    waited: READY_TIMEOUT,
                    last,
                    log: LogTail::read(&paths.log),
                });
            }
        }
    }
}

impl Backend for LocalBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    fn snapshots(&self) -> Option<SnapshotWay> {
        None
    }

    async fn create(&self, machine: Machine<'_>) -> Result<serde_json::Value, BackendError> {
        let paths = self.paths(&machine);
        let len = paths.socket.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(LocalError::SocketPathTooLong {
                path: paths.socket,
                len,
            }
            .into());
        }
        create_private_dir(&paths.dir).map_err(io_err("create", &paths.dir))?;
        Ok(self.start(machine).await?.backend_ref)
    }

    async fn status(&self, machine: Machine<'_>) -> Result<MachineState, BackendError> {
        let paths = self.paths(&machine);
        if !paths.dir.is_dir() {
            return Ok(MachineState::Missing);
        }
        Ok(match Self::live_pid(&paths) {
            Some(pid) if Self::healthy(&Self::client(&paths, &machine), pid).await => {
                MachineState::Running
            }
            _ => MachineState::Stopped,
        })
    }

    async fn start(&self, machine: Machine<'_>) -> Result<MachineStarted, BackendError> {
        let paths = self.paths(&machine);
        if !paths.dir.is_dir() {
            return Err(LocalError::Missing { dir: paths.dir }.into());
        }
        let _lock = lock(&paths.lock).await?;
        Ok(self.start_locked(&paths, &machine).await?)
    }

    async fn stop(&self, machine: Machine<'_>) -> Result<bool, BackendError> {
        let paths = self.paths(&machine);
        if !paths.dir.is_dir() {
            return Ok(false);
        }
        let _lock = lock(&paths.lock).await?;
        Ok(Self::stop_locked(&paths).await?)
    }

    async fn remove(&self, machine: Machine<'_>) -> Result<(), BackendError> {
        let paths = self.paths(&machine);
        if !paths.dir.is_dir() {
            return Ok(());
        }
        let _lock = lock(&paths.lock).await?;
        Self::stop_locked(&paths).await?;
        force_remove_dir(&paths.dir).map_err(io_err("remove", &paths.dir))?;
        Ok(())
    }

    fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError> {
        Ok(Endpoint::Unix(self.paths(&machine).socket))
    }

    /// The agent's workload runs as host processes, so its ports are the
    /// host's own.
    async fn port_url(&self, _machine: Machine<'_>, port: u16) -> Result<PortUrl, BackendError> {
        let host = format!("{LOOPBACK}:{port}");
        Ok(PortUrl {
            url: format!("http://{host}"),
            host,
            headers: Vec::new(),
        })
    }

    /// A pid file whose agent is gone means the agent exited on its own
    /// (`silo stop` removes the pid file). It removes its socket when it
    /// shuts down in order, so a socket left behind marks a crash or a kill.
    /// Its last act is logging its exit, so the log's mtime dates the end.
    async fn last_exit(&self, machine: Machine<'_>) -> Result<Option<LastExit>, BackendError> {
        let paths = self.paths(&machine);
        if !paths.pid.exists() || Self::live_pid(&paths).is_some() {
            return Ok(None);
        }
        let at_ms = fs::metadata(&paths.log)
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Ok(at_ms.map(|at_ms| LastExit {
            at_ms,
            clean: !paths.socket.exists(),
        }))
    }
}

fn exited(paths: &Paths, status: String) -> LocalError {
    LocalError::AgentExited {
        status,
        log: LogTail::read(&paths.log),
    }
}

/// The last lines of an agent's log, captured when it failed (the file itself
/// may be gone by the time anyone reads the error).
#[derive(Debug)]
pub struct LogTail {
    path: PathBuf,
    tail: String,
}

impl LogTail {
    fn read(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            tail: tail(path, LOG_TAIL_LINES),
        }
    }
}

impl std::fmt::Display for LogTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.tail.trim().is_empty() {
            write!(f, "its log {} is empty", self.path.display())
        } else {
            write!(
                f,
                "last lines of its log {}:\n{}",
                self.path.display(),
                self.tail
            )
        }
    }
}

/// Takes the sandbox's start/stop lock, waiting up to [`LOCK_TIMEOUT`] for
/// another process to release it. Released when dropped.
async fn lock(path: &Path) -> Result<Flock<fs::File>, LocalError> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("open", path))?;
    let deadline = Deadline::after(LOCK_TIMEOUT, POLL);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Ok(locked),
            Err((back, Errno::EWOULDBLOCK)) if !deadline.passed() => {
                file = back;
                deadline.pause().await;
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(LocalError::Busy {
                    lock: path.to_owned(),
                    waited: LOCK_TIMEOUT,
                });
            }
            Err((_, errno)) => return Err(io_err("lock", path)(io::Error::from(errno))),
        }
    }
}

/// `remove_dir_all` that also handles trees a command made read-only (a Go
/// module cache, `chmod -w` test fixtures): on failure, make every directory
/// owner-writable and try once more.
fn force_remove_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(dir);
            fs::remove_dir_all(dir)
        }
    }
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode();
    // Best effort: whatever still fails surfaces in the retried removal.
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            make_writable(&entry.path());
        }
    }
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LocalError {
    let path = path.to_owned();
    move |source| LocalError::Io { what, path, source }
}

/// Why the local backend failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A file operation in the sandbox directory failed.
    #[error("cannot {what} {}", path.display())]
    Io {
        /// The operation.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No agent binary to run.
    #[error(transparent)]
    AgentBinary(#[from] AgentBinaryError),
    /// The agent could not be executed.
    #[error("cannot run agent {}", agent.display())]
    Spawn {
        /// The binary.
        agent: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The agent died before it was ready.
    #[error("agent exited during startup ({status}); {log}")]
    AgentExited {
        /// Its exit status.
        status: String,
        /// The end of its log.
        log: LogTail,
    },
    /// The agent did not answer in time (it has been killed).
    #[error("agent did not answer its health check within {waited:?} (last probe: {last}); {log}")]
    NotReady {
        /// How long we waited.
        waited: Duration,
        /// Why the last probe failed, with its causes (inline rather than a
        /// `#[source]`, so the log excerpt stays at the end of the message).
        last: String,
        /// The end of its log.
        log: LogTail,
    },
    /// The sandbox directory is gone.
    #[error("sandbox directory {} is gone (removed outside silo?)", dir.display())]
    Missing {
        /// The directory.
        dir: PathBuf,
    },
    /// The socket path would exceed the kernel's limit.
    #[error(
        "agent socket path {} is {len} bytes, over the {MAX_SOCKET_PATH}-byte limit \
         of Unix sockets; use a shorter SILO_HOME",
        path.display()
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// Another process holds the start/stop lock.
    #[error("another silo process has held {} for {waited:?}; try again", lock.display())]
    Busy {
        /// The lock file.
        lock: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The agent could not be stopped.
    #[error(transparent)]
    Terminate(#[from] TerminateError),
}
