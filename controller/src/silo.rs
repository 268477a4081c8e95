//! [`Silo`]: the library's front door, one handle on one `$SILO_HOME`.
//!
//! It ties the pieces together: names and ids, the state database, the master
//! key, the backends and the agent client. Each lifecycle operation asks the
//! backend first and records the outcome (row and event in one transaction)
//! after, so the log never claims what did not happen.
//!
//! Database calls are short and synchronous; they run inline on the async
//! caller's thread rather than on a blocking pool, because a hop to another
//! thread costs more than the query.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;
use silo_protocol::auth::{Key, derive_sandbox_key};

use crate::agent_binary::AgentLocator;
use crate::backend::kubernetes::KubernetesConfig;
use crate::backend::podman::PodmanError;
use crate::backend::{
    AnyBackend, Backend, BackendError, BackendSetup, Backends, DaytonaConfig, DockerError,
    E2bConfig, Machine, MachineState, NoMemoryFork, NoPortRoute, PortUrl,
};
use crate::client::{AgentClient, ClientError, ExecConnection};
use crate::fleet::Fleet;
use crate::home::{Home, HomeError};
use crate::naming::{NamingError, generated_name, new_sandbox_id, validate_name};
use crate::spec::{BackendKind, SandboxSpec};
use crate::state::{
    EventKind, EventRecord, HostRecord, MasterKeyError, NewSandbox, SandboxRecord, StateDb,
    StateError, load_or_create_master_key, without_secrets,
};

mod gc;
mod lease;
mod memory;
mod memory_fork;
mod network;
mod open;
mod pool;
mod push;
mod snapshot;

pub use gc::{Collected, GcReport};
pub use lease::Lease;
pub use memory::MemoryCheckpoint;
pub use open::{UpAction, UpOutcome, UpRequest};
pub use pool::{FillReport, MAX_POOL_SIZE, PoolError, PoolStatus};
pub use snapshot::{
    BaseStored, COMPACT_AT, Compacted, DiffReport, DiffedPath, ForkTarget, ImageSource, InPlace,
    MAX_FORKS, RestoreReport, SnapshotError, SnapshotProgress, SnapshotProgressFn, SnapshotReport,
    StoreGc, no_progress,
};

/// Most status looks [`Silo::statuses`] has under way at once: each is a
/// socket, a pid file or an API call, so this stays well under a process's
/// file limit and a provider's rate limit.
pub const STATUS_CONCURRENCY: usize = 32;

/// Tries at drawing a free generated name before giving up.
const NAME_ATTEMPTS: u32 = 8;
/// The message of the snapshot a stop takes of a sandbox whose stop
/// deletes its machine.
pub const STOP_SNAPSHOT_MESSAGE: &str = "taken by silo stop: the machine is deleted";

/// How to open a [`Silo`].
#[derive(Debug, Clone, Default)]
pub struct SiloOptions {
    /// The state directory; `$SILO_HOME` or `~/.local/share/silo` when absent.
    pub home: Option<PathBuf>,
    /// The agent binary to run; when absent, `$SILO_AGENT`, a `silo-agent`
    /// beside the executable, or the one this build embeds.
    pub agent: Option<PathBuf>,
    /// How to reach E2B; from the environment (`E2B_API_KEY` …) when absent.
    pub e2b: Option<E2bConfig>,
    /// How to reach Daytona; from the environment (`DAYTONA_API_KEY` …)
    /// when absent.
    pub daytona: Option<DaytonaConfig>,
    /// silo's Kubernetes settings; from the environment
    /// (`SILO_KUBERNETES_*`) when absent.
    pub kubernetes: Option<KubernetesConfig>,
    /// This host's name and where the state lives; from the environment
    /// (`SILO_HOST`, `SILO_STATE_URL`) when absent.
    pub fleet: Option<Fleet>,
}

/// What to create.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// Its name; a generated one when absent.
    pub name: Option<String>,
    /// Its backend and settings.
    pub spec: SandboxSpec,
}

impl CreateRequest {
    /// A request for a sandbox on `backend` with default settings.
    pub fn new(backend: BackendKind) -> Self {
        Self {
            name: None,
            spec: SandboxSpec::new(backend),
        }
    }

    /// Sets the name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// What [`Silo::start`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Started {
    /// The sandbox as it is now recorded.
    pub sandbox: SandboxRecord,
    /// It was running already, so nothing was started.
    pub was_running: bool,
}

/// A handle on one silo home: its state, its key and its backends.
///
/// Cheap to clone: clones share one state connection, so a harness can hand
/// one to each task, and each [`crate::Sandbox`] handle carries one.
#[derive(Debug, Clone)]
pub struct Silo(Arc<Shared>);

