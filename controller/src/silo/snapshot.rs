//! Snapshots: taking one (`silo snapshot`), putting a sandbox back to one
//! (`silo rewind`, and `silo up` restoring a machine that is gone), making a
//! new sandbox from one (`silo fork`), listing and deleting them, and the
//! store's half of `silo gc`.
//!
//! A snapshot is one image layer on top of the image the sandbox's machine
//! was made from: the sandbox's agent writes the changes since that image
//! (see `silo_protocol::snapshot`), and the controller streams them into
//! the content-addressed store. The base image's own layers are stored once,
//! by the first snapshot that stands on them (the engine's export of that
//! image), and shared by every later one. A snapshot's row lists all its
//! layers, base first, so any snapshot can be loaded back from the store
//! alone, onto an engine that has lost every image.
//!
//! The moments a snapshot reports:
//! - **captured**: the layer is taken and the sandbox runs again;
//! - **durable**: the layer is fsynced in the store and the row recorded;
//! - **loaded**: the engine has the snapshot as an image, so a rewind on
//!   this engine need not load it. Loading sends only the layers the engine
//!   lacks (it skips a layer whose chain it has).
//!
//! Processes and memory are not captured: a rewound sandbox boots afresh.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::{Value, json};
use silo_protocol::snapshot::SnapshotRequest;

use super::{Silo, SiloError, backend_error, machine};
use crate::CreateRequest;
use crate::backend::docker::{LABEL_HOME, LABEL_SNAPSHOT, snapshot_tag, unix_ms_to_rfc3339};
use crate::backend::{BackendError, DockerBackend, DockerError, Machine, MachineState};
use crate::bridge;
use crate::client::ClientError;
use crate::naming::{new_snapshot_id, validate_name};
use crate::spec::BackendKind;
use crate::state::{EventKind, SandboxRecord, Snapshot, StateError, StoredImage, now_ms};
use crate::store::{
    BlobTee, Digest, Index, IndexError, IngestError, LayerDelta, LoadArchiveError, LoadPlan, Store,
    StoreError, load_archive, save_archive,
};

/// How far before its container's creation a file's ctime still counts as
/// changed. File times come from a clock that ticks a few milliseconds
/// behind the one the engine stamps containers with; a margin can only make
/// a snapshot larger, never miss a change.
const CTIME_MARGIN_NS: i64 = 20_000_000;
/// Longest wait for gc's exclusive hold on the store.
const GC_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// A tar archive ends with two zero blocks.
const TAR_END_MARKER: usize = 1024;
/// Longest parent chain followed when looking for layers the engine has.
const MAX_CHAIN: usize = 256;

/// What a long snapshot step reports, for progress bars.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// A step begins; `total` bytes when known.
    Step {
        /// What it does, in a few words.
        label: &'static str,
        /// Its size, when known.
        total: Option<u64>,
    },
    /// Bytes done in the current step.
    Bytes(u64),
}

/// Receives [`Progress`]; called from blocking threads too.
pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// A progress receiver that ignores everything.
pub fn no_progress() -> ProgressFn {
    Arc::new(|_| {})
}

/// What [`Silo::snapshot`] did.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotReport {
    /// The snapshot, as recorded.
    pub snapshot: Snapshot,
    /// The base image's layers, when this snapshot had to store them.
    pub base_stored: Option<BaseStored>,
    /// Milliseconds from the start until the layer was taken and the
    /// sandbox ran again.
    pub captured_ms: f64,
    /// Milliseconds from the start until it was in the store and recorded.
    pub durable_ms: f64,
    /// Milliseconds from the start until the engine had it as an image;
    /// `None` if loading it failed (see `load_error`; a rewind loads it then).
    pub loaded_ms: Option<f64>,
    /// Why loading it into the engine failed.
    pub load_error: Option<String>,
    /// Entries in its layer (files, directories, links, deletions).
    pub entries: u64,
    /// Deletions among them.
    pub deletions: u64,
    /// Processes stopped while the layer was read.
    pub processes_stopped: u64,
    /// Processes that had not stopped when the layer started (in
    /// uninterruptible sleep, say): a write of theirs under way may be in
    /// the snapshot half done.
    pub processes_unsettled: u64,
}

