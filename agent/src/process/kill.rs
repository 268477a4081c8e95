//! Stopping a command and everything it started: signal, grace, SIGKILL sweep.
//!
//! A first signal (SIGINT for an interrupt or timeout, SIGTERM at shutdown)
//! goes to the command's process group. If the group empties during the grace,
//! the wait ends at once (an interrupted `sleep 100` must not cost the whole
//! grace). Then sweeps run until nothing is left: each finds the command's
//! processes (its session, carriers of its environment marker, and their
//! descendants: see [`ProcessOps::members`]) and SIGKILLs them along with the
//! group. Sweeps repeat because a process may fork while being killed; they
//! are bounded so a process the agent cannot kill never wedges the caller.
//!
//! The exec registry, the session shells and the workload supervisor all use
//! this, so the same escalation applies to an interrupt, a timeout, a detach
//! timeout, a workload run's leftovers and shutdown.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use super::{ProcessOps, Scope};

/// How often an emptied group is looked for during the grace, besides the
/// wake-up when the leader is reaped.
const GROUP_POLL: Duration = Duration::from_millis(5);
/// Most SIGKILL sweeps before giving up on survivors.
const MAX_SWEEPS: u32 = 40;
/// Pause between sweeps, for killed processes to die and forks to show up.
const SWEEP_PAUSE: Duration = Duration::from_millis(5);

/// What an escalation achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillOutcome {
    /// SIGKILL sweeps that found something to kill.
    pub sweeps: u32,
    /// Processes still found after the last sweep (0 when clean).
    pub survivors: usize,
}

/// Sends `first` to the group, waits up to `grace` for it to empty, then
/// SIGKILLs everything in `scope` until nothing is left.
///
/// `leader_gone` turns true when the leader has been reaped; it only serves to
/// notice an emptied group sooner than the poll would.
pub async fn escalate(
    ops: Arc<dyn ProcessOps>,
    scope: Scope,
    first: Signal,
    grace: Duration,
    mut leader_gone: watch::Receiver<bool>,
) -> KillOutcome {
    let pgid = scope.leader;
    ops.signal_group(pgid, first);
    if !grace.is_zero() {
        let deadline = Instant::now() + grace;
        let mut watching = true;
        while ops.group_alive(pgid) {
            tokio::select! {
                () = sleep_until(deadline) => break,
                () = sleep(GROUP_POLL) => {}
                changed = leader_gone.changed(), if watching => watching = changed.is_ok(),
            }
        }
    }
    sweep(ops, scope).await
}

async fn sweep(ops: Arc<dyn ProcessOps>, scope: Scope) -> KillOutcome {
    let mut sweeps = 0;
    let mut survivors = 0;
    for _ in 0..MAX_SWEEPS {
        // Find before killing: once the leader dies its children are
        // re-parented and the parent links that lead to them are gone.
        let found = find(&ops, &scope).await;
        let group = ops.signal_group(scope.leader, Signal::SIGKILL);
        if found.is_empty() && !group {
            survivors = 0;
            break;
        }
        sweeps += 1;
        survivors = found.len();
        for pid in found {
            ops.signal_pid(pid, Signal::SIGKILL);
        }
        sleep(SWEEP_PAUSE).await;
    }
    if survivors > 0 {
        tracing::warn!(
            leader = scope.leader,
            survivors,
            "processes survived SIGKILL sweeps"
        );
    }
    KillOutcome { sweeps, survivors }
}