/// What every clone of a [`Silo`] shares: the context each of its services
/// (lifecycle, snapshots, pools, push, gc) works in.
#[derive(Debug)]
struct Shared {
    home: Home,
    fleet: Fleet,
    /// The fleet's shared blob store, when it has one.
    shared_store: Option<crate::store::SharedStore>,
    db: Mutex<StateDb>,
    master: Key,
    backends: Backends,
}

/// The lease operation of `silo rm`: a call that finds it held knows its
/// sandbox is going.
pub(crate) const RM_OP: &str = "rm";

impl Silo {
    /// Opens the home at `home` (or the default), creating it on first use.
    pub fn open(home: Option<PathBuf>) -> Result<Self, SiloError> {
        Self::open_with(SiloOptions {
            home,
            ..SiloOptions::default()
        })
    }

    /// Opens a home with every option given.
    pub fn open_with(options: SiloOptions) -> Result<Self, SiloError> {
        let home = Home::resolve(options.home)?;
        home.ensure()?;
        let fleet = match options.fleet {
            Some(fleet) => fleet,
            None => Fleet::from_env(&home.state_db())?,
        };
        let mut db = StateDb::open_at(&fleet.state)?;
        let master = if fleet.state.is_shared() {
            shared_master_key(&mut db)?
        } else {
            load_or_create_master_key(&home.master_key())?
        };
        db.host_seen(&fleet.host)?;
        let shared_store = fleet
            .store
            .as_deref()
            .map(crate::store::SharedStore::open)
            .transpose()?;
        let agent = Arc::new(AgentLocator::new(options.agent, home.bin_dir()));
        let backends = Backends::open(&BackendSetup {
            home: home.clone(),
            agent,
            e2b: options.e2b,
            daytona: options.daytona,
            kubernetes: options.kubernetes,
        });
        Ok(Self(Arc::new(Shared {
            backends,
            home,
            fleet,
            shared_store,
            db: Mutex::new(db),
            master,
        })))
    }

    /// The home this handle works on.
    pub fn home(&self) -> &Home {
        &self.0.home
    }

    /// This host's name, and where the state it shares lives.
    pub fn fleet(&self) -> &Fleet {
        &self.0.fleet
    }

    /// The fleet's shared blob store, when it has one.
    pub(crate) fn shared_store(&self) -> Option<&crate::store::SharedStore> {
        self.0.shared_store.as_ref()
    }

    /// Every host that has used this state, by name.
    pub fn hosts(&self) -> Result<Vec<HostRecord>, SiloError> {
        Ok(self.db().hosts()?)
    }

    /// Image builds on the engine the Docker backend uses.
    pub fn images(&self) -> crate::image::Images {
        crate::image::Images::new(self.docker_backend().clone())
    }

    /// Image builds on the engine `kind`'s machines are made from (Docker's,
    /// Podman's); `None` for a backend with no engine.
    pub fn images_on(&self, kind: BackendKind) -> Option<crate::image::Images> {
        let engine = self.backend(kind).snapshots()?.engine_images()?;
        Some(crate::image::Images::new(engine.backend()))
    }

    /// Creates a sandbox and starts it. Nothing is left behind on failure
    /// (the log keeps a `created` and a `removed` event saying why).
    pub async fn create(&self, request: CreateRequest) -> Result<SandboxRecord, SiloError> {
        request.spec.check()?;
        // A generated name is fresh, so nobody else can be working on it.
        let _lease = match &request.name {
            Some(name) => Some(self.lease(name, "create").await?),
            None => None,
        };
        self.create_unleased(request).await
    }

    /// [`Silo::create`] for a caller that holds the name's lease (or needs none).
    async fn create_unleased(&self, request: CreateRequest) -> Result<SandboxRecord, SiloError> {
        let sandbox = self.reserve(request, None)?;
        self.launch(sandbox, None).await
    }

    /// Makes the machine of a just-reserved sandbox, from `image` when given
    /// (a snapshot's) or its spec's. On failure nothing is left behind: the
    /// machine is removed and the sandbox forgotten (the log keeps a
    /// `created` and a `removed` event saying why).
    async fn launch(
        &self,
        sandbox: SandboxRecord,
        image: Option<&str>,
    ) -> Result<SandboxRecord, SiloError> {
        self.launch_from(sandbox, image, false).await
    }

