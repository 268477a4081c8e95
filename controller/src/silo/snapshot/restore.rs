//! A snapshot back into a machine: loading its image onto the engine from
//! the store (only the layers the engine lacks), or applying its layers
//! onto a fresh VM from the template (remote backends), and the operations
//! that replace a sandbox's machine with one made from it (rewind, `up`
//! tier 2) or make a new sandbox from it (fork, onto any backend with
//! snapshots).
//!
//! A snapshot moves between backends by its layers above its base: on
//! Docker they go on top of the engine image that carries its base's base
//! id (the snapshot is *rebased* onto that image's stored layers), on a VM
//! they are applied onto a fresh machine whose template carries it.
//!
//! A machine an engine built from a snapshot's image lacks what an engine
//! cannot build (the root directory's own metadata, extended attributes
//! with an empty value): its agent applies that as one small layer before
//! the machine is handed out ([`Silo::fill_engine_gaps`]).

use std::io;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::baseline::agent_error;
use super::config::snapshot_config;
use super::layer::CountingWriter;
use super::{
    ImageSource, RestoreReport, SnapshotError, SnapshotProgress, SnapshotProgressFn, blocking,
    digests, engine, ms_since, no_progress, parse_digest,
};
use crate::backend::{Backend, EngineImages};
use crate::bridge;
use crate::naming::validate_name;
use crate::silo::{Silo, SiloError, machine};
use crate::spec::BackendKind;
use crate::state::{SandboxRecord, Snapshot};
use crate::store::rewind::engine_gaps;
use crate::store::{LoadPlan, Store, load_archive};

/// Most forks [`Silo::fork_many`] makes at once: each is a sandbox whose
/// machine is claimed or started while the others are.
pub const MAX_FORKS: u32 = 64;

/// Longest parent chain followed when looking for layers the engine has.
const MAX_CHAIN: usize = 256;

/// Where [`Silo::fork`] puts the new sandbox; every field left `None`
/// keeps what the snapshot's sandbox had.
#[derive(Debug, Clone, Default)]
pub struct ForkTarget {
    /// The backend.
    pub backend: Option<BackendKind>,
    /// The image (Docker) or template (remote backends).
    pub image: Option<String>,
}

impl Silo {
    /// Makes the engine image a restore onto a new container would need for
    /// `snapshot` (from the store, sending only the layers the engine
    /// lacks), ahead of that restore; says how the engine got it. A
    /// snapshot does not make it (see the module docs of `snapshot`).
    pub async fn make_engine_image(
        &self,
        snapshot: &str,
        progress: &SnapshotProgressFn,
    ) -> Result<ImageSource, SiloError> {
        let snapshot = self.db().snapshot(snapshot)?;
        let store = self.store()?;
        let images = self.engine_images(snapshot.spec.backend)?;
        let (_, source) = self
            .load_snapshot_image(&images, &store, &snapshot, None, progress)
            .await?;
        Ok(source)
    }

    /// Makes sure the engine has the snapshot's image, loading it from the
    /// store if not; returns the image id and how it got there. A snapshot
    /// taken on a template, or asked onto another `image`, is rebased onto
    /// the engine image with the same base id first.
    pub(super) async fn load_snapshot_image(
        &self,
        images: &EngineImages,
        store: &Store,
        snapshot: &Snapshot,
        image: Option<&str>,
        progress: &SnapshotProgressFn,
    ) -> Result<(String, ImageSource), SnapshotError> {
        let rebased = self
            .rebase_onto_engine(images, store, snapshot, image, progress)
            .await?;
        self.load_as_is(
            images,
            store,
            rebased.as_ref().unwrap_or(snapshot),
            progress,
        )
        .await
    }