/// A base image stored by a snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct BaseStored {
    /// The engine's id of the image.
    pub image_id: String,
    /// Its layers.
    pub layers: usize,
    /// Bytes the store grew by.
    pub bytes: u64,
    /// Milliseconds it took.
    pub ms: f64,
}

/// What a restore (rewind, fork, `up` tier 2) did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// The sandbox, as recorded now.
    pub sandbox: SandboxRecord,
    /// The snapshot it runs from.
    pub snapshot: String,
    /// How the engine got the snapshot's image.
    pub image: ImageSource,
    /// Milliseconds from the start until its agent answered.
    pub ms: f64,
}

/// Where a restore found the snapshot's image.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageSource {
    /// The engine had it.
    Engine,
    /// It was loaded from the store: this many layers and bytes were sent.
    Store {
        /// Layers sent (the engine had the rest).
        layers_sent: usize,
        /// Bytes sent.
        bytes: u64,
    },
}

/// What the store's part of gc did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreGc {
    /// Blobs removed (no snapshot or stored image names them).
    pub blobs_removed: usize,
    /// Bytes they took.
    pub bytes_freed: u64,
    /// Temp files of interrupted writes removed.
    pub temps_removed: usize,
    /// Base images no snapshot stands on any more, forgotten.
    pub images_forgotten: Vec<String>,
    /// Engine images of deleted snapshots, removed.
    pub engine_images_removed: Vec<String>,
}

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The sandbox's backend cannot snapshot.
    #[error("sandbox {name:?} runs on the {backend} backend, which has no snapshots (docker has)")]
    Unsupported {
        /// The sandbox.
        name: String,
        /// Its backend.
        backend: BackendKind,
    },
    /// Rewind was given a snapshot from outside the sandbox's history.
    #[error(
        "snapshot {snapshot} was taken of sandbox {owner:?} and is not in the history of \
         {sandbox:?}; `silo fork {snapshot} --name NEW` makes a new sandbox from it"
    )]
    OtherSandbox {
        /// The snapshot.
        snapshot: String,
        /// The sandbox it was taken of.
        owner: String,
        /// The sandbox asked to rewind.
        sandbox: String,
    },
    /// A snapshot to delete is what live sandboxes run from.
    #[error(
        "snapshot {snapshot} is what {} run{} from; rewind or remove {} first",
        sandboxes.join(", "),
        if sandboxes.len() == 1 { "s" } else { "" },
        if sandboxes.len() == 1 { "it" } else { "them" }
    )]
    InUse {
        /// The snapshot.
        snapshot: String,
        /// The sandboxes' names.
        sandboxes: Vec<String>,
    },
    /// The agent refused or failed the snapshot.
    #[error("the agent of sandbox {name:?} could not take the snapshot")]
    Agent {
        /// The sandbox.
        name: String,
        /// Why.
        #[source]
        source: Box<ClientError>,
    },
    /// The layer stream broke off or could not be stored.
    #[error("receiving the snapshot layer of sandbox {name:?} failed")]
    Layer {
        /// The sandbox.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The engine failed.
    #[error("the engine could not {what}")]
    Engine {
        /// What was asked of it.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<DockerError>,
    },
    /// The blob store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The state database failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A stored layer or index could not be read.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The engine's export of the base image could not be stored.
    #[error("storing the layers of image {image} failed")]
    Ingest {
        /// The image.
        image: String,
        /// Why.
        #[source]
        source: IngestError,
    },
    /// The image archive for the engine could not be written.
    #[error(transparent)]
    LoadArchive(#[from] LoadArchiveError),
    /// What the state database holds does not fit together.
    #[error("inconsistent snapshot records: {0}")]
    Inconsistent(String),
    /// A blocking step panicked or was cancelled.
    #[error("a snapshot step failed to run: {0}")]
    Task(String),
}

impl From<SnapshotError> for SiloError {
    fn from(error: SnapshotError) -> Self {
        SiloError::Snapshot(Box::new(error))
    }
}

fn engine(what: &'static str) -> impl FnOnce(DockerError) -> SnapshotError {
    move |source| SnapshotError::Engine {
        what,
        source: Box::new(source),
    }
}

/// Runs blocking store work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SnapshotError> + Send + 'static,
) -> Result<T, SnapshotError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SnapshotError::Task(e.to_string()))?
}

fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

