//! The optional supervised command given after `--` (a notebook server, an
//! agent harness): started in its own session, restarted per policy with
//! exponential backoff, signalled on the agent's behalf, stopped at shutdown.
//!
//! Its failures are logged and retried, never fatal: the agent must keep
//! serving requests whatever the workload does, and no request waits on it.

use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
pub use silo_protocol::workload::RestartPolicy;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::exec::EXEC_MARKER_VAR;
use crate::process::{ProcessOps, Scope, kill, new_session};
use crate::reaper::{ProcessExit, Reaper};
use crate::session::SHELL_MARKER_VAR;

/// Environment variable the workload's processes carry, so shutdown can find
/// the ones that left its process group.
pub const WORKLOAD_MARKER_VAR: &str = "SILO_WORKLOAD";
/// First restart delay; doubled after each quick failure.
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest restart delay.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A run at least this long counts as stable and resets the backoff.
const STABLE_RUN: Duration = Duration::from_secs(10);
/// Status reported when the workload could not be started at all (the shell's "not found").
const SPAWN_FAILED_CODE: i32 = 127;
/// How long what a finished run left behind gets, after SIGTERM, before the
/// SIGKILL sweep: a child still holding the run's port would make the next
/// run fail.
const LEFTOVER_GRACE: Duration = Duration::from_secs(1);

/// Whether `policy` starts the workload again after `exit`.
fn restarts_after(policy: RestartPolicy, exit: ProcessExit) -> bool {
    match policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => !exit.success(),
        RestartPolicy::Never => false,
    }
}

/// Delay before the next start, given how many quick failures came before.
pub fn restart_delay(quick_failures: u32) -> Duration {
    BACKOFF_BASE
        .checked_mul(1u32.checked_shl(quick_failures).unwrap_or(u32::MAX))
        .map_or(BACKOFF_MAX, |delay| delay.min(BACKOFF_MAX))
}

/// The quick-failure count after a run of `ran_for`: reset by a stable run.
pub fn next_quick_failures(previous: u32, ran_for: Duration) -> u32 {
    if ran_for >= STABLE_RUN {
        0
    } else {
        previous.saturating_add(1)
    }
}

/// A running supervisor.
pub struct Workload {
    /// Process group of the current run, while it runs.
    current: Arc<Mutex<Option<i32>>>,
    ops: Arc<dyn ProcessOps>,
    stop: oneshot::Sender<Duration>,
    task: JoinHandle<Option<ProcessExit>>,
}

impl Workload {
    /// Starts supervising `argv`. `marker_value` must be unique to this agent.
    pub fn start(
        argv: Vec<String>,
        policy: RestartPolicy,
        reaper: Reaper,
        ops: Arc<dyn ProcessOps>,
        marker_value: &str,
    ) -> Self {
        let current = Arc::new(Mutex::new(None));
        let (stop, stop_rx) = oneshot::channel();
        let supervisor = Supervisor {
            argv,
            policy,
            reaper,
            ops: Arc::clone(&ops),
            marker_value: marker_value.to_owned(),
            current: Arc::clone(&current),
        };
        let task = tokio::spawn(supervisor.run(stop_rx));
        Self {
            current,
            ops,
            stop,
            task,
        }
    }

    /// Forwards a signal to the workload's process group, if it is running.
    pub fn forward(&self, signal: Signal) {
        let pgid = *self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pgid) = pgid {
            tracing::info!(pgid, %signal, "forwarding signal to the workload");
            self.ops.signal_group(pgid, signal);
        }
    }

    /// Stops restarting, SIGTERMs the workload, SIGKILLs it after `grace`.
    /// Returns its last exit (`None` if it never ran).
    pub async fn stop(self, grace: Duration) -> Option<ProcessExit> {
        // An error means the supervisor already ended; its result is still in the task.
        let _ = self.stop.send(grace);
        self.task.await.ok().flatten()
    }
}

struct Supervisor {
    argv: Vec<String>,
    policy: RestartPolicy,
    reaper: Reaper,
    ops: Arc<dyn ProcessOps>,
    marker_value: String,
    current: Arc<Mutex<Option<i32>>>,
}

