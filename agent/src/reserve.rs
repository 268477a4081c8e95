//! What the agent holds back from the workload, so that a sandbox's own
//! processes cannot silence it: threads for its blocking work, and the OOM
//! killer's choice.
//!
//! - **Threads.** A sandbox's process limit (`pids.max`) counts threads, and
//!   a workload that forks up to it leaves none for a new one. Tokio's
//!   blocking pool makes threads on demand and panics when it has none and
//!   cannot make one; with one alive, it queues the work instead. The agent
//!   makes [`RESERVED_THREADS`] at boot and keeps every thread it made (up
//!   to [`MAX_BLOCKING_THREADS`]), so snapshots, pushes and file calls go on
//!   at the limit. A new command still needs a pid of its own; at the limit
//!   its spawn fails with a named error (`ExecError::OutOfProcesses`).
//! - **Memory.** When the sandbox runs out of memory the kernel kills the
//!   process with the highest score; the agent is PID 1, so choosing it ends
//!   the sandbox. Every process the agent starts gets
//!   [`WORKLOAD_OOM_SCORE_ADJ`] above the agent's own adjustment, inherited
//!   by all it starts, so the workload goes first. (Raising a score needs no
//!   privilege; lowering the agent's own would.)
//! - **Open files** cannot be reserved: the limit is per process, and on
//!   fuse-overlayfs it is the storage driver's, shared by the whole sandbox
//!   (`silo doctor` names it).

use std::sync::OnceLock;
use std::time::Duration;

/// Blocking threads made at boot and kept.
pub const RESERVED_THREADS: usize = 2;
/// Most blocking threads the agent keeps at once (each counts against the
/// sandbox's process limit once made, since they are kept).
pub const MAX_BLOCKING_THREADS: usize = 64;
/// How long an idle blocking thread is kept: as long as the agent runs.
pub const THREAD_KEEP_ALIVE: Duration = Duration::from_secs(u32::MAX as u64);
/// How much more likely than the agent a process it starts is to be chosen
/// by the OOM killer (the kernel's scale runs from -1000 to 1000).
pub const WORKLOAD_OOM_SCORE_ADJ: i32 = 500;
/// The kernel's highest adjustment.
const MAX_OOM_SCORE_ADJ: i32 = 1000;

/// Makes [`RESERVED_THREADS`] blocking threads now, while the sandbox has
/// pids to spare; the runtime keeps them ([`THREAD_KEEP_ALIVE`]). Must run
/// inside the runtime. Returns how many were made: fewer only when the
/// sandbox was already at its process limit.
pub async fn hold_threads() -> usize {
    // Each task holds its thread until every one has been asked for, so no
    // thread runs two of them.
    let mut releases = Vec::with_capacity(RESERVED_THREADS);
    let mut jobs = Vec::with_capacity(RESERVED_THREADS);
    for _ in 0..RESERVED_THREADS {
        let (release, held) = std::sync::mpsc::channel::<()>();
        // Tokio panics when it can make no thread at all; at boot that means
        // the sandbox has no pid left for the agent, and there is nothing to
        // hold (the panic is caught, not a crash).
        let spawned = std::panic::catch_unwind(|| {
            tokio::task::spawn_blocking(move || {
                let _ = held.recv();
            })
        });
        match spawned {
            Ok(job) => {
                jobs.push(job);
                releases.push(release);
            }
            Err(_) => break,
        }
    }
    if jobs.len() < RESERVED_THREADS {
        tracing::warn!(
            made = jobs.len(),
            wanted = RESERVED_THREADS,
            "the sandbox is at its process limit; fewer reserved threads"
        );
    }
    drop(releases);
    let mut made = 0;
    for job in jobs {
        if job.await.is_ok() {
            made += 1;
        }
    }
    made
}

/// Makes `pid`, just started by the agent, the OOM killer's choice before
/// the agent: its adjustment becomes [`workload_adj`]. Best effort: a
/// process that has already exited, or a kernel without the file, keeps
/// what it inherited.
pub fn yield_to_oom_killer(pid: u32) {
    let adj = workload_adj();
    if let Err(error) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), adj) {
        tracing::debug!(pid, %error, "cannot raise the OOM score of a started process");
    }
}

/// The agent's own adjustment plus [`WORKLOAD_OOM_SCORE_ADJ`], as the
/// file takes it; read once (nothing changes the agent's own), not at
/// every start.
fn workload_adj() -> &'static str {
    static ADJ: OnceLock<String> = OnceLock::new();
    ADJ.get_or_init(|| {
        let own = read_adj("/proc/self/oom_score_adj").unwrap_or(0);
        own.saturating_add(WORKLOAD_OOM_SCORE_ADJ)
            .min(MAX_OOM_SCORE_ADJ)
            .to_string()
    })
}

fn read_adj(path: &str) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_process_is_chosen_by_the_oom_killer_before_the_agent() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        yield_to_oom_killer(child.id());
        let own = read_adj("/proc/self/oom_score_adj").expect("own adjustment");
        let theirs = read_adj(&format!("/proc/{}/oom_score_adj", child.id())).expect("child's");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            theirs,
            (own + WORKLOAD_OOM_SCORE_ADJ).min(MAX_OOM_SCORE_ADJ)
        );
        assert!(theirs > own || own == MAX_OOM_SCORE_ADJ);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_reserve_is_made_of_distinct_threads() {
        assert_eq!(hold_threads().await, RESERVED_THREADS);
    }
}