    /// [`Silo::launch`], `from_memory` when `image` is another machine's
    /// capture with its memory ([`Machine::from_memory`]).
    async fn launch_from(
        &self,
        sandbox: SandboxRecord,
        image: Option<&str>,
        from_memory: bool,
    ) -> Result<SandboxRecord, SiloError> {
        let key = self.sandbox_key(&sandbox);
        let backend = self.backend(sandbox.backend);
        let made = Machine {
            image,
            from_memory,
            ..self.machine_to_make(&sandbox, &key)
        };
        let made = backend.create(made).await;
        match self.record_made(&sandbox, made).await {
            Ok(sandbox) => Ok(sandbox),
            Err(error) => Err(self.forget_failed(&sandbox, "create", error)?),
        }
    }

    /// Deletes the row of `sandbox`, reserved for a `what` ("create",
    /// "fork") that failed with `error`, logging why; answers `error` for
    /// the caller to return.
    pub(crate) fn forget_failed(
        &self,
        sandbox: &SandboxRecord,
        what: &str,
        error: SiloError,
    ) -> Result<SiloError, SiloError> {
        let reason = json!({
            "reason": format!("{what} failed: {}", silo_protocol::http::error_chain(&error)),
        });
        self.db().delete_sandbox(sandbox, &reason)?;
        Ok(error)
    }

    /// Records the machine a backend just made for `sandbox` (its handle and
    /// a `started` event, and what a fresh machine's first snapshot will be
    /// measured against: a remote VM's baseline, a container's own listing
    /// when the store lacks its image); when making it failed,
    /// removes whatever it left and returns why. The sandbox's row stays
    /// either way: a recreate or restore leaves it machineless for the next
    /// `up`.
    async fn record_made(
        &self,
        sandbox: &SandboxRecord,
        made: Result<serde_json::Value, BackendError>,
    ) -> Result<SandboxRecord, SiloError> {
        match made {
            Ok(backend_ref) => {
                let detail = json!({ "backend_ref": without_secrets(&backend_ref) });
                let sandbox = self.db().update_backend_ref(
                    sandbox,
                    &backend_ref,
                    Some((EventKind::Started, detail)),
                )?;
                if sandbox.origin_snapshot.is_some() {
                    return Ok(sandbox);
                }
                let Some(strategy) = self.strategy(sandbox.backend) else {
                    return Ok(sandbox);
                };
                let recorded = strategy.record_start(self, &sandbox).await;
                // A sandbox that cannot snapshot is still a working sandbox:
                // its snapshots say why, and a recreate tries again. Without
                // its listing, a container's first snapshot stores its image
                // before it captures, as when the listing is not wanted.
                match recorded {
                    Ok(sandbox) => Ok(sandbox),
                    Err(error) => {
                        tracing::warn!(
                            sandbox = sandbox.name,
                            "recording the files its machine started with: {}",
                            silo_protocol::http::error_chain(&error)
                        );
                        Ok(sandbox)
                    }
                }
            }
            Err(source) => {
                let key = self.sandbox_key(sandbox);
                let backend = self.backend(sandbox.backend);
                if let Err(cleanup) = backend.remove(machine(sandbox, &key)).await {
                    tracing::warn!(
                        sandbox = sandbox.name,
                        "cleaning up a failed create: {cleanup}"
                    );
                }
                Err(backend_error("create", sandbox, source))
            }
        }
    }

    /// The sandbox with this name or id.
    pub fn get(&self, name_or_id: &str) -> Result<SandboxRecord, SiloError> {
        Ok(self.db().sandbox(name_or_id)?)
    }

    /// Every sandbox, oldest first.
    pub fn list(&self) -> Result<Vec<SandboxRecord>, SiloError> {
        Ok(self.db().sandboxes()?)
    }

    /// What the sandbox's backend says about its machine now.
    pub async fn status(&self, sandbox: &SandboxRecord) -> Result<MachineState, SiloError> {
        let key = self.sandbox_key(sandbox);
        self.backend_of(sandbox)?
            .status(machine(sandbox, &key))
            .await
            .map_err(|e| backend_error("inspect", sandbox, e))
    }

    /// What the backends say about each of `sandboxes`, in their order: the
    /// looks run [`STATUS_CONCURRENCY`] at a time, so a thousand sandboxes
    /// cost about what a few dozen sequential looks do.
    pub async fn statuses(
        &self,
        sandboxes: &[SandboxRecord],
    ) -> Vec<Result<MachineState, SiloError>> {
        use futures_util::StreamExt;
        futures_util::stream::iter(sandboxes)
            .map(|sandbox| self.status(sandbox))
            .buffered(STATUS_CONCURRENCY)
            .collect()
            .await
    }

