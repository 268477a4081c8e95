//! Backends: what makes, finds, starts, stops and removes the machine a
//! sandbox runs on. Nothing else: everything that happens inside a sandbox
//! goes through its agent, identically on every backend.
//!
//! [`Backend`] is the contract. Its methods are `async` (they wait on
//! processes, engines and HTTP APIs), and async trait methods are not
//! dyn-compatible, so backends are dispatched through the [`AnyBackend`] enum
//! rather than `Box<dyn Backend>`: no boxed futures, no allocation per call,
//! and adding a backend is its folder and one line of `spec::backends!`, which
//! makes its [`BackendKind`] and its registration (`register_backends!`).
//!
//! A backend keeps whatever it needs to find its machine again (a pid, a
//! container id, a VM id) in an opaque JSON `backend_ref` that the state
//! database stores with the sandbox. A backend may keep truth of its own
//! outside the database (the local backend's pid file, a container's labels)
//! when that is what several `silo` processes must agree on.

pub mod daytona;
pub mod docker;
pub mod e2b;
pub mod kubernetes;
pub mod labels;
pub mod local;
pub mod podman;
pub mod remote;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use silo_protocol::auth::Key;

use crate::agent_binary::AgentLocator;
use crate::client::Endpoint;
use crate::home::Home;
use crate::spec::{BackendKind, SandboxSpec};

pub use daytona::DaytonaConfig;
pub use docker::{DockerBackend, DockerError};
// What the snapshot engine holds of a backend that makes machines from
// engine images, the facts it reads of them, and the labels it writes into
// a snapshot's image config.
pub use docker::{ContainerFacts, EngineImages, SnapshotLabels, UpperLayer};
pub use e2b::E2bConfig;

/// What a backend is told about the sandbox it acts on.
#[derive(Debug, Clone, Copy)]
pub struct Machine<'a> {
    /// The sandbox id (stable for the sandbox's life).
    pub id: &'a str,
    /// The sandbox name (for labels and messages).
    pub name: &'a str,
    /// What it was created with.
    pub spec: &'a SandboxSpec,
    /// What this backend returned last time (`{}` before the first create).
    pub backend_ref: &'a serde_json::Value,
    /// The sandbox's own key, which its agent must be given.
    pub key: &'a Key,
    /// The image to make the machine from when it is not the spec's: a
    /// snapshot's, already on the engine (rewind, fork, restore).
    pub image: Option<&'a str>,
    /// An earlier machine of the same template had the agent in it (an
    /// image made by `silo image bake`), so a remote backend may start that
    /// one rather than upload its own (and falls back if it cannot).
    pub agent_in_image: bool,
    /// `image` is another machine's capture with its memory
    /// ([`Backend::capture_memory`]): the machine may wake with that one's
    /// processes running, its agent (and that one's key) among them.
    pub from_memory: bool,
}

/// Where a sandbox's machine is in its life, as its backend sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineState {
    /// Up, and its agent answers.
    Running,
    /// Exists but is not serving (never started, stopped, crashed, agent hung).
    Stopped,
    /// Gone: removed behind silo's back, or never made.
    Missing,
}

impl MachineState {
    /// The lowercase name shown to users.
    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Running => "running",
            MachineState::Stopped => "stopped",
            MachineState::Missing => "missing",
        }
    }
}

/// What [`Backend::start`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineStarted {
    /// The machine's handle now.
    pub backend_ref: serde_json::Value,
    /// It was already running, so nothing was started (another process may
    /// have started it a moment ago).
    pub was_running: bool,
}

/// How a stopped machine last ended, as far as its backend can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastExit {
    /// When (unix ms).
    pub at_ms: i64,
    /// It ended by itself in an orderly way (the agent exited 0, e.g. on its
    /// idle timeout), as opposed to a crash, a kill or running out of memory.
    pub clean: bool,
}

/// Where a port inside a sandbox is reached from the host, and what a
/// client must send to be let through (a provider's access token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortUrl {
    /// `HOST` or `HOST:PORT`, as E2B's `get_host` answers.
    pub host: String,
    /// The URL of the port's root (`http://` or `https://`).
    pub url: String,
    /// Headers every request to it must carry (name, value).
    pub headers: Vec<(String, String)>,
}

/// A port a backend gives no route to from the host.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("port {port} of sandbox {name:?} has no host address: {why}")]
pub struct NoPortRoute {
    /// The sandbox.
    pub name: String,
    /// The port asked for.
    pub port: u16,
    /// Why, and what to do instead.
    pub why: &'static str,
}

/// A memory fork asked of a backend that cannot capture a machine's
/// memory.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "sandbox {name:?} is on {backend}, which cannot fork a sandbox with its memory \
     (only e2b can); `silo snapshot {name}` then `silo fork SNAPSHOT` copies its files \
     to any backend"
)]
pub struct NoMemoryFork {
    /// The sandbox asked to be forked.
    pub name: String,
    /// Its backend.
    pub backend: BackendKind,
}

