//! Suspending a sandbox for a checkpoint of its memory (protocol 11).
//!
//! A runtime that checkpoints a whole sandbox (gVisor's `runsc checkpoint`)
//! cannot save a socket bound to the host, and the agent's listener and
//! every connection to it are such sockets. So before a checkpoint the
//! client asks the agent to suspend:
//!
//! 1. `POST` [`crate::http::PATH_SUSPEND`]: the agent stops the sandbox's
//!    processes (as a snapshot does) and answers [`Suspended`]; then it
//!    ends every connection and closes its listener, whose socket file is
//!    gone once nothing of the host is held. The client waits for that.
//! 2. The runtime checkpoints the sandbox, which stops it, and restores
//!    it (the same sandbox, or a copy).
//! 3. The agent wakes when its key file appears (the one it was started
//!    with: a restore puts the copy's key there first, so a copy never
//!    answers its parent's key) and listens again; if none appears within
//!    [`SuspendRequest::wake_after_ms`] (no checkpoint came), it wakes with
//!    its own key and continues the processes at once.
//! 4. `POST` [`crate::http::PATH_RESUME`]: the processes continue. A woken
//!    agent continues them by itself after [`HOLD_AFTER_WAKE_MS`] if no
//!    client says so, so a client that dies leaves nothing stopped.
//!
//! Between 1 and 4 nothing in the sandbox runs, so its files read after
//! the wake are the files the memory image saw.

use serde::{Deserialize, Serialize};

/// How long a woken agent keeps the processes stopped for a client that
/// wants to read the files first, before continuing them by itself.
pub const HOLD_AFTER_WAKE_MS: u64 = 60_000;

/// Body of `POST` [`crate::http::PATH_SUSPEND`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuspendRequest {
    /// How long the agent waits for a key file before it wakes by itself.
    pub wake_after_ms: u64,
}

/// Answer of `POST` [`crate::http::PATH_SUSPEND`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspended {
    /// How many processes were stopped.
    pub stopped: usize,
}

/// Answer of `POST` [`crate::http::PATH_RESUME`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// How many stopped processes were continued (0: none were held).
    pub continued: usize,
}
