//! One session shell process: finding a shell program, starting it fresh or
//! restored from its saved state, writing lines to it, and watching its records
//! and its exit.
//!
//! The shell runs interactive (so SIGINT aborts its running command instead
//! of killing it) in a session of its own, with a pipe from the agent as
//! stdin and one pipe to the agent as both stdout and stderr: bash and dash
//! print their prompt (which carries the `P` record) on stderr, busybox ash
//! on stdout, and the record parser skips whatever else a shell prints
//! there (a banner, job-control notes). Its pid is
//! registered with the reaper like any child's; a task turns the reaped
//! status into a watch, and another parses stderr into [`Record`]s.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::fcntl::OFlag;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};

use super::report::{Parser, Record};
use super::script::{self, Flavor, SHELL_MARKER_VAR};
use crate::exec::EXEC_MARKER_VAR;
use crate::process::{Scope, new_session};
use crate::reaper::{ProcessExit, Reaper};

/// Records queued between the stderr reader and the run that consumes them.
/// Outside a run nobody reads them, so older ones are dropped when it is full.
const RECORD_QUEUE: usize = 32;
/// Bytes read from the shell's stderr at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Where programs are looked for when the agent has no `PATH`.
const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A shell program and its dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Absolute path.
    pub path: PathBuf,
    /// How to talk to it.
    pub flavor: Flavor,
}

impl Program {
    /// `bash` if the sandbox has it, else `sh`.
    pub fn default_shell() -> Option<Self> {
        Self::find("bash").or_else(|| Self::find("sh"))
    }

    /// A named shell: a path, or a name looked up in `PATH`. Only `bash`
    /// (by file name) gets bash's flags; anything else is treated as POSIX sh.
    pub fn find(name: &str) -> Option<Self> {
        let path = if name.contains('/') {
            Some(PathBuf::from(name)).filter(|p| is_executable(p))
        } else {
            let search = std::env::var_os("PATH").unwrap_or_else(|| FALLBACK_PATH.into());
            std::env::split_paths(&search)
                .map(|dir| dir.join(name))
                .find(|p| is_executable(p))
        }?;
        let flavor = if path.file_name() == Some(OsStr::new("bash")) {
            Flavor::Bash
        } else {
            Flavor::Posix
        };
        Some(Self { path, flavor })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What a session's last normally ended run left (cwd and exported
/// environment), for restarting its shell.
#[derive(Debug, Clone, Default)]
pub struct Saved {
    /// `$PWD` after the last run that ended normally.
    pub cwd: Vec<u8>,
    /// `export -p` after it; `None` until a run has ended normally.
    pub env: Option<Vec<u8>>,
}

/// How to start a shell.
pub struct Launch<'a> {
    /// The program.
    pub program: &'a Program,
    /// Its working directory at startup.
    pub cwd: &'a Path,
    /// Variables added to the agent's environment (fresh start only).
    pub env: &'a BTreeMap<String, String>,
    /// A dead shell's state to restore; the environment then comes from it alone.
    pub restore: Option<&'a Saved>,
}

/// A live (or just died) shell.
pub struct Shell {
    /// Its pid, session and process group id.
    pub pid: i32,
    /// The `NAME=value` marker everything started from it carries.
    pub marker: String,
    control: pipe::Sender,
    /// Text to send before the next line (startup commands).
    pending: Vec<u8>,
    /// Parsed records from its stderr, in order.
    pub records: mpsc::Receiver<Record>,
    /// Its status, once reaped.
    pub exit: watch::Receiver<Option<ProcessExit>>,
    /// Turns true once reaped (for kill escalation).
    pub gone: watch::Receiver<bool>,
}

impl Shell {
    /// Starts a shell. Its startup commands are queued and go out with the
    /// first line written to it.
    pub fn spawn(reaper: &Reaper, launch: &Launch<'_>) -> io::Result<Self> {
        let (control_r, control_w) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let (report_r, report_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let marker_value = crate::random_hex::<8>()?;
        let mut cmd = Command::new(&launch.program.path);
        cmd.args(launch.program.flavor.args())
            .current_dir(launch.cwd)
            .stdin(Stdio::from(control_r))
            .stdout(Stdio::from(report_w.try_clone()?))
            .stderr(Stdio::from(report_w));
        if launch.restore.is_some() {
            cmd.env_clear();
        } else {
            cmd.envs(launch.env);
        }
        // An interactive sh sources $ENV at startup; nothing may run before
        // the agent's own setup.
        cmd.env_remove("ENV")
            .env_remove(EXEC_MARKER_VAR)
            .env(SHELL_MARKER_VAR, &marker_value);
        new_session(&mut cmd);
        let (child, exit_rx) = reaper.spawn(&mut cmd)?;
        drop(cmd);
        let pid = i32::try_from(child.id()).map_err(|_| io::Error::other("pid out of range"))?;

        let (exit_tx, exit) = watch::channel(None);
        let (gone_tx, gone) = watch::channel(false);
        tokio::spawn(async move {
            if let Ok(status) = exit_rx.await {
                exit_tx.send_replace(Some(status));
            }
            gone_tx.send_replace(true);
        });
        let (records_tx, records) = mpsc::channel(RECORD_QUEUE);
        tokio::spawn(read_records(
            pipe::Receiver::from_owned_fd(report_r)?,
            records_tx,
        ));

        let mut pending = Vec::new();
        if let Some(saved) = launch.restore {
            pending.extend(script::restore(
                saved.env.as_deref().unwrap_or_default(),
                &saved.cwd,
                &marker_value,
            ));
        }
        pending.extend(script::init(launch.program.flavor));
        tracing::debug!(pid, shell = %launch.program.path.display(), restored = launch.restore.is_some(), "session shell started");
        Ok(Self {
            pid,
            marker: format!("{SHELL_MARKER_VAR}={marker_value}"),
            control: pipe::Sender::from_owned_fd(control_w)?,
            pending,
            records,
            exit,
            gone,
        })
    }

    /// Writes a line (after any queued startup commands).
    pub async fn write(&mut self, line: &[u8]) -> io::Result<()> {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.control.write_all(&pending).await?;
        }
        self.control.write_all(line).await
    }

    /// Its status, if it has been reaped.
    pub fn exited(&self) -> Option<ProcessExit> {
        *self.exit.borrow()
    }

    /// What killing this shell must reach: its session and group, and with
    /// `escaped`, everything started from it that left them.
    pub fn scope(&self, escaped: bool) -> Scope {
        Scope {
            leader: self.pid,
            marker: if escaped {
                self.marker.clone()
            } else {
                String::new()
            },
        }
    }

    /// Throws away records left from earlier runs.
    pub fn drain_records(&mut self) {
        while self.records.try_recv().is_ok() {}
    }
}

/// Parses the shell's stderr until it closes.
async fn read_records(mut from: pipe::Receiver, to: mpsc::Sender<Record>) {
    let mut parser = Parser::default();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut parsed = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                tracing::debug!(%err, "session shell's stderr failed");
                break;
            }
        };
        parser.feed(&buf[..n], &mut parsed);
        for record in parsed.drain(..) {
            // Full only when nobody is running: those records are stale anyway.
            if let Err(mpsc::error::TrySendError::Closed(_)) = to.try_send(record) {
                return;
            }
        }
    }
}

/// The descriptor's number, as `/proc/self/fd` names it.
pub fn raw(fd: &OwnedFd) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}
