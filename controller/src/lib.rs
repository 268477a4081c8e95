//! silo, the host controller: it creates sandboxes on a backend, keeps their
//! state, and talks to the silo-agent inside each one.
//!
//! Start at [`Silo`]: open a home, then [`Silo::up_sandbox`] (open or
//! create) or [`Silo::sandbox`] gives a [`Sandbox`] with its commands and
//! snapshots. The `silo` binary (crate `silo-cli`) is a thin CLI over
//! this library.
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
//! # Layout
//! - [`silo`]: `Silo`, the front door: create, get, list, start, stop, remove, events, client.
//!   Its children: `open` (`up`, open-or-create), `lease` (serializing lifecycle
//!   operations across processes), `gc` (expired sandboxes, orphaned containers
//!   and VMs), `snapshot` (take, restore, the store's gc).
//! - [`sandbox`]: `Sandbox`, the handle a harness holds: `commands()` (run, and
//!   spawn that re-attaches after a dropped connection), `files()` (read, write,
//!   list, trees, and copies to and from the host with `docker cp`'s rules),
//!   `snapshots()`, push.
//! - [`client`]: AgentClient, the one way the controller talks to an agent.
//! - [`push`]: bundles from files, one push with retries, fan-out and its report
//!   (`Silo::push_to_sandboxes` in `silo/push.rs` ties it to sandboxes and events).
//! - [`backend`]: the `Backend` contract, enum dispatch, the `local`, `docker` and
//!   `e2b` backends, and `remote` (what every provider backend shares).
//! - [`image`]: building images through the engine (`image bake`, `image base`).
//! - [`state`]: SQLite state (sandboxes, append-only events) and the master key.
//! - [`store`]: the content-addressed blob store of snapshot layers, image path
//!   indexes, and the engine's image export and import archives.
//! - [`spec`]: what a sandbox is asked to be, and its stable hash.
//! - [`naming`]: sandbox ids, name rules and generated names.
//! - [`agent_binary`]: finding (or extracting the embedded) silo-agent binary.
//! - [`doctor`]: what the host has and lacks for silo, with the fix for each.
//! - [`home`]: the `$SILO_HOME` directory layout.
//! - `bridge` (private): async byte streams to and from blocking `std::io` code.
//! - `fsutil` (private): atomic writes and log tails for files under `$SILO_HOME`,
//!   and `human_bytes`, the one way sizes are written for people.
//! - `retry` (private): deadlines polled at a steady pace, and doubling backoff with jitter.
#![deny(missing_docs)]

pub mod agent_binary;
pub mod backend;
mod bridge;
pub mod client;
pub mod doctor;
mod fsutil;
pub mod home;
pub mod image;
pub mod naming;
pub mod push;
mod retry;
pub mod sandbox;
pub mod silo;
pub mod spec;
pub mod state;
pub mod store;
mod timestamp;

/// The wire crate, for the types below and anything else a harness needs
/// of it, so that depending on `silo` alone is enough.
pub use silo_protocol;
pub use silo_protocol::ErrorKind;
pub use silo_protocol::bundle::FileSet;
pub use silo_protocol::exec::{ExecSpec, ExitInfo};
pub use silo_protocol::files::FileStat;

pub use backend::MachineState;
pub use fsutil::human_bytes;
pub use sandbox::Sandbox;
pub use silo::{CreateRequest, ForkTarget, Silo, SiloError, SiloOptions, Started};
pub use silo::{GcReport, UpAction, UpOutcome, UpRequest};
pub use spec::{BackendKind, SandboxSpec};
pub use state::{Event, SandboxRecord};
pub use timestamp::unix_ms_to_rfc3339;
