//! How silo marks the machines it owns, on every backend: labels carrying
//! the sandbox's id, name and spec hash, the silo version, and the identity
//! of the `$SILO_HOME` that made it.
//!
//! The home identity is a random id drawn once per home and kept in
//! `$SILO_HOME/home-id`. Two homes sharing one engine or one provider
//! account (two users, a test suite beside a developer) therefore never
//! adopt, stop or garbage-collect each other's machines: every lookup
//! checks the label.

use crate::backend::Machine;

/// Label: the sandbox id.
pub const LABEL_SANDBOX_ID: &str = "silo.sandbox.id";
/// Label: the sandbox name at creation.
pub const LABEL_SANDBOX_NAME: &str = "silo.sandbox.name";
/// Label: the spec hash the machine was made for.
pub const LABEL_SPEC_HASH: &str = "silo.spec.hash";
/// Label: the silo version that made it.
pub const LABEL_VERSION: &str = "silo.version";
/// Label: the identity of the `$SILO_HOME` that owns it.
pub const LABEL_HOME: &str = "silo.home";

/// The labels silo puts on a sandbox's machine, over whatever the spec
/// asks for (which the spec check keeps from naming these).
pub(crate) fn owner_labels(machine: &Machine<'_>, home_id: &str) -> [(&'static str, String); 5] {
    [
        (LABEL_SANDBOX_ID, machine.id.to_owned()),
        (LABEL_SANDBOX_NAME, machine.name.to_owned()),
        (LABEL_SPEC_HASH, machine.spec.hash()),
        (LABEL_VERSION, env!("CARGO_PKG_VERSION").to_owned()),
        (LABEL_HOME, home_id.to_owned()),
    ]
}