    /// Starts a stopped sandbox (a no-op for a running one, which the
    /// outcome tells apart).
    pub async fn start(&self, name_or_id: &str) -> Result<Started, SiloError> {
        let (_lease, sandbox) = self.lease_sandbox(name_or_id, "start").await?;
        self.start_machine(&sandbox).await
    }

    /// Stops a sandbox, keeping it for a later start. Returns whether it was running.
    pub async fn stop(&self, name_or_id: &str) -> Result<bool, SiloError> {
        let (_lease, sandbox) = self.lease_sandbox(name_or_id, "stop").await?;
        let key = self.sandbox_key(&sandbox);
        let backend = self.backend_of(&sandbox)?;
        if !backend.stop_keeps_files() && self.status(&sandbox).await? == MachineState::Running {
            // The stop deletes the machine (a pod): its files go into a
            // snapshot first, which a start makes it anew from.
            self.snapshot_leased(sandbox.clone(), Some(STOP_SNAPSHOT_MESSAGE.into()))
                .await?;
        }
        let was_running = backend
            .stop(machine(&sandbox, &key))
            .await
            .map_err(|e| backend_error("stop", &sandbox, e))?;
        if was_running {
            self.db()
                .append_event(&sandbox, EventKind::Stopped, &json!({}))?;
        }
        Ok(was_running)
    }

    /// Pauses a sandbox whose machine keeps memory and processes across a
    /// stop (E2B, a Daytona VM), so [`Silo::start`] resumes them as they
    /// were; refused where a stop loses them. Answers whether it was
    /// running.
    pub async fn pause(&self, name_or_id: &str) -> Result<bool, SiloError> {
        let sandbox = self.get(name_or_id)?;
        if !self.stop_keeps_processes(&sandbox) {
            return Err(SiloError::NoPause {
                name: sandbox.name,
                backend: sandbox.backend,
            });
        }
        self.stop(&sandbox.id).await
    }

    /// Whether stopping this sandbox keeps its processes (a pause).
    pub fn stop_keeps_processes(&self, sandbox: &SandboxRecord) -> bool {
        let key = self.sandbox_key(sandbox);
        self.backend(sandbox.backend)
            .stop_keeps_processes(&machine(sandbox, &key))
    }

    /// Stops and deletes a sandbox. Its events stay in the log.
    pub async fn remove(&self, name_or_id: &str) -> Result<SandboxRecord, SiloError> {
        let (_lease, sandbox) = self.lease_sandbox(name_or_id, RM_OP).await?;
        let key = self.sandbox_key(&sandbox);
        self.backend_of(&sandbox)?
            .remove(machine(&sandbox, &key))
            .await
            .map_err(|e| backend_error("remove", &sandbox, e))?;
        self.db().delete_sandbox(&sandbox, &json!({}))?;
        Ok(sandbox)
    }

    /// The sandbox's events, oldest first; works for removed sandboxes too.
    pub fn events(&self, name_or_id: &str) -> Result<Vec<EventRecord>, SiloError> {
        Ok(self.db().events_of(name_or_id)?)
    }

    /// Makes sure the sandbox's agent answers, starting a stopped machine.
    /// Returns the sandbox as it is now recorded.
    pub async fn ensure_running(
        &self,
        sandbox: &SandboxRecord,
    ) -> Result<SandboxRecord, SiloError> {
        match self.status(sandbox).await? {
            MachineState::Running => Ok(sandbox.clone()),
            MachineState::Stopped => {
                let _lease = self.lease(&sandbox.name, "start").await?;
                self.start_sandbox(sandbox).await
            }
            MachineState::Missing => Err(self.gone(sandbox)),
        }
    }

    /// Why the machine of `sandbox` (as the caller read its record) is no
    /// longer there: removed by `silo rm`, replaced by a new machine (a
    /// rewind or a recreate, since the caller read the record), or gone
    /// from outside silo.
    pub(crate) fn gone(&self, sandbox: &SandboxRecord) -> SiloError {
        let name = sandbox.name.clone();
        match self.db().sandbox(&sandbox.id) {
            Err(_) => SiloError::Removed { name },
            Ok(now) if now.backend_ref != sandbox.backend_ref => SiloError::Replaced { name },
            Ok(_) => SiloError::Missing {
                name,
                backend: sandbox.backend,
            },
        }
    }

    /// Opens an exec channel to a sandbox that should be running. Does not
    /// start a stopped one (that is [`Silo::ensure_running`], or open-or-create):
    /// a stopped sandbox was stopped on purpose or by its idle timeout. When
    /// the agent cannot be reached, the error says whether the sandbox is
    /// stopped or gone rather than only that a socket refused.
    pub async fn connect(&self, sandbox: &SandboxRecord) -> Result<ExecConnection, SiloError> {
        let client = self.client(sandbox)?;
        match client.connect().await {
            Ok(connection) => Ok(connection),
            Err(source) => Err(self.unreachable(sandbox, source).await),
        }
    }

