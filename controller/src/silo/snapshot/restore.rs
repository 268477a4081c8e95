//! A snapshot back into a machine: loading its image onto the engine from
//! the store (only the layers the engine lacks), and the operations that
//! replace a sandbox's machine with one made from it (rewind, `up` tier 2)
//! or make a new sandbox from it (fork).

use std::io;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::layer::CountingWriter;
use super::{
    ImageSource, Progress, ProgressFn, RestoreReport, SnapshotError, engine, ms_since, no_progress,
    parse_digest,
};
use crate::CreateRequest;
use crate::backend::docker::snapshot_tag;
use crate::backend::{Backend, BackendError, DockerBackend, Machine, SnapshotSupport};
use crate::bridge;
use crate::naming::validate_name;
use crate::silo::{Silo, SiloError, machine};
use crate::state::{EventKind, SandboxRecord, Snapshot};
use crate::store::{LoadPlan, Store, load_archive};

/// Longest parent chain followed when looking for layers the engine has.
const MAX_CHAIN: usize = 256;

impl Silo {
    /// Makes sure the engine has the snapshot's image, loading it from the
    /// store if not; returns the image id and how it got there.
    pub(super) async fn load_snapshot_image(
        &self,
        docker: &DockerBackend,
        store: &Store,
        snapshot: &Snapshot,
        progress: &ProgressFn,
    ) -> Result<(String, ImageSource), SnapshotError> {
        let image_id = load_archive::image_id(snapshot.config.as_bytes());
        if docker
            .image_layers(&image_id)
            .await
            .map_err(engine("inspect a snapshot image"))?
            .is_some()
        {
            return Ok((image_id, ImageSource::Engine));
        }
        let layers = snapshot
            .layers
            .iter()
            .map(|l| parse_digest(l))
            .collect::<Result<Vec<_>, _>>()?;
        let present = self.layers_on_engine(docker, snapshot).await?;
        let attempt = |present: usize| {
            let include: Vec<bool> = (0..layers.len()).map(|i| i >= present).collect();
            let plan = LoadPlan {
                config_bytes: snapshot.config.as_bytes().to_vec(),
                layers: layers.clone(),
                include,
                repo_tag: Some(snapshot_tag(&snapshot.id)),
            };
            self.load_plan(docker, store, plan, progress)
        };
        let sent = match attempt(present).await {
            Ok(sent) => sent,
            // The engine dropped a layer since it was asked; send them all.
            Err(error) if present > 0 => {
                tracing::info!("loading with every layer after: {error}");
                attempt(0).await?
            }
            Err(error) => return Err(error),
        };
        Ok((
            image_id,
            ImageSource::Store {
                layers_sent: layers.len() - present.min(layers.len()),
                bytes: sent,
            },
        ))
    }

    /// How many of the snapshot's bottom layers the engine has, chain and
    /// all: the longest prefix it shares with the base image or the image
    /// of a snapshot in its chain.
    async fn layers_on_engine(
        &self,
        docker: &DockerBackend,
        snapshot: &Snapshot,
    ) -> Result<usize, SnapshotError> {
        let mut candidates = vec![snapshot.base_image.clone()];
        let mut parent = snapshot.parent.clone();
        while let Some(id) = parent.take() {
            if candidates.len() > MAX_CHAIN {
                break;
            }
            let Ok(ancestor) = self.db().snapshot(&id) else {
                break; // deleted: its children still list its layers
            };
            candidates.push(load_archive::image_id(ancestor.config.as_bytes()));
            parent = ancestor.parent;
        }
        let mut best = 0;
        for candidate in candidates {
            let Some(engine_layers) = docker
                .image_layers(&candidate)
                .await
                .map_err(engine("inspect an image"))?
            else {
                continue;
            };
            let shared = engine_layers
                .iter()
                .zip(&snapshot.layers)
                .take_while(|(engine, ours)| {
                    engine.strip_prefix("sha256:").unwrap_or(engine) == ours.as_str()
                })
                .count();
            best = best.max(shared);
        }
        Ok(best)
    }

