//! Shell sessions: long-lived shells the agent owns, in which commands run one
//! at a time and share cwd, environment and shell variables, as they would
//! typed into one terminal.
//!
//! [`Sessions`] creates, finds, lists, interrupts and closes them by id. A
//! command run in a session is an exec of the registry ([`crate::exec`]
//! adopts it), so output, replay, attach, stdin and status work unchanged;
//! only interrupt is routed back here (see `run`), because the point is to
//! stop the command and keep the shell.
//!
//! How a run stays clean and interruptible (details in `script` and `run`):
//! the shell is interactive, so SIGINT aborts whatever it is doing and brings
//! it back to its prompt instead of killing it; the script is sourced from a
//! pipe with per-run pipes as its streams; the shell reports on its own
//! stderr with framed records, the prompt being one of them. If the shell
//! dies anyway (`exit`, a kill, a command that ignores SIGINT inside a loop
//! that never returns), the next step restarts it with the last known cwd and
//! exported environment and says so (`restored`).
//!
//! # Layout
//! - `script`: the text written to the shell (pure).
//! - `report`: parsing what the shell writes back (pure).
//! - `shell`: one shell process.
//! - `run`: one command, from the queue to its exit report.
//! - `line`: its line in the shell: pipes, records, interrupt.

mod line;
mod report;
mod run;
mod script;
pub use script::SHELL_MARKER_VAR;
mod shell;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use silo_protocol::exec::{ErrorKind, ExecId, ExecSpec};
use silo_protocol::session::{SessionIdError, SessionInfo, check_id};

use crate::exec::{ExecError, Execs, Started, Subscriber};
use crate::process::{ProcessOps, kill};
use crate::reaper::Reaper;
use shell::{Launch, Program, Saved, Shell};

/// Most sessions at once; each is a shell process.
pub const MAX_SESSIONS: usize = 32;

/// Why a session request failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The id is malformed.
    #[error("invalid session id")]
    BadId(#[from] SessionIdError),
    /// No session has this id.
    #[error("no session {0:?}")]
    Unknown(String),
    /// The session runs another command and the request would not wait.
    #[error("session {0:?} is running another command")]
    Busy(String),
    /// [`MAX_SESSIONS`] exist already.
    #[error("too many sessions (limit {MAX_SESSIONS})")]
    TooMany,
    /// Neither `bash` nor `sh` is in `PATH`.
    #[error("no shell in the sandbox: looked for bash and sh in PATH")]
    NoShell,
    /// The requested shell is not there.
    #[error("no shell {0:?} in the sandbox")]
    ShellNotFound(String),
    /// Sessions hand each run's pipes to the shell as `/proc/AGENT/fd/N`.
    #[error("sessions need /proc, which this sandbox does not mount")]
    NoProc,
    /// The shell could not be started.
    #[error("cannot start the session's shell {}", .program.display())]
    Spawn {
        /// The shell.
        program: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The spec cannot run in a session.
    #[error("invalid session request: {0}")]
    BadSpec(String),
    /// The exec registry refused the run (too many execs).
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl SessionError {
    /// The protocol's category for this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::BadId(_) | Self::BadSpec(_) => ErrorKind::BadRequest,
            Self::Unknown(_) => ErrorKind::UnknownSession,
            Self::Busy(_) => ErrorKind::Busy,
            Self::TooMany => ErrorKind::LimitReached,
            Self::NoShell | Self::ShellNotFound(_) | Self::NoProc | Self::Spawn { .. } => {
                ErrorKind::SpawnFailed
            }
            Self::Exec(err) => err.kind(),
        }
    }
}

/// What a new session starts from.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Shell program; the default shell when absent.
    pub shell: Option<String>,
    /// Working directory (already resolved); the workdir when absent.
    pub cwd: Option<PathBuf>,
    /// Variables added to the shell's environment.
    pub env: BTreeMap<String, String>,
}

/// The session registry. Cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

struct Inner {
    workdir: PathBuf,
    default_grace: Duration,
    reaper: Reaper,
    ops: Arc<dyn ProcessOps>,
    table: Mutex<HashMap<String, Arc<Session>>>,
}

/// One session.
pub struct Session {
    id: String,
    program: Program,
    /// Where and with what its first shell started; restarts before any run
    /// has finished start from here again.
    cwd: PathBuf,
    env: BTreeMap<String, String>,
    /// Held by the run in progress: one command at a time, in arrival order.
    slot: Arc<tokio::sync::Mutex<Slot>>,
    state: Mutex<State>,
}

