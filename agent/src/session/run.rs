//! One command in a session, from its place in the queue to its exit report.
//!
//! A run waits for the session's slot (one command at a time, first come
//! first served), makes sure the shell is alive (restarting it from the last
//! snapshot if not), hands the shell one line (see `script::run_line`) with
//! fresh pipes for the script and the streams, and watches the shell's records
//! until the line ends.
//!
//! Interrupt, once the shell has said it started the line (never earlier: a
//! signal while the shell is still reading its input could garble it):
//! SIGINT to the shell's process group, which is what a terminal's Ctrl-C
//! does. The foreground command dies of it and the interactive shell drops
//! the rest of the line and prints its prompt, whose record ends the run
//! with status 130; cwd, environment and variables stay. If the line has not
//! ended after the grace, the run's own processes (found by the exec marker)
//! are SIGKILLed; if it still has not ended [`SETTLE`] later, the shell is
//! killed and restarted from its snapshot. After a run that was signalled,
//! a fence line proves the shell reads commands again before the next run.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use silo_protocol::exec::{Channel, ExecSpec};
use silo_protocol::limits::MAX_GRACE;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::{Instant, sleep_until, timeout};

use super::report::Record;
use super::script::{self, RunFds};
use super::shell::{Shell, raw};
use super::{Session, SessionError, Slot};
use crate::exec::{Adopted, ExecError, Execs, Interrupter, LINGER, Started, Subscriber, kill};
use crate::process::ProcessOps;
use crate::reaper::{ProcessExit, Reaper};

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
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a run needs from the registry.
pub struct Context {
    pub reaper: Reaper,
    pub ops: Arc<dyn ProcessOps>,
    pub workdir: PathBuf,
    pub default_grace: Duration,
}

/// What to run and the limits that apply.
struct Plan {
    script: Vec<u8>,
    stdin: bool,
    timeout: Option<Duration>,
    grace: Duration,
    detach_after: Option<Duration>,
}

/// Interrupt requests for one run; the shortest grace asked for wins.
struct Control {
    requests: watch::Sender<Option<Duration>>,
}

impl Control {
    fn request(&self, grace: Duration) {
        self.requests
            .send_modify(|current| *current = Some(current.map_or(grace, |g| g.min(grace))));
    }
}

impl Interrupter for Control {
    fn interrupt(&self, grace: Duration) {
        self.request(grace);
    }
}