impl Silo {
    /// The content-addressed store under this home.
    pub fn store(&self) -> Result<Store, SiloError> {
        Ok(Store::open(self.home.store_dir()).map_err(SnapshotError::from)?)
    }

    fn snapshot_backend(&self, sandbox: &SandboxRecord) -> Result<&DockerBackend, SnapshotError> {
        match sandbox.backend {
            BackendKind::Docker => Ok(&self.docker),
            backend => Err(SnapshotError::Unsupported {
                name: sandbox.name.clone(),
                backend,
            }),
        }
    }

    /// Snapshots a sandbox's file system (starting it first if it is
    /// stopped). See the module docs for what is captured and reported.
    pub async fn snapshot(
        &self,
        name_or_id: &str,
        message: Option<String>,
        progress: &ProgressFn,
    ) -> Result<SnapshotReport, SiloError> {
        let start = Instant::now();
        let (_lease, sandbox) = self.lease_sandbox(name_or_id, "snapshot").await?;
        let docker = self.snapshot_backend(&sandbox)?;
        let sandbox = match self.status(&sandbox).await? {
            MachineState::Running => sandbox,
            MachineState::Stopped => self.start_sandbox(&sandbox).await?,
            MachineState::Missing => {
                return Err(SiloError::Missing {
                    name: sandbox.name.clone(),
                    backend: sandbox.backend,
                });
            }
        };
        let key = self.sandbox_key(&sandbox);
        let facts = docker
            .container_facts(machine(&sandbox, &key))
            .await
            .map_err(|e| backend_error("snapshot", &sandbox, BackendError::from(e)))?;
        let store = self.store()?;
        let lock = {
            let store = store.clone();
            blocking(move || Ok(store.shared_lock()?)).await?
        };

        // What the machine was made from: a snapshot, or its image as is.
        let (base, layers, config, parent, base_stored) = match &sandbox.origin_snapshot {
            Some(origin) => {
                let origin = self.db().snapshot(origin)?;
                let base = self.db().stored_image(&origin.base_image)?.ok_or_else(|| {
                    SnapshotError::Inconsistent(format!(
                        "snapshot {} stands on image {}, which is not stored",
                        origin.id, origin.base_image
                    ))
                })?;
                let config: Value = serde_json::from_str(&origin.config).map_err(|e| {
                    SnapshotError::Inconsistent(format!("config of {}: {e}", origin.id))
                })?;
                (base, origin.layers.clone(), config, Some(origin.id), None)
            }
            None => {
                let (base, stored) = self
                    .store_base_image(docker, &store, &facts.image_id, progress)
                    .await?;
                let layers = base.layers.clone();
                let config = base.config.clone();
                (base, layers, config, None, stored)
            }
        };
        let baseline = {
            let (store, base, layers) = (store.clone(), base.clone(), layers.clone());
            blocking(move || image_index(&store, &base, &layers)).await?
        };

        progress(Progress::Step {
            label: "capturing",
            total: None,
        });
        let request = SnapshotRequest {
            changed_since_ns: facts.created_ns.saturating_sub(CTIME_MARGIN_NS),
            prune_unchanged_dirs: facts.overlay,
            exclude: facts.exclude.clone(),
            baseline: baseline.to_vec(),
        };
        let client = self.client(&sandbox)?;
        let agent_error = |source| SnapshotError::Agent {
            name: sandbox.name.clone(),
            source: Box::new(source),
        };
        let answer = client.snapshot(&request).await.map_err(agent_error)?;
        let (processes_stopped, processes_unsettled) = (answer.stopped, answer.unsettled);
        if answer.unsettled > 0 {
            tracing::warn!(
                sandbox = %sandbox.name,
                unsettled = answer.unsettled,
                "processes had not stopped when the layer started; their writes under way may be half in it"
            );
        }
        let (written, stats) = {
            let store = store.clone();
            let progress = Arc::clone(progress);
            bridge::consume_blocking(answer.body.into_data_stream(), move |reader| {
                receive_layer(reader, &store, &progress)
            })
            .await
        }
        .map_err(|e| SnapshotError::Task(e.to_string()))?
        .map_err(|failure| match failure {
            Received::Stream(source) => SnapshotError::Layer {
                name: sandbox.name.clone(),
                source,
            },
            Received::Store(error) => SnapshotError::Store(error),
        })?;
        let captured_ms = ms_since(start);

        let id = new_snapshot_id()?;
        let mut layers = layers;
        layers.push(written.digest.to_string());
        let config = snapshot_config(
            config,
            &layers,
            &id,
            message.as_deref(),
            &docker
                .home_id()
                .map_err(engine("read this home's identity"))?,
        )?;
        let base_bytes = base_stored.as_ref().map_or(0, |b| b.bytes);
        let snapshot = Snapshot {
            id,
            sandbox_id: sandbox.id.clone(),
            sandbox_name: sandbox.name.clone(),
            parent,
            spec: sandbox.spec.clone(),
            base_image: base.image_id.clone(),
            layers,
            config,
            message,
            layer_bytes: written.size,
            new_bytes: base_bytes + if written.new { written.size } else { 0 },
            created_at_ms: now_ms(),
        };
        let detail = json!({
            "snapshot": snapshot.id,
            "parent": snapshot.parent,
            "layer_bytes": snapshot.layer_bytes,
            "new_bytes": snapshot.new_bytes,
            "message": snapshot.message,
        });
        self.db().insert_snapshot(&snapshot, &detail)?;
        drop(lock);
        let durable_ms = ms_since(start);

        // The engine already has every layer but the new one: the
        // container's image is what the snapshot stands on.
        let (loaded_ms, load_error) = match self
            .load_snapshot_image(docker, &store, &snapshot, progress)
            .await
        {
            Ok(_) => (Some(ms_since(start)), None),
            Err(error) => {
                let error = silo_protocol::http::error_chain(&error);
                tracing::warn!(snapshot = snapshot.id, "loading into the engine: {error}");
                (None, Some(error))
            }
        };
        Ok(SnapshotReport {
            snapshot,
            base_stored,
            captured_ms,
            durable_ms,
            loaded_ms,
            load_error,
            entries: stats.entries,
            deletions: stats.whiteouts,
            processes_stopped,
            processes_unsettled,
        })
    }

