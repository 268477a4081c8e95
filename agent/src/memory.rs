//! The sandbox's memory limit, and what the agent's output buffers may take
//! of it.
//!
//! The agent is PID 1: when the kernel's OOM killer picks it, the sandbox
//! dies. So the memory it keeps for clients (output of running commands for
//! re-attach, output of finished ones for a late client) is bounded by a
//! configured size and, when the sandbox has a memory limit, by a share of
//! it, whichever is less. The limit is read once at boot from the cgroup the
//! agent runs in (v2 `memory.max`, else v1 `memory.limit_in_bytes`).

use std::path::Path;

/// Each output budget takes at most this fraction (1/N) of the sandbox's
/// memory limit: under `--memory 64m`, 4 MiB for running and 4 MiB for
/// finished output.
pub const LIMIT_SHARE_DIVISOR: u64 = 16;
/// Smallest budget a small memory limit leaves: below it, re-attach would
/// replay too little to be of use.
pub const MIN_BUDGET: usize = 256 * 1024;
/// A v1 limit at or above this means "no limit" (the kernel's page-rounded
/// `i64::MAX`).
const V1_UNLIMITED: u64 = 1 << 62;

/// The memory limit of the cgroup this process runs in, in bytes; `None`
/// when there is none or it cannot be read.
pub fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok();
    let v2_dir = own
        .as_deref()
        .and_then(|text| text.lines().find_map(|line| line.strip_prefix("0::")))
        .map(|path| Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')));
    let candidates = [
        v2_dir.map(|dir| dir.join("memory.max")),
        Some(Path::new("/sys/fs/cgroup/memory.max").to_path_buf()),
        Some(Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").to_path_buf()),
    ];
    candidates
        .into_iter()
        .flatten()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| parse_limit(&text))
}

/// A limit file's text as bytes: `max` and v1's huge values are no limit.
fn parse_limit(text: &str) -> Option<u64> {
    let value: u64 = text.trim().parse().ok()?;
    (value < V1_UNLIMITED).then_some(value)
}

/// `configured`, or the memory limit's share when that is less (never below
/// [`MIN_BUDGET`], unless `configured` is).
pub fn bounded_budget(configured: usize, limit: Option<u64>) -> usize {
    let Some(limit) = limit else {
        return configured;
    };
    let share = usize::try_from(limit / LIMIT_SHARE_DIVISOR).unwrap_or(usize::MAX);
    configured.min(share.max(MIN_BUDGET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_files_read_as_bytes_or_none() {
        assert_eq!(parse_limit("67108864\n"), Some(64 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
    }

    #[test]
    fn a_memory_limit_caps_a_budget_at_its_share() {
        let mib = 1 << 20;
        assert_eq!(bounded_budget(4 * mib, None), 4 * mib);
        assert_eq!(bounded_budget(8 * mib, Some(64 << 20)), 4 * mib);
        assert_eq!(bounded_budget(2 * mib, Some(64 << 20)), 2 * mib);
        assert_eq!(bounded_budget(8 * mib, Some(1 << 20)), MIN_BUDGET);
        assert_eq!(bounded_budget(1024, Some(1 << 20)), 1024);
    }
}