/// A memory snapshot asked of a backend whose machines silo cannot
/// checkpoint with their memory.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "the {backend} backend's machines cannot be checkpointed with their memory \
     (only docker sandboxes made with --runtime runsc can); a snapshot without \
     --memory keeps the files"
)]
pub struct NoMemorySnapshot {
    /// The backend.
    pub backend: BackendKind,
}

/// A change of outbound rules asked of a backend whose machines keep the
/// ones they were made with.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "sandbox {name:?} is on {backend}, whose network rules cannot change after create \
     (only e2b and daytona can); `silo up {name} --recreate` with the new flags makes it again"
)]
pub struct NoNetworkChange {
    /// The sandbox.
    pub name: String,
    /// Its backend.
    pub backend: BackendKind,
}

/// How a backend's machines are snapshotted and brought back: what the
/// backend hands the snapshot engine ([`Backend::snapshots`]), which asks
/// nothing else of it.
///
/// The agent writes a snapshot's layer on every backend that has one; what
/// differs is where the machine's base comes from and how a snapshot
/// becomes a machine again.
#[derive(Debug, Clone)]
pub enum SnapshotWay {
    /// Machines are made from images on this engine: a base image's layers
    /// are exported into the store, and a snapshot goes back onto the engine
    /// as an image its new machine is made from (Docker, Podman).
    EngineImages(EngineImages),
    /// Machines are made from a provider's template, which silo cannot
    /// export: the template's paths are listed by a fresh machine's agent
    /// (the baseline), and a snapshot goes back as its layers applied by
    /// the agent onto a fresh machine from the template (E2B, Daytona).
    AgentLayers(AgentLayers),
}

impl SnapshotWay {
    /// The engine, when machines are made from its images.
    pub fn engine_images(self) -> Option<EngineImages> {
        match self {
            SnapshotWay::EngineImages(engine) => Some(engine),
            SnapshotWay::AgentLayers(_) => None,
        }
    }
}

/// What a backend whose machines take the agent-layers way hands the
/// snapshot engine with it: what only the backend knows of its machines.
/// (An engine's containers say theirs in [`ContainerFacts`].)
#[derive(Debug, Clone)]
pub struct AgentLayers {
    /// Paths every snapshot, listing and rewind of its machines leaves out:
    /// silo's own directory on the machine (the agent, its key, its
    /// journals), which is no part of the sandbox's files.
    pub exclude: Vec<String>,
}

/// The operations every backend provides.
///
/// Each one must be safe to call from several `silo` processes at once, and
/// `start`, `stop` and `remove` must be idempotent: they are retried after
/// crashes, and issued by processes that cannot know what another just did.
pub trait Backend {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// How its machines are snapshotted and brought back; `None` when they
    /// have no snapshots (the agent is not PID 1 of a private root file
    /// system, as the local backend's host process, so there is nothing
    /// whole to capture).
    fn snapshots(&self) -> Option<SnapshotWay>;

    /// Whether a stopped machine keeps its memory and processes, so a start
    /// resumes them as they were (a provider's pause) rather than booting
    /// afresh.
    fn stop_keeps_processes(&self, machine: &Machine<'_>) -> bool {
        let _ = machine;
        false
    }

    /// Whether a stopped machine keeps its files for a start; `false` where
    /// a stop deletes the machine (a pod cannot stop), so the caller
    /// snapshots it before a stop and a start makes it anew from that
    /// snapshot.
    fn stop_keeps_files(&self) -> bool {
        true
    }

    /// Whether a running machine can be captured whole, memory and
    /// processes with its files, for a new machine to start from
    /// ([`Backend::capture_memory`]).
    fn forks_memory(&self) -> bool {
        false
    }

    /// Captures the running machine `source` whole as `name` and answers
    /// the image a new machine is made from (with
    /// [`Machine::from_memory`]); the capture goes when that machine is
    /// removed. Refused where [`Backend::forks_memory`] is false.
    fn capture_memory(
        &self,
        source: Machine<'_>,
        name: &str,
    ) -> impl Future<Output = Result<String, BackendError>> + Send {
        let _ = name;
        let refused = NoMemoryFork {
            name: source.name.to_owned(),
            backend: self.kind(),
        };
        async move { Err(refused.into()) }
    }

    /// Deletes the capture `image` ([`Backend::capture_memory`]'s answer)
    /// that no machine was made from (the create from it failed); one
    /// already gone is not an error. A backend without captures has
    /// nothing to delete.
    fn drop_capture(&self, image: &str) -> impl Future<Output = Result<(), BackendError>> + Send {
        let _ = image;
        async { Ok(()) }
    }

