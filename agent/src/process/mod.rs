//! The seam between process-control decisions and the kernel.
//!
//! Kill escalation (`kill`) decides what to signal and when; [`ProcessOps`]
//! sends the signals and walks `/proc` to find the processes that belong to
//! a command (and lists them all for a snapshot's freeze, which picks its
//! own). Keeping the kernel behind that trait lets the escalation be
//! tested with a recording fake, and keeps every signal the agent sends in
//! one place, behind guards that refuse to signal the agent itself or pid 0/1.
//! Execs, session shells and the workload all stop their processes through
//! [`kill::escalate`], so one escalation serves interrupts, timeouts, detach
//! timeouts, leftover cleanup and shutdown alike. Plain execs start through
//! [`spawn`] (`posix_spawn`, no fork of the agent); PTY execs, session shells
//! and the workload through `Command` with [`new_session`]. What a
//! machine's agent found running below it at its start ([`Inherited`]) is
//! spared by the freeze, the rewind's ending and the stray sweep alike.

pub mod inherited;
pub mod kill;
pub mod spawn;

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::{self, Signal, killpg};
use nix::unistd::{Pid, getpgrp, setsid};

pub use inherited::Inherited;

/// What belongs to one command: its session (led by `leader`, which is also
/// its process group id) and every process whose environment carries `marker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Pid of the command's first process; its session and group id. 0 when
    /// the command has no session of its own (a run in a session's shell,
    /// which shares the shell's): then only the marker finds its processes.
    pub leader: i32,
    /// An exact `NAME=value` environment entry that every process of the
    /// command inherits, so descendants that left the session with their own
    /// `setsid` can still be found. Empty to find by session alone.
    pub marker: String,
}

/// Signalling and discovery of processes.
pub trait ProcessOps: Send + Sync + 'static {
    /// Sends `signal` to process group `pgid`. False when the group has no members.
    fn signal_group(&self, pgid: i32, signal: Signal) -> bool;
    /// Sends `signal` to one process.
    fn signal_pid(&self, pid: i32, signal: Signal);
    /// Whether process group `pgid` still has members.
    fn group_alive(&self, pgid: i32) -> bool;
    /// Whether `pid` has exited, reaped or not: the kernel knows before the
    /// reaper has delivered its status.
    fn process_ended(&self, pid: i32) -> bool;
    /// Live (not zombie) processes in `scope`: the leader's session, carriers
    /// of the marker, and all their descendants.
    fn members(&self, scope: &Scope) -> Vec<i32>;
    /// Children of the agent it did not start itself (not in `registered`)
    /// and that carry none of the `spared` variables: orphans re-parented to
    /// the agent that left both their session and their environment, which
    /// only their parentage still gives away.
    fn strays(&self, _registered: &HashSet<i32>, _spared: &[&str]) -> Vec<i32> {
        Vec::new()
    }
    /// The pids of `table` that are not the sandbox's though they run
    /// below the agent: what it inherited at its start and their
    /// descendants ([`Inherited`]). Nothing may signal them.
    fn inherited(&self, _table: &[(i32, ProcStat)]) -> HashSet<i32> {
        HashSet::new()
    }
    /// Every process of this pid namespace that can be read, with its stat
    /// (the agent's own included): what a snapshot's freeze chooses from.
    fn table(&self) -> io::Result<Vec<(i32, ProcStat)>> {
        Ok(live_pids()?
            .into_iter()
            .filter_map(|pid| Some((pid, read_stat(pid)?)))
            .collect())
    }
}

/// The real kernel, with what the agent inherited at its start.
#[derive(Debug, Default)]
pub struct System {
    inherited: Inherited,
}

impl System {
    /// The kernel of an agent that inherited `inherited` at its start.
    pub fn inheriting(inherited: Inherited) -> Self {
        Self { inherited }
    }

    /// Refuses targets that would hit the agent itself, init or everyone.
    fn allowed(target: i32) -> bool {
        target > 1 && target != own_pid() && target != getpgrp().as_raw()
    }
}

impl ProcessOps for System {
    fn signal_group(&self, pgid: i32, signal: Signal) -> bool {
        if !Self::allowed(pgid) {
            return false;
        }
        match killpg(Pid::from_raw(pgid), signal) {
            Ok(()) => true,
            Err(Errno::ESRCH) => false,
            Err(err) => {
                tracing::debug!(pgid, %err, "cannot signal process group");
                true
            }
        }
    }

    fn signal_pid(&self, pid: i32, signal: Signal) {
        if Self::allowed(pid) {
            // ESRCH means it died on its own; nothing else can be done about EPERM.
            let _ = signal::kill(Pid::from_raw(pid), signal);
        }
    }

