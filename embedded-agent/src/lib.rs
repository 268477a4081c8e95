//! The silo-agent binary, built by this crate's build script and carried as
//! bytes, so a program that depends on it needs no agent file beside it.
//!
//! The `silo` command depends on this crate; the `silo` library reaches it
//! only through its `embedded-agent` feature, so a harness that ships its
//! own agent builds no nested agent at all.
#![deny(missing_docs)]

/// The agent; empty when the build embedded none (`SILO_AGENT_BIN=/dev/null`).
static AGENT: &[u8] = include_bytes!(env!("SILO_EMBEDDED_AGENT"));

/// The target the agent was built for (`<arch>-unknown-linux-musl`, or the
/// static glibc fallback `<arch>-unknown-linux-gnu`), or `prebuilt` when the
/// build embedded a given file.
pub const TARGET: &str = env!("SILO_EMBEDDED_AGENT_TARGET");

/// The agent's bytes, if this build carries one.
pub fn bytes() -> Option<&'static [u8]> {
    (!AGENT.is_empty()).then_some(AGENT)
}
