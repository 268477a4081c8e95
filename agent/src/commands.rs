//! Every command the controller asks the agent to run, routed to what runs it.
//!
//! Three kinds of command arrive as one `exec` request: a plain command and
//! a PTY command, which the exec registry ([`crate::exec`]) spawns itself,
//! and a run in a shell session, which the session's shell runs
//! ([`crate::session`]) and the registry adopts. [`Commands`] owns both
//! registries and is the only place that tells the kinds apart, so the exec
//! registry knows nothing of sessions and sessions use only the registry's
//! adopt API. It also stops everything at shutdown, in one order.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use silo_protocol::exec::{ErrorKind, ExecSpec};

use crate::exec::{ExecConfig, ExecError, Execs, Started, Subscriber};
use crate::process::ProcessOps;
use crate::reaper::Reaper;
use crate::session::{SessionError, Sessions};

/// Why a command could not be started (or a session request answered).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The exec registry refused it.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The session refused it.
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl CommandError {
    /// The protocol's category for this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Exec(err) => err.kind(),
            Self::Session(err) => err.kind(),
        }
    }
}

/// The exec registry and the shell sessions. Cheap to clone.
#[derive(Clone)]
pub struct Commands {
    execs: Execs,
    sessions: Sessions,
}

impl Commands {
    /// Empty registries; sessions take their workdir and grace from `config`.
    pub fn new(config: ExecConfig, reaper: Reaper, ops: Arc<dyn ProcessOps>) -> io::Result<Self> {
        let sessions = Sessions::new(
            config.workdir.clone(),
            config.default_grace,
            reaper.clone(),
            Arc::clone(&ops),
        );
        let execs = Execs::new(config, reaper, ops)?;
        Ok(Self { execs, sessions })
    }

    /// The exec registry: attach, status, stdin, interrupt and resize of any
    /// command, whoever runs it.
    pub fn execs(&self) -> &Execs {
        &self.execs
    }

    /// The shell sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Starts a command; `sub` follows its output from the first byte. A
    /// spec naming a session runs in that session's shell (or, with `tty`,
    /// starts an interactive shell from its state); a `tty` spec without a
    /// command runs the sandbox's interactive shell.
    pub fn start(&self, mut spec: ExecSpec, sub: Subscriber) -> Result<Started, CommandError> {
        match (&spec.session, spec.tty) {
            (Some(_), false) => {
                crate::exec::validate(&spec)?;
                let cwd = match spec.cwd.as_deref() {
                    Some(dir) => Some(self.execs.resolve_cwd(Some(dir))?),
                    None => None,
                };
                return Ok(self.sessions.run(&self.execs, spec, cwd, sub)?);
            }
            (Some(_), true) => spec = self.sessions.interactive(spec)?,
            (None, true) if spec.argv.is_empty() => spec.argv = self.sessions.default_shell()?,
            (None, _) => {}
        }
        Ok(self.execs.start(spec, sub)?)
    }

    /// Shutdown: SIGTERM every unfinished exec and SIGHUP every session's
    /// shell, SIGKILL what is left after `grace`, then give the exits a
    /// moment to reach clients.
    pub async fn terminate_all(&self, grace: Duration) {
        tokio::join!(
            self.execs.terminate_all(grace),
            self.sessions.terminate_all(grace)
        );
        self.execs.settle().await;
    }
}
