//! Stopping the sandbox's processes while a snapshot reads, and continuing
//! exactly those afterwards.
//!
//! [`freeze`] sends SIGSTOP to every process but the agent, pass after pass
//! over `/proc` until a pass finds nobody new (a process may fork between
//! the listing and its signal), then waits, bounded by [`SETTLE_TIMEOUT`],
//! until each is really stopped, so no write is half done. Processes someone
//! else stopped, zombies and kernel threads are left alone. The [`Frozen`]
//! it returns continues what it stopped when dropped (so on every path,
//! panics included), children before parents, so a job-control shell never
//! sees its child stopped, and only a process whose start time still matches
//! (a pid reused since is someone else's).
//!
//! What "every process" means is the [`FreezeScope`]: as PID 1 the agent
//! owns its pid namespace, so every process in it is the sandbox's; as a
//! machine's agent that is not PID 1 (`--machine-agent`: a provider VM,
//! whose init and daemons run beside it) only the processes descended from
//! the agent are, its commands and their orphans, which re-parent to it as
//! the child subreaper. Anywhere else there is no scope and no freeze: it
//! would stop the host's processes. In either scope, what the agent
//! inherited at its start (`process::inherited`: the relays of its own
//! output) is never stopped.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::process::{ProcStat, ProcessOps, own_pid, read_stat, with_descendants};

/// Longest wait for signalled processes to reach the stopped state.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);
/// First pause between looks at the processes that have not stopped yet:
/// a stop usually lands within tens of microseconds, so the pause starts
/// short and doubles up to [`SETTLE_POLL_MAX`], which keeps a snapshot of
/// a quiet sandbox from paying a whole long pause.
const SETTLE_POLL_MIN: Duration = Duration::from_micros(50);
/// Longest pause between looks.
const SETTLE_POLL_MAX: Duration = Duration::from_millis(5);
/// Most passes over `/proc`; each pass only stops processes forked during
/// the previous one, so this is only reached by something pathological.
const MAX_PASSES: usize = 64;
/// `PF_KTHREAD` in the `flags` field: kernel threads ignore SIGSTOP.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Which processes a freeze stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeScope {
    /// Every process in the pid namespace but the agent: the agent is PID 1.
    Namespace,
    /// The agent's descendants only: it runs beside a machine's own init
    /// and daemons, which must never be stopped.
    Descendants,
}

impl FreezeScope {
    /// The scope of an agent that is PID 1 or not, and was started as the
    /// machine's agent or not; `None` when it may stop nothing.
    pub fn of_agent(is_pid1: bool, machine_agent: bool) -> Option<Self> {
        match (is_pid1, machine_agent) {
            (true, _) => Some(Self::Namespace),
            (false, true) => Some(Self::Descendants),
            (false, false) => None,
        }
    }
}

/// Whether this agent is PID 1, which [`FreezeScope::Namespace`] requires.
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// Stopped, traced, zombie or dead: nothing it does can change a file.
fn settled(stat: &ProcStat) -> bool {
    matches!(stat.state, 'T' | 't') || stat.dead()
}

/// Whether the freeze should stop it: not stopped by someone else (which
/// must not be continued later), not a zombie, not a kernel thread.
fn wants_stop(stat: &ProcStat) -> bool {
    !settled(stat) && !is_kernel_thread(stat)
}

/// Kernel threads ignore signals and are no sandbox's.
pub(crate) fn is_kernel_thread(stat: &ProcStat) -> bool {
    stat.flags & PF_KTHREAD != 0
}

/// One process the freeze stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Its pid.
    pub pid: i32,
    /// Its start time when it was stopped.
    pub start: u64,
}

/// The processes a freeze stopped; continued when dropped.
#[derive(Debug, Default)]
pub struct Frozen {
    stopped: Vec<Stopped>,
    /// pid → parent of every process seen, for the thaw's order.
    parents: HashMap<i32, i32>,
    /// Stopped processes that had not reached the stopped state in time.
    pub unsettled: usize,
}

impl Frozen {
    /// How many processes were stopped.
    pub fn count(&self) -> usize {
        self.stopped.len()
    }

    /// Continues every stopped process that is still the one we stopped,
    /// deepest first.
    pub fn thaw(&mut self) {
        for stopped in thaw_order(&self.stopped, &self.parents) {
            let same = read_stat(stopped.pid).is_some_and(|stat| stat.start == stopped.start);
            if same && signal_allowed(stopped.pid) {
                // ESRCH: it died meanwhile; nothing else can be done about others.
                let _ = kill(Pid::from_raw(stopped.pid), Signal::SIGCONT);
            }
        }
        self.stopped.clear();
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.thaw();
    }
}

