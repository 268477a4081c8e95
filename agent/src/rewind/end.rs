//! Ending every process of the sandbox but the agent, as a new machine
//! would have none of them: what a rewind does after the workload, the
//! execs and the session shells have been stopped through their owners,
//! for whatever is left (daemons that left their session, `docker exec`
//! processes, orphans).
//!
//! The processes are those a snapshot's freeze would stop (its
//! [`FreezeScope`]: every process but the agent as PID 1, only the agent's
//! descendants as a machine agent; never what it inherited at its start,
//! the relays of its own output), found anew pass after pass, since a
//! process may fork while its siblings die, each sent SIGKILL through the
//! process seam. Zombies count as gone: they hold no file open and the
//! reaper collects them. A process that does not die within the bound (one
//! stuck in uninterruptible sleep) is counted, never waited for forever.

use std::collections::HashSet;
use std::io;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::{ProcessOps, own_pid};
use crate::snapshot::FreezeScope;
use crate::snapshot::freeze::{candidates, is_kernel_thread, is_pid1};

/// Longest a rewind waits for the sandbox's processes to be gone.
pub const END_WITHIN: Duration = Duration::from_secs(5);
/// First pause between passes: a SIGKILLed process is usually gone within
/// tens of microseconds.
const PASS_PAUSE_MIN: Duration = Duration::from_micros(50);
/// Longest pause between passes.
const PASS_PAUSE_MAX: Duration = Duration::from_millis(5);

/// What ending the sandbox's processes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ended {
    /// Processes sent SIGKILL.
    pub killed: usize,
    /// Processes still alive when the bound passed.
    pub left: usize,
}

/// Why the processes could not be ended.
#[derive(Debug, thiserror::Error)]
pub enum EndError {
    /// The agent is not PID 1, so "every process" would be the host's.
    #[error("the agent is not PID 1, so the processes around it are not the sandbox's")]
    NotPid1,
    /// `/proc` could not be listed.
    #[error("cannot list /proc")]
    Proc(#[source] io::Error),
}

/// SIGKILLs every process in `scope` but the agent until none is alive,
/// at most for `within` (blocking).
pub fn end_all(
    ops: &dyn ProcessOps,
    scope: FreezeScope,
    within: Duration,
) -> Result<Ended, EndError> {
    if scope == FreezeScope::Namespace && !is_pid1() {
        return Err(EndError::NotPid1);
    }
    let me = own_pid();
    let deadline = Instant::now() + within;
    let mut killed: HashSet<(i32, u64)> = HashSet::new();
    let mut pause = PASS_PAUSE_MIN;
    loop {
        let table = ops.table().map_err(EndError::Proc)?;
        let inherited = ops.inherited(&table);
        let alive: Vec<_> = candidates(&table, scope, me, &inherited)
            .into_iter()
            .filter(|(_, stat)| !stat.dead() && !is_kernel_thread(stat))
            .collect();
        if alive.is_empty() {
            return Ok(Ended {
                killed: killed.len(),
                left: 0,
            });
        }
        if Instant::now() >= deadline {
            return Ok(Ended {
                killed: killed.len(),
                left: alive.len(),
            });
        }
        for (pid, stat) in alive {
            ops.signal_pid(pid, Signal::SIGKILL);
            killed.insert((pid, stat.start));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(PASS_PAUSE_MAX);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::sync::Mutex;

    use super::*;
    use crate::process::{ProcStat, Scope};

    /// A process table where a SIGKILLed process turns into a zombie on
    /// the next listing, and one process never dies.
    struct Table {
        procs: Mutex<Vec<(i32, ProcStat)>>,
        immortal: i32,
        signalled: Mutex<Vec<i32>>,
        inherited: HashSet<i32>,
    }

    impl ProcessOps for Table {
        fn signal_group(&self, _pgid: i32, _signal: Signal) -> bool {
            false
        }
        fn signal_pid(&self, pid: i32, signal: Signal) {
            assert_eq!(signal, Signal::SIGKILL);
            self.signalled.lock().unwrap().push(pid);
            if pid != self.immortal {
                for (p, stat) in self.procs.lock().unwrap().iter_mut() {
                    if *p == pid {
                        stat.state = 'Z';
                    }
                }
            }
        }
        fn group_alive(&self, _pgid: i32) -> bool {
            false
        }
        fn process_ended(&self, _pid: i32) -> bool {
            true
        }
        fn members(&self, _scope: &Scope) -> Vec<i32> {
            Vec::new()
        }
        fn table(&self) -> io::Result<Vec<(i32, ProcStat)>> {
            Ok(self.procs.lock().unwrap().clone())
        }
        fn inherited(&self, _table: &[(i32, ProcStat)]) -> HashSet<i32> {
            self.inherited.clone()
        }
    }

    fn proc(ppid: i32) -> ProcStat {
        ProcStat {
            state: 'S',
            ppid,
            session: 0,
            flags: 0,
            start: 7,
        }
    }

    #[test]
    fn a_machine_agent_ends_its_descendants_and_counts_what_will_not_die() {
        let me = i32::try_from(std::process::id()).unwrap();
        // The agent's command (70) and its child (71); the machine's own
        // daemon (90) is not the agent's and is left alone.
        let table = Table {
            procs: Mutex::new(vec![
                (me, proc(1)),
                (70, proc(me)),
                (71, proc(70)),
                (90, proc(1)),
            ]),
            immortal: 0,
            signalled: Mutex::default(),
            inherited: HashSet::new(),
        };
        let ended = end_all(&table, FreezeScope::Descendants, END_WITHIN).unwrap();
        assert_eq!(ended, Ended { killed: 2, left: 0 });
        let mut signalled = table.signalled.lock().unwrap().clone();
        signalled.sort_unstable();
        assert_eq!(signalled, [70, 71]);

        let stuck = Table {
            procs: Mutex::new(vec![(me, proc(1)), (70, proc(me))]),
            immortal: 70,
            signalled: Mutex::default(),
            inherited: HashSet::new(),
        };
        let ended = end_all(&stuck, FreezeScope::Descendants, Duration::from_millis(20)).unwrap();
        assert_eq!(ended, Ended { killed: 1, left: 1 });
    }

    #[test]
    fn what_the_agent_inherited_at_its_start_is_never_ended() {
        let me = i32::try_from(std::process::id()).unwrap();
        // The relays of the agent's output (61, 62) were its children at
        // its start; its command (70) is the sandbox's.
        let table = Table {
            procs: Mutex::new(vec![
                (me, proc(1)),
                (61, proc(me)),
                (62, proc(me)),
                (70, proc(me)),
            ]),
            immortal: 0,
            signalled: Mutex::default(),
            inherited: HashSet::from([61, 62]),
        };
        let ended = end_all(&table, FreezeScope::Descendants, END_WITHIN).unwrap();
        assert_eq!(ended, Ended { killed: 1, left: 0 });
        assert_eq!(*table.signalled.lock().unwrap(), [70]);
    }

    #[test]
    fn outside_pid_1_every_process_is_never_the_sandbox_s() {
        let table = Table {
            procs: Mutex::new(vec![(4242, proc(1))]),
            immortal: 0,
            signalled: Mutex::default(),
            inherited: HashSet::new(),
        };
        assert!(matches!(
            end_all(&table, FreezeScope::Namespace, END_WITHIN),
            Err(EndError::NotPid1)
        ));
        assert!(table.signalled.lock().unwrap().is_empty());
    }
}