    /// Replaces the outbound rules of the made machine with those of
    /// `machine.spec` (its network, `allow_out` and `deny_out`), in place;
    /// refused with [`NoNetworkChange`] where they are fixed at create.
    fn set_egress(
        &self,
        machine: Machine<'_>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        let refused = NoNetworkChange {
            name: machine.name.to_owned(),
            backend: self.kind(),
        };
        async move { Err(refused.into()) }
    }

    /// Makes the machine and starts its agent; returns the new `backend_ref`.
    /// On failure the caller calls [`Backend::remove`] to clean up.
    fn create(
        &self,
        machine: Machine<'_>,
    ) -> impl Future<Output = Result<serde_json::Value, BackendError>> + Send;

    /// Looks at the machine now.
    fn status(
        &self,
        machine: Machine<'_>,
    ) -> impl Future<Output = Result<MachineState, BackendError>> + Send;

    /// Brings the machine up and waits until its agent answers. Does nothing
    /// (but still answers) if it is already running.
    fn start(
        &self,
        machine: Machine<'_>,
    ) -> impl Future<Output = Result<MachineStarted, BackendError>> + Send;

    /// Stops the machine, keeping it (and its files) for a later start.
    /// Returns whether it was running.
    fn stop(&self, machine: Machine<'_>)
    -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Stops the machine and deletes it. Succeeds if it is already gone.
    fn remove(&self, machine: Machine<'_>)
    -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Where the machine's agent listens.
    fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError>;

    /// Where `port` inside the machine is reached from the host; an error
    /// naming why when the backend gives it no route.
    fn port_url(
        &self,
        machine: Machine<'_>,
        port: u16,
    ) -> impl Future<Output = Result<PortUrl, BackendError>> + Send;

    /// How the machine last ended, when it is stopped; `None` when it is
    /// running, missing, or the backend cannot tell. Whether silo itself
    /// stopped it is for the caller to tell, from the event log.
    fn last_exit(
        &self,
        machine: Machine<'_>,
    ) -> impl Future<Output = Result<Option<LastExit>, BackendError>> + Send;

    /// Removes this home's machines whose sandbox id is not in `live` (only
    /// lists them when `dry_run`), and answers their names. A backend it
    /// cannot reach (no engine, no API key) has none to sweep.
    fn sweep_orphans(
        &self,
        live: &HashSet<String>,
        dry_run: bool,
    ) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send {
        let _ = (live, dry_run);
        async { Ok(Vec::new()) }
    }
}

/// The agent flags a spec sets on every backend (workdir, idle timeout,
/// restart policy) and the workload after `--`; each backend adds how the
/// agent listens and gets its key.
pub(crate) fn agent_flags(spec: &SandboxSpec, workload: &[String]) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(dir) = &spec.workdir {
        flags.extend(["--workdir".to_owned(), dir.clone()]);
    }
    if let Some(secs) = spec.idle_timeout_secs {
        flags.extend(["--idle-timeout".to_owned(), secs.to_string()]);
    }
    if let Some(policy) = spec.restart {
        flags.extend(["--restart".to_owned(), policy.to_string()]);
    }
    if !workload.is_empty() {
        flags.push("--".to_owned());
        flags.extend(workload.iter().cloned());
    }
    flags
}

/// What every backend is opened with: the home, the agent to put in each
/// machine, and the provider settings a caller gave (the environment's
/// otherwise).
#[derive(Debug, Clone)]
pub(crate) struct BackendSetup {
    /// The home whose machines the backends make.
    pub home: Home,
    /// Finds the agent binary machines are given.
    pub agent: Arc<AgentLocator>,
    /// How to reach E2B, when not from the environment.
    pub e2b: Option<E2bConfig>,
    /// How to reach Daytona, when not from the environment.
    pub daytona: Option<DaytonaConfig>,
    /// silo's Kubernetes settings, when not from the environment.
    pub kubernetes: Option<kubernetes::KubernetesConfig>,
}