/// Why processes could not be stopped.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    /// The agent is not PID 1, so the processes around it are not the sandbox's.
    #[error("the agent is not PID 1")]
    NotPid1,
    /// `/proc` could not be listed.
    #[error("cannot list /proc")]
    Proc(#[source] io::Error),
}

/// Stops every process of the sandbox in `scope` but the agent (blocking:
/// up to [`SETTLE_TIMEOUT`]), listing them through `ops`. Whatever was
/// stopped is continued if this fails.
pub fn freeze(ops: &dyn ProcessOps, scope: FreezeScope) -> Result<Frozen, FreezeError> {
    if scope == FreezeScope::Namespace && !is_pid1() {
        return Err(FreezeError::NotPid1);
    }
    let me = own_pid();
    // Built first, so an error or a panic below still thaws what was stopped.
    let mut frozen = Frozen::default();
    let mut ours: HashSet<i32> = HashSet::new();
    for _ in 0..MAX_PASSES {
        let mut stopped_now = 0usize;
        let table = ops.table().map_err(FreezeError::Proc)?;
        let inherited = ops.inherited(&table);
        for (pid, stat) in candidates(&table, scope, me, &inherited) {
            frozen.parents.insert(pid, stat.ppid);
            if ours.contains(&pid) || !wants_stop(&stat) {
                continue;
            }
            match kill(Pid::from_raw(pid), Signal::SIGSTOP) {
                Ok(()) => {
                    ours.insert(pid);
                    frozen.stopped.push(Stopped {
                        pid,
                        start: stat.start,
                    });
                    stopped_now += 1;
                }
                Err(Errno::ESRCH) => {}
                Err(err) => tracing::warn!(pid, %err, "cannot stop a process for a snapshot"),
            }
        }
        if stopped_now == 0 {
            break;
        }
    }
    frozen.unsettled = settle(&frozen.stopped, SETTLE_TIMEOUT);
    Ok(frozen)
}

/// The processes of `table` that `scope` lets a freeze by agent `me` stop:
/// never the agent, init, the "every process" pids or what the agent
/// `inherited` at its start (the relays of its own output); with
/// [`FreezeScope::Descendants`], only those descended from the agent.
pub(crate) fn candidates(
    table: &[(i32, ProcStat)],
    scope: FreezeScope,
    me: i32,
    inherited: &HashSet<i32>,
) -> Vec<(i32, ProcStat)> {
    let ours = match scope {
        FreezeScope::Namespace => None,
        FreezeScope::Descendants => Some(with_descendants(table, HashSet::from([me]))),
    };
    table
        .iter()
        .filter(|(pid, _)| *pid != me && signal_allowed(*pid) && !inherited.contains(pid))
        .filter(|(pid, _)| ours.as_ref().is_none_or(|ours| ours.contains(pid)))
        .copied()
        .collect()
}

