//! How silo marks the containers it owns: a container name derived from the
//! sandbox id, and labels carrying the sandbox's id, name and spec hash, the
//! silo version, and the identity of the `$SILO_HOME` that made it.
//!
//! The home identity is a random id drawn once per home and kept in
//! `$SILO_HOME/home-id`. Two homes sharing one engine (two users, a test
//! suite beside a developer) therefore never adopt, stop or garbage-collect
//! each other's containers: every lookup checks the label.

use std::collections::HashMap;

use crate::backend::Machine;

/// Label: the sandbox id.
pub const LABEL_SANDBOX_ID: &str = "silo.sandbox.id";
/// Label: the sandbox name at creation.
pub const LABEL_SANDBOX_NAME: &str = "silo.sandbox.name";
/// Label: the spec hash the container was made for.
pub const LABEL_SPEC_HASH: &str = "silo.spec.hash";
/// Label: the silo version that made it.
pub const LABEL_VERSION: &str = "silo.version";
/// Label: the identity of the `$SILO_HOME` that owns it.
pub const LABEL_HOME: &str = "silo.home";

/// The container of a sandbox: its id is random and unique, so the name
/// never collides across homes, and any process can find it without the database.
pub fn container_name(sandbox_id: &str) -> String {
    format!("silo-{sandbox_id}")
}

/// Every label a sandbox's container carries: the spec's own, then silo's
/// (which the spec check keeps the spec from overriding).
pub fn labels(machine: &Machine<'_>, home_id: &str) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = machine
        .spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in [
        (LABEL_SANDBOX_ID, machine.id.to_owned()),
        (LABEL_SANDBOX_NAME, machine.name.to_owned()),
        (LABEL_SPEC_HASH, machine.spec.hash()),
        (LABEL_VERSION, env!("CARGO_PKG_VERSION").to_owned()),
        (LABEL_HOME, home_id.to_owned()),
    ] {
        labels.insert(key.to_owned(), value);
    }
    labels
}