impl Supervisor {
    async fn run(self, mut stop: oneshot::Receiver<Duration>) -> Option<ProcessExit> {
        let mut quick_failures = 0;
        loop {
            let began = Instant::now();
            let exit = match self.spawn() {
                Ok((pgid, exit_rx)) => {
                    self.set_current(Some(pgid));
                    let outcome = self.wait(pgid, exit_rx, &mut stop).await;
                    self.set_current(None);
                    match outcome {
                        Waited::Exited(exit) => {
                            self.clear_leftovers(pgid).await;
                            exit
                        }
                        Waited::Stopped(exit) => return Some(exit),
                    }
                }
                Err(err) => {
                    tracing::error!(argv = ?self.argv, %err, "cannot start the workload");
                    ProcessExit::Code(SPAWN_FAILED_CODE)
                }
            };
            if !restarts_after(self.policy, exit) {
                tracing::info!(?exit, policy = ?self.policy, "workload exited; not restarting");
                // Stay until shutdown, so `stop` still returns this exit.
                let _ = (&mut stop).await;
                return Some(exit);
            }
            quick_failures = next_quick_failures(quick_failures, began.elapsed());
            let delay = restart_delay(quick_failures.saturating_sub(1));
            tracing::warn!(?exit, ?delay, "workload exited; restarting");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = &mut stop => return Some(exit),
            }
        }
    }

    fn spawn(&self) -> std::io::Result<(i32, oneshot::Receiver<ProcessExit>)> {
        let (program, args) = self
            .argv
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty workload command"))?;
        let mut cmd = Command::new(program);
        cmd.args(args).env(WORKLOAD_MARKER_VAR, &self.marker_value);
        new_session(&mut cmd);
        let (child, exit_rx) = self.reaper.spawn(&mut cmd)?;
        let pgid = i32::try_from(child.id()).map_err(std::io::Error::other)?;
        tracing::info!(pid = pgid, argv = ?self.argv, "workload started");
        Ok((pgid, exit_rx))
    }

    async fn wait(
        &self,
        pgid: i32,
        mut exit_rx: oneshot::Receiver<ProcessExit>,
        stop: &mut oneshot::Receiver<Duration>,
    ) -> Waited {
        let lost = ProcessExit::Signal(Signal::SIGKILL as i32);
        tokio::select! {
            exit = &mut exit_rx => Waited::Exited(exit.unwrap_or(lost)),
            grace = stop => {
                let grace = grace.unwrap_or(Duration::ZERO);
                let (gone_tx, gone_rx) = watch::channel(false);
                let kill = kill::escalate(Arc::clone(&self.ops), self.scope(pgid), Signal::SIGTERM, grace, gone_rx);
                let reaped = async {
                    let exit = exit_rx.await.unwrap_or(lost);
                    gone_tx.send_replace(true);
                    exit
                };
                let (exit, _) = tokio::join!(reaped, kill);
                Waited::Stopped(exit)
            }
        }
    }

    /// Everything a run started: its group, and processes that left it but
    /// carry the workload's marker (the next run does not exist yet).
    fn scope(&self, pgid: i32) -> Scope {
        Scope {
            leader: pgid,
            marker: format!("{WORKLOAD_MARKER_VAR}={}", self.marker_value),
        }
    }

    /// Ends what a run whose leader exited left running (background
    /// children, daemons that `setsid` away), as an interrupt does: SIGTERM,
    /// a short grace, then SIGKILL sweeps.
    async fn clear_leftovers(&self, pgid: i32) {
        let leader_gone = watch::channel(true).1;
        let scope = self.scope(pgid);
        let outcome = kill::escalate(
            Arc::clone(&self.ops),
            scope,
            Signal::SIGTERM,
            LEFTOVER_GRACE,
            leader_gone,
        )
        .await;
        if outcome.sweeps > 0 {
            tracing::info!(
                pgid,
                sweeps = outcome.sweeps,
                "killed what the workload's last run left"
            );
        }
        self.clear_strays().await;
    }

    /// Ends orphans of the agent that no command, session or run owns: a
    /// child that left both the run's session and its environment
    /// (`env -i setsid`) carries no marker, but it was re-parented to the
    /// agent and nobody registered it. Orphans of commands and sessions
    /// keep their markers and are spared; they end with their owners.
    async fn clear_strays(&self) {
        let strays = self.ops.strays(
            &self.reaper.registered(),
            &[EXEC_MARKER_VAR, SHELL_MARKER_VAR],
        );
        if strays.is_empty() {
            return;
        }
        tracing::info!(?strays, "ending orphans no command or session owns");
        let kills = strays.into_iter().map(|pid| {
            let scope = Scope {
                leader: pid,
                marker: String::new(),
            };
            kill::escalate(
                Arc::clone(&self.ops),
                scope,
                Signal::SIGTERM,
                LEFTOVER_GRACE,
                watch::channel(false).1,
            )
        });
        futures_util::future::join_all(kills).await;
    }

    fn set_current(&self, pgid: Option<i32>) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = pgid;
    }
}

enum Waited {
    Exited(ProcessExit),
    Stopped(ProcessExit),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_and_caps() {
        assert_eq!(restart_delay(0), Duration::from_millis(100));
        assert_eq!(restart_delay(1), Duration::from_millis(200));
        assert_eq!(restart_delay(5), Duration::from_millis(3200));
        assert_eq!(restart_delay(9), BACKOFF_MAX);
        assert_eq!(restart_delay(40), BACKOFF_MAX);
        assert_eq!(restart_delay(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn a_stable_run_resets_the_backoff() {
        let quick = Duration::from_millis(50);
        let mut failures = 0;
        for _ in 0..4 {
            failures = next_quick_failures(failures, quick);
        }
        assert_eq!(failures, 4);
        assert_eq!(next_quick_failures(failures, STABLE_RUN), 0);
        assert_eq!(next_quick_failures(u32::MAX, quick), u32::MAX);
    }

    #[test]
    fn policies_decide_restarts() {
        let ok = ProcessExit::Code(0);
        let failed = ProcessExit::Code(1);
        let killed = ProcessExit::Signal(9);
        assert!(restarts_after(RestartPolicy::Always, ok));
        assert!(!restarts_after(RestartPolicy::OnFailure, ok));
        assert!(restarts_after(RestartPolicy::OnFailure, failed));
        assert!(restarts_after(RestartPolicy::OnFailure, killed));
        assert!(!restarts_after(RestartPolicy::Never, killed));
    }

    #[tokio::test]
    async fn a_crashing_workload_is_restarted_and_stop_returns_its_status() {
        let dir = std::env::temp_dir().join(format!("silo-agent-wl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let count = dir.join("runs");
        let _ = std::fs::remove_file(&count);
        let script = format!("echo x >> {}; exit 3", count.display());
        let workload = Workload::start(
            vec!["/bin/sh".into(), "-c".into(), script],
            RestartPolicy::OnFailure,
            crate::reaper::test_reaper().clone(),
            Arc::new(crate::process::System::default()),
            "test",
        );
        // 100 ms + 200 ms of backoff: three runs fit comfortably in 2 s.
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let exit = workload.stop(Duration::from_millis(100)).await;
        let runs = std::fs::read_to_string(&count).unwrap().lines().count();
        assert!(runs >= 3, "only {runs} runs");
        assert_eq!(exit, Some(ProcessExit::Code(3)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