/// How a run's line ended.
enum Ended {
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

/// Registers the run and starts driving it; replies at once, even if it has
/// to wait for the session.
pub fn start(
    ctx: Context,
    session: Arc<Session>,
    execs: &Execs,
    spec: ExecSpec,
    cwd: Option<PathBuf>,
    sub: Subscriber,
) -> Result<Started, ExecError> {
    // The slot is taken now when it is free, so runs start in the order
    // their requests arrived; otherwise the run queues (or is refused).
    let guard = match Arc::clone(&session.slot).try_lock_owned() {
        Ok(guard) => Some(guard),
        Err(_) if spec.no_wait => return Err(SessionError::Busy(session.id.clone()).into()),
        Err(_) => None,
    };
    let control = Arc::new(Control {
        requests: watch::channel(None).0,
    });
    let pid = session
        .state()
        .pid
        .and_then(|pid| u32::try_from(pid).ok())
        .unwrap_or(0);
    let adopted = execs.adopt(
        pid,
        spec.stdin,
        sub,
        Arc::clone(&control) as Arc<dyn Interrupter>,
    )?;
    let cwd = cwd.map(|dir| dir.into_os_string().into_encoded_bytes());
    let plan = Plan {
        script: script::user_script(&spec.argv, cwd.as_deref(), &spec.env),
        stdin: spec.stdin,
        timeout: spec.timeout_ms.map(Duration::from_millis),
        grace: spec
            .grace_ms
            .map_or(ctx.default_grace, Duration::from_millis)
            .min(MAX_GRACE),
        detach_after: spec.detach_timeout_ms.map(Duration::from_millis),
    };
    let started = Started {
        exec_id: adopted.id(),
        pid,
    };
    {
        let mut state = session.state();
        match guard {
            Some(_) => state.running = Some(started.exec_id),
            None => state.queued += 1,
        }
    }
    tracing::debug!(exec_id = started.exec_id, session = %session.id, "session run accepted");
    tokio::spawn(drive(ctx, session, adopted, control, plan, guard));
    Ok(started)
}

async fn drive(
    ctx: Context,
    session: Arc<Session>,
    mut adopted: Adopted,
    control: Arc<Control>,
    plan: Plan,
    guard: Option<OwnedMutexGuard<Slot>>,
) {
    let mut requests = control.requests.subscribe();
    let timeout_at = plan.timeout.map(|t| Instant::now() + t);
    let guard = match guard {
        Some(guard) => Some(guard),
        None => {
            let guard = queue(&session, &mut requests, timeout_at, &adopted).await;
            let mut state = session.state();
            state.queued = state.queued.saturating_sub(1);
            guard
        }
    };
    let Some(mut slot) = guard else {
        // Interrupted (or timed out) before its turn: it never ran.
        adopted.finish(Some(ProcessExit::Signal(Signal::SIGINT as i32)), false);
        return;
    };
    {
        let mut state = session.state();
        if state.closed {
            state.running = None;
            drop(state);
            adopted.note("the session was closed before this command could run");
            adopted.finish(Some(ProcessExit::Signal(Signal::SIGKILL as i32)), false);
            return;
        }
        state.running = Some(adopted.id());
    }
    let mut restored = false;
    let ended = match ensure_shell(&ctx, &session, &mut slot) {
        Ok(restarted) => {
            restored = restarted;
            match slot.shell.as_mut() {
                Some(shell) => {
                    let mut run = Run {
                        ctx: &ctx,
                        session: &session,
                        shell,
                        adopted: &mut adopted,
                        control: &control,
                        requests,
                        plan: &plan,
                        timeout_at,
                        signalled: false,
                    };
                    let ended = run.execute().await;
                    (ended, run.signalled)
                }
                None => (Ended::Failed, false),
            }
        }
        Err(err) => {
            adopted.note(&describe(&err));
            (Ended::Failed, false)
        }
    };
    let (ended, signalled) = ended;
    let status = match ended {
        Ended::Done(status) | Ended::Aborted(status) => Some(ProcessExit::Code(status)),
        Ended::ShellDied(exit) => exit,
        Ended::Killed => Some(ProcessExit::Signal(Signal::SIGKILL as i32)),
        Ended::Failed => None,
    };
    if matches!(ended, Ended::ShellDied(_) | Ended::Killed) {
        // Restarted now, so the result can say so and the next command does
        // not pay for it.
        slot.shell = None;
        if !session.state().closed {
            match ensure_shell(&ctx, &session, &mut slot) {
                Ok(restarted) => restored |= restarted,
                Err(err) => {
                    tracing::warn!(session = %session.id, err = %describe(&err), "cannot restart the session's shell")
                }
            }
        }
    }
    let exit = adopted.finish(status, restored);
    tracing::debug!(session = %session.id, ?exit, "session run finished");
    if signalled
        && let Some(shell) = slot.shell.as_mut()
        && !fence(shell).await
    {
        tracing::warn!(session = %session.id, "session shell did not answer a fence; restarting it");
        kill_shell(&ctx, shell).await;
        slot.shell = None;
    }
    let mut state = session.state();
    state.running = None;
    state.runs += 1;
}

/// Waits for the session's slot, unless the run is interrupted or times out first.
async fn queue(
    session: &Arc<Session>,
    requests: &mut watch::Receiver<Option<Duration>>,
    timeout_at: Option<Instant>,
    adopted: &Adopted,
) -> Option<OwnedMutexGuard<Slot>> {
    let lock = Arc::clone(&session.slot).lock_owned();
    tokio::pin!(lock);
    let far = Instant::now() + FAR_FUTURE;
    loop {
        tokio::select! {
            guard = &mut lock => return Some(guard),
            changed = requests.changed() => {
                if changed.is_err() || requests.borrow_and_update().is_some() {
                    return None;
                }
            }
            () = sleep_until(timeout_at.unwrap_or(far)), if timeout_at.is_some() => {
                adopted.record().mark_timed_out();
                return None;
            }
        }
    }
}

/// Restarts the shell if it is gone. True when it did.
fn ensure_shell(ctx: &Context, session: &Session, slot: &mut Slot) -> Result<bool, SessionError> {
    if slot
        .shell
        .as_ref()
        .is_some_and(|shell| shell.exited().is_none())
    {
        return Ok(false);
    }
    slot.shell = Some(session.spawn_shell(&ctx.reaper, &ctx.workdir, true)?);
    tracing::info!(session = %session.id, "session shell restarted with its last cwd and environment");
    Ok(true)
}

/// One run's line in the shell.
struct Run<'a> {
    ctx: &'a Context,
    session: &'a Session,
    shell: &'a mut Shell,
    adopted: &'a mut Adopted,
    control: &'a Control,
    requests: watch::Receiver<Option<Duration>>,
    plan: &'a Plan,
    timeout_at: Option<Instant>,
    /// SIGINT was sent to the shell during this run.
    signalled: bool,
}

/// The agent's ends of one run's pipes that the shell opens through /proc.
struct Held {
    script: OwnedFd,
    stdin: Option<OwnedFd>,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl Run<'_> {
    async fn execute(&mut self) -> Ended {
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
        let mut attached = record.attached();
        let mut watch_attached = self.plan.detach_after.is_some();
        let mut detach_at: Option<Instant> = None;
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
                changed = attached.changed(), if watch_attached => {
                    if changed.is_err() {
                        watch_attached = false;
                    } else if let Some(after) = self.plan.detach_after {
                        detach_at = (*attached.borrow_and_update() == 0).then(|| Instant::now() + after);
                    }
                }
                () = sleep_until(detach_at.unwrap_or(far)), if detach_at.is_some() => {
                    detach_at = None;
                    watch_attached = false;
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
        state.snapshot.cwd = cwd;
        if env.is_some() {
            state.snapshot.env = env;
        }
    }
}

/// Kills a shell and what runs in its session, and waits for its status.
async fn kill_shell(ctx: &Context, shell: &mut Shell) {
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
async fn fence(shell: &mut Shell) -> bool {
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

/// An error and its causes on one line.
fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
