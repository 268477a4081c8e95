//! `Silo::checkpoint_memory` and `Silo::restore_memory`: a running
//! sandbox's processes and memory written to a directory on the host, and
//! put back from one, on Docker under gVisor (`backend/docker/memory`).
//!
//! A checkpoint is the protocol's suspend (the processes stop and the agent
//! lets go of the host), the engine's checkpoint (the container stops), and
//! at once a restore of the same image, so the sandbox goes on as it was;
//! the pause its processes see is measured and reported. A failed
//! checkpoint wakes the agent where it is, or starts the container again
//! (its files kept, its processes lost) when the engine had stopped it.
//! The restored processes stay stopped until [`Silo::resume_processes`],
//! so a caller can read the files the image saw first.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{Silo, SiloError, backend_error, machine};
use crate::backend::NoMemorySnapshot;
use crate::spec::BackendKind;
use crate::state::SandboxRecord;

/// How long a suspended agent waits for its restore before it wakes by
/// itself: far longer than a checkpoint and restore take.
const WAKE_AFTER: Duration = Duration::from_secs(120);

/// What a memory checkpoint cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryCheckpoint {
    /// Bytes of the memory image.
    pub bytes: u64,
    /// Processes stopped for it.
    pub stopped: usize,
    /// How long the processes were stopped, up to the restore's wake.
    pub pause: Duration,
}

impl Silo {
    /// Checkpoints the running sandbox `name` with its processes and memory
    /// into the empty directory `into`, and brings it back from that image
    /// at once; its processes stay stopped until
    /// [`Silo::resume_processes`] (read its files first).
    pub async fn checkpoint_memory(
        &self,
        name: &str,
        into: &Path,
    ) -> Result<MemoryCheckpoint, SiloError> {
        let sandbox = self.get(name)?;
        let docker = self.memory_backend(&sandbox).await?;
        let key = self.sandbox_key(&sandbox);
        let machine = machine(&sandbox, &key);
        let client = self.client(&sandbox)?;
        let agent_error = |source| SiloError::Agent {
            name: sandbox.name.clone(),
            source: Box::new(source),
        };
        let started = Instant::now();
        let stopped = client.suspend(WAKE_AFTER).await.map_err(agent_error)?;
        let bytes = match docker.checkpoint_memory(machine, into).await {
            Ok(bytes) => bytes,
            Err(error) => {
                self.wake_after_failed_checkpoint(&sandbox).await;
                return Err(backend_error("checkpoint", &sandbox, error.into()));
            }
        };
        docker
            .restore_memory(machine, into)
            .await
            .map_err(|e| backend_error("restore", &sandbox, e.into()))?;
        Ok(MemoryCheckpoint {
            bytes,
            stopped,
            pause: started.elapsed(),
        })
    }

    /// Puts sandbox `name`'s processes and memory back as the image in
    /// `from` holds them, replacing whatever runs there now; its files must
    /// be those the image saw. The processes stay stopped until
    /// [`Silo::resume_processes`].
    pub async fn restore_memory(&self, name: &str, from: &Path) -> Result<(), SiloError> {
        let sandbox = self.get(name)?;
        let docker = self.memory_backend(&sandbox).await?;
        let key = self.sandbox_key(&sandbox);
        docker
            .restore_memory(machine(&sandbox, &key), from)
            .await
            .map_err(|e| backend_error("restore", &sandbox, e.into()))
    }

    /// Continues the processes a checkpoint or restore left stopped;
    /// answers how many.
    pub async fn resume_processes(&self, name: &str) -> Result<usize, SiloError> {
        let sandbox = self.get(name)?;
        self.client(&sandbox)?
            .resume()
            .await
            .map_err(|source| SiloError::Agent {
                name: sandbox.name.clone(),
                source: Box::new(source),
            })
    }

    /// The Docker backend, when `sandbox` can go back in memory on it.
    async fn memory_backend(
        &self,
        sandbox: &SandboxRecord,
    ) -> Result<&crate::backend::DockerBackend, SiloError> {
        if sandbox.backend != BackendKind::Docker {
            return Err(backend_error(
                "checkpoint the memory of",
                sandbox,
                NoMemorySnapshot {
                    backend: sandbox.backend,
                }
                .into(),
            ));
        }
        let docker = self.backends().docker();
        let key = self.sandbox_key(sandbox);
        docker
            .memory_refusal(&machine(sandbox, &key))
            .await
            .map_err(|e| backend_error("checkpoint the memory of", sandbox, e.into()))?;
        Ok(docker)
    }

    /// After a failed checkpoint: a container the engine left running has
    /// a suspended agent, woken by its key file; one the engine stopped is
    /// started again (its files kept, its processes gone).
    async fn wake_after_failed_checkpoint(&self, sandbox: &SandboxRecord) {
        let key = self.sandbox_key(sandbox);
        let docker = self.backends().docker();
        if let Err(error) = docker.wake(machine(sandbox, &key)).await {
            tracing::warn!(
                sandbox = sandbox.name,
                "waking after a failed checkpoint: {error}"
            );
        } else if let Err(error) = self.resume_processes(&sandbox.name).await {
            tracing::warn!(
                sandbox = sandbox.name,
                "resuming after a failed checkpoint: {error}"
            );
        }
    }
}
