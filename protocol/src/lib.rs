//! Everything silo-agent and the silo controller must agree on, and nothing else.
//!
//! The agent runs inside a sandbox and the controller runs on the host; they may
//! be built at different times, so every type that crosses the wire lives here
//! and carries the protocol version. This crate has no server code, no async
//! runtime, no Docker and no SQLite: it is plain data, pure functions, the
//! bundle builder (blocking `std::io`, which reads the files it bundles),
//! the reader of a tar's entries that both sides' layer readers share
//! (blocking `std::io` over a reader it is handed) and one small piece of
//! state (the replay guard behind [`auth::Verifier`]).
//!
//! # Layout
//! - [`version`]: protocol versions, their negotiation, and the features of each.
//! - [`http`]: endpoint paths, header names and the JSON error body.
//! - [`error`]: the one list of error kinds, each with its HTTP status.
//! - [`auth`]: request signing, verification, key derivation.
//! - [`replay`]: the nonces seen within the skew window, bounded in memory.
//! - [`exec`]: the exec channel: control messages (JSON) and output frames (binary).
//! - [`files`]: the file API: read, write, stat, list, mkdir, remove, trees as tar.
//! - [`health`]: the unauthenticated `GET /healthz` answer.
//! - [`limits`]: defaults both sides need to know (ring size, grace, keepalive).
//! - [`query`]: percent-encoded query strings, built and read one way on both tiers.
//! - [`push`]: the push request's query and its answer.
//! - [`bundle`]: the bundle format, its limits, and the deterministic builder.
//! - [`exact`]: a tar entry's contents read to exactly the size its header declared.
//! - [`extras`]: what a layer entry carries beyond its header (time to the
//!   nanosecond, extended attributes), as PAX records.
//! - [`link`]: a symlink's target written into a layer entry verbatim.
//! - [`members`]: a tar's entries with their whole names, link targets and
//!   [`extras`], PAX records read by their lengths (every layer reader's).
//! - [`snapshot`]: the snapshot request and the layer format of its answer.
//! - [`layers`]: a layer applied onto the machine (new with remote backends):
//!   its limits, answer and error kinds.
//! - [`index`]: every path of the machine, the baseline of a first snapshot
//!   (new with remote backends).
//! - [`rewind`]: a sandbox brought back to a snapshot by its own agent
//!   (protocol 3): the change list, the hold and the token.
//! - [`session`]: shell session ids and the info the agent reports about them.
//! - [`workload`]: the workload's restart policy, spelt one way on both sides.
#![deny(missing_docs)]

pub mod auth;
pub mod blocks;
pub mod bundle;
pub mod error;
pub mod exact;
pub mod exec;
pub mod extras;
pub mod files;
pub mod health;
pub mod http;
pub mod index;
pub mod layers;
pub mod limits;
pub mod link;
pub mod members;
pub mod push;
pub mod query;
pub mod replay;
pub mod rewind;
pub mod session;
pub mod snapshot;
pub mod suspend;
pub mod version;
pub mod workload;

pub use error::ErrorKind;
pub use version::{Feature, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, Versions};