/// The registration of every backend this build has, from the lines of
/// `crate::spec::backends!` (each backend's variant, its folder, which is
/// also the field that holds it, and its type and error there; the type has
/// `fn open(&BackendSetup) -> Self`): the dispatch enum [`AnyBackend`], the error [`BackendError`] and
/// the registry [`Backends`]; the variant is also the backend's
/// [`BackendKind`].
macro_rules! register_backends {
    ($($(#[$doc:meta])* $variant:ident = $name:literal, $machines:ident, $egress:ident
        => $field:ident: $backend:ident, $error:ident;)+) => {
        /// Every backend this build has, for dispatch without trait objects.
        #[derive(Debug, Clone)]
        pub(crate) enum AnyBackend {
            $($(#[$doc])* $variant($field::$backend),)+
        }

        impl Backend for AnyBackend {
            fn kind(&self) -> BackendKind {
                match self { $(AnyBackend::$variant(b) => b.kind(),)+ }
            }

            fn snapshots(&self) -> Option<SnapshotWay> {
                match self { $(AnyBackend::$variant(b) => b.snapshots(),)+ }
            }

            fn stop_keeps_processes(&self, machine: &Machine<'_>) -> bool {
                match self { $(AnyBackend::$variant(b) => b.stop_keeps_processes(machine),)+ }
            }

            fn forks_memory(&self) -> bool {
                match self { $(AnyBackend::$variant(b) => b.forks_memory(),)+ }
            }

            fn stop_keeps_files(&self) -> bool {
                match self { $(AnyBackend::$variant(b) => b.stop_keeps_files(),)+ }
            }

            async fn capture_memory(&self, source: Machine<'_>, name: &str) -> Result<String, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.capture_memory(source, name).await,)+ }
            }

            async fn set_egress(&self, machine: Machine<'_>) -> Result<(), BackendError> {
                match self { $(AnyBackend::$variant(b) => b.set_egress(machine).await,)+ }
            }

            async fn drop_capture(&self, image: &str) -> Result<(), BackendError> {
                match self { $(AnyBackend::$variant(b) => b.drop_capture(image).await,)+ }
            }

            async fn create(&self, machine: Machine<'_>) -> Result<serde_json::Value, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.create(machine).await,)+ }
            }

            async fn status(&self, machine: Machine<'_>) -> Result<MachineState, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.status(machine).await,)+ }
            }

            async fn start(&self, machine: Machine<'_>) -> Result<MachineStarted, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.start(machine).await,)+ }
            }

            async fn stop(&self, machine: Machine<'_>) -> Result<bool, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.stop(machine).await,)+ }
            }

            async fn remove(&self, machine: Machine<'_>) -> Result<(), BackendError> {
                match self { $(AnyBackend::$variant(b) => b.remove(machine).await,)+ }
            }

            fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.endpoint(machine),)+ }
            }

            async fn port_url(&self, machine: Machine<'_>, port: u16) -> Result<PortUrl, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.port_url(machine, port).await,)+ }
            }

            async fn last_exit(&self, machine: Machine<'_>) -> Result<Option<LastExit>, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.last_exit(machine).await,)+ }
            }

            async fn sweep_orphans(
                &self,
                live: &HashSet<String>,
                dry_run: bool,
            ) -> Result<Vec<String>, BackendError> {
                match self { $(AnyBackend::$variant(b) => b.sweep_orphans(live, dry_run).await,)+ }
            }
        }

        /// Why a backend operation failed.
        #[derive(Debug, thiserror::Error)]
        #[non_exhaustive]
        pub enum BackendError {
            $(
                $(#[$doc])*
                #[error(transparent)]
                $variant(#[from] $field::$error),
            )+
            /// The backend gives the port asked for no route from the host.
            #[error(transparent)]
            NoPortRoute(#[from] NoPortRoute),
            /// The backend cannot fork a sandbox with its memory.
            #[error(transparent)]
            NoMemoryFork(#[from] NoMemoryFork),
            /// The backend cannot checkpoint a machine's memory.
            #[error(transparent)]
            NoMemorySnapshot(#[from] NoMemorySnapshot),
            /// The backend cannot change a made machine's outbound rules.
            #[error(transparent)]
            NoNetworkChange(#[from] NoNetworkChange),
        }

        /// The backends of one home, keyed by kind: one of each registered.
        #[derive(Debug, Clone)]
        pub(crate) struct Backends {
            $($field: $field::$backend,)+
        }

        impl Backends {
            /// Opens every backend (none reaches its engine or API yet).
            pub(crate) fn open(setup: &BackendSetup) -> Self {
                Self { $($field: $field::$backend::open(setup),)+ }
            }

            /// The backend of `kind`.
            pub(crate) fn get(&self, kind: BackendKind) -> AnyBackend {
                match kind { $(BackendKind::$variant => AnyBackend::$variant(self.$field.clone()),)+ }
            }

            /// Every backend, in registration order.
            pub(crate) fn all(&self) -> Vec<AnyBackend> {
                vec![$(AnyBackend::$variant(self.$field.clone()),)+]
            }
        }
    };
}

crate::spec::backends!(register_backends);

impl Backends {
    /// The Docker backend, for building images on its engine.
    pub(crate) fn docker(&self) -> &DockerBackend {
        &self.docker
    }

    /// Every engine the backends make machines from (for the snapshot
    /// store's gc and a deleted snapshot's image).
    pub(crate) fn engines(&self) -> Vec<EngineImages> {
        self.all()
            .iter()
            .filter_map(|backend| backend.snapshots()?.engine_images())
            .collect()
    }
}
