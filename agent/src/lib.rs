//! silo-agent: the process that runs as PID 1 in every sandbox, as a library
//! (its binary boots it; the fuzz harness drives its parsers and extractor).
//!
//! It reaps orphans, supervises an optional workload, runs commands for the
//! controller over a signed WebSocket channel (with replay, interrupt and
//! stdin), takes pushed file bundles into mount paths with an atomic swap,
//! and shuts everything down in order when asked. It is one static
//! binary with no runtime dependencies, so the same file works in any image;
//! it also runs as an ordinary process (local backend, tests), where it makes
//! itself a child subreaper to keep the same guarantees.
//!
//! # Layout
//! - `config`: command-line flags, then the validated settings derived from them.
//! - `reaper`: the single owner of `waitpid(-1)`; delivers statuses to registered pids.
//! - `cleanup`: removals retried until done (journaled, resumed at boot) and unique temporary names.
//! - `fs_error`: the one error for a failed file system call (what, path, why).
//! - `process`: the seam for signalling and finding processes (`/proc`), faked in tests, and kill escalation.
//! - `exec`: the exec registry: spawn (pipes or a PTY), adopted execs, output ring and fan-out, stdin, interrupt, retention.
//! - `session`: persistent shell sessions whose runs are adopted execs; interrupt keeps the shell.
//! - `commands`: routes each exec request to the registry or a session; shutdown of both.
//! - `workload`: the optional command after `--`, restarted with backoff.
//! - `workload_handle`: the workload shared: signalled, stopped and started again around a rewind.
//! - `push`: signed bundle push: safe streaming extract, atomic swap, version cleanup.
//! - `files`: the file API's work: read, write, stat, list, mkdir, remove, tar trees in and out.
//! - `snapshot`: the sandbox's changes as an image layer, read while its processes are stopped,
//!   and the tree kept from the last snapshot or rewind, which a request may name by digest;
//!   the path index of the whole machine.
//! - `layers`: an image layer applied onto the machine (remote restores, rewinds), staged and
//!   checked first, journaled while placed.
//! - `rewind`: the sandbox brought back to a snapshot in place: its processes ended, what
//!   changed listed, held until the restoring layer is placed.
//! - `server`: HTTP/1.1 + WebSocket transport, listeners, TLS, request admission.
//! - `memory`: the sandbox's memory limit and the share of it output buffers may take.
//! - `activity`: what counts as use, for `--idle-timeout`.
//! - `deadline`: the lifetime deadline after which the agent stops the sandbox.
//! - `watch`: directory watches (inotify), streamed to an exec connection.
//! - `clock`: the machine's wall clock as the protocol reports it.
//! - `shutdown`: the shutdown phases every long-lived task watches.
//!

pub mod activity;
pub mod body;
pub mod cleanup;
pub mod clock;
pub mod commands;
pub mod config;
pub mod deadline;
pub mod exec;
pub mod files;
pub mod fs_error;
pub mod layers;
pub mod memory;
pub mod paths;
pub mod process;
pub mod push;
pub mod reaper;
pub mod reserve;
pub mod rewind;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod snapshot;
pub mod suspend;
pub mod watch;
pub mod workload;
pub mod workload_handle;

/// `N` random bytes as hex: boot ids and the session shells' process markers.
pub fn random_hex<const N: usize>() -> std::io::Result<String> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)
        .map_err(|err| std::io::Error::other(format!("no randomness: {err}")))?;
    Ok(hex::encode(bytes))
}
