//! The Docker backend: each sandbox is one container on a Docker engine,
//! driven through the Engine API (bollard), never the docker CLI.
//!
//! Any image works as it is: the static agent is bind-mounted read-only and
//! runs as the container's PID 1 (see `config`). Each sandbox owns
//! `$SILO_HOME/sandboxes/<id>/run/`, mounted at `/.silo/run`: the agent's
//! socket lives there, so the controller reaches it through the file system
//! even with `--network none`, and the sandbox key is written there just
//! before each start and deleted once the agent has read it and answered.
//!
//! The container is the truth several `silo` processes agree on. It is
//! found by its name (`silo-<sandbox id>`), and a container is only ever
//! treated as the sandbox's if its labels name this home and this sandbox.
//! Containers outlive the `silo` process that made them; only `remove`
//! deletes one. The engine is reached lazily: running a command in a
//! sandbox talks to its agent's socket alone, never to the engine.
//!
//! The same code drives any engine that speaks the Docker Engine API: an
//! engine [`Flavor`] (the backend's kind, its socket, its extra container
//! settings) is all another one (Podman, in `backend/podman`) brings.
//!
//! Layout: `engine` (flavors, connection, version negotiation, logs), `config` (the
//! create request), `labels` (names, labels, home identity), `image`
//! (inspect or pull), `ready` (waiting for the agent), `sweep` (containers of this home with no sandbox),
//! `snapshot` (container facts, image export and import for snapshots), `error`.

mod config;
mod engine;
mod error;
mod image;
mod labels;
mod memory;
mod ready;
pub mod security;
mod snapshot;
mod sweep;
mod upper;

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bollard::Docker;
use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, RenameContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use serde::{Deserialize, Serialize};

use super::{
    Backend, BackendError, LastExit, Machine, MachineStarted, MachineState, NoPortRoute, PortUrl,
    SnapshotWay,
};
use crate::agent_binary::{AgentLocator, is_static_executable};
use crate::client::{AgentClient, Endpoint};
use crate::fsutil::{remove_if_present, write_atomic};
use crate::home::{Home, HomeId, create_private_dir};
use crate::spec::{BackendKind, SpecError};
use crate::timestamp::rfc3339_to_unix_ms;

pub use super::labels::{LABEL_HOME, LABEL_SANDBOX_ID, LABEL_SANDBOX_NAME, LABEL_SPEC_HASH};
pub use config::STOP_TIMEOUT_SECS;
pub use engine::{DOCKER, Flavor, LONG_REQUEST_TIMEOUT, connect, connect_to, engine_host};
pub use error::DockerError;
pub use image::ensure_image;
pub use labels::container_name;
pub use snapshot::{ContainerFacts, EngineImages, SnapshotLabels};
pub use upper::UpperLayer;

pub(crate) use error::is_not_found;
use error::{api, io, is_conflict, is_missing_image, is_unknown_runtime};

/// Longest socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Mode of the run directory. The agent may run as any user of the image
/// (`--user`, user-namespace remapping), so it must be able to create its
/// socket there; the host side is guarded by `$SILO_HOME`'s own 0700.
const RUN_DIR_MODE: u32 = 0o777;
/// Mode of the key file, for the same reason; it exists only while the agent starts.
const KEY_MODE: u32 = 0o644;

/// Runs sandboxes as containers on the Docker engine named by `DOCKER_HOST`
/// (or, with another [`Flavor`], on another engine with the same API).
#[derive(Debug, Clone)]
pub struct DockerBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    home: Home,
    agent: Arc<AgentLocator>,
    /// Which engine this is.
    flavor: Flavor,
    /// Connected on first use, so commands that never need the engine
    /// (`silo exec` on a running sandbox) never pay for it.
    engine: tokio::sync::OnceCell<Docker>,
    home_id: HomeId,
    /// The agent binary, once found and checked to be static.
    agent_path: OnceLock<PathBuf>,
    /// The engine's root directory, once checked to take memory checkpoints.
    checkpoint_root: tokio::sync::OnceCell<PathBuf>,
}

/// The Docker backend's `backend_ref`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DockerRef {
    container: String,
    container_id: String,
    socket: PathBuf,
}

/// What a lookup of a sandbox's container found.
enum Found {
    Ours(Box<ContainerInspectResponse>),
    /// A container with the sandbox's name, labelled for another home.
    Foreign(String),
    Missing,
}

/// The files of one sandbox on the host.
struct Paths {
    dir: PathBuf,
    run: PathBuf,
    socket: PathBuf,
    key: PathBuf,
}

