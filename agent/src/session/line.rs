//! One run's line in the session's shell: its pipes, the line itself, and
//! following the shell's records until the line ends, interrupts included.
//!
//! Interrupt, once the shell has said it started the line (never earlier: a
//! signal while the shell is still reading its input could garble it):
//! SIGINT to the shell's process group, which is what a terminal's Ctrl-C
//! does. The foreground command dies of it and the interactive shell drops
//! the rest of the line and prints its prompt, whose record ends the run
//! with status 130; cwd, environment and variables stay. If the line has not
//! ended after the grace, the run's own processes (found by the exec marker)
//! are SIGKILLed; if it still has not ended [`SETTLE`] later, the shell is
//! killed (and restarted by the caller). After a run that was signalled,
//! [`fence`] proves the shell reads commands again before the next run.
//!
//! Caveat, as in a terminal: bash takes a command that did not die *of
//! SIGINT* (it ignored it and was SIGKILLed) as one that handled it, and
//! goes on with the rest of the script; dash stops.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use silo_protocol::exec::Channel;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use super::Session;
use super::report::Record;
use super::run::{Context, Control, Plan};
use super::script::{self, RunFds};
use super::shell::{Shell, raw};
use crate::exec::detach::DetachTimer;
use crate::exec::{Adopted, LINGER};
use crate::process::kill;
use crate::reaper::ProcessExit;

/// After the SIGKILL sweep at the end of the grace, how long the shell gets
/// to finish the line before it is killed and restarted.
pub const SETTLE: Duration = Duration::from_millis(500);
/// How long a shell may take to start a line (or take it in) before it is
/// deemed stuck, killed and restarted.
const UNRESPONSIVE: Duration = Duration::from_secs(10);
/// How long one fence may take.
const FENCE_WAIT: Duration = Duration::from_millis(500);
/// Fences tried before the shell is deemed garbled and restarted.
const FENCE_ATTEMPTS: u64 = 3;
/// How long to wait for the reaper after killing a shell.
const REAP_WAIT: Duration = Duration::from_secs(2);
/// Stands in for "never" in deadlines that are not armed.
pub(super) const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How a run's line ended.
pub(super) enum Ended {
    /// It ran to its end; the script's status.
    Done(i32),
    /// SIGINT aborted it; `$?` at the prompt.
    Aborted(i32),
    /// The shell died.
    ShellDied(Option<ProcessExit>),
    /// The agent killed the shell: it ignored the interrupt, stopped
    /// answering, or lost its stderr.
    Killed,
    /// The run could not be set up; the reason is in its stderr.
    Failed,
}

/// One run's line in the shell.
pub(super) struct Line<'a> {
    pub(super) ctx: &'a Context,
    pub(super) session: &'a Session,
    pub(super) shell: &'a mut Shell,
    pub(super) adopted: &'a mut Adopted,
    pub(super) control: &'a Control,
    pub(super) requests: watch::Receiver<Option<Duration>>,
    pub(super) plan: &'a Plan,
    pub(super) timeout_at: Option<Instant>,
    /// SIGINT was sent to the shell during this run.
    pub(super) signalled: bool,
}

