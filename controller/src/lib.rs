//! silo, the host controller: it creates sandboxes on a backend, keeps their
//! state, and talks to the silo-agent inside each one.
//!
//! Start at [`Silo`]: open a home, then [`Silo::up_sandbox`] (open or
//! create) or [`Silo::sandbox`] gives a [`Sandbox`], the handle a harness
//! holds: its [`Commands`], [`Files`] and [`Snapshots`], and push. The
//! `silo` binary (crate `silo-cli`) is a thin CLI over this library.
//!
//! ```no_run
//! # async fn step() -> Result<(), Box<dyn std::error::Error>> {
//! use silo::{BackendKind, ExecSpec, SandboxSpec, Silo, UpRequest};
//!
//! let silo = Silo::open(None)?;
//! let (sandbox, _) = silo
//!     .up_sandbox(UpRequest {
//!         name: "work".into(),
//!         spec: Some(SandboxSpec::new(BackendKind::Local)),
//!         recreate: false,
//!     })
//!     .await?;
//! let out = sandbox
//!     .commands()
//!     .run(ExecSpec::shell("echo hello > notes.txt && cat notes.txt"))
//!     .await?;
//! assert_eq!(out.stdout, b"hello\n");
//! let checkpoint = sandbox.snapshots().take(Some("after step 1".into())).await?;
//! # let _ = checkpoint;
//! # Ok(())
//! # }
//! ```
//!
//! The public surface is the crate root, plus [`client`] (talking to one
//! agent directly), [`spec`] (what a sandbox is asked to be) and [`doctor`]
//! (what the host lacks). Everything else is private, and no engine or
//! provider client type appears in a public signature.
//!
//! # Layout
//! - `silo`: [`Silo`], the context (home, state, master key, the backends
//!   keyed by kind) and its services: lifecycle (create, start, stop,
//!   remove, `up`), `lease` (serializing lifecycle operations across
//!   processes), `snapshot` (take, restore, fork, the store's gc), `pool`,
//!   `push` (fan-out to sandboxes) and `gc`.
//! - `sandbox`: [`Sandbox`], with [`Commands`] (run, and spawn that
//!   re-attaches after a dropped connection), [`Files`] (read, write, list,
//!   trees, and copies with `docker cp`'s rules) and [`Snapshots`].
//! - [`client`]: the agent client, the one way the controller talks to an agent.
//! - `push`: bundles from files, one push with retries, fan-out and its report.
//! - `backend`: the `Backend` contract and its registration; the `local`,
//!   `docker`, `e2b` and `daytona` backends, `remote` (what every provider
//!   backend shares) and `labels` (how machines are marked as silo's).
//! - `image`: building images through the engine ([`Images`]).
//! - `state`: SQLite state (sandboxes, snapshots, pools, leases, the
//!   append-only event log) and the master key.
//! - `store`: the content-addressed blob store of snapshot layers, image path
//!   indexes, and the engine's image export and import archives.
//! - [`spec`]: what a sandbox is asked to be, and its stable hash.
//! - `naming`: sandbox ids, name rules and generated names.
//! - `agent_binary`: finding (or extracting the embedded) silo-agent binary.
//! - [`doctor`]: what the host has and lacks for silo, with the fix for each.
//! - `home`: the `$SILO_HOME` directory layout.
//! - `bridge`: async byte streams to and from blocking `std::io` code.
//! - `fsutil`: atomic writes and log tails for files under `$SILO_HOME`,
//!   and [`human_bytes`], the one way sizes are written for people.
//! - `timestamp`: RFC 3339 times read and written ([`unix_ms_to_rfc3339`]).
//! - `retry`: deadlines polled at a steady pace, and doubling backoff with jitter.
//! - `faults`: places a test can make the process die at
//!   (`SILO_TEST_DIE_AT`), to check what a later process makes of it.
//! - `internals` (hidden): what the workspace's own tests, benchmarks and
//!   fuzzers drive directly; not part of the API.
#![deny(missing_docs)]

// The surface a harness uses, in its own modules: each is public because
// its items appear in what `Silo` and `Sandbox` answer.
pub mod client;
pub mod doctor;
pub mod spec;

// Everything else is the controller's own: reached through `Silo`,
// `Sandbox` and the re-exports below, never by path.
mod agent_binary;
mod backend;
mod bridge;
mod faults;
pub mod fleet;
mod fsutil;
mod home;
mod image;
mod naming;
mod push;
mod retry;
mod sandbox;
mod silo;
mod state;
mod store;
mod timestamp;

#[doc(hidden)]
pub mod internals;

/// The wire crate, for the types below and anything else a harness needs
/// of it, so that depending on `silo` alone is enough.
pub use silo_protocol;
pub use silo_protocol::ErrorKind;
pub use silo_protocol::bundle::FileSet;
pub use silo_protocol::exec::{ExecSpec, ExitInfo};
pub use silo_protocol::files::FileStat;

pub use backend::kubernetes::KubernetesConfig;
pub use backend::{DaytonaConfig, E2bConfig, MachineState, NoMemoryFork, NoPortRoute, PortUrl};
pub use fsutil::human_bytes;
pub use home::{Home, HomeError};
pub use image::{
    BAKED_AGENT_PATH, DEFAULT_BASE_TAG, DEFAULT_BUSYBOX, DEFAULT_LISTEN, EngineInfo, ImageError,
    Images,
};
pub use naming::{NamingError, looks_like_id, validate_name};
pub use push::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CONCURRENCY, DEFAULT_RETRY_BUDGET, FilesError, PushError,
    PushEvent, PushFailure, PushOptions, PushProgressFn, PushReport, RetryPolicy, files_from_dir,
};
pub use sandbox::{
    CommandEvent, CommandOutput, Commands, Copied, CopyError, Execution, FileError, FileStream,
    Files, Sandbox, Snapshots,
};
pub use silo::{
    BaseStored, COMPACT_AT, Collected, Compacted, CreateRequest, DiffReport, DiffedPath,
    FillReport, ForkTarget, GcReport, ImageSource, InPlace, MAX_FORKS, MAX_POOL_SIZE,
    MemoryCheckpoint, PoolError, PoolStatus, RestoreReport, STATUS_CONCURRENCY, Silo, SiloError,
    SiloOptions, SnapshotError, SnapshotProgress, SnapshotProgressFn, SnapshotReport, Started,
    StoreGc, UpAction, UpOutcome, UpRequest, no_progress,
};
pub use spec::{BackendKind, SandboxSpec};
pub use state::{
    EventRecord, HostRecord, MasterKeyError, SandboxRecord, Snapshot, StateError, StateLocation,
};
pub use store::{Aspect, PathChange};
pub use timestamp::unix_ms_to_rfc3339;
