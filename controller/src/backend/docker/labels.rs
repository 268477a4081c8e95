//! How silo marks the containers it owns: a container name derived from the
//! sandbox id, and labels carrying the sandbox's id, name and spec hash, the
//! silo version, and the identity of the `$SILO_HOME` that made it.
//!
//! The home identity is a random id drawn once per home and kept in
//! `$SILO_HOME/home-id`. Two homes sharing one engine (two users, a test
//! suite beside a developer) therefore never adopt, stop or garbage-collect
//! each other's containers: every lookup checks the label.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;

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
/// Random bytes in a home identity (shown as twice as many hex digits).
const HOME_ID_BYTES: usize = 8;

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

/// The home's identity, drawn and stored on first use. Two processes racing
/// to draw it agree: the file is linked into place only if absent, and
/// whoever loses reads the winner's.
pub fn load_or_create_home_id(path: &Path) -> io::Result<String> {
    if let Some(id) = read_home_id(path)? {
        return Ok(id);
    }
    let mut bytes = [0u8; HOME_ID_BYTES];
    getrandom::fill(&mut bytes).map_err(|_| io::Error::other("no randomness for a home id"))?;
    crate::fsutil::create_atomic(path, format!("{}\n", hex::encode(bytes)).as_bytes(), 0o600)?;
    read_home_id(path)?.ok_or_else(|| io::Error::other("home id file is empty"))
}

fn read_home_id(path: &Path) -> io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_owned()).filter(|id| !id.is_empty())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_ids_are_drawn_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("home-id");
        let first = load_or_create_home_id(&path).unwrap();
        assert_eq!(first.len(), HOME_ID_BYTES * 2);
        assert_eq!(load_or_create_home_id(&path).unwrap(), first);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            load_or_create_home_id(&other.path().join("home-id")).unwrap(),
            first
        );
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp files left"
        );
    }
}