/// The agent's ends of one run's pipes that the shell opens through /proc.
struct Held {
    script: OwnedFd,
    stdin: Option<OwnedFd>,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl Line<'_> {
    pub(super) async fn execute(&mut self) -> Ended {
        self.shell.drain_records();
        let (held, script_w, out_r, err_r, stdin_w) = match pipes(self.plan.stdin) {
            Ok(pipes) => pipes,
            Err(err) => {
                self.adopted
                    .note(&format!("cannot set up the command's pipes: {err}"));
                return Ended::Failed;
            }
        };
        let pumps = [
            self.adopted.pump(Channel::Stdout, out_r),
            self.adopted.pump(Channel::Stderr, err_r),
        ];
        if let Some(stdin_w) = stdin_w {
            self.adopted.feed_stdin(stdin_w);
        }
        let script = self.plan.script.clone();
        let writer = tokio::spawn(async move {
            let mut script_w = script_w;
            // The shell may never read it (an interrupt first); the task is aborted then.
            let _ = script_w.write_all(&script).await;
        });
        let fds = RunFds {
            script: raw(&held.script),
            stdin: held.stdin.as_ref().map(raw),
            stdout: raw(&held.stdout),
            stderr: raw(&held.stderr),
        };
        let line = script::run_line(std::process::id(), self.adopted.id(), &fds);
        let ended = match timeout(UNRESPONSIVE, self.shell.write(&line)).await {
            Ok(Ok(())) => self.follow().await,
            Ok(Err(err)) => {
                tracing::debug!(%err, "cannot write to the session shell");
                self.died_or_kill().await
            }
            Err(_) => {
                kill_shell(self.ctx, self.shell).await;
                Ended::Killed
            }
        };
        // Only background processes can still hold the streams now; give
        // them what a plain exec gives them, then stop reading.
        drop(held);
        writer.abort();
        let aborts: Vec<_> = pumps.iter().map(|p| p.abort_handle()).collect();
        if timeout(LINGER, futures_util::future::join_all(pumps))
            .await
            .is_err()
        {
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
        }
        ended
    }

    /// Follows the shell's records until the line ends.
    async fn follow(&mut self) -> Ended {
        let id = self.adopted.id();
        let record = Arc::clone(self.adopted.record());
        let far = Instant::now() + FAR_FUTURE;
        let mut started = false;
        let mut start_by = Some(Instant::now() + UNRESPONSIVE);
        let mut grace_at: Option<Instant> = None;
        let mut settle_at: Option<Instant> = None;
        let mut detach = DetachTimer::new(record.attached(), self.plan.detach_after);
        let unattended = detach.expired();
        tokio::pin!(unattended);
        let mut detach_fired = false;
        loop {
            tokio::select! {
                got = self.shell.records.recv() => match got {
                    Some(Record::Started { run }) if run == id => {
                        started = true;
                        start_by = None;
                        let asked = *self.requests.borrow_and_update();
                        if let Some(grace) = asked {
                            self.signal(grace, &mut grace_at, settle_at.is_some());
                        }
                    }
                    Some(Record::Done { run, status, env, cwd }) if run == id => {
                        self.session.remember(env, cwd);
                        return Ended::Done(status);
                    }
                    Some(Record::Prompt { run: Some(run), status }) if run == id => {
                        return Ended::Aborted(status);
                    }
                    Some(_) => {}
                    // Its stderr is gone: no record can come any more.
                    None => return self.died_or_kill().await,
                },
                _ = self.shell.exit.changed() => return Ended::ShellDied(self.shell.exited()),
                changed = self.requests.changed(), if started => {
                    let asked = if changed.is_ok() { *self.requests.borrow_and_update() } else { None };
                    if let Some(grace) = asked {
                        self.signal(grace, &mut grace_at, settle_at.is_some());
                    }
                }
                () = sleep_until(grace_at.unwrap_or(far)), if grace_at.is_some() => {
                    grace_at = None;
                    tracing::debug!(exec_id = id, "grace over; killing the command's processes");
                    tokio::spawn(kill::escalate(
                        Arc::clone(&self.ctx.ops),
                        record.scope.clone(),
                        Signal::SIGKILL,
                        Duration::ZERO,
                        record.leader_gone(),
                    ));
                    settle_at = Some(Instant::now() + SETTLE);
                }
                () = sleep_until(settle_at.or(start_by).unwrap_or(far)), if settle_at.is_some() || start_by.is_some() => {
                    tracing::info!(exec_id = id, session = %self.session.id, "session shell did not come back; killing it");
                    kill_shell(self.ctx, self.shell).await;
                    return Ended::Killed;
                }
                () = sleep_until(self.timeout_at.unwrap_or(far)), if self.timeout_at.is_some() => {
                    self.timeout_at = None;
                    record.mark_timed_out();
                    self.control.request(self.plan.grace);
                }
                () = &mut unattended, if !detach_fired => {
                    detach_fired = true;
                    tracing::debug!(exec_id = id, "no client attached; interrupting");
                    self.control.request(self.ctx.default_grace);
                }
            }
        }
    }

