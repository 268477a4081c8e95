//! Memory checkpoints of a sandbox's container: the engine's checkpoint API
//! (Docker in experimental mode) over gVisor's `runsc checkpoint` and
//! `runsc restore`.
//!
//! Why the engine's API: it drives the runtime against its own state and
//! bundle, and restores into a container the engine keeps managing (stop,
//! inspect, logs), where `runsc` driven beside the engine left a container
//! the engine had already torn down. Its limits shape what is here:
//! - `--leave-running` fails in runsc 20221219 (`invalid state transition:
//!   paused => stopped`) and kills the container, so a checkpoint always
//!   stops it, and going on means restoring it at once.
//! - A custom checkpoint directory is refused ("custom checkpointdir is not
//!   supported"), so the image is copied out of, and into, the engine's
//!   own `containers/<id>/checkpoints/<name>/` under its root directory,
//!   which must be on this host (a remote engine is refused by name).
//! - runsc cannot save a socket bound to the host, so the agent lets go of
//!   its listener and connections first (the protocol's suspend), which
//!   the caller does before [`DockerBackend::checkpoint_memory`].
//! - A restore needs the file system the image saw: the container's own
//!   (a rewind puts the files back first), or one made from the snapshot
//!   taken with it (a fork). Snapshots leave the agent's own directory
//!   out, but the agent holds its cleanup journal there open (locked), so
//!   that part of it travels with the image ([`AGENT_STATE`]), read from
//!   the stopped container and written into the one restored.

use std::fs;
use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::container::CreateCheckpointOptions;
use bollard::query_parameters::{
    DownloadFromContainerOptions, StopContainerOptionsBuilder, UploadToContainerOptions,
};
use futures_util::StreamExt;

use super::error::{DockerError, api, io};
use super::labels::container_name;
use super::{DockerBackend, Found, ready};
use crate::backend::Machine;

/// The checkpoint's name at the engine: one at a time per container, gone
/// again once copied out or restored from.
const CHECKPOINT: &str = "silo-memory";
/// The file in a memory image's directory that holds the agent's own
/// files the restored agent still has open (its cleanup journal), as a tar
/// of [`AGENT_STATE_PATH`] taken through the engine.
pub const AGENT_STATE: &str = "agent-state.tar";
/// What of the agent's own directory a restore needs.
const AGENT_STATE_PATH: &str = "/.silo/cleanup";
/// Where that tar is unpacked.
const AGENT_STATE_PARENT: &str = "/.silo";
/// The runtime whose checkpoints silo can take.
const MEMORY_RUNTIME: &str = "runsc";

impl DockerBackend {
    /// Why this sandbox's memory cannot be checkpointed, if it cannot: it
    /// must run under runsc on an engine in experimental mode whose root
    /// directory this host can read.
    pub async fn memory_refusal(&self, machine: &Machine<'_>) -> Result<(), DockerError> {
        if machine.spec.runtime.as_deref() != Some(MEMORY_RUNTIME) {
            return Err(DockerError::NoMemoryRuntime {
                runtime: machine
                    .spec
                    .runtime
                    .clone()
                    .unwrap_or_else(|| "runc".to_owned()),
            });
        }
        self.checkpoints_dir_root().await.map(drop)
    }

    /// The engine's root directory, checked to take checkpoints here (read
    /// once: every checkpoint and restore needs it).
    async fn checkpoints_dir_root(&self) -> Result<PathBuf, DockerError> {
        self.inner
            .checkpoint_root
            .get_or_try_init(|| self.read_checkpoint_root())
            .await
            .cloned()
    }

    async fn read_checkpoint_root(&self) -> Result<PathBuf, DockerError> {
        let engine = self.engine().await?;
        let info = engine
            .info()
            .await
            .map_err(api("read the engine's settings".to_owned()))?;
        if info.experimental_build != Some(true) {
            return Err(DockerError::NoCheckpoints);
        }
        let root = PathBuf::from(info.docker_root_dir.unwrap_or_default());
        if !root.join("containers").is_dir() {
            return Err(DockerError::RemoteCheckpoints { root });
        }
        Ok(root)
    }

    /// Checkpoints the running container (it stops) and copies its memory
    /// image into the empty directory `into`; answers the image's bytes.
    /// The agent must be suspended: the checkpoint waits until it has let
    /// go of the host (its socket file is gone).
    pub async fn checkpoint_memory(
        &self,
        machine: Machine<'_>,
        into: &Path,
    ) -> Result<u64, DockerError> {
        let root = self.checkpoints_dir_root().await?;
        let engine = self.engine().await?;
        let (name, id) = self.container_id(engine, &machine).await?;
        wait_released(&self.paths(&machine).socket).await?;
        let options = CreateCheckpointOptions {
            checkpoint_id: CHECKPOINT.to_owned(),
            checkpoint_dir: None,
            exit: true,
        };
        // A leftover of an interrupted checkpoint would make the engine refuse.
        let _ = engine.delete_checkpoint(&name, CHECKPOINT, None).await;
        engine
            .create_checkpoint(&name, options)
            .await
            .map_err(api(format!("checkpoint container {name}")))?;
        let dir = checkpoint_dir(&root, &id);
        let copied = async {
            let image = copy_files(&dir, into)?;
            let state = save_agent_state(engine, &name, &into.join(AGENT_STATE)).await?;
            Ok(image + state)
        }
        .await;
        if let Err(error) = engine.delete_checkpoint(&name, CHECKPOINT, None).await {
            tracing::warn!(container = name, "deleting a copied checkpoint: {error}");
        }
        copied
    }