    /// Why a sandbox's agent could not be reached: removed, stopped or gone
    /// ([`Silo::down`]), else the client's own error.
    pub(crate) async fn unreachable(
        &self,
        sandbox: &SandboxRecord,
        source: ClientError,
    ) -> SiloError {
        self.down(sandbox)
            .await
            .unwrap_or_else(|| SiloError::Agent {
                name: sandbox.name.clone(),
                source: Box::new(source),
            })
    }

    /// Why `sandbox` cannot be reached, if it is down: removed by silo
    /// (`silo rm` under way, or its record gone, whatever its machine still
    /// shows), stopped, or its machine gone. `None` when its machine runs.
    pub(crate) async fn down(&self, sandbox: &SandboxRecord) -> Option<SiloError> {
        let removing = self
            .db()
            .lease_holder(&sandbox.name, &self.fleet().host)
            .ok()
            .flatten()
            .is_some_and(|holder| holder.op == RM_OP);
        if removing || self.db().sandbox(&sandbox.id).is_err() {
            return Some(SiloError::Removed {
                name: sandbox.name.clone(),
            });
        }
        match self.status(sandbox).await {
            Ok(MachineState::Stopped) => Some(SiloError::NotRunning {
                name: sandbox.name.clone(),
            }),
            Ok(MachineState::Missing) => Some(self.gone(sandbox)),
            _ => None,
        }
    }

    /// A client for the sandbox's agent (it does not check that the agent is up).
    pub fn client(&self, sandbox: &SandboxRecord) -> Result<AgentClient, SiloError> {
        let key = self.sandbox_key(sandbox);
        let endpoint = self
            .backend_of(sandbox)?
            .endpoint(machine(sandbox, &key))
            .map_err(|e| backend_error("reach", sandbox, e))?;
        Ok(AgentClient::new(endpoint, key).for_sandbox(&sandbox.name))
    }

    /// Where `port` inside the sandbox is reached from the host, as its
    /// backend routes it.
    pub(crate) async fn port_url(
        &self,
        sandbox: &SandboxRecord,
        port: u16,
    ) -> Result<PortUrl, SiloError> {
        let key = self.sandbox_key(sandbox);
        self.backend_of(sandbox)?
            .port_url(machine(sandbox, &key), port)
            .await
            .map_err(|e| match e {
                BackendError::NoPortRoute(refused) => SiloError::NoPortRoute(refused),
                e => backend_error("reach a port of", sandbox, e),
            })
    }

    /// The key this sandbox's agent accepts.
    pub fn sandbox_key(&self, sandbox: &SandboxRecord) -> Key {
        derive_sandbox_key(&self.0.master, &sandbox.id)
    }

    async fn start_sandbox(&self, sandbox: &SandboxRecord) -> Result<SandboxRecord, SiloError> {
        Ok(self.start_machine(sandbox).await?.sandbox)
    }

    async fn start_machine(&self, sandbox: &SandboxRecord) -> Result<Started, SiloError> {
        let key = self.sandbox_key(sandbox);
        let backend = self.backend_of(sandbox)?;
        if !backend.stop_keeps_files() && self.status(sandbox).await? != MachineState::Running {
            return self.start_anew(sandbox).await;
        }
        let started = backend
            .start(machine(sandbox, &key))
            .await
            .map_err(|e| backend_error("start", sandbox, e))?;
        // Another process may have started it a moment ago; only the one that
        // did logs it.
        let event = (!started.was_running).then(|| {
            let detail = json!({ "backend_ref": without_secrets(&started.backend_ref) });
            (EventKind::Started, detail)
        });
        let sandbox = self
            .db()
            .update_backend_ref(sandbox, &started.backend_ref, event)?;
        Ok(Started {
            sandbox,
            was_running: started.was_running,
        })
    }

    /// Starts a sandbox whose stop deleted its machine: a new machine from
    /// its latest snapshot (the one its stop took), or a fresh one when it
    /// has none (its machine ended by itself before any snapshot).
    async fn start_anew(&self, sandbox: &SandboxRecord) -> Result<Started, SiloError> {
        let sandbox = match self.restore_latest(sandbox, "started").await? {
            Some(restored) => restored.sandbox,
            None => {
                let spec = sandbox.spec.clone();
                self.recreate(
                    sandbox.clone(),
                    spec,
                    "started with no snapshot",
                    Vec::new(),
                )
                .await?
                .sandbox
            }
        };
        Ok(Started {
            sandbox,
            was_running: false,
        })
    }