    /// SIGINT to the shell's group (once), and the grace's end.
    fn signal(&mut self, grace: Duration, grace_at: &mut Option<Instant>, settling: bool) {
        if !self.signalled {
            tracing::debug!(
                exec_id = self.adopted.id(),
                ?grace,
                "interrupting session run"
            );
            self.ctx.ops.signal_group(self.shell.pid, Signal::SIGINT);
            self.signalled = true;
        }
        if !settling {
            let at = Instant::now() + grace;
            *grace_at = Some(grace_at.map_or(at, |old| old.min(at)));
        }
    }

    /// The shell stopped listening: it died, or is about to be killed.
    async fn died_or_kill(&mut self) -> Ended {
        if timeout(LINGER, self.shell.exit.wait_for(Option::is_some))
            .await
            .is_ok()
        {
            return Ended::ShellDied(self.shell.exited());
        }
        kill_shell(self.ctx, self.shell).await;
        Ended::Killed
    }
}

impl Session {
    /// Keeps what a normally ended run reported, for a later restore.
    fn remember(&self, env: Option<Vec<u8>>, cwd: Vec<u8>) {
        let mut state = self.state();
        state.saved.cwd = cwd;
        if env.is_some() {
            state.saved.env = env;
        }
    }
}

/// Kills a shell and what runs in its session, and waits for its status.
pub(super) async fn kill_shell(ctx: &Context, shell: &mut Shell) {
    kill::escalate(
        Arc::clone(&ctx.ops),
        shell.scope(false),
        Signal::SIGKILL,
        Duration::ZERO,
        shell.gone.clone(),
    )
    .await;
    let _ = timeout(REAP_WAIT, shell.exit.wait_for(Option::is_some)).await;
}

/// Proves the shell reads commands again and no SIGINT is still on its way
/// (one arriving mid-read would garble the next run's line). False if it
/// never answered.
pub(super) async fn fence(shell: &mut Shell) -> bool {
    for attempt in 0..FENCE_ATTEMPTS {
        let token = attempt + 1;
        if timeout(FENCE_WAIT, shell.write(&script::fence(token)))
            .await
            .is_err()
        {
            return false;
        }
        let answered = timeout(FENCE_WAIT, async {
            while let Some(record) = shell.records.recv().await {
                if record == (Record::Fence { token }) {
                    return true;
                }
            }
            false
        })
        .await;
        match answered {
            Ok(true) => return true,
            Ok(false) => return false,
            Err(_) => {}
        }
    }
    false
}

type Pipes = (
    Held,
    pipe::Sender,
    pipe::Receiver,
    pipe::Receiver,
    Option<pipe::Sender>,
);

/// The run's pipes: the agent keeps one end of each for itself and holds the
/// other open until the run ends, for the shell to open through /proc.
fn pipes(stdin: bool) -> io::Result<Pipes> {
    let pair = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from);
    let (script_r, script_w) = pair()?;
    let (out_r, out_w) = pair()?;
    let (err_r, err_w) = pair()?;
    let (stdin_r, stdin_w) = if stdin {
        let (r, w) = pair()?;
        (Some(r), Some(pipe::Sender::from_owned_fd(w)?))
    } else {
        (None, None)
    };
    Ok((
        Held {
            script: script_r,
            stdin: stdin_r,
            stdout: out_w,
            stderr: err_w,
        },
        pipe::Sender::from_owned_fd(script_w)?,
        pipe::Receiver::from_owned_fd(out_r)?,
        pipe::Receiver::from_owned_fd(err_r)?,
        stdin_w,
    ))
}
