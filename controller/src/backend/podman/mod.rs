//! The Podman backend: each sandbox is one container on a Podman engine,
//! reached through Podman's Docker-compatible API socket (`podman system
//! service`) by the Docker backend's own code. This folder only names the
//! engine (its [`Flavor`]) and what Podman needs that Docker does not; every
//! operation, and the engine-images snapshot strategy, is the Docker
//! backend's.
//!
//! What differs from Docker, and how it is met:
//! - There is no daemon to find: the API is served by `podman system
//!   service --time=0 unix://PATH`, at [`SOCKET_ENV`] when set, else the
//!   socket Podman's own units use (`$XDG_RUNTIME_DIR/podman/podman.sock`
//!   for a user, `/run/podman/podman.sock` for root).
//! - Its default resource limits (the open-file limit it raises to its
//!   own maximum) fail to start a container where the engine may not raise
//!   them (`error setting rlimit type 7: operation not permitted`), so
//!   every container is given [`ULIMITS`] explicitly.
//! - Its images are its own store, not Docker's: a snapshot's image is
//!   loaded into it from silo's store as on Docker, and a fork from one
//!   engine to the other sends the snapshot's layers over.
//! - Its API drops a container's runtime (`--runtime runsc` would run on
//!   runc): a spec naming one is refused before anything is made.
//! - It publishes no ports of a sandbox, as Docker's backend does not.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use super::docker::{DockerBackend, DockerError, Flavor};
use super::{
    Backend, BackendError, BackendSetup, LastExit, Machine, MachineStarted, MachineState,
    NoPortRoute, PortUrl, SnapshotWay,
};
use crate::agent_binary::AgentLocator;
use crate::client::Endpoint;
use crate::home::Home;
use crate::spec::BackendKind;

/// Environment variable naming Podman's API socket (a path, or
/// `unix://PATH`).
pub const SOCKET_ENV: &str = "SILO_PODMAN_SOCKET";
/// Root's socket, as Podman's `podman.socket` unit serves it.
const ROOT_SOCKET: &str = "/run/podman/podman.sock";
/// Where a user's socket lives under `$XDG_RUNTIME_DIR`.
const USER_SOCKET: &str = "podman/podman.sock";
/// Limits every container is given (name, soft, hard): well inside what a
/// service started by an ordinary login may grant. The process limit
/// matches the sandbox's default pids limit; like any `nproc` it counts the
/// user's processes, and binds no process of root.
pub const ULIMITS: &[(&str, i64, i64)] = &[("nofile", 1024, 1024), ("nproc", 4096, 4096)];

/// The Podman engine.
pub const PODMAN: Flavor = Flavor {
    kind: BackendKind::Podman,
    name: "podman",
    host: podman_host,
    start_hint: "start its API socket (`podman system service --time=0 unix://PATH &`) \
                 or set SILO_PODMAN_SOCKET to the socket it serves",
    ulimits: ULIMITS,
    no_runtime: Some(
        "podman's Docker-compatible API ignores a container's runtime, so the sandbox \
         would run on podman's default one; choose the runtime in containers.conf \
         (engine.runtime) or run this sandbox on docker",
    ),
};

/// The address of Podman's API socket in use: [`SOCKET_ENV`], else the
/// user's or root's default.
pub fn podman_host() -> String {
    match std::env::var(SOCKET_ENV).ok().filter(|s| !s.is_empty()) {
        Some(set) => format!("unix://{}", set.trim_start_matches("unix://")),
        None => format!("unix://{}", default_socket().display()),
    }
}

fn default_socket() -> PathBuf {
    let root = nix::unistd::Uid::effective().is_root();
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) if !root => PathBuf::from(dir).join(USER_SOCKET),
        _ => PathBuf::from(ROOT_SOCKET),
    }
}

/// Why the Podman backend failed: the Docker backend's reasons, met on
/// Podman's engine (each names the engine and its socket where it matters).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct PodmanError(#[from] pub DockerError);

/// Runs sandboxes as containers on the Podman engine at [`podman_host`].
#[derive(Debug, Clone)]
pub struct PodmanBackend(DockerBackend);

impl PodmanBackend {
    /// A Podman backend keeping sandbox directories under `home`, mounting
    /// the agent `agent` finds.
    pub fn new(home: Home, agent: Arc<AgentLocator>) -> Self {
        Self(DockerBackend::with_flavor(home, agent, PODMAN))
    }

    /// The Podman backend of a home.
    pub(crate) fn open(setup: &BackendSetup) -> Self {
        Self::new(setup.home.clone(), Arc::clone(&setup.agent))
    }
}

/// The Docker backend's error, told as Podman's.
fn podman(error: BackendError) -> BackendError {
    match error {
        BackendError::Docker(error) => PodmanError(error).into(),
        other => other,
    }
}

impl Backend for PodmanBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Podman
    }

    fn snapshots(&self) -> Option<SnapshotWay> {
        self.0.snapshots()
    }

    async fn create(&self, machine: Machine<'_>) -> Result<serde_json::Value, BackendError> {
        self.0.create(machine).await.map_err(podman)
    }

    async fn status(&self, machine: Machine<'_>) -> Result<MachineState, BackendError> {
        self.0.status(machine).await.map_err(podman)
    }

    async fn start(&self, machine: Machine<'_>) -> Result<MachineStarted, BackendError> {
        self.0.start(machine).await.map_err(podman)
    }

    async fn stop(&self, machine: Machine<'_>) -> Result<bool, BackendError> {
        self.0.stop(machine).await.map_err(podman)
    }

    async fn remove(&self, machine: Machine<'_>) -> Result<(), BackendError> {
        self.0.remove(machine).await.map_err(podman)
    }

    fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError> {
        self.0.endpoint(machine).map_err(podman)
    }

    async fn port_url(&self, machine: Machine<'_>, port: u16) -> Result<PortUrl, BackendError> {
        Err(NoPortRoute {
            name: machine.name.to_owned(),
            port,
            why: "a podman sandbox publishes no ports \
                  (run the client inside it, or use a local, e2b or daytona sandbox)",
        }
        .into())
    }

    async fn last_exit(&self, machine: Machine<'_>) -> Result<Option<LastExit>, BackendError> {
        self.0.last_exit(machine).await.map_err(podman)
    }

    async fn sweep_orphans(
        &self,
        live: &HashSet<String>,
        dry_run: bool,
    ) -> Result<Vec<String>, BackendError> {
        self.0.sweep_orphans(live, dry_run).await.map_err(podman)
    }
}