    /// Validates or draws a name and records the sandbox under a fresh id.
    /// `origin` is the snapshot its first machine is made from (a fork).
    fn reserve(
        &self,
        request: CreateRequest,
        origin: Option<String>,
    ) -> Result<SandboxRecord, SiloError> {
        let id = new_sandbox_id()?;
        if let Some(name) = request.name {
            validate_name(&name)?;
            let new = NewSandbox {
                id,
                name,
                spec: request.spec,
                origin_snapshot: origin,
                host: self.fleet().host.clone(),
            };
            return Ok(self.db().insert_sandbox(&new)?);
        }
        let mut last = None;
        for attempt in 0..NAME_ATTEMPTS {
            let new = NewSandbox {
                id: id.clone(),
                name: generated_name(attempt)?,
                spec: request.spec.clone(),
                origin_snapshot: origin.clone(),
                host: self.fleet().host.clone(),
            };
            match self.db().insert_sandbox(&new) {
                Ok(sandbox) => return Ok(sandbox),
                Err(StateError::NameTaken(name)) => last = Some(name),
                Err(other) => return Err(other.into()),
            }
        }
        Err(StateError::NameTaken(last.unwrap_or_default()).into())
    }

    fn backend(&self, kind: BackendKind) -> AnyBackend {
        self.0.backends.get(kind)
    }

    /// The backend that operates `sandbox`'s machine, if this host may:
    /// a container or local process made on another host of the fleet is
    /// out of this host's reach, and left alone.
    fn backend_of(&self, sandbox: &SandboxRecord) -> Result<AnyBackend, SiloError> {
        if !self.fleet().may_operate(sandbox) {
            return Err(SiloError::OtherHost {
                name: sandbox.name.clone(),
                host: sandbox.host.clone().unwrap_or_default(),
                backend: sandbox.backend,
            });
        }
        Ok(self.backend(sandbox.backend))
    }

    /// Every backend of this home.
    fn backends(&self) -> &Backends {
        &self.0.backends
    }

    /// The Docker backend, whose engine holds snapshot images.
    pub(crate) fn docker_backend(&self) -> &crate::backend::DockerBackend {
        self.0.backends.docker()
    }