/// What only the running command touches: the shell itself.
struct Slot {
    shell: Option<Shell>,
}

/// What anyone may look at.
#[derive(Default)]
struct State {
    saved: Saved,
    /// The live shell's pid and marker, for closing it without its slot.
    pid: Option<i32>,
    marker: String,
    gone: Option<tokio::sync::watch::Receiver<bool>>,
    running: Option<ExecId>,
    /// The running command's words.
    command: Option<String>,
    queued: u32,
    runs: u64,
    restarts: u32,
    closed: bool,
}

impl Sessions {
    /// An empty registry.
    pub fn new(
        workdir: PathBuf,
        default_grace: Duration,
        reaper: Reaper,
        ops: Arc<dyn ProcessOps>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                workdir,
                default_grace,
                reaper,
                ops,
                table: Mutex::default(),
            }),
        }
    }

    /// Finds the session, or creates it (starting its shell) from `options`.
    /// Returns it and whether it was created.
    pub fn open(&self, id: &str, options: Options) -> Result<(SessionInfo, bool), SessionError> {
        let (session, created) = self.get_or_create(id, options)?;
        Ok((session.info(), created))
    }

    /// Every session, by id.
    pub fn list(&self) -> Vec<SessionInfo> {
        let mut all: Vec<SessionInfo> = self.table().values().map(|s| s.info()).collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Interrupts the session's running command; `None` when it was idle.
    pub fn interrupt(
        &self,
        execs: &Execs,
        id: &str,
        grace: Option<Duration>,
    ) -> Result<Option<ExecId>, SessionError> {
        check_id(id)?;
        let session = self
            .table()
            .get(id)
            .cloned()
            .ok_or_else(|| SessionError::Unknown(id.to_owned()))?;
        let running = session.state().running;
        if let Some(exec_id) = running {
            execs.interrupt(exec_id, grace);
        }
        Ok(running)
    }

    /// Closes a session: kills its running command, then its shell and
    /// everything started from it. False when there was no such session.
    pub fn close(&self, execs: &Execs, id: &str) -> Result<bool, SessionError> {
        check_id(id)?;
        let Some(session) = self.table().remove(id) else {
            return Ok(false);
        };
        let running = {
            let mut state = session.state();
            state.closed = true;
            state.running
        };
        if let Some(exec_id) = running {
            execs.interrupt(exec_id, Some(Duration::ZERO));
        }
        tokio::spawn(session.kill_shell(
            Arc::clone(&self.inner.ops),
            Signal::SIGKILL,
            Duration::ZERO,
        ));
        Ok(true)
    }

    /// Runs `spec` in its session (created on first use). `cwd` is the spec's,
    /// resolved.
    pub fn run(
        &self,
        execs: &Execs,
        spec: ExecSpec,
        cwd: Option<PathBuf>,
        sub: Subscriber,
    ) -> Result<Started, SessionError> {
        let id = spec.session.clone().unwrap_or_default();
        let (session, _) = self.get_or_create(&id, Options::default())?;
        run::start(self.inner.context(), session, execs, spec, cwd, sub)
    }

    /// Rewrites a `tty` spec naming a session into one that starts the
    /// session's shell, interactive, from the session's last known cwd and
    /// exported environment (created on first use).
    pub fn interactive(&self, mut spec: ExecSpec) -> Result<ExecSpec, SessionError> {
        if !spec.argv.is_empty() {
            return Err(SessionError::BadSpec(
                "an interactive session shell takes no command".into(),
            ));
        }
        let id = spec.session.take().unwrap_or_default();
        let (session, _) = self.get_or_create(&id, Options::default())?;
        let saved = session.state().saved.clone();
        let shell = session.program.path.as_os_str().as_encoded_bytes();
        let text = script::interactive(shell, saved.env.as_deref(), &saved.cwd, &spec.env);
        spec.argv = vec![
            session.program.path.to_string_lossy().into_owned(),
            "-c".into(),
            String::from_utf8_lossy(&text).into_owned(),
        ];
        Ok(spec)
    }

    /// The argv of the sandbox's interactive shell.
    pub fn default_shell(&self) -> Result<Vec<String>, SessionError> {
        let program = Program::default_shell().ok_or(SessionError::NoShell)?;
        Ok(vec![
            program.path.to_string_lossy().into_owned(),
            "-i".into(),
        ])
    }

    /// Shutdown: SIGHUP every shell (interactive shells ignore SIGTERM) and
    /// everything started from it, SIGKILL what is left after `grace`.
    pub async fn terminate_all(&self, grace: Duration) {
        let all: Vec<Arc<Session>> = self.table().drain().map(|(_, s)| s).collect();
        let kills = all.into_iter().map(|session| {
            session.state().closed = true;
            session.kill_shell(Arc::clone(&self.inner.ops), Signal::SIGHUP, grace)
        });
        futures_util::future::join_all(kills).await;
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn get_or_create(
        &self,
        id: &str,
        options: Options,
    ) -> Result<(Arc<Session>, bool), SessionError> {
        check_id(id)?;
        let mut table = self.table();
        if let Some(session) = table.get(id) {
            return Ok((Arc::clone(session), false));
        }
        if table.len() >= MAX_SESSIONS {
            return Err(SessionError::TooMany);
        }
        if !Path::new("/proc/self/fd").is_dir() {
            return Err(SessionError::NoProc);
        }
        let program = match &options.shell {
            Some(name) => {
                Program::find(name).ok_or_else(|| SessionError::ShellNotFound(name.clone()))?
            }
            None => Program::default_shell().ok_or(SessionError::NoShell)?,
        };
        let cwd = options.cwd.unwrap_or_else(|| self.inner.workdir.clone());
        let session = Arc::new(Session {
            id: id.to_owned(),
            program,
            state: Mutex::new(State {
                saved: Saved {
                    cwd: cwd.as_os_str().as_encoded_bytes().to_vec(),
                    env: None,
                },
                ..State::default()
            }),
            cwd,
            env: options.env,
            slot: Arc::new(tokio::sync::Mutex::new(Slot { shell: None })),
        });
        // Started now, so the first command does not wait for it.
        let shell = session.spawn_shell(&self.inner.reaper, &self.inner.workdir, false)?;
        if let Ok(mut slot) = session.slot.try_lock() {
            slot.shell = Some(shell);
        }
        table.insert(id.to_owned(), Arc::clone(&session));
        tracing::debug!(session = id, "session created");
        Ok((session, true))
    }
}

impl Inner {
    fn context(self: &Arc<Self>) -> run::Context {
        run::Context {
            reaper: self.reaper.clone(),
            ops: Arc::clone(&self.ops),
            workdir: self.workdir.clone(),
            default_grace: self.default_grace,
        }
    }
}

impl Session {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn info(&self) -> SessionInfo {
        let state = self.state();
        let alive = state.gone.as_ref().is_some_and(|gone| !*gone.borrow());
        SessionInfo {
            id: self.id.clone(),
            shell: self.program.path.display().to_string(),
            pid: state
                .pid
                .filter(|_| alive)
                .and_then(|pid| u32::try_from(pid).ok()),
            cwd: String::from_utf8_lossy(&state.saved.cwd).into_owned(),
            running: state.running,
            command: state.command.clone(),
            queued: state.queued,
            runs: state.runs,
            restarts: state.restarts,
        }
    }

    /// Starts a shell: fresh from the session's options, or (`restore`) from
    /// its saved state. A cwd that no longer exists falls back to `workdir`;
    /// the restore text `cd`s to the saved one.
    fn spawn_shell(
        &self,
        reaper: &Reaper,
        workdir: &Path,
        restore: bool,
    ) -> Result<Shell, SessionError> {
        let saved = self.state().saved.clone();
        let cwd = if self.cwd.is_dir() {
            &self.cwd
        } else {
            workdir
        };
        let launch = Launch {
            program: &self.program,
            cwd,
            env: &self.env,
            restore: (restore && saved.env.is_some()).then_some(&saved),
        };
        let shell = Shell::spawn(reaper, &launch).map_err(|source| SessionError::Spawn {
            program: self.program.path.clone(),
            source,
        })?;
        let mut state = self.state();
        state.pid = Some(shell.pid);
        state.marker = shell.marker.clone();
        state.gone = Some(shell.gone.clone());
        if restore {
            state.restarts += 1;
        }
        Ok(shell)
    }

    /// Kills the current shell and everything started from it.
    async fn kill_shell(self: Arc<Self>, ops: Arc<dyn ProcessOps>, first: Signal, grace: Duration) {
        let (pid, marker, gone) = {
            let state = self.state();
            (state.pid, state.marker.clone(), state.gone.clone())
        };
        let (Some(pid), Some(gone)) = (pid, gone) else {
            return;
        };
        let scope = crate::process::Scope {
            leader: pid,
            marker,
        };
        kill::escalate(ops, scope, first, grace, gone).await;
    }
}