/// Walks `/proc` off the async thread: it reads a file or two per process.
async fn find(ops: &Arc<dyn ProcessOps>, scope: &Scope) -> Vec<i32> {
    let ops = Arc::clone(ops);
    let scope = scope.clone();
    tokio::task::spawn_blocking(move || ops.members(&scope))
        .await
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::process::Command;
    use std::sync::Mutex;

    use crate::process::{System, new_session};
    use crate::reaper::test_reaper;

    /// Records what it is asked to do and answers from scripts.
    #[derive(Default)]
    struct Fake {
        log: Mutex<Vec<String>>,
        /// Answers to `group_alive`, then "empty" once exhausted.
        alive: Mutex<VecDeque<bool>>,
        /// Answers to `members`, then "none" once exhausted.
        members: Mutex<VecDeque<Vec<i32>>>,
        /// Answer to `signal_group` with SIGKILL.
        group_has_members: Mutex<VecDeque<bool>>,
    }

    impl ProcessOps for Fake {
        fn signal_group(&self, pgid: i32, signal: Signal) -> bool {
            self.log
                .lock()
                .unwrap()
                .push(format!("group {pgid} {signal}"));
            if signal == Signal::SIGKILL {
                self.group_has_members
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or(false)
            } else {
                true
            }
        }
        fn signal_pid(&self, pid: i32, signal: Signal) {
            self.log.lock().unwrap().push(format!("pid {pid} {signal}"));
        }
        fn group_alive(&self, _pgid: i32) -> bool {
            self.alive.lock().unwrap().pop_front().unwrap_or(false)
        }
        fn process_ended(&self, _pid: i32) -> bool {
            false
        }
        fn members(&self, _scope: &Scope) -> Vec<i32> {
            self.members.lock().unwrap().pop_front().unwrap_or_default()
        }
    }

    fn scope() -> Scope {
        Scope {
            leader: 100,
            marker: "SILO_EXEC_ID=1".into(),
        }
    }

    #[tokio::test]
    async fn zero_grace_goes_straight_to_sigkill_and_sweeps_escapees() {
        let fake = Arc::new(Fake::default());
        fake.members
            .lock()
            .unwrap()
            .extend([vec![100, 200], vec![200]]);
        fake.group_has_members.lock().unwrap().extend([true]);
        let (_tx, rx) = watch::channel(false);
        let out = escalate(fake.clone(), scope(), Signal::SIGINT, Duration::ZERO, rx).await;
        assert_eq!(
            out,
            KillOutcome {
                sweeps: 2,
                survivors: 0
            }
        );
        assert_eq!(
            *fake.log.lock().unwrap(),
            [
                "group 100 SIGINT",
                "group 100 SIGKILL",
                "pid 100 SIGKILL",
                "pid 200 SIGKILL",
                "group 100 SIGKILL",
                "pid 200 SIGKILL",
                "group 100 SIGKILL",
            ]
        );
    }

    #[tokio::test]
    async fn an_emptied_group_ends_the_grace_early() {
        let fake = Arc::new(Fake::default());
        fake.alive.lock().unwrap().extend([true, false]);
        let (tx, rx) = watch::channel(false);
        let started = std::time::Instant::now();
        let wake = tokio::spawn(async move {
            sleep(Duration::from_millis(2)).await;
            tx.send(true).unwrap();
            tx
        });
        let out = escalate(
            fake.clone(),
            scope(),
            Signal::SIGINT,
            Duration::from_secs(30),
            rx,
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            out,
            KillOutcome {
                sweeps: 0,
                survivors: 0
            }
        );
        drop(wake.await);
    }

    #[tokio::test]
    async fn a_group_that_ignores_the_first_signal_waits_out_the_grace() {
        let fake = Arc::new(Fake::default());
        fake.alive.lock().unwrap().extend([true; 1000]);
        let (_tx, rx) = watch::channel(false);
        let started = std::time::Instant::now();
        escalate(
            fake.clone(),
            scope(),
            Signal::SIGINT,
            Duration::from_millis(60),
            rx,
        )
        .await;
        assert!(started.elapsed() >= Duration::from_millis(60));
        assert!(
            fake.log
                .lock()
                .unwrap()
                .contains(&"group 100 SIGKILL".to_string())
        );
    }

    #[tokio::test]
    async fn unkillable_processes_end_after_bounded_sweeps() {
        let fake = Arc::new(Fake::default());
        fake.members
            .lock()
            .unwrap()
            .extend(std::iter::repeat_n(vec![300], 1000));
        let (_tx, rx) = watch::channel(false);
        let out = escalate(fake, scope(), Signal::SIGINT, Duration::ZERO, rx).await;
        assert_eq!(
            out,
            KillOutcome {
                sweeps: MAX_SWEEPS,
                survivors: 1
            }
        );
    }

    #[tokio::test]
    async fn a_setsid_grandchild_is_killed_too() {
        let mut marker_bytes = [0u8; 8];
        getrandom::fill(&mut marker_bytes).unwrap();
        let marker_value = hex::encode(marker_bytes);
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("setsid sleep 100 & sleep 100")
            .env("SILO_EXEC_ID", &marker_value);
        new_session(&mut cmd);
        let (child, exit_rx) = test_reaper().spawn(&mut cmd).unwrap();
        let scope = Scope {
            leader: child.id() as i32,
            marker: format!("SILO_EXEC_ID={marker_value}"),
        };
        let ops: Arc<dyn ProcessOps> = Arc::new(System::default());
        // Wait until the escapee has left the session, so the test proves it is found.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let members = ops.members(&scope);
            let escaped = members
                .iter()
                .any(|&pid| read_session(pid).is_some_and(|session| session != scope.leader));
            if members.len() >= 3 && escaped {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "children never appeared"
            );
            sleep(Duration::from_millis(10)).await;
        }

        let (gone_tx, gone_rx) = watch::channel(false);
        let reaped = tokio::spawn(async move {
            let exit = exit_rx.await.unwrap();
            gone_tx.send(true).unwrap();
            exit
        });
        let out = escalate(
            ops.clone(),
            scope.clone(),
            Signal::SIGINT,
            Duration::from_millis(200),
            gone_rx,
        )
        .await;
        assert_eq!(out.survivors, 0);
        assert!(ops.members(&scope).is_empty(), "{:?}", ops.members(&scope));
        let exit = tokio::time::timeout(Duration::from_secs(10), reaped)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(exit, crate::reaper::ProcessExit::Signal(_)),
            "{exit:?}"
        );
    }

    fn read_session(pid: i32) -> Option<i32> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &text[text.rfind(')')? + 1..];
        rest.split_ascii_whitespace().nth(3)?.parse().ok()
    }
}