    /// Streams a load archive from the store into the engine; returns its size.
    async fn load_plan(
        &self,
        docker: &DockerBackend,
        store: &Store,
        plan: LoadPlan,
        progress: &ProgressFn,
    ) -> Result<u64, SnapshotError> {
        let mut total = 0;
        for (layer, include) in plan.layers.iter().zip(&plan.include) {
            if *include {
                total += store.size(layer)?;
            }
        }
        progress(Progress::Step {
            label: "loading into the engine",
            total: Some(total),
        });
        let (writer, stream) = bridge::writer_stream();
        let write = {
            let store = store.clone();
            let progress = Arc::clone(progress);
            tokio::task::spawn_blocking(move || {
                let mut counted = CountingWriter {
                    inner: writer,
                    progress,
                };
                match load_archive::write(&mut counted, &plan, &store) {
                    Ok(bytes) => {
                        counted.inner.finish().map_err(|e| {
                            SnapshotError::Task(format!("streaming to the engine: {e}"))
                        })?;
                        Ok(bytes)
                    }
                    Err(error) => {
                        counted.inner.fail(io::Error::other(error.to_string()));
                        Err(SnapshotError::from(error))
                    }
                }
            })
        };
        let loaded = docker.load_image(stream).await;
        let written = write
            .await
            .map_err(|e| SnapshotError::Task(e.to_string()))?;
        loaded.map_err(engine("load a snapshot image"))?;
        written
    }

    /// Replaces a sandbox's machine with one made from `snapshot` (removing
    /// the old one), keeping its id, name, spec (mounts, network, env,
    /// labels) and history. Call with the sandbox's lease held.
    async fn restore(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
        reason: &str,
        progress: &ProgressFn,
    ) -> Result<RestoreReport, SiloError> {
        let start = Instant::now();
        let docker = self.image_engine(sandbox)?;
        let store = self.store()?;
        let (image_id, source) = self
            .load_snapshot_image(docker, &store, snapshot, progress)
            .await?;
        let key = self.sandbox_key(sandbox);
        let detail = json!({ "snapshot": snapshot.id, "reason": reason });
        let sandbox = self.db().replace_machine(
            sandbox,
            &sandbox.spec,
            Some(&snapshot.id),
            (EventKind::Rewound, detail),
        )?;
        progress(Progress::Step {
            label: "starting",
            total: None,
        });
        let made = Machine {
            image: Some(&image_id),
            ..machine(&sandbox, &key)
        };
        let made = docker.replace(made).await.map_err(BackendError::from);
        let sandbox = self.record_made(&sandbox, made).await?;
        Ok(RestoreReport {
            sandbox,
            snapshot: snapshot.id.clone(),
            image: source,
            ms: ms_since(start),
        })
    }

    /// Puts a sandbox back to one of its snapshots (`silo rewind`).
    pub async fn rewind(
        &self,
        name_or_id: &str,
        snapshot: &str,
        progress: &ProgressFn,
    ) -> Result<RestoreReport, SiloError> {
        let (_lease, sandbox) = self.lease_sandbox(name_or_id, "rewind").await?;
        let snapshot = self.db().snapshot(snapshot)?;
        if !self.in_history(&sandbox, &snapshot)? {
            return Err(SnapshotError::OtherSandbox {
                snapshot: snapshot.id,
                owner: snapshot.sandbox_name,
                sandbox: sandbox.name,
            }
            .into());
        }
        self.restore(&sandbox, &snapshot, "rewind", progress).await
    }

    /// `up`'s tier 2: the sandbox's machine is gone, so it is made again
    /// from its latest snapshot. `None` when it has none (or its backend
    /// has no snapshots), for tier 3 to take over.
    pub(in crate::silo) async fn restore_latest(
        &self,
        sandbox: &SandboxRecord,
        reason: &str,
    ) -> Result<Option<RestoreReport>, SiloError> {
        if self.backend(sandbox.backend).snapshot_support() == SnapshotSupport::None {
            return Ok(None);
        }
        let Some(latest) = self.db().latest_snapshot(&sandbox.id)? else {
            return Ok(None);
        };
        self.restore(sandbox, &latest, reason, &no_progress())
            .await
            .map(Some)
    }

    /// Makes a new sandbox named `name` from a snapshot (`silo fork`), with
    /// the spec its source had; the source is left alone.
    pub async fn fork(
        &self,
        snapshot: &str,
        name: &str,
        progress: &ProgressFn,
    ) -> Result<RestoreReport, SiloError> {
        let start = Instant::now();
        validate_name(name)?;
        let snapshot = self.db().snapshot(snapshot)?;
        let _lease = self.lease(name, "fork").await?;
        let store = self.store()?;
        let (image_id, source) = self
            .load_snapshot_image(&self.docker, &store, &snapshot, progress)
            .await?;
        progress(Progress::Step {
            label: "starting",
            total: None,
        });
        let request = CreateRequest {
            name: Some(name.to_owned()),
            spec: snapshot.spec.clone(),
        };
        let sandbox = self.reserve(request, Some(snapshot.id.clone()))?;
        let sandbox = self.launch(sandbox, Some(&image_id)).await?;
        Ok(RestoreReport {
            sandbox,
            snapshot: snapshot.id,
            image: source,
            ms: ms_since(start),
        })
    }
}
