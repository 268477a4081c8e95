//! The processes a machine's agent found already running below it when it
//! started, which are not the sandbox's.
//!
//! A provider starts the agent through a shell of its own that `exec`s it:
//! Daytona's process session wraps each command so that its output is
//! relayed through processes that shell forks first (one per stream, each
//! reading a FIFO the command writes), and after the `exec` those relays
//! are the agent's children. They carry the agent's own stdout and stderr,
//! so a rewind that ended them, or a snapshot's freeze that stopped them,
//! would cut off or stall the agent's log. [`Inherited`] records them when
//! the agent starts, before it has started anything, as pid and start time
//! (a pid reused later names someone else), and later answers them and
//! whatever they started since as spared.
//!
//! Nothing the agent starts is ever spared: its commands, sessions and
//! workload descend from the agent through children it forked itself, and
//! an orphan is re-parented to the agent (the subreaper), never to one of
//! these.

use std::collections::HashSet;

use super::{ProcStat, with_descendants};

/// The processes below the agent at its start (empty for an agent that
/// inherited none, or that does not look).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inherited {
    /// Pid and start time of each.
    procs: Vec<(i32, u64)>,
}

impl Inherited {
    /// The descendants of agent `me` in `table`, the process table read at
    /// its start.
    pub fn at_start(table: &[(i32, ProcStat)], me: i32) -> Self {
        let below = with_descendants(table, HashSet::from([me]));
        let mut procs: Vec<(i32, u64)> = table
            .iter()
            .filter(|(pid, stat)| *pid != me && below.contains(pid) && !stat.dead())
            .map(|(pid, stat)| (*pid, stat.start))
            .collect();
        procs.sort_unstable();
        Self { procs }
    }

    /// How many there were.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether there were none.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The pids of `table` to spare: those inherited still running (same
    /// pid, same start time) and every process descended from them.
    pub fn spared(&self, table: &[(i32, ProcStat)]) -> HashSet<i32> {
        if self.procs.is_empty() {
            return HashSet::new();
        }
        let seeds: HashSet<i32> = table
            .iter()
            .filter(|(pid, stat)| self.procs.binary_search(&(*pid, stat.start)).is_ok())
            .map(|(pid, _)| *pid)
            .collect();
        if seeds.is_empty() {
            return seeds;
        }
        with_descendants(table, seeds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(ppid: i32, start: u64) -> ProcStat {
        ProcStat {
            state: 'S',
            ppid,
            session: 0,
            flags: 0,
            start,
        }
    }

    #[test]
    fn what_ran_below_the_agent_at_its_start_is_spared_and_nothing_it_started() {
        // The provider's daemon (50) ran a session shell that forked two
        // relays (61, 62; 62 with a child 63) and then became the agent (60).
        // Beside it, the daemon's own process (90).
        let boot = [
            (1, proc(0, 1)),
            (50, proc(1, 2)),
            (60, proc(50, 3)),
            (61, proc(60, 4)),
            (62, proc(60, 4)),
            (63, proc(62, 5)),
            (90, proc(50, 6)),
        ];
        let inherited = Inherited::at_start(&boot, 60);
        assert_eq!(inherited.len(), 3);
        // Later: 61 is gone and its pid was reused by a command of the
        // agent (a later start time); 62 started 64; the agent's workload
        // (70) and its child (71), and an orphan re-parented to the agent
        // (80), are the sandbox's.
        let later = [
            (1, proc(0, 1)),
            (60, proc(50, 3)),
            (61, proc(60, 40)),
            (62, proc(60, 4)),
            (63, proc(62, 5)),
            (64, proc(62, 41)),
            (70, proc(60, 42)),
            (71, proc(70, 43)),
            (80, proc(60, 44)),
        ];
        let mut spared: Vec<i32> = inherited.spared(&later).into_iter().collect();
        spared.sort_unstable();
        assert_eq!(spared, [62, 63, 64]);
        assert!(Inherited::default().spared(&later).is_empty());
        assert!(Inherited::at_start(&later[..2], 60).is_empty());
    }
}