    fn db(&self) -> MutexGuard<'_, StateDb> {
        // A panic while holding the lock cannot leave SQLite inconsistent
        // (transactions roll back), so a poisoned lock is still usable.
        self.0
            .db
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Silo {
    /// The machine a backend is to make for `sandbox`: what [`machine`]
    /// says, and whether an earlier machine of its template carried the
    /// agent.
    fn machine_to_make<'a>(&self, sandbox: &'a SandboxRecord, key: &'a Key) -> Machine<'a> {
        Machine {
            agent_in_image: self.template_carries_agent(sandbox),
            ..machine(sandbox, key)
        }
    }
}

fn machine<'a>(sandbox: &'a SandboxRecord, key: &'a Key) -> Machine<'a> {
    Machine {
        id: &sandbox.id,
        name: &sandbox.name,
        spec: &sandbox.spec,
        backend_ref: &sandbox.backend_ref,
        key,
        image: None,
        agent_in_image: false,
        from_memory: false,
    }
}

fn backend_error(op: &'static str, sandbox: &SandboxRecord, source: BackendError) -> SiloError {
    SiloError::Backend {
        op,
        name: sandbox.name.clone(),
        backend: sandbox.backend,
        source: Box::new(source),
    }
}

/// The master key every host sharing `db` derives sandbox keys from:
/// recorded in the database by the first host that opened it.
fn shared_master_key(db: &mut StateDb) -> Result<Key, SiloError> {
    let unreadable = |source| MasterKeyError::Shared { source };
    let candidate = Key::generate().map_err(unreadable)?;
    let hex = db.shared_master_key(&candidate.to_hex())?;
    Ok(Key::from_hex(&hex).map_err(unreadable)?)
}

/// Why a [`Silo`] operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SiloError {
    /// The home directory is unusable.
    #[error(transparent)]
    Home(#[from] HomeError),
    /// The state database failed or refused.
    #[error(transparent)]
    State(#[from] StateError),
    /// The master key is unusable.
    #[error(transparent)]
    MasterKey(#[from] MasterKeyError),
    /// The fleet's shared store cannot be used as configured.
    #[error(transparent)]
    SharedStore(#[from] crate::store::SharedError),
    /// A name or id could not be made or accepted.
    #[error(transparent)]
    Naming(#[from] NamingError),
    /// A port of a sandbox has no route from the host on its backend.
    #[error(transparent)]
    NoPortRoute(NoPortRoute),
    /// A backend operation failed.
    #[error("cannot {op} sandbox {name:?} ({backend} backend)")]
    Backend {
        /// The operation.
        op: &'static str,
        /// The sandbox.
        name: String,
        /// Its backend.
        backend: BackendKind,
        /// Why (boxed: backend errors are large and this enum is returned everywhere).
        #[source]
        source: Box<BackendError>,
    },
    /// A memory fork was asked of a backend that cannot make one.
    #[error(transparent)]
    NoMemoryFork(#[from] NoMemoryFork),
    /// Pause was asked of a backend whose stop loses processes.
    #[error(
        "sandbox {name:?} runs on the {backend} backend, where a stop ends its processes; \
         `silo stop {name}` stops it anyway (files kept); e2b and Daytona VM sandboxes \
         (linux-vm) pause with memory"
    )]
    NoPause {
        /// The sandbox.
        name: String,
        /// Its backend.
        backend: BackendKind,
    },
    /// The sandbox's machine lives on another host of the fleet.
    #[error(
        "sandbox {name:?} runs on host {host:?} ({backend} backend), which alone can reach \
         its machine; run this there (SILO_HOST={host})"
    )]
    OtherHost {
        /// The sandbox.
        name: String,
        /// The host that holds its machine.
        host: String,
        /// Its backend.
        backend: BackendKind,
    },
    /// The sandbox exists but is stopped.
    #[error("sandbox {name:?} is stopped; start it with `silo start {name}`")]
    NotRunning {
        /// The sandbox.
        name: String,
    },
    /// The sandbox's agent refused or failed a request.
    #[error("cannot talk to the agent of sandbox {name:?}")]
    Agent {
        /// The sandbox.
        name: String,
        /// Why (boxed: client errors are large).
        #[source]
        source: Box<ClientError>,
    },
    /// The sandbox was removed by silo (`silo rm`, the library's remove, a
    /// Python `kill()`) before or while a call to it ran.
    #[error("sandbox {name:?} has been removed")]
    Removed {
        /// The sandbox.
        name: String,
    },
    /// The sandbox's machine was replaced by a new one (a rewind onto a new
    /// machine, a recreate) while a call to the old one was under way.
    #[error(
        "sandbox {name:?} got a new machine (a rewind or a recreate) while this call was \
         under way; try it again"
    )]
    Replaced {
        /// The sandbox.
        name: String,
    },
    /// The sandbox's machine no longer exists.
    #[error(
        "sandbox {name:?} no longer exists on the {backend} backend (removed outside silo?); \
         `silo up {name}` makes it a fresh one, `silo rm {name}` forgets it"
    )]
    Missing {
        /// The sandbox.
        name: String,
        /// Its backend.
        backend: BackendKind,
    },
    /// The spec asks for something its backend cannot do.
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    /// `up` found the sandbox with another spec and was not asked to recreate it.
    #[error(
        "sandbox {name:?} exists with a different spec: {}; pass --recreate to replace its \
         machine (files in it are lost), or choose another name",
        differences.join("; ")
    )]
    SpecDrift {
        /// The sandbox.
        name: String,
        /// One line per differing setting, stored value first.
        differences: Vec<String>,
    },
    /// `up` without a spec for a sandbox that does not exist.
    #[error("no sandbox named {name:?}; give an image (--image) or a backend to create it")]
    NeedsSpec {
        /// The name asked for.
        name: String,
    },
    /// Another process kept the sandbox's lease for too long.
    #[error("sandbox {name:?} is busy: {holder} still holds it after {waited:?}; try again")]
    Busy {
        /// The sandbox.
        name: String,
        /// Who holds the lease, in words.
        holder: String,
        /// How long we waited.
        waited: std::time::Duration,
    },
    /// A snapshot, rewind, fork or store operation failed.
    #[error(transparent)]
    Snapshot(Box<SnapshotError>),
    /// A pool request was refused.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// This process cannot be identified for a lease (no `/proc`).
    #[error("cannot identify this process for a lease: /proc is unreadable")]
    NoProcessIdentity,
}