    /// The base image, stored: from the records when its layers are in the
    /// store already, else exported from the engine into the store now.
    async fn store_base_image(
        &self,
        docker: &DockerBackend,
        store: &Store,
        image_id: &str,
        progress: &ProgressFn,
    ) -> Result<(StoredImage, Option<BaseStored>), SnapshotError> {
        let recorded = self.db().stored_image(image_id)?;
        if let Some(image) = recorded {
            let store2 = store.clone();
            let blobs: Vec<String> = image
                .layers
                .iter()
                .cloned()
                .chain([image.index_blob.clone()])
                .collect();
            let complete = blocking(move || {
                for blob in blobs {
                    if !store2.has(&parse_digest(&blob)?)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            })
            .await?;
            if complete {
                return Ok((image, None));
            }
        }
        let start = Instant::now();
        progress(Progress::Step {
            label: "storing the base image",
            total: None,
        });
        let export = docker
            .export_image(image_id)
            .await
            .map_err(engine("export the base image"))?;
        let (saved, index) = {
            let store = store.clone();
            let image = image_id.to_owned();
            let progress = Arc::clone(progress);
            bridge::consume_blocking(export, move |reader| {
                let counted = CountingReader {
                    inner: reader,
                    progress,
                };
                let saved = save_archive::ingest(counted, &store)
                    .map_err(|source| SnapshotError::Ingest { image, source })?;
                let mut index = store.writer()?;
                saved.index.write_to(&mut index)?;
                let index = index.finish()?;
                Ok::<_, SnapshotError>((saved, index))
            })
            .await
        }
        .map_err(|e| SnapshotError::Task(e.to_string()))??;
        let image = StoredImage {
            image_id: image_id.to_owned(),
            config: saved.config,
            layers: saved.layers.iter().map(ToString::to_string).collect(),
            index_blob: index.digest.to_string(),
            bytes: saved.bytes_stored + index.size,
            stored_at_ms: now_ms(),
        };
        self.db().insert_image(&image)?;
        let stored = BaseStored {
            image_id: image_id.to_owned(),
            layers: image.layers.len(),
            bytes: image.bytes,
            ms: ms_since(start),
        };
        Ok((image, Some(stored)))
    }

    /// Makes sure the engine has the snapshot's image, loading it from the
    /// store if not; returns the image id and how it got there.
    async fn load_snapshot_image(
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
        let docker = self.snapshot_backend(sandbox)?;
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

    /// Whether `snapshot` is in the sandbox's history: taken of it, or an
    /// ancestor of what it was forked or rewound from, or of its own
    /// snapshots (so a fork can go back to where it forked).
    fn in_history(&self, sandbox: &SandboxRecord, snapshot: &Snapshot) -> Result<bool, SiloError> {
        if snapshot.sandbox_id == sandbox.id {
            return Ok(true);
        }
        let db = self.db();
        let mut starts: Vec<Option<String>> = db
            .snapshots(Some(&sandbox.id))?
            .into_iter()
            .map(|own| own.parent)
            .collect();
        starts.push(sandbox.origin_snapshot.clone());
        let mut seen = HashSet::new();
        for start in starts {
            let mut next = start;
            while let Some(id) = next.take() {
                if id == snapshot.id {
                    return Ok(true);
                }
                if !seen.insert(id.clone()) {
                    break;
                }
                next = db.snapshot(&id).ok().and_then(|s| s.parent);
            }
        }
        Ok(false)
    }

    /// `up`'s tier 2: the sandbox's machine is gone, so it is made again
    /// from its latest snapshot. `None` when it has none (or its backend
    /// has no snapshots), for tier 3 to take over.
    pub(super) async fn restore_latest(
        &self,
        sandbox: &SandboxRecord,
        reason: &str,
    ) -> Result<Option<RestoreReport>, SiloError> {
        if sandbox.backend != BackendKind::Docker {
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

    /// Snapshots, oldest first: one sandbox's (by name or id; a removed
    /// sandbox's id works too), or all.
    pub fn snapshots(&self, sandbox: Option<&str>) -> Result<Vec<Snapshot>, SiloError> {
        let id = match sandbox {
            None => None,
            Some(name_or_id) => match self.get(name_or_id) {
                Ok(sandbox) => Some(sandbox.id),
                Err(SiloError::State(crate::state::StateError::UnknownSandbox(_))) => {
                    Some(name_or_id.to_owned())
                }
                Err(other) => return Err(other),
            },
        };
        Ok(self.db().snapshots(id.as_deref())?)
    }

    /// One snapshot, by id or a unique prefix of it.
    pub fn snapshot_info(&self, id: &str) -> Result<Snapshot, SiloError> {
        Ok(self.db().snapshot(id)?)
    }

    /// Deletes a snapshot's record and its engine image. Its blobs go at the
    /// next gc, unless other snapshots share them. A snapshot a live
    /// sandbox runs from is refused.
    pub async fn remove_snapshot(&self, id: &str) -> Result<Snapshot, SiloError> {
        let snapshot = self.db().snapshot(id)?;
        let users = self.db().sandboxes_made_from(&snapshot.id)?;
        if !users.is_empty() {
            return Err(SnapshotError::InUse {
                snapshot: snapshot.id,
                sandboxes: users,
            }
            .into());
        }
        self.db().delete_snapshot(&snapshot)?;
        let image = load_archive::image_id(snapshot.config.as_bytes());
        match self.docker.remove_image(&image).await {
            Ok(_) | Err(DockerError::Unreachable { .. } | DockerError::Unresponsive { .. }) => {}
            Err(error) => tracing::warn!(snapshot = snapshot.id, "removing its image: {error}"),
        }
        Ok(snapshot)
    }

    /// The store's part of gc: forgets base images no snapshot stands on,
    /// removes blobs nothing names and temp files of interrupted writes,
    /// and the engine images of deleted snapshots.
    pub async fn gc_store(&self, dry_run: bool) -> Result<StoreGc, SiloError> {
        // No snapshot was ever taken here: nothing to collect, and no store
        // to make just to find that out.
        if !self.home.store_dir().exists() {
            return Ok(StoreGc::default());
        }
        let store = self.store()?;
        let lock = {
            let store = store.clone();
            blocking(move || Ok(store.exclusive_lock(GC_LOCK_WAIT)?)).await?
        };
        let mut report = StoreGc::default();
        if !dry_run {
            report.images_forgotten = self.db().forget_unused_images()?;
        }
        let named = self.db().named_blobs()?;
        let report = {
            let store = store.clone();
            blocking(move || {
                for (digest, size) in store.list()? {
                    if named.contains(digest.as_str()) {
                        continue;
                    }
                    if dry_run || store.remove(&digest, &lock)? {
                        report.blobs_removed += 1;
                        report.bytes_freed += size;
                    }
                }
                if !dry_run {
                    report.temps_removed = store.sweep_temps(&lock)?;
                }
                Ok(report)
            })
            .await?
        };
        let mut report = report;
        let known: HashSet<String> = self
            .db()
            .snapshots(None)?
            .into_iter()
            .map(|s| s.id)
            .collect();
        match self.docker.snapshot_images().await {
            Ok(images) => {
                for image in images.into_iter().filter(|i| !known.contains(&i.snapshot)) {
                    if dry_run
                        || self
                            .docker
                            .remove_image(&image.image_id)
                            .await
                            .map_err(engine("remove a snapshot image"))?
                    {
                        report.engine_images_removed.push(image.image_id);
                    }
                }
            }
            Err(DockerError::Unreachable { .. } | DockerError::Unresponsive { .. }) => {}
            Err(error) => return Err(engine("list snapshot images")(error).into()),
        }
        Ok(report)
    }
}

/// The paths of an image made of `layers`: the base image's stored index,
/// then each layer above the base's applied in order.
fn image_index(
    store: &Store,
    base: &StoredImage,
    layers: &[String],
) -> Result<Index, SnapshotError> {
    let mut index = Index::read_from(store.open_blob(&parse_digest(&base.index_blob)?)?)?;
    if !layers.starts_with(&base.layers) {
        return Err(SnapshotError::Inconsistent(format!(
            "layers do not start with those of image {}",
            base.image_id
        )));
    }
    for layer in &layers[base.layers.len()..] {
        let file = store.open_blob(&parse_digest(layer)?)?;
        index.apply_layer(io::BufReader::new(file))?;
    }
    Ok(index)
}

/// Writes the agent's layer into the store, checking as it goes that it is
/// one whole tar (its end marker included: a body cut short at an entry
/// boundary reads like a shorter tar); returns the blob and what it holds.
fn receive_layer(
    reader: bridge::ChannelReader,
    store: &Store,
    progress: &ProgressFn,
) -> Result<(crate::store::Written, crate::store::LayerStats), Received> {
    let mut blob = store.writer().map_err(Received::Store)?;
    let tail = Tail {
        inner: CountingReader {
            inner: reader,
            progress: Arc::clone(progress),
        },
        bytes: Vec::with_capacity(2 * TAR_END_MARKER),
    };
    let mut tee = BlobTee::new(tail, &mut blob);
    let parsed = LayerDelta::read(&mut tee)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        .and_then(|delta| io::copy(&mut tee, &mut io::sink()).map(|_| delta.stats()));
    // A full disk fails the parser's read too: the store's error is the one to tell.
    if let Some(error) = tee.write_error() {
        return Err(Received::Store(error));
    }
    let stats = parsed.map_err(Received::Stream)?;
    let tail = &tee.inner().bytes;
    if tail.len() < TAR_END_MARKER || tail.iter().any(|b| *b != 0) {
        return Err(Received::Stream(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the layer ended without the tar end marker (the agent stopped short)",
        )));
    }
    let written = blob.finish().map_err(Received::Store)?;
    Ok((written, stats))
}

/// Why a layer was not received: the stream from the agent, or the store.
#[derive(Debug)]
enum Received {
    Stream(io::Error),
    Store(StoreError),
}

/// The image config of a snapshot: its parent's (or the base image's),
/// with its layers, a history entry, and the labels that find it again.
fn snapshot_config(
    mut config: Value,
    layers: &[String],
    id: &str,
    message: Option<&str>,
    home_id: &str,
) -> Result<String, SnapshotError> {
    let Some(object) = config.as_object_mut() else {
        return Err(SnapshotError::Inconsistent(
            "image config is not an object".into(),
        ));
    };
    let diff_ids: Vec<Value> = layers
        .iter()
        .map(|l| Value::String(format!("sha256:{l}")))
        .collect();
    object.insert(
        "rootfs".into(),
        json!({ "type": "layers", "diff_ids": diff_ids }),
    );
    object.insert(
        "created".into(),
        Value::String(unix_ms_to_rfc3339(now_ms())),
    );
    let history = object
        .entry("history")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Some(history) = history.as_array_mut() {
        history.push(json!({
            "created": unix_ms_to_rfc3339(now_ms()),
            "created_by": format!("silo snapshot {id}"),
            "comment": message.unwrap_or_default(),
        }));
    }
    let inner = object.entry("config").or_insert_with(|| json!({}));
    if inner.is_null() {
        *inner = json!({});
    }
    if let Some(inner) = inner.as_object_mut() {
        let labels = inner.entry("Labels").or_insert_with(|| json!({}));
        if labels.is_null() {
            *labels = json!({});
        }
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(LABEL_SNAPSHOT.into(), Value::String(id.to_owned()));
            labels.insert(LABEL_HOME.into(), Value::String(home_id.to_owned()));
        }
    }
    serde_json::to_string(&config).map_err(|e| SnapshotError::Inconsistent(e.to_string()))
}

fn parse_digest(text: &str) -> Result<Digest, SnapshotError> {
    Digest::parse(text).map_err(|e| SnapshotError::Inconsistent(format!("{text:?}: {e}")))
}

/// Reports bytes read as progress.
struct CountingReader<R> {
    inner: R,
    progress: ProgressFn,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.progress)(Progress::Bytes(n as u64));
        Ok(n)
    }
}

