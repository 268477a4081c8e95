//! One command in a session, from its place in the queue to its exit report.
//!
//! A run is accepted at once (the client gets its exec id even if it must
//! wait), takes the session's slot (one command at a time, first come first
//! served), makes sure the shell is alive (restarting it from the last
//! saved state if not), hands the line to `line`, and reports the exit, with
//! `restored` when the shell had to be restarted before or during the run.

use silo_protocol::http::error_chain;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use silo_protocol::exec::ExecSpec;
use silo_protocol::limits::MAX_GRACE;
use silo_protocol::session::MAX_COMMAND_SHOWN;
use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::{Instant, sleep_until};

use super::line::{Ended, FAR_FUTURE, Line, fence, kill_shell};
use super::script;
use super::{Session, SessionError, Slot};
use crate::exec::{Adopted, Execs, Interrupter, Started, Subscriber, What};
use crate::process::ProcessOps;
use crate::reaper::{ProcessExit, Reaper};

/// What a run needs from the registry.
pub struct Context {
    pub reaper: Reaper,
    pub ops: Arc<dyn ProcessOps>,
    pub workdir: PathBuf,
    pub default_grace: Duration,
}

/// What to run and the limits that apply.
pub(super) struct Plan {
    /// The run's words, for `session ls`.
    pub(super) command: String,
    pub(super) script: Vec<u8>,
    pub(super) stdin: bool,
    pub(super) timeout: Option<Duration>,
    pub(super) grace: Duration,
    pub(super) detach_after: Option<Duration>,
}

/// Interrupt requests for one run; the shortest grace asked for wins.
pub(super) struct Control {
    requests: watch::Sender<Option<Duration>>,
}

impl Control {
    pub(super) fn request(&self, grace: Duration) {
        self.requests
            .send_modify(|current| *current = Some(current.map_or(grace, |g| g.min(grace))));
    }
}

impl Interrupter for Control {
    fn interrupt(&self, grace: Duration) {
        self.request(grace);
    }
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
) -> Result<Started, SessionError> {
    // The slot is taken now when it is free, so runs start in the order
    // their requests arrived; otherwise the run queues (or is refused).
    let guard = match Arc::clone(&session.slot).try_lock_owned() {
        Ok(guard) => Some(guard),
        Err(_) if spec.no_wait => return Err(SessionError::Busy(session.id.clone())),
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
    let what = What {
        argv: spec.argv.clone(),
        cwd: cwd
            .as_deref()
            .map(|dir| dir.display().to_string())
            .unwrap_or_else(|| String::from_utf8_lossy(&session.state().saved.cwd).into_owned()),
        session: Some(session.id.clone()),
        tty: false,
    };
    let adopted = execs.adopt(
        pid,
        spec.stdin,
        what,
        sub,
        Arc::clone(&control) as Arc<dyn Interrupter>,
    )?;
    let cwd = cwd.map(|dir| dir.into_os_string().into_encoded_bytes());
    let plan = Plan {
        command: shown(&spec.argv),
        script: script::user_script(&spec.argv, cwd.as_deref(), &spec.env),
        stdin: spec.stdin,
        timeout: spec.timeout_ms.map(Duration::from_millis),
        grace: spec
            .grace_ms
            .map_or(ctx.default_grace, Duration::from_millis)
            .min(MAX_GRACE),
        detach_after: execs.detach_after(spec.detach_timeout_ms),
    };
    let started = Started {
        exec_id: adopted.id(),
        pid,
    };
    {
        let mut state = session.state();
        match guard {
            Some(_) => {
                state.running = Some(started.exec_id);
                state.command = Some(plan.command.clone());
            }
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
            state.command = None;
            drop(state);
            adopted.note("the session was closed before this command could run");
            adopted.finish(Some(ProcessExit::Signal(Signal::SIGKILL as i32)), false);
            return;
        }
        state.running = Some(adopted.id());
        state.command = Some(plan.command.clone());
    }
    let mut restored = false;
    let ended = match ensure_shell(&ctx, &session, &mut slot) {
        Ok(restarted) => {
            restored = restarted;
            match slot.shell.as_mut() {
                Some(shell) => {
                    let mut run = Line {
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
            adopted.note(&error_chain(&err));
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
                    tracing::warn!(session = %session.id, err = %error_chain(&err), "cannot restart the session's shell")
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
    state.command = None;
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
///
/// A shell killed while idle may not have been reaped yet, so its status can
/// still be pending; asking the kernel as well keeps the next run from being
/// handed to a shell that can no longer run it.
fn ensure_shell(ctx: &Context, session: &Session, slot: &mut Slot) -> Result<bool, SessionError> {
    if slot
        .shell
        .as_ref()
        .is_some_and(|shell| shell.exited().is_none() && !ctx.ops.process_ended(shell.pid))
    {
        return Ok(false);
    }
    slot.shell = Some(session.spawn_shell(&ctx.reaper, &ctx.workdir, true)?);
    tracing::info!(session = %session.id, "session shell restarted with its last cwd and environment");
    Ok(true)
}

/// The words of a run as `session ls` shows them, cut at
/// [`MAX_COMMAND_SHOWN`] characters.
fn shown(argv: &[String]) -> String {
    let text = argv.join(" ");
    match text.char_indices().nth(MAX_COMMAND_SHOWN) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}