    fn group_alive(&self, pgid: i32) -> bool {
        Self::allowed(pgid) && !matches!(killpg(Pid::from_raw(pgid), None), Err(Errno::ESRCH))
    }

    fn process_ended(&self, pid: i32) -> bool {
        read_stat(pid).is_none_or(|stat| stat.dead())
    }

    fn members(&self, scope: &Scope) -> Vec<i32> {
        let Ok(pids) = live_pids() else {
            return Vec::new();
        };
        let me = own_pid();
        let procs: Vec<(i32, ProcStat)> = pids
            .into_iter()
            .filter(|&pid| pid > 1 && pid != me)
            .filter_map(|pid| Some((pid, read_stat(pid)?)))
            .filter(|(_, stat)| !stat.dead())
            .collect();
        select_members(&procs, scope, |pid| has_marker(pid, &scope.marker))
    }

    fn strays(&self, registered: &HashSet<i32>, spared: &[&str]) -> Vec<i32> {
        let Ok(table) = self.table() else {
            return Vec::new();
        };
        let inherited = self.inherited(&table);
        select_strays(&table, own_pid(), registered, |pid| {
            inherited.contains(&pid) || spared.iter().any(|name| has_var(pid, name))
        })
    }

    fn inherited(&self, table: &[(i32, ProcStat)]) -> HashSet<i32> {
        self.inherited.spared(table)
    }
}

/// The pids of `procs` whose parent is `me`, alive, not `registered`, and
/// not `spared`.
fn select_strays(
    procs: &[(i32, ProcStat)],
    me: i32,
    registered: &HashSet<i32>,
    spared: impl Fn(i32) -> bool,
) -> Vec<i32> {
    procs
        .iter()
        .filter(|(pid, stat)| {
            stat.ppid == me && *pid != me && !stat.dead() && !registered.contains(pid)
        })
        .map(|(pid, _)| *pid)
        .filter(|pid| !spared(*pid))
        .collect()
}

/// Whether the environment of `pid` sets `name` (to anything).
fn has_var(pid: i32, name: &str) -> bool {
    let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    env.split(|&b| b == 0).any(|entry| {
        entry.len() > name.len() && entry.starts_with(name.as_bytes()) && entry[name.len()] == b'='
    })
}

/// Makes `cmd` start in a new session, so it leads its own process group and
/// no signal aimed at it (or at the terminal the agent runs in) reaches the agent.
pub fn new_session(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // setsid(2), which is async-signal-safe and touches no memory shared with
    // the parent.
    unsafe {
        cmd.pre_exec(|| setsid().map(drop).map_err(io::Error::from));
    }
}

/// The agent's own pid (0, which no check matches, were it ever out of
/// range).
pub fn own_pid() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(0)
}

/// The fields of `/proc/PID/stat` the agent reads: the kill sweep walks
/// sessions and parents, the snapshot freeze states, flags and start times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// One-letter state (`R`, `S`, `D`, `T`, `t`, `Z`, ...).
    pub state: char,
    /// Parent pid.
    pub ppid: i32,
    /// Session id.
    pub session: i32,
    /// Kernel flags (`PF_*`).
    pub flags: u64,
    /// Start time in clock ticks after boot: with the pid, names one process.
    pub start: u64,
}