/// Reports bytes written as progress.
struct CountingWriter<W> {
    inner: W,
    progress: ProgressFn,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        (self.progress)(Progress::Bytes(n as u64));
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Remembers the last [`TAR_END_MARKER`] bytes read through it.
struct Tail<R> {
    inner: R,
    bytes: Vec<u8>,
}

impl<R: Read> Read for Tail<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.extend_from_slice(&buf[..n]);
        if self.bytes.len() > TAR_END_MARKER {
            self.bytes.drain(..self.bytes.len() - TAR_END_MARKER);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// A ustar entry written by hand, so a hostile name stays hostile.
    fn entry(name: &str, data: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_ustar();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    async fn receive(store: &Store, bytes: Vec<u8>) -> Result<crate::store::Written, Received> {
        let chunks = vec![Ok::<_, io::Error>(Bytes::from(bytes))];
        let store = store.clone();
        bridge::consume_blocking(futures_util::stream::iter(chunks), move |reader| {
            receive_layer(reader, &store, &no_progress())
        })
        .await
        .unwrap()
        .map(|(written, _)| written)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hostile_or_cut_short_layer_is_refused_and_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let temps = || {
            std::fs::read_dir(dir.path().join("store/tmp"))
                .unwrap()
                .count()
        };

        let mut good = entry("etc/motd", b"hello\n");
        good.extend_from_slice(&[0; TAR_END_MARKER]);
        let written = receive(&store, good.clone()).await.unwrap();
        assert_eq!(written.size, good.len() as u64);

        let mut climbing = entry("../escape", b"x");
        climbing.extend_from_slice(&[0; TAR_END_MARKER]);
        let refused = receive(&store, climbing).await.unwrap_err();
        assert!(
            matches!(&refused, Received::Stream(e) if e.kind() == io::ErrorKind::InvalidData),
            "{refused:?}"
        );

        let cut = entry("etc/motd", b"hello\n");
        let refused = receive(&store, cut).await.unwrap_err();
        assert!(
            matches!(&refused, Received::Stream(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{refused:?}"
        );

        assert_eq!(
            store.list().unwrap().len(),
            1,
            "only the whole layer is stored"
        );
        assert_eq!(temps(), 0, "a refused layer leaves no temp file");
    }

    #[test]
    fn a_snapshot_config_carries_its_layers_history_and_labels() {
        let base = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": null,
            "rootfs": { "type": "layers", "diff_ids": ["sha256:aa"] },
            "history": [{ "created_by": "import" }],
        });
        let text = snapshot_config(
            base,
            &["aa".into(), "bb".into()],
            "snap-000000000001",
            Some("first"),
            "home1",
        )
        .unwrap();
        let config: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"],
            json!(["sha256:aa", "sha256:bb"])
        );
        assert_eq!(config["history"].as_array().unwrap().len(), 2);
        assert_eq!(config["history"][1]["comment"], "first");
        assert_eq!(
            config["config"]["Labels"][LABEL_SNAPSHOT],
            "snap-000000000001"
        );
        assert_eq!(config["config"]["Labels"][LABEL_HOME], "home1");
    }
}
