//! The one owner of `waitpid(-1)`.
//!
//! As PID 1 (or a child subreaper) the agent inherits every orphan in the
//! sandbox, so something must reap them; and the status of each process the
//! agent started must reach whoever waits for it. If two parties waited on
//! children (say this loop and tokio's own child handling) either could steal
//! the other's status. So nothing else in the agent waits on children:
//! processes are started through [`Reaper::spawn`] (or
//! [`Reaper::spawn_with`]), which starts the child and registers its pid
//! while holding the lock that [`Reaper::reap`] takes before each
//! `waitpid`. A child therefore cannot be reaped before it is registered, and
//! its pid cannot be handed to a new process while its status is undelivered
//! (a zombie keeps its pid). Statuses nobody registered (orphans) are reaped
//! and dropped.

use std::collections::{HashMap, HashSet};
use std::io;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::signal::unix::Signal;
use tokio::sync::oneshot;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessExit {
    /// It called `exit` with this code.
    Code(i32),
    /// This signal killed it.
    Signal(i32),
}

impl ProcessExit {
    /// The shell convention: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            Self::Code(code) => code,
            Self::Signal(signal) => 128 + signal,
        }
    }

    /// Exited with code 0.
    pub fn success(self) -> bool {
        self == Self::Code(0)
    }
}

type Waiters = HashMap<i32, oneshot::Sender<ProcessExit>>;

/// Spawns registered children and reaps every child. Cheap to clone.
#[derive(Clone, Default)]
pub struct Reaper {
    /// pid → where its status goes. Held across fork and across `waitpid`.
    waiters: Arc<Mutex<Waiters>>,
}

impl Reaper {
    /// Spawns `cmd` and registers its pid; the receiver gets its status once reaped.
    ///
    /// The caller must not wait on the returned [`Child`]; dropping it is fine.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<(Child, oneshot::Receiver<ProcessExit>)> {
        self.spawn_with(|| cmd.spawn(), Child::id)
    }

    /// Runs `start`, which starts one child, and registers the pid `pid_of`
    /// reads from what it returns; the receiver gets the child's status.
    /// For children started without `Command` (see
    /// [`crate::process::spawn`]).
    pub fn spawn_with<T>(
        &self,
        start: impl FnOnce() -> io::Result<T>,
        pid_of: impl FnOnce(&T) -> u32,
    ) -> io::Result<(T, oneshot::Receiver<ProcessExit>)> {
        let mut waiters = self.lock();
        // std and the libcs' posix_spawn wait on the child themselves when
        // exec fails; holding the lock keeps `reap` from racing that wait.
        let child = start()?;
        let (tx, rx) = oneshot::channel();
        let pid = pid_of(&child);
        crate::reserve::yield_to_oom_killer(pid);
        let pid = i32::try_from(pid)
            .map_err(|_| io::Error::other("kernel returned a pid that does not fit in pid_t"))?;
        if waiters.insert(pid, tx).is_some() {
            tracing::warn!(pid, "pid registered twice; the older waiter is dropped");
        }
        Ok((child, rx))
    }

    /// Pids of the children someone is waiting for: every live command,
    /// session shell and workload run the agent started itself.
    pub fn registered(&self) -> HashSet<i32> {
        self.lock().keys().copied().collect()
    }

    /// Reaps every child that has exited, delivering registered statuses.
    /// Returns how many children were reaped.
    pub fn reap(&self) -> usize {
        let mut waiters = self.lock();
        let mut reaped = 0;
        loop {
            let mut status: libc::c_int = 0;
            // Not nix's waitpid: its WaitStatus cannot hold a real-time
            // signal, so a child killed by one would be reaped and its status
            // lost to an EINVAL. The raw status is decoded below instead.
            // SAFETY: waitpid only writes through the pointer we pass, which
            // points at a live local.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid == 0 {
                break;
            }
            if pid < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => break,
                    _ => {
                        tracing::warn!(error = %io::Error::last_os_error(), "waitpid failed");
                        break;
                    }
                }
            }
            let exit = if libc::WIFEXITED(status) {
                ProcessExit::Code(libc::WEXITSTATUS(status))
            } else if libc::WIFSIGNALED(status) {
                ProcessExit::Signal(libc::WTERMSIG(status))
            } else {
                // Stops and continues are only reported with flags we never pass.
                continue;
            };
            reaped += 1;
            match waiters.remove(&pid) {
                // The waiter may have given up (its receiver dropped); nothing to do then.
                Some(tx) => drop(tx.send(exit)),
                None => tracing::debug!(pid, ?exit, "reaped an orphan"),
            }
        }
        reaped
    }

    /// Reaps whenever SIGCHLD arrives, until the signal stream ends.
    ///
    /// `sigchld` must be created before the first child is spawned; the first
    /// pass below catches anything that exited before this task first ran.
    pub async fn run(self, mut sigchld: Signal) {
        loop {
            self.reap();
            if sigchld.recv().await.is_none() {
                break;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One reaper for a whole test binary. Tests are threads of one process, so
/// two reapers would steal each other's children; every test that starts a
/// process goes through this one.
#[cfg(test)]
pub fn test_reaper() -> &'static Reaper {
    use std::sync::OnceLock;
    static REAPER: OnceLock<Reaper> = OnceLock::new();
    REAPER.get_or_init(|| {
        // Orphans of test commands come to this process, as they would to the agent.
        nix::sys::prctl::set_child_subreaper(true).expect("set subreaper");
        let reaper = Reaper::default();
        let looped = reaper.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("reaper runtime");
            rt.block_on(async move {
                let sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
                    .expect("sigchld");
                ready_tx.send(()).expect("ready");
                looped.run(sigchld).await;
            });
        });
        ready_rx.recv().expect("reaper thread started");
        reaper
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script);
        cmd
    }

    #[tokio::test]
    async fn registered_child_gets_its_own_status() {
        let reaper = test_reaper();
        let (_child, rx) = reaper.spawn(&mut sh("exit 3")).unwrap();
        let exit = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(exit, ProcessExit::Code(3));

        let (child, rx) = reaper.spawn(&mut sh("sleep 10")).unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        let exit = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(exit, ProcessExit::Signal(9));
        assert_eq!(exit.shell_code(), 137);
    }

    #[tokio::test]
    async fn orphan_statuses_are_dropped_without_stealing_registered_ones() {
        let reaper = test_reaper();
        // The subshells outlive their parent and are re-parented to us
        // (subreaper); their statuses have no waiter. A registered child that
        // exits after them must still get its own status.
        let (_parent, parent_rx) = reaper
            .spawn(&mut sh(
                "for i in 1 2 3 4 5; do (sleep 0.05; exit 7) & done; exit 4",
            ))
            .unwrap();
        let (_late, late_rx) = reaper.spawn(&mut sh("sleep 0.3; exit 5")).unwrap();
        let parent = tokio::time::timeout(Duration::from_secs(10), parent_rx)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(parent, ProcessExit::Code(4));
        let exit = tokio::time::timeout(Duration::from_secs(10), late_rx)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(exit, ProcessExit::Code(5));
    }

    #[tokio::test]
    async fn failed_exec_is_an_error_not_a_stolen_status() {
        let reaper = test_reaper();
        let err = reaper
            .spawn(&mut Command::new("/nonexistent/silo-test-binary"))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