    /// [`Silo::load_snapshot_image`] for a snapshot that stands on an
    /// engine image.
    pub(super) async fn load_as_is(
        &self,
        images: &EngineImages,
        store: &Store,
        snapshot: &Snapshot,
        progress: &SnapshotProgressFn,
    ) -> Result<(String, ImageSource), SnapshotError> {
        let image_id = load_archive::image_id(snapshot.config.as_bytes());
        if images
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
        let present = self.layers_on_engine(images, snapshot).await?;
        let attempt = |present: usize| {
            let include: Vec<bool> = (0..layers.len()).map(|i| i >= present).collect();
            let plan = LoadPlan {
                config_bytes: snapshot.config.as_bytes().to_vec(),
                layers: layers.clone(),
                include,
                repo_tag: Some(images.snapshot_tag(&snapshot.id)),
            };
            self.load_plan(images, store, plan, progress)
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

    /// The snapshot as it would be had it been taken on the engine image
    /// with its base's base id (or on `image`, which must carry it); `None`
    /// when it already stands on an engine image and no other was asked.
    pub(super) async fn rebase_onto_engine(
        &self,
        images: &EngineImages,
        store: &Store,
        snapshot: &Snapshot,
        image: Option<&str>,
        progress: &SnapshotProgressFn,
    ) -> Result<Option<Snapshot>, SnapshotError> {
        let base = self.base_of(snapshot)?;
        if !base.is_template() && image.is_none() {
            return Ok(None);
        }
        let mismatch = |target: String, found: Option<String>| SnapshotError::BaseMismatch {
            snapshot: snapshot.id.clone(),
            base: base.image_id.clone(),
            base_id: base.identity.clone(),
            target,
            found,
        };
        // The engine image to stand on: its id, and the name the fork's
        // spec gives.
        let (target, name) = match (image, &base.identity) {
            (Some(image), _) => {
                let (id, found) = images
                    .image_base_id(image)
                    .await
                    .map_err(engine("inspect an image"))?;
                let same_image = id == base.image_id;
                if !same_image && (base.identity.is_none() || found != base.identity) {
                    return Err(mismatch(format!("image {image}"), found));
                }
                (id, image.to_owned())
            }
            (None, Some(base_id)) => images
                .images_with_base_id(base_id)
                .await
                .map_err(engine("list images"))?
                .into_iter()
                .next()
                .map(|(id, tag)| (id.clone(), tag.unwrap_or(id)))
                .ok_or_else(|| SnapshotError::NoEngineImage {
                    snapshot: snapshot.id.clone(),
                    base_id: base_id.clone(),
                })?,
            (None, None) => {
                return Err(mismatch(format!("the {} engine", images.kind()), None));
            }
        };
        let (engine_base, _) = self
            .store_base_image(images, store, &target, progress)
            .await?;
        if engine_base.image_id == base.image_id {
            return Ok(None);
        }
        let mut layers = engine_base.layers.clone();
        layers.extend(snapshot.layers.iter().skip(base.layers.len()).cloned());
        let config = snapshot_config(
            engine_base.config.clone(),
            &layers,
            (&snapshot.id, true),
            snapshot.message.as_deref(),
            &images
                .snapshot_labels()
                .map_err(engine("read this home's identity"))?,
        )?;
        let mut spec = snapshot.spec.clone();
        spec.backend = images.kind();
        spec.image = Some(name);
        Ok(Some(Snapshot {
            base_image: engine_base.image_id,
            layers,
            config,
            parent: None,
            spec,
            ..snapshot.clone()
        }))
    }

    /// How many of the snapshot's bottom layers the engine has, chain and
    /// all: the longest prefix it shares with the image of a snapshot in its
    /// chain or with the base image. The nearest ancestor is asked first:
    /// when its whole image is a prefix of the snapshot's, no older one can
    /// share more, which keeps a long chain of small snapshots to one look.
    async fn layers_on_engine(
        &self,
        images: &EngineImages,
        snapshot: &Snapshot,
    ) -> Result<usize, SnapshotError> {
        let mut candidates = Vec::new();
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
        candidates.push(snapshot.base_image.clone());
        let mut best = 0;
        for candidate in candidates {
            let Some(engine_layers) = images
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
            if shared == engine_layers.len() {
                break;
            }
        }
        Ok(best)
    }

    /// Streams a load archive from the store into the engine; returns its size.
    async fn load_plan(
        &self,
        images: &EngineImages,
        store: &Store,
        plan: LoadPlan,
        progress: &SnapshotProgressFn,
    ) -> Result<u64, SnapshotError> {
        let mut total = 0;
        for (layer, include) in plan.layers.iter().zip(&plan.include) {
            if *include {
                total += store.size(layer)?;
            }
        }
        progress(SnapshotProgress::Step {
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
        let loaded = images.load_image(stream).await;
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
        progress: &SnapshotProgressFn,
    ) -> Result<RestoreReport, SiloError> {
        self.restore_because(sandbox, snapshot, (reason, None), progress)
            .await
    }

    /// [`Silo::restore`] of a rewind that could not be done in place: the
    /// `rewound` event says why (`why.1`), so `silo events` counts every
    /// fall back to a new machine with its reason.
    async fn restore_because(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
        why: (&str, Option<&str>),
        progress: &SnapshotProgressFn,
    ) -> Result<RestoreReport, SiloError> {
        let (reason, not_in_place) = why;
        let start = Instant::now();
        let strategy = self.strategy_of(sandbox)?;
        let key = self.sandbox_key(sandbox);
        let mut detail = json!({ "snapshot": snapshot.id, "reason": reason });
        if let Some(because) = not_in_place {
            detail["new_machine_because"] = json!(because);
        }
        let (sandbox, source) = strategy
            .restore(self, sandbox, snapshot, &key, detail, progress)
            .await?;
        Ok(RestoreReport {
            sandbox,
            snapshot: snapshot.id.clone(),
            image: source,
            ms: ms_since(start),
            new_machine_because: None,
            pool: None,
        })
    }

    /// Gives `sandbox`'s machine, which an engine just built from
    /// `snapshot`'s image, what the engine leaves out of a tree
    /// (`store::rewind::engine_gaps`), through its agent; nothing to send
    /// for a snapshot that has none of it.
    pub(super) async fn fill_engine_gaps(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
    ) -> Result<(), SiloError> {
        let store = self.store()?;
        let layers = digests(&snapshot.layers)?;
        let client = self.client(sandbox)?;
        let spoken = client.protocol().await.map_err(agent_error(sandbox))?;
        let root = spoken.require(silo_protocol::Feature::RootEntry).is_ok();
        let gaps = blocking(move || Ok(engine_gaps(&store, &layers, root)?)).await?;
        let Some(gaps) = gaps else {
            return Ok(());
        };
        client
            .apply_layer(gaps.layer.into())
            .await
            .map_err(agent_error(sandbox))?;
        Ok(())
    }

    /// Applies the snapshot onto the sandbox's fresh machine; when that
    /// fails, removes the machine (the sandbox stays, machineless, for the
    /// next `up`) and says why.
    pub(super) async fn apply_or_remove(
        &self,
        sandbox: SandboxRecord,
        snapshot: &Snapshot,
        progress: &SnapshotProgressFn,
    ) -> Result<(SandboxRecord, ImageSource), SiloError> {
        progress(SnapshotProgress::Step {
            label: "applying the snapshot",
            total: None,
        });
        match self.apply_snapshot(&sandbox, snapshot).await {
            Ok(applied) => Ok(applied),
            Err(error) => {
                self.remove_failed_machine(&sandbox).await;
                Err(error)
            }
        }
    }

    /// Removes the machine of a sandbox whose making failed after it
    /// started; a failure to is only logged (the error that matters is the
    /// one that made it fail).
    pub(super) async fn remove_failed_machine(&self, sandbox: &SandboxRecord) {
        let key = self.sandbox_key(sandbox);
        if let Err(cleanup) = self
            .backend(sandbox.backend)
            .remove(machine(sandbox, &key))
            .await
        {
            tracing::warn!(sandbox = sandbox.name, "removing its machine: {cleanup}");
        }
    }

    /// Puts a sandbox back to one of its snapshots (`silo rewind`): in
    /// place when its machine allows, else on a new machine made from it
    /// (the report says which, and why).
    pub(crate) async fn rewind(
        &self,
        name_or_id: &str,
        snapshot: &str,
        progress: &SnapshotProgressFn,
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
        progress(SnapshotProgress::Step {
            label: "rewinding in place",
            total: None,
        });
        let why = match self.rewind_in_place(&sandbox, &snapshot, false).await? {
            Ok(report) => return Ok(report),
            Err(why) => why.0,
        };
        tracing::info!(
            sandbox = sandbox.name,
            "rewinding onto a new machine: {why}"
        );
        let report = self
            .restore_because(&sandbox, &snapshot, ("rewind", Some(&why)), progress)
            .await?;
        Ok(RestoreReport {
            new_machine_because: Some(why),
            ..report
        })
    }

    /// `up`'s tier 2: the sandbox's machine is gone, so it is made again
    /// from its latest snapshot. `None` when it has none (or its backend
    /// has no snapshots), for tier 3 to take over.
    pub(in crate::silo) async fn restore_latest(
        &self,
        sandbox: &SandboxRecord,
        reason: &str,
    ) -> Result<Option<RestoreReport>, SiloError> {
        if self.strategy(sandbox.backend).is_none() {
            return Ok(None);
        }
        // A fresh machine of a remote backend records its baseline; one
        // without it (it could not be asked) has no snapshots either.
        let Some(latest) = self.db().latest_snapshot(&sandbox.id)? else {
            return Ok(None);
        };
        self.restore(sandbox, &latest, reason, &no_progress())
            .await
            .map(Some)
    }

    /// Makes a new sandbox named `name` from a snapshot (`silo fork`), with
    /// the spec its source had or on another backend or image `target` asks
    /// for (a template on a remote backend): onto a started sandbox of a
    /// pool of that spec, rewound in place to the snapshot, when one fits
    /// (see `pooled`; the report names the pool, which is one short), else
    /// the snapshot's layers above its base go onto a new machine whose
    /// base id is the base's (the report says why no pool member was
    /// taken), or the fork is refused. The source is left alone.
    pub async fn fork(
        &self,
        snapshot: &str,
        name: &str,
        target: &ForkTarget,
        progress: &SnapshotProgressFn,
    ) -> Result<RestoreReport, SiloError> {
        let start = Instant::now();
        validate_name(name)?;
        let snapshot = self.db().snapshot(snapshot)?;
        let _lease = self.lease(name, "fork").await?;
        let mut spec = snapshot.spec.clone();
        if let Some(backend) = target.backend.filter(|b| *b != spec.backend) {
            // One backend's image names mean nothing to another: the new
            // one's default, unless named.
            spec.backend = backend;
            spec.image = None;
        }
        if let Some(image) = &target.image {
            spec.image = Some(image.clone());
        }
        let Some(strategy) = self.strategy(spec.backend) else {
            return Err(SnapshotError::Unsupported {
                name: name.to_owned(),
                backend: spec.backend,
            }
            .into());
        };
        progress(SnapshotProgress::Step {
            label: "taking a pool member",
            total: None,
        });
        let not_pooled = match self
            .fork_onto_pool(&strategy, &snapshot, &spec, name)
            .await?
        {
            Ok(report) => return Ok(report),
            Err(why) => why,
        };
        let (sandbox, source) = strategy
            .fork(self, &snapshot, spec, name, target, progress)
            .await?;
        Ok(RestoreReport {
            sandbox,
            snapshot: snapshot.id,
            image: source,
            ms: ms_since(start),
            new_machine_because: Some(not_pooled),
            pool: None,
        })
    }

    /// Makes `count` forks of one snapshot at once (`silo fork --count`),
    /// named `NAME-1` to `NAME-count`, each as [`Silo::fork`] makes one:
    /// its own sandbox, id and key, from a pool member when one fits.
    /// Answers each fork's name and outcome, in order; a failed fork leaves
    /// the others. A `count` of 0 or over [`MAX_FORKS`] is refused before
    /// anything is made.
    pub async fn fork_many(
        &self,
        snapshot: &str,
        name: &str,
        count: u32,
        target: &ForkTarget,
    ) -> Result<Vec<(String, Result<RestoreReport, SiloError>)>, SiloError> {
        if count == 0 || count > MAX_FORKS {
            return Err(SnapshotError::ForkCount(count).into());
        }
        let progress = no_progress();
        let names: Vec<String> = (1..=count).map(|i| format!("{name}-{i}")).collect();
        let forks = names
            .iter()
            .map(|name| self.fork(snapshot, name, target, &progress));
        let outcomes = futures_util::future::join_all(forks).await;
        Ok(names.into_iter().zip(outcomes).collect())
    }
}