/// Waits until every process in `stopped` is stopped or gone, at most
/// `timeout`; answers how many were still not.
fn settle(stopped: &[Stopped], timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<i32> = stopped.iter().map(|s| s.pid).collect();
    let mut pause = SETTLE_POLL_MIN;
    loop {
        pending.retain(|&pid| read_stat(pid).is_some_and(|stat| !settled(&stat)));
        if pending.is_empty() || Instant::now() >= deadline {
            return pending.len();
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(SETTLE_POLL_MAX);
    }
}

/// Never the agent itself, init, or the "every process" pids.
fn signal_allowed(pid: i32) -> bool {
    pid > 1 && u32::try_from(pid).is_ok_and(|pid| pid != std::process::id())
}

/// The order to continue `stopped` in: deepest in the process tree first
/// (children before their parents), depth counted through `parents`.
pub fn thaw_order(stopped: &[Stopped], parents: &HashMap<i32, i32>) -> Vec<Stopped> {
    let depth = |pid: i32| {
        let mut depth = 0usize;
        let mut at = pid;
        // Bounded by the map's size, so a cycle (a pid reused mid-scan) ends.
        while let Some(&parent) = parents.get(&at) {
            if depth > parents.len() {
                break;
            }
            depth += 1;
            at = parent;
        }
        depth
    };
    let mut ordered: Vec<(usize, Stopped)> = stopped.iter().map(|s| (depth(s.pid), *s)).collect();
    ordered.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.pid.cmp(&a.1.pid)));
    ordered.into_iter().map(|(_, s)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_running_user_processes_are_stopped() {
        let stat = |line: &str| crate::process::parse_stat(line).unwrap();
        let stopped = stat("9 (x) T 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5");
        assert!(settled(&stopped) && !wants_stop(&stopped));
        assert!(!wants_stop(&stat(
            "9 (x) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5"
        )));
        assert!(!wants_stop(&stat(
            "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 3"
        )));
        assert!(wants_stop(&stat(
            "42 (a) b (c) S 7 42 40 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 98765 1 2 3"
        )));
    }

    #[test]
    fn own_stat_reads_and_the_agent_is_never_signalled() {
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(read_stat(me).is_some_and(|stat| wants_stop(&stat)));
        assert!(!signal_allowed(me));
        assert!(!signal_allowed(1));
        assert!(!signal_allowed(0));
        assert!(!signal_allowed(-1));
        // Tests never run as PID 1: the freeze must refuse, not stop the host.
        assert!(matches!(
            freeze(&crate::process::System::default(), FreezeScope::Namespace),
            Err(FreezeError::NotPid1)
        ));
    }

    /// A process table to choose from; nothing else is asked of it.
    struct Table(Vec<(i32, ProcStat)>);

    impl ProcessOps for Table {
        fn signal_group(&self, _pgid: i32, _signal: Signal) -> bool {
            false
        }
        fn signal_pid(&self, _pid: i32, _signal: Signal) {}
        fn group_alive(&self, _pgid: i32) -> bool {
            false
        }
        fn process_ended(&self, _pid: i32) -> bool {
            true
        }
        fn members(&self, _scope: &crate::process::Scope) -> Vec<i32> {
            Vec::new()
        }
        fn table(&self) -> io::Result<Vec<(i32, ProcStat)>> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn a_machine_agent_freezes_its_descendants_only() {
        let proc = |ppid| ProcStat {
            state: 'S',
            ppid,
            session: 0,
            flags: 0,
            start: 0,
        };
        // A provider VM: init (1) runs the provider's daemon (50), which
        // started the agent (60) and something of its own (90). The agent's
        // command (70) has a child (71) listed before it, and an orphan (80)
        // of another command was re-parented to the agent, its subreaper.
        let ops = Table(vec![
            (1, proc(0)),
            (2, proc(0)),
            (50, proc(1)),
            (71, proc(70)),
            (60, proc(50)),
            (70, proc(60)),
            (80, proc(60)),
            (90, proc(50)),
            (100, proc(1)),
            (101, proc(100)),
        ]);
        let table = ops.table().unwrap();
        let pids = |scope| -> Vec<i32> {
            let mut pids: Vec<i32> = candidates(&table, scope, 60, &HashSet::new())
                .into_iter()
                .map(|(pid, _)| pid)
                .collect();
            pids.sort_unstable();
            pids
        };
        assert_eq!(pids(FreezeScope::Descendants), [70, 71, 80]);
        // As PID 1 everything but init and the agent is the sandbox's
        // (kernel threads are left out later, by their flags).
        assert_eq!(
            pids(FreezeScope::Namespace),
            [2, 50, 70, 71, 80, 90, 100, 101]
        );
        assert_eq!(FreezeScope::of_agent(false, false), None);
        assert_eq!(
            FreezeScope::of_agent(false, true),
            Some(FreezeScope::Descendants)
        );
        assert_eq!(
            FreezeScope::of_agent(true, false),
            Some(FreezeScope::Namespace)
        );
    }

    #[test]
    fn thaw_goes_deepest_first() {
        // 1 → 10 (shell) → 11 (job) → 12 (its child); 20 → 21 elsewhere.
        let parents: HashMap<i32, i32> = [(10, 1), (11, 10), (12, 11), (20, 1), (21, 20)]
            .into_iter()
            .collect();
        let stopped: Vec<Stopped> = [10, 20, 11, 21, 12]
            .into_iter()
            .map(|pid| Stopped { pid, start: 0 })
            .collect();
        let order: Vec<i32> = thaw_order(&stopped, &parents)
            .into_iter()
            .map(|s| s.pid)
            .collect();
        assert_eq!(order, vec![12, 21, 11, 20, 10]);
        // A cycle in a racy scan still ends.
        let cyclic: HashMap<i32, i32> = [(5, 6), (6, 5)].into_iter().collect();
        let pair = [Stopped { pid: 5, start: 0 }, Stopped { pid: 6, start: 0 }];
        assert_eq!(thaw_order(&pair, &cyclic).len(), 2);
    }
}