impl SiloError {
    /// The sandbox's image is not on its container engine and could not be
    /// pulled. (The backend's error is transparent, so a walk of the error's
    /// sources never meets it; this asks it directly.)
    pub fn is_missing_image(&self) -> bool {
        let Self::Backend { source, .. } = self else {
            return false;
        };
        matches!(
            source.as_ref(),
            BackendError::Docker(DockerError::ImageUnavailable { .. })
                | BackendError::Podman(PodmanError(DockerError::ImageUnavailable { .. }))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Silo) {
        let dir = tempfile::tempdir().unwrap();
        let silo = Silo::open(Some(dir.path().join("home"))).unwrap();
        (dir, silo)
    }

    #[test]
    fn opening_makes_a_private_home_and_keeps_its_key() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, silo) = open();
        let mode = std::fs::metadata(silo.home().root())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let sandbox = SandboxRecord {
            id: "sbx-00000000000a".into(),
            name: "a".into(),
            backend: BackendKind::Local,
            spec: SandboxSpec::default(),
            spec_hash: String::new(),
            backend_ref: json!({}),
            created_at_ms: 0,
            updated_at_ms: 0,
            origin_snapshot: None,
            baseline: None,
            checkpoint: None,
            host: None,
        };
        let key = silo.sandbox_key(&sandbox);
        drop(silo);
        let again = Silo::open(Some(dir.path().join("home"))).unwrap();
        assert_eq!(again.sandbox_key(&sandbox), key);
    }

    #[tokio::test]
    async fn hosts_of_one_shared_state_share_keys_and_keep_to_their_machines() {
        let Some((_schema, url)) = crate::state::test_support::temp_postgres() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let open = |host: &str| {
            Silo::open_with(SiloOptions {
                home: Some(dir.path().join(host)),
                fleet: Some(Fleet {
                    host: host.into(),
                    state: crate::state::StateLocation::Postgres(url.clone()),
                    store: None,
                }),
                ..SiloOptions::default()
            })
            .unwrap()
        };
        let (a, b) = (open("a"), open("b"));
        let new = |id: &str, name: &str, backend| NewSandbox {
            id: id.into(),
            name: name.into(),
            spec: SandboxSpec::new(backend),
            origin_snapshot: None,
            host: "a".into(),
        };
        let local = a
            .db()
            .insert_sandbox(&new("sbx-00000000000a", "on-a", BackendKind::Local))
            .unwrap();
        let remote = a
            .db()
            .insert_sandbox(&new("sbx-00000000000b", "vm", BackendKind::E2b))
            .unwrap();
        // One master key for the fleet: b can reach a provider VM a made.
        assert_eq!(a.sandbox_key(&remote), b.sandbox_key(&remote));
        // A name is the fleet's: taken on a, refused on b.
        let err = b
            .db()
            .insert_sandbox(&NewSandbox {
                host: "b".into(),
                ..new("sbx-00000000000c", "on-a", BackendKind::Local)
            })
            .unwrap_err();
        assert!(matches!(err, StateError::NameTaken(_)), "{err}");
        // a's local machine is a's to operate; b is told where it is.
        let err = b.remove("on-a").await.unwrap_err();
        assert!(
            matches!(&err, SiloError::OtherHost { host, .. } if host == "a"),
            "{err}"
        );
        assert!(err.to_string().contains(r#"host "a""#), "{err}");
        assert_eq!(b.get("on-a").unwrap(), local, "refused, and left as it was");
        let hosts: Vec<String> = b.hosts().unwrap().into_iter().map(|h| h.name).collect();
        assert_eq!(hosts, ["a", "b"]);
    }

    #[tokio::test]
    async fn bad_names_and_unknown_sandboxes_are_refused_before_any_work() {
        let (_dir, silo) = open();
        let err = silo
            .create(CreateRequest::new(BackendKind::Local).name("no spaces"))
            .await
            .unwrap_err();
        assert!(matches!(err, SiloError::Naming(_)), "{err}");
        let err = silo.remove("ghost").await.unwrap_err();
        assert_eq!(err.to_string(), r#"unknown sandbox "ghost""#);
        assert!(silo.list().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_failed_create_leaves_only_its_history() {
        let dir = tempfile::tempdir().unwrap();
        let silo = Silo::open_with(SiloOptions {
            home: Some(dir.path().join("home")),
            agent: Some(dir.path().join("no-such-agent")),
            ..SiloOptions::default()
        })
        .unwrap();
        let err = silo
            .create(CreateRequest::new(BackendKind::Local).name("a"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, SiloError::Backend { op: "create", .. }),
            "{err}"
        );
        assert!(silo.list().unwrap().is_empty());
        let kinds: Vec<String> = silo
            .events("a")
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["created", "removed"]);
        assert!(
            !silo
                .home()
                .root()
                .join("sandboxes")
                .read_dir()
                .unwrap()
                .any(|_| true)
        );
    }
}
