//! What makes several hosts one fleet: this host's name (`SILO_HOST`),
//! where the state every host shares lives (`SILO_STATE_URL`), and the
//! bucket their snapshots' blobs share (`SILO_STORE_URL`).
//!
//! Unset, silo is one host: its home's SQLite database, named after the
//! machine. Set, every host that points at the same PostgreSQL database
//! sees the same sandboxes, names, snapshots and pools; each sandbox
//! records the host that made it, and one whose machine lives on that host
//! (a container, a local process) is operated from there only
//! ([`Fleet::may_operate`]).

use std::path::Path;

use crate::spec::BackendKind;
use crate::state::{SandboxRecord, StateError, StateLocation};

pub use crate::store::shared::STORE_URL_ENV;

/// Names this host in a fleet; the machine's host name when unset.
pub const HOST_ENV: &str = "SILO_HOST";
/// Where the state lives: `sqlite:[PATH]` (the default, the home's file)
/// or `postgres://…` (a fleet's shared database).
pub const STATE_URL_ENV: &str = "SILO_STATE_URL";

/// This host, and the state it shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    /// This host's name.
    pub host: String,
    /// Where the state lives.
    pub state: StateLocation,
    /// The shared store's bucket (`s3://bucket/prefix`), if there is one;
    /// the home's store alone otherwise.
    pub store: Option<String>,
}

impl Fleet {
    /// The fleet the environment describes, with the home's database
    /// `home_db` as the default state.
    pub fn from_env(home_db: &Path) -> Result<Self, StateError> {
        let url = std::env::var(STATE_URL_ENV).unwrap_or_default();
        let state = StateLocation::parse(&url, home_db).map_err(StateError::Location)?;
        let store = std::env::var(STORE_URL_ENV)
            .ok()
            .map(|url| url.trim().to_owned())
            .filter(|url| !url.is_empty());
        Ok(Self {
            host: this_host(),
            state,
            store,
        })
    }

    /// Whether this host may operate `sandbox`'s machine: one on a
    /// backend whose machines live on one host only from that host, any
    /// other from anywhere. A record with no host (made before fleets)
    /// is this home's own.
    pub fn may_operate(&self, sandbox: &SandboxRecord) -> bool {
        !held_by_one_host(sandbox.backend)
            || sandbox.host.as_deref().is_none_or(|host| host == self.host)
    }
}

/// Whether a backend's machines live on the host that made them (a
/// container in its engine, a process of its own), so only that host can
/// reach them; a provider's VMs and a cluster's pods are reached from
/// anywhere.
pub fn held_by_one_host(kind: BackendKind) -> bool {
    !matches!(
        kind.machines(),
        crate::spec::Machines::ProviderVm | crate::spec::Machines::Pod
    )
}

/// `SILO_HOST`, else the machine's host name, else `localhost`.
pub fn this_host() -> String {
    std::env::var(HOST_ENV)
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SandboxSpec;

    fn record(backend: BackendKind, host: Option<&str>) -> SandboxRecord {
        SandboxRecord {
            id: "sbx-00000000000a".into(),
            name: "a".into(),
            backend,
            spec: SandboxSpec::new(backend),
            spec_hash: String::new(),
            backend_ref: serde_json::json!({}),
            created_at_ms: 0,
            updated_at_ms: 0,
            origin_snapshot: None,
            baseline: None,
            checkpoint: None,
            host: host.map(str::to_owned),
        }
    }

    #[test]
    fn a_host_bound_machine_is_operated_from_its_host_only() {
        let fleet = Fleet {
            host: "b".into(),
            state: StateLocation::Postgres("postgres://db/silo".into()),
            store: None,
        };
        assert!(!fleet.may_operate(&record(BackendKind::Docker, Some("a"))));
        assert!(!fleet.may_operate(&record(BackendKind::Local, Some("a"))));
        assert!(fleet.may_operate(&record(BackendKind::Docker, Some("b"))));
        assert!(fleet.may_operate(&record(BackendKind::Docker, None)));
        assert!(fleet.may_operate(&record(BackendKind::E2b, Some("a"))));
        assert!(fleet.may_operate(&record(BackendKind::Daytona, Some("a"))));
    }
}