impl ProcStat {
    /// Zombie or dead: it holds no resources and cannot be signalled meaningfully.
    pub fn dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Every pid in `/proc` (this pid namespace's processes).
pub(crate) fn live_pids() -> io::Result<Vec<i32>> {
    Ok(fs::read_dir("/proc")?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .collect())
}

/// A process's stat, or `None` when it is gone (or unreadable).
pub(crate) fn read_stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses `pid (comm) state ppid pgrp session tty tpgid flags ... starttime`.
/// `comm` may hold spaces and parentheses, so fields are counted from the
/// last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = text.get(text.rfind(')')? + 1..)?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let _pgrp = fields.next()?;
    let session = fields.next()?.parse().ok()?;
    // tty_nr, tpgid, then flags (field 9).
    let flags = fields.nth(2)?.parse().ok()?;
    // minflt ... itrealvalue (fields 10 to 21), then starttime (field 22).
    let start = fields.nth(12)?.parse().ok()?;
    Some(ProcStat {
        state,
        ppid,
        session,
        flags,
        start,
    })
}

fn has_marker(pid: i32, marker: &str) -> bool {
    // An empty marker would match the empty entry after the last NUL of every
    // environment: it means "no marker".
    if marker.is_empty() {
        return false;
    }
    // Unreadable (another user's process, or gone): not ours to kill anyway.
    fs::read(format!("/proc/{pid}/environ"))
        .map(|env| {
            env.split(|&b| b == 0)
                .any(|entry| entry == marker.as_bytes())
        })
        .unwrap_or(false)
}

/// The pure part of [`System::members`]: seeds by session and marker, then
/// closes over the parent links so children that cleared their environment
/// are still found while their parent is.
fn select_members(
    procs: &[(i32, ProcStat)],
    scope: &Scope,
    marked: impl Fn(i32) -> bool,
) -> Vec<i32> {
    // Kernel threads have session 0, so a leader of 0 (none) must seed nothing.
    let led = |pid: i32, stat: &ProcStat| {
        scope.leader > 0 && (pid == scope.leader || stat.session == scope.leader)
    };
    let seeds: HashSet<i32> = procs
        .iter()
        .filter(|(pid, stat)| led(*pid, stat) || marked(*pid))
        .map(|(pid, _)| *pid)
        .collect();
    let mut out: Vec<i32> = with_descendants(procs, seeds).into_iter().collect();
    out.sort_unstable();
    out
}

/// `seeds` and every process of `procs` descended from one of them,
/// following parent links (however deep, in any listing order).
pub fn with_descendants(procs: &[(i32, ProcStat)], mut seeds: HashSet<i32>) -> HashSet<i32> {
    loop {
        let before = seeds.len();
        for (pid, stat) in procs {
            if seeds.contains(&stat.ppid) {
                seeds.insert(*pid);
            }
        }
        if seeds.len() == before {
            return seeds;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let stat =
            parse_stat("42 (a b) c)) S 7 42 40 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 77").unwrap();
        assert_eq!(
            stat,
            ProcStat {
                state: 'S',
                ppid: 7,
                session: 40,
                flags: 4_194_304,
                start: 77,
            }
        );
        assert!(
            parse_stat("43 (x) Z 1 43 43 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5")
                .unwrap()
                .dead()
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (short) S 0 1"), None);
    }

    #[test]
    fn strays_are_unregistered_unmarked_children_of_the_agent() {
        let st = |ppid, state| ProcStat {
            state,
            ppid,
            session: 0,
            flags: 0,
            start: 0,
        };
        let procs = [
            (5, st(0, 'S')),   // the agent
            (10, st(5, 'S')),  // a command it started
            (11, st(5, 'S')),  // an orphan carrying a command's marker
            (12, st(5, 'S')),  // an orphan that dropped everything
            (13, st(5, 'Z')),  // a zombie not reaped yet
            (14, st(12, 'S')), // the stray's own child: its session goes with it
        ];
        let registered = HashSet::from([10]);
        assert_eq!(
            select_strays(&procs, 5, &registered, |pid| pid == 11),
            vec![12]
        );
    }

    #[test]
    fn members_are_session_marker_and_descendants() {
        let st = |ppid, session| ProcStat {
            state: 'S',
            ppid,
            session,
            flags: 0,
            start: 0,
        };
        let procs = [
            (10, st(1, 10)),  // the leader
            (11, st(10, 10)), // in its session
            (20, st(11, 20)), // escaped with setsid, keeps the marker
            (21, st(20, 20)), // child of the escapee, cleared its environment
            (30, st(1, 30)),  // unrelated
            (31, st(30, 30)), // unrelated child
        ];
        let scope = Scope {
            leader: 10,
            marker: "SILO_EXEC_ID=1".into(),
        };
        assert_eq!(
            select_members(&procs, &scope, |pid| pid == 20),
            vec![10, 11, 20, 21]
        );
        // Without a leader only the marker seeds: a kernel thread (session 0)
        // and the unrelated tree stay out.
        let kthread = (2, st(0, 0));
        let mut with_kthread = procs.to_vec();
        with_kthread.push(kthread);
        let markerless = Scope {
            leader: 0,
            marker: "SILO_EXEC_ID=1".into(),
        };
        assert_eq!(
            select_members(&with_kthread, &markerless, |pid| pid == 20),
            vec![20, 21]
        );
        assert!(!has_marker(own_pid(), ""));
    }

    #[test]
    fn process_ended_tells_live_from_gone() {
        assert!(!System::default().process_ended(own_pid()));
        // Above any kernel's pid_max: never a process.
        assert!(System::default().process_ended(i32::MAX));
    }

    #[test]
    fn the_agent_never_signals_itself_or_init() {
        assert!(!System::allowed(0));
        assert!(!System::allowed(1));
        assert!(!System::allowed(own_pid()));
        assert!(!System::default().signal_group(own_pid(), Signal::SIGCONT));
    }
}
