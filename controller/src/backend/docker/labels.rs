//! How silo names the containers it owns (from the sandbox id) and labels
//! them (the spec's labels, then silo's own from [`crate::backend::labels`]).

use std::collections::HashMap;

use crate::backend::Machine;
use crate::backend::labels::owner_labels;

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
    for (key, value) in owner_labels(machine, home_id) {
        labels.insert(key.to_owned(), value);
    }
    labels
}