    /// Starts the stopped container from the memory image in `from` (a
    /// directory [`DockerBackend::checkpoint_memory`] filled), with the
    /// sandbox's key: the restored agent wakes on it and answers no other.
    /// A running container is killed first (its processes are replaced).
    pub async fn restore_memory(
        &self,
        machine: Machine<'_>,
        from: &Path,
    ) -> Result<(), DockerError> {
        let root = self.checkpoints_dir_root().await?;
        let engine = self.engine().await?;
        let (name, id) = self.container_id(engine, &machine).await?;
        // Its processes are replaced: no grace. The engine answers once the
        // container has stopped (a start from the image while the old one
        // still ran would find it running and restore nothing).
        let now = StopContainerOptionsBuilder::new().t(0).build();
        engine
            .stop_container(&name, Some(now))
            .await
            .map_err(api(format!("stop container {name}")))?;
        let _ = engine.delete_checkpoint(&name, CHECKPOINT, None).await;
        let dir = checkpoint_dir(&root, &id);
        copy_files(from, &dir)?;
        load_agent_state(engine, &name, &from.join(AGENT_STATE)).await?;
        let paths = self.paths(&machine);
        let started = self
            .boot_from(engine, &paths, &machine, Some(CHECKPOINT))
            .await;
        if let Err(error) = engine.delete_checkpoint(&name, CHECKPOINT, None).await {
            tracing::warn!(container = name, "deleting a restored checkpoint: {error}");
        }
        started
    }

    /// Wakes the agent of a failed checkpoint: one whose container still
    /// runs takes its key file and listens again; a stopped container is
    /// started afresh (its files kept, its processes gone).
    pub async fn wake(&self, machine: Machine<'_>) -> Result<(), DockerError> {
        let engine = self.engine().await?;
        let paths = self.paths(&machine);
        let name = container_name(machine.id);
        match self.find(engine, &machine).await? {
            Found::Ours(info) if ready::is_running(&info) => {
                super::write_key(&paths, &machine)?;
                let woken =
                    ready::wait_for_agent(engine, &name, &Self::client(&paths, &machine)).await;
                super::forget_key(&paths)?;
                woken
            }
            Found::Ours(_) => self.boot(engine, &paths, &machine).await,
            Found::Foreign(owner) => Err(DockerError::Foreign {
                container: name,
                owner,
            }),
            Found::Missing => Err(DockerError::Missing { container: name }),
        }
    }

    async fn container_id(
        &self,
        engine: &Docker,
        machine: &Machine<'_>,
    ) -> Result<(String, String), DockerError> {
        let name = container_name(machine.id);
        match self.find(engine, machine).await? {
            Found::Ours(info) => Ok((name, info.id.unwrap_or_default())),
            Found::Foreign(owner) => Err(DockerError::Foreign {
                container: name,
                owner,
            }),
            Found::Missing => Err(DockerError::Missing { container: name }),
        }
    }
}

/// Where the engine keeps container `id`'s checkpoint.
fn checkpoint_dir(root: &Path, id: &str) -> PathBuf {
    root.join("containers")
        .join(id)
        .join("checkpoints")
        .join(CHECKPOINT)
}

/// Reads the agent's own files a restore needs out of the stopped
/// container `name` into the tar file `to`; answers its bytes.
async fn save_agent_state(engine: &Docker, name: &str, to: &Path) -> Result<u64, DockerError> {
    let options = DownloadFromContainerOptions {
        path: AGENT_STATE_PATH.to_owned(),
    };
    let mut tar = Vec::new();
    let mut stream = engine.download_from_container(name, Some(options));
    while let Some(chunk) = stream.next().await {
        tar.extend_from_slice(&chunk.map_err(api(format!("read {AGENT_STATE_PATH} of {name}")))?);
    }
    fs::write(to, &tar).map_err(io("write", to))?;
    Ok(tar.len() as u64)
}

/// Writes the agent's files saved in the tar file `from` into the stopped
/// container `name`.
async fn load_agent_state(engine: &Docker, name: &str, from: &Path) -> Result<(), DockerError> {
    let tar = fs::read(from).map_err(io("read", from))?;
    let options = UploadToContainerOptions {
        path: AGENT_STATE_PARENT.to_owned(),
        ..Default::default()
    };
    engine
        .upload_to_container(name, Some(options), bollard::body_full(tar.into()))
        .await
        .map_err(api(format!("write {AGENT_STATE_PATH} of {name}")))
}

/// Copies the regular files of `from` into `to` (made if missing), the
/// agent's saved files aside; answers their bytes.
fn copy_files(from: &Path, to: &Path) -> Result<u64, DockerError> {
    fs::create_dir_all(to).map_err(io("create", to))?;
    let mut bytes = 0;
    for entry in fs::read_dir(from).map_err(io("list", from))? {
        let entry = entry.map_err(io("list", from))?;
        let kind = entry.file_type().map_err(io("look at", &entry.path()))?;
        if kind.is_file() && entry.file_name() != AGENT_STATE {
            let target = to.join(entry.file_name());
            bytes += fs::copy(entry.path(), &target).map_err(io("copy", &entry.path()))?;
        }
    }
    Ok(bytes)
}

/// Waits until the suspended agent's socket file is gone: the agent holds
/// nothing of the host any more.
async fn wait_released(socket: &Path) -> Result<(), DockerError> {
    let deadline = std::time::Instant::now() + ready::READY_TIMEOUT;
    while socket.exists() {
        if std::time::Instant::now() > deadline {
            return Err(DockerError::NotReleased {
                socket: socket.to_path_buf(),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    Ok(())
}