impl Paths {
    fn new(home: &Home, id: &str) -> Self {
        let dir = home.sandbox_dir(id);
        let run = dir.join("run");
        Self {
            socket: run.join("agent.sock"),
            key: run.join("agent.key"),
            run,
            dir,
        }
    }
}

impl DockerBackend {
    /// A Docker backend keeping sandbox directories under `home`, mounting the agent `agent` finds.
    pub fn new(home: Home, agent: Arc<AgentLocator>) -> Self {
        Self::with_flavor(home, agent, DOCKER)
    }

    /// The same on the engine `flavor` names.
    pub fn with_flavor(home: Home, agent: Arc<AgentLocator>, flavor: Flavor) -> Self {
        Self {
            inner: Arc::new(Inner {
                home_id: HomeId::of(&home),
                home,
                agent,
                flavor,
                engine: tokio::sync::OnceCell::new(),
                agent_path: OnceLock::new(),
                checkpoint_root: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// The Docker backend of a home.
    pub(crate) fn open(setup: &super::BackendSetup) -> Self {
        Self::new(setup.home.clone(), Arc::clone(&setup.agent))
    }

    /// The engine, connected on first use, at the API version negotiated
    /// with it by this home's last process on the same engine, or now.
    pub async fn engine(&self) -> Result<&Docker, DockerError> {
        let flavor = &self.inner.flavor;
        let remembered = self.inner.home.engine_api_version(flavor.name);
        self.inner
            .engine
            .get_or_try_init(|| engine::connect_remembering(flavor, &remembered))
            .await
    }

    /// Which engine this backend drives.
    pub fn flavor(&self) -> &Flavor {
        &self.inner.flavor
    }

    /// This home's identity, as its containers' [`LABEL_HOME`] carries it.
    pub fn home_id(&self) -> Result<String, DockerError> {
        let home_id = &self.inner.home_id;
        home_id.get().map_err(io("read or create", home_id.path()))
    }

    fn paths(&self, machine: &Machine<'_>) -> Paths {
        Paths::new(&self.inner.home, machine.id)
    }

    fn client(paths: &Paths, machine: &Machine<'_>) -> AgentClient {
        AgentClient::new(Endpoint::Unix(paths.socket.clone()), machine.key.clone())
    }

    /// The agent binary to mount; it must be static to run in any image.
    pub fn agent_binary(&self) -> Result<PathBuf, DockerError> {
        if let Some(path) = self.inner.agent_path.get() {
            return Ok(path.clone());
        }
        let agent = self.inner.agent.get()?;
        let bytes = fs::read(&agent.path).map_err(io("read", &agent.path))?;
        if !is_static_executable(&bytes) {
            return Err(DockerError::AgentNotStatic { path: agent.path });
        }
        Ok(self.inner.agent_path.get_or_init(|| agent.path).clone())
    }

    /// Looks the sandbox's container up by name and checks its labels.
    async fn find(&self, engine: &Docker, machine: &Machine<'_>) -> Result<Found, DockerError> {
        let name = container_name(machine.id);
        let info = match engine.inspect_container(&name, None).await {
            Ok(info) => info,
            Err(error) if is_not_found(&error) => return Ok(Found::Missing),
            Err(error) => return Err(api(format!("inspect container {name}"))(error)),
        };
        let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        let home = labels.get(LABEL_HOME).cloned().unwrap_or_default();
        if home != self.home_id()?
            || labels.get(LABEL_SANDBOX_ID).map(String::as_str) != Some(machine.id)
        {
            return Ok(Found::Foreign(home));
        }
        Ok(Found::Ours(Box::new(info)))
    }

    /// The sandbox's container, which must exist and be this sandbox's.
    async fn ours(
        &self,
        engine: &Docker,
        machine: &Machine<'_>,
    ) -> Result<Box<ContainerInspectResponse>, DockerError> {
        let container = container_name(machine.id);
        match self.find(engine, machine).await? {
            Found::Ours(info) => Ok(info),
            Found::Foreign(owner) => Err(DockerError::Foreign { container, owner }),
            Found::Missing => Err(DockerError::Missing { container }),
        }
    }

    fn backend_ref(
        paths: &Paths,
        machine: &Machine<'_>,
        container_id: String,
    ) -> serde_json::Value {
        let docker = DockerRef {
            container: container_name(machine.id),
            container_id,
            socket: paths.socket.clone(),
        };
        serde_json::to_value(docker).unwrap_or_default()
    }

    /// Starts the (created or stopped) container and waits for its agent.
    /// The key is on disk only from just before the start until the agent
    /// has answered (or failed to), so commands in the sandbox cannot read it.
    async fn boot(
        &self,
        engine: &Docker,
        paths: &Paths,
        machine: &Machine<'_>,
    ) -> Result<(), DockerError> {
        self.boot_from(engine, paths, machine, None).await
    }

    /// [`Self::boot`], from the engine's checkpoint `checkpoint` of the
    /// container when one is named (a memory restore: the restored agent
    /// wakes on the key written here).
    async fn boot_from(
        &self,
        engine: &Docker,
        paths: &Paths,
        machine: &Machine<'_>,
        checkpoint: Option<&str>,
    ) -> Result<(), DockerError> {
        let name = container_name(machine.id);
        prepare_run_dir(paths)?;
        write_key(paths, machine)?;
        let booted = async {
            let engine = match checkpoint {
                Some(checkpoint) => &with_checkpoint(engine, checkpoint),
                None => engine,
            };
            engine
                .start_container(&name, None)
                .await
                .map_err(api(format!("start container {name}")))?;
            ready::wait_for_agent(engine, &name, &Self::client(paths, machine)).await
        }
        .await;
        forget_key(paths)?;
        booted
    }

    async fn create_container(
        &self,
        engine: &Docker,
        paths: &Paths,
        machine: &Machine<'_>,
    ) -> Result<String, DockerError> {
        machine.spec.check()?;
        if let (Some(runtime), Some(why)) = (&machine.spec.runtime, self.inner.flavor.no_runtime) {
            return Err(SpecError::Invalid {
                setting: "runtime",
                reason: format!("{runtime:?}: {why}"),
            }
            .into());
        }
        let image_name = config::image_ref(machine).to_owned();
        // The image's config matters only for `--workload image`; otherwise
        // a missing image shows up as the create's 404, saving a round trip.
        let image = if machine.spec.workload_from_image {
            Some(image::ensure_image(engine, &self.inner.flavor, &image_name).await?)
        } else {
            None
        };
        let agent = self.agent_binary()?;
        for bind in &machine.spec.binds {
            let source = PathBuf::from(&bind.source);
            if !source.exists() {
                return Err(DockerError::BindSource { path: source });
            }
        }
        create_private_dir(&paths.dir).map_err(io("create", &paths.dir))?;
        prepare_run_dir(paths)?;
        let home_id = self.home_id()?;
        let body = config::create_body(&config::Plan {
            machine,
            image: image.as_ref(),
            agent: &agent,
            run_dir: &paths.run,
            home_id: &home_id,
            ulimits: self.inner.flavor.ulimits,
        })?;
        let name = container_name(machine.id);
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        match engine
            .create_container(Some(options.clone()), body.clone())
            .await
        {
            Ok(created) => return Ok(created.id),
            Err(error) if is_missing_image(&error) => {
                image::ensure_image(engine, &self.inner.flavor, &image_name).await?;
                return engine
                    .create_container(Some(options), body)
                    .await
                    .map(|created| created.id)
                    .map_err(api(format!("create container {name}")));
            }
            Err(error) if is_conflict(&error) => {}
            Err(error) if is_unknown_runtime(&error) => {
                return Err(DockerError::UnknownRuntime {
                    runtime: machine.spec.runtime.clone().unwrap_or_default(),
                });
            }
            Err(error) => return Err(api(format!("create container {name}"))(error)),
        }
        // The name is taken: a leftover of this sandbox from an interrupted
        // create is replaced; anyone else's container is left alone.
        match self.find(engine, machine).await? {
            Found::Foreign(owner) => {
                return Err(DockerError::Foreign {
                    container: name,
                    owner,
                });
            }
            Found::Ours(_) | Found::Missing => remove_container(engine, &name).await?,
        }
        let created = engine
            .create_container(Some(options), body)
            .await
            .map_err(api(format!("create container {name}")))?;
        Ok(created.id)
    }

    /// Replaces the sandbox's container with a new one made from
    /// `machine.image` (rewind, restore), keeping the sandbox's directory.
    /// Removing a running container costs about what starting one does (it
    /// is killed first), so the old one is renamed aside and removed while
    /// the new one starts. Its socket is unlinked before that, so nothing
    /// reaches the old agent meanwhile: the socket path leads to the new
    /// agent or to nothing.
    pub async fn replace(&self, machine: Machine<'_>) -> Result<serde_json::Value, DockerError> {
        let paths = self.paths(&machine);
        check_socket_path(&paths)?;
        let engine = self.engine().await?;
        let name = container_name(machine.id);
        let old = match self.find(engine, &machine).await? {
            Found::Ours(info) => info.id,
            Found::Foreign(owner) => {
                return Err(DockerError::Foreign {
                    container: name,
                    owner,
                });
            }
            Found::Missing => None,
        };
        if let Some(old) = &old {
            remove_if_present(&paths.socket).map_err(io("remove", &paths.socket))?;
            let aside = format!("{name}-replaced-{}", old.get(..12).unwrap_or(old));
            let options = RenameContainerOptionsBuilder::new().name(&aside).build();
            engine
                .rename_container(old, options)
                .await
                .map_err(api(format!("rename container {name} to {aside}")))?;
        }
        let removal = async {
            match &old {
                Some(old) => remove_container(engine, old).await,
                None => Ok(()),
            }
        };
        let made = async {
            let id = self.create_container(engine, &paths, &machine).await?;
            self.boot(engine, &paths, &machine).await?;
            Ok::<_, DockerError>(id)
        };
        let (removed, made) = tokio::join!(removal, made);
        if let Err(error) = removed {
            tracing::warn!(container = name, "removing the replaced container: {error}");
        }
        Ok(Self::backend_ref(&paths, &machine, made?))
    }
}

impl Backend for DockerBackend {
    fn kind(&self) -> BackendKind {
        self.inner.flavor.kind
    }

    fn snapshots(&self) -> Option<SnapshotWay> {
        Some(SnapshotWay::EngineImages(EngineImages(self.clone())))
    }

    async fn sweep_orphans(
        &self,
        live: &std::collections::HashSet<String>,
        dry_run: bool,
    ) -> Result<Vec<String>, BackendError> {
        match self.sweep(live, dry_run).await {
            Ok(names) => Ok(names),
            // No engine, so no containers to collect.
            Err(DockerError::Unreachable { .. } | DockerError::Unresponsive { .. }) => {
                Ok(Vec::new())
            }
            Err(error) => Err(error.into()),
        }
    }

    async fn create(&self, machine: Machine<'_>) -> Result<serde_json::Value, BackendError> {
        let paths = self.paths(&machine);
        check_socket_path(&paths)?;
        let engine = self.engine().await?;
        let id = self.create_container(engine, &paths, &machine).await?;
        self.boot(engine, &paths, &machine).await?;
        Ok(Self::backend_ref(&paths, &machine, id))
    }

    async fn status(&self, machine: Machine<'_>) -> Result<MachineState, BackendError> {
        let engine = self.engine().await?;
        Ok(match self.find(engine, &machine).await? {
            Found::Ours(info) if ready::is_running(&info) => {
                let paths = self.paths(&machine);
                if ready::healthy(&Self::client(&paths, &machine)).await {
                    // A process killed while booting this container left its
                    // key behind; the agent has read it, so it goes now.
                    remove_if_present(&paths.key).map_err(io("remove", &paths.key))?;
                    MachineState::Running
                } else {
                    MachineState::Stopped
                }
            }
            Found::Ours(_) => MachineState::Stopped,
            Found::Foreign(_) | Found::Missing => MachineState::Missing,
        })
    }

    async fn start(&self, machine: Machine<'_>) -> Result<MachineStarted, BackendError> {
        let engine = self.engine().await?;
        let name = container_name(machine.id);
        let info = self.ours(engine, &machine).await?;
        let paths = self.paths(&machine);
        let id = info.id.clone().unwrap_or_default();
        if ready::is_running(&info) {
            if ready::healthy(&Self::client(&paths, &machine)).await {
                return Ok(MachineStarted {
                    backend_ref: Self::backend_ref(&paths, &machine, id),
                    was_running: true,
                });
            }
            tracing::warn!(
                container = name,
                "agent is not answering; restarting its container"
            );
            stop_container(engine, &name).await?;
        }
        self.boot(engine, &paths, &machine).await?;
        Ok(MachineStarted {
            backend_ref: Self::backend_ref(&paths, &machine, id),
            was_running: false,
        })
    }

    async fn stop(&self, machine: Machine<'_>) -> Result<bool, BackendError> {
        let engine = self.engine().await?;
        match self.find(engine, &machine).await? {
            Found::Ours(info) if ready::is_running(&info) => {
                stop_container(engine, &container_name(machine.id)).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn remove(&self, machine: Machine<'_>) -> Result<(), BackendError> {
        let engine = self.engine().await?;
        if let Found::Ours(_) = self.find(engine, &machine).await? {
            remove_container(engine, &container_name(machine.id)).await?;
        }
        let dir = self.paths(&machine).dir;
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DockerError::Io {
                what: "remove",
                path: dir,
                source: e,
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// Refuses a socket path that is not a socket: the run directory is
    /// writable from inside the sandbox, and a symlink planted there would
    /// otherwise send the controller's requests to a host socket of the
    /// sandbox's choosing.
    fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError> {
        let socket = self.paths(&machine).socket;
        match fs::symlink_metadata(&socket) {
            Ok(meta) if !meta.file_type().is_socket() => {
                Err(DockerError::SocketReplaced { path: socket }.into())
            }
            _ => Ok(Endpoint::Unix(socket)),
        }
    }

    async fn port_url(&self, machine: Machine<'_>, port: u16) -> Result<PortUrl, BackendError> {
        Err(NoPortRoute {
            name: machine.name.to_owned(),
            port,
            why: "a docker sandbox publishes no ports \
                  (run the client inside it, or use a local, e2b or daytona sandbox)",
        }
        .into())
    }

    async fn last_exit(&self, machine: Machine<'_>) -> Result<Option<LastExit>, BackendError> {
        let engine = self.engine().await?;
        let Found::Ours(info) = self.find(engine, &machine).await? else {
            return Ok(None);
        };
        if ready::is_running(&info) {
            return Ok(None);
        }
        let state = info.state.unwrap_or_default();
        Ok(state
            .finished_at
            .as_deref()
            .and_then(rfc3339_to_unix_ms)
            .map(|at_ms| LastExit {
                at_ms,
                clean: state.exit_code == Some(0) && state.oom_killed != Some(true),
            }))
    }
}

/// Refuses a sandbox whose socket path the kernel would not accept.
fn check_socket_path(paths: &Paths) -> Result<(), DockerError> {
    let len = paths.socket.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(DockerError::SocketPathTooLong {
            path: paths.socket.clone(),
            len,
            max: MAX_SOCKET_PATH,
        });
    }
    Ok(())
}

/// Creates the run directory (if needed) with a mode the agent can use
/// whatever user it runs as.
/// Writes the sandbox key for the agent a start boots or a restore wakes.
fn write_key(paths: &Paths, machine: &Machine<'_>) -> Result<(), DockerError> {
    write_atomic(
        &paths.key,
        format!("{}\n", machine.key.to_hex()).as_bytes(),
        KEY_MODE,
    )
    .map_err(io("write", &paths.key))
}

/// Removes the key file once the agent has answered (or failed to).
fn forget_key(paths: &Paths) -> Result<(), DockerError> {
    remove_if_present(&paths.key).map_err(io("remove", &paths.key))
}

/// A client of the same engine whose container starts name `checkpoint`
/// (the Engine API's `checkpoint` query parameter, which bollard's start
/// options do not carry).
fn with_checkpoint(engine: &Docker, checkpoint: &str) -> Docker {
    let query = format!("checkpoint={checkpoint}");
    engine.clone().with_request_modifier(move |mut request| {
        let uri = request.uri();
        if request.method() == http::Method::POST && uri.path().ends_with("/start") {
            let joined = match uri.query() {
                Some(existing) if !existing.is_empty() => {
                    format!("{}?{existing}&{query}", uri.path())
                }
                _ => format!("{}?{query}", uri.path()),
            };
            let mut parts = uri.clone().into_parts();
            if let Ok(path_and_query) = joined.parse() {
                parts.path_and_query = Some(path_and_query);
                if let Ok(rewritten) = http::Uri::from_parts(parts) {
                    *request.uri_mut() = rewritten;
                }
            }
        }
        request
    })
}

fn prepare_run_dir(paths: &Paths) -> Result<(), DockerError> {
    fs::create_dir_all(&paths.run).map_err(io("create", &paths.run))?;
    fs::set_permissions(&paths.run, fs::Permissions::from_mode(RUN_DIR_MODE))
        .map_err(io("set the mode of", &paths.run))
}

async fn stop_container(engine: &Docker, name: &str) -> Result<(), DockerError> {
    let options = StopContainerOptionsBuilder::new()
        .t(STOP_TIMEOUT_SECS as i32)
        .build();
    match engine.stop_container(name, Some(options)).await {
        Err(error) if !is_not_found(&error) => Err(api(format!("stop container {name}"))(error)),
        _ => Ok(()),
    }
}

async fn remove_container(engine: &Docker, name: &str) -> Result<(), DockerError> {
    let options = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    match engine.remove_container(name, Some(options)).await {
        Err(error) if !is_not_found(&error) => Err(api(format!("remove container {name}"))(error)),
        _ => Ok(()),
    }
}
