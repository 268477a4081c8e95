//! Snapshots: taking one (`silo snapshot`), putting a sandbox back to one
//! (`silo rewind`, and `silo up` restoring a machine that is gone), making a
//! new sandbox from one (`silo fork`), listing and deleting them, and the
//! store's half of `silo gc`.
//!
//! A snapshot is one image layer on top of the image (or, on a remote VM,
//! the provider's template) the sandbox's machine was made from: the sandbox's agent writes the changes since that image
//! (see `silo_protocol::snapshot`), and the controller streams them into
//! the content-addressed store. The base image's own layers are stored once,
//! by the first snapshot that stands on them (the engine's export of that
//! image), and shared by every later one. A snapshot's row lists all its
//! layers, base first, so any snapshot can be loaded back from the store
//! alone, onto an engine that has lost every image.
//!
//! The moments a snapshot reports:
//! - **captured**: the layer is taken and the sandbox runs again;
//! - **durable**: the layer (and, for the first snapshot on an image, the
//!   image, stored after the capture) is fsynced in the store and the row
//!   recorded;
//!
//! A snapshot returns once durable. The engine image of a snapshot is made
//! only when a restore onto a new container (a recreate rewind, a fork,
//! `up` tier 2) needs it, or ahead of one on request
//! ([`Silo::make_engine_image`]); a rewind in place never needs one.
//! Making it sends only the layers the engine lacks (it skips a layer whose
//! chain it has), so a process that exits right after a snapshot loses
//! nothing: the next restore that needs the image makes it.
//!
//! Processes and memory are not captured: a rewound sandbox boots afresh.
//!
//! What a backend's machines need is its `strategy` (engine images or agent
//! layers, made from what the backend hands out: an engine, or the paths
//! its machines' snapshots leave out), never its name. This module holds
//! the types, the errors, listing and deletion; the work is in its
//! children:
//! - `strategy`: the one place engine images and agent layers part ways,
//!   answering where a machine started as values;
//! - `take`: a snapshot taken by one object, `Snapshotter`, made for one
//!   sandbox by `Silo::snapshot` and holding what it needs as values (the
//!   agent's client, the machine's way, the store, the labels of its
//!   image), in named phases: plan, capture, store, record, compact;
//! - `layer`: receiving a layer stream into the store, checked as it comes;
//! - `base`: an engine image's export stored as a base, once, and the
//!   paths of an image made of a base and layers above it;
//! - `config`: a snapshot's image config (layers, history, labels);
//! - `restore`: a snapshot back onto the engine as an image, and the
//!   operations that make a machine from it (rewind, fork, `up` tier 2);
//! - `in_place`: a rewind on the same machine, its agent putting back what
//!   changed since from the store's layers;
//! - `pooled`: a fork onto a warm pool member, rewound in place to the
//!   snapshot instead of a new machine;
//! - `settle`: a rewind in place whose client ended after sending its
//!   layer, recorded (or forgotten) by whoever opens the sandbox next;
//! - `remembered`: what one process keeps between rewinds (container facts,
//!   anchors' path indexes with their digests, by which a snapshot or rewind
//!   names its baseline to an agent that kept the same tree);
//! - `baseline`: what a machine's first snapshot is measured against when
//!   the store has no index of its image (an image's listing, a template
//!   baseline), base ids, and applying a snapshot's layers onto remote VMs;
//! - `diff`: what differs between a sandbox's live tree and a snapshot;
//! - `publish`: blobs put in a fleet's shared store (and held against its
//!   gc) before a row names them;
//! - `gc`: the store's half of `silo gc`.

mod base;
mod baseline;
mod config;
mod diff;
mod gc;
mod in_place;
mod layer;
mod pooled;
mod publish;
mod remembered;
mod restore;
mod settle;
mod strategy;
mod take;

pub use diff::{DiffReport, DiffedPath};
pub use in_place::InPlace;
pub(in crate::silo) use in_place::NotInPlace;
pub use restore::{ForkTarget, MAX_FORKS};

use std::collections::HashSet;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::Silo;
use super::SiloError;
use crate::backend::{Backend, DockerError, EngineImages, SnapshotLabels, SnapshotWay};
use crate::client::{BaselineSent, ClientError};
use crate::home::HomeId;
use crate::spec::BackendKind;
use crate::state::{SandboxRecord, Snapshot, StateError, StoredImage};
use crate::store::{
    Digest, IndexError, IngestError, LoadArchiveError, SharedLock, Store, StoreError, load_archive,
};

/// What a long snapshot step reports, for progress bars.
#[derive(Debug, Clone, Copy)]
pub enum SnapshotProgress {
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

/// Receives [`SnapshotProgress`]; called from blocking threads too.
pub type SnapshotProgressFn = Arc<dyn Fn(SnapshotProgress) + Send + Sync>;

/// A progress receiver that ignores everything.
pub fn no_progress() -> SnapshotProgressFn {
    Arc::new(|_| {})
}

/// What [`crate::Snapshots::take`] did.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotReport {
    /// The snapshot, as recorded.
    pub snapshot: Snapshot,
    /// The base image's layers, when this snapshot had to store them.
    pub base_stored: Option<BaseStored>,
    /// Milliseconds from the start until the layer was taken and the
    /// sandbox ran again.
    pub captured_ms: f64,
    /// Milliseconds from the start until it was in the store and recorded
    /// (with the base image, when this snapshot stored it).
    pub durable_ms: f64,
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
    /// Its chain, squashed after it was durable, when the chain had grown
    /// to [`COMPACT_AT`] layers.
    pub compacted: Option<Compacted>,
    /// How the tree it was measured against reached the agent: by digest
    /// when the agent kept it from the last snapshot or rewind.
    pub baseline_sent: BaselineSent,
}

/// How many layers a snapshot may have above its base before they are
/// squashed into one. Engines refuse images of more than about 125 layers,
/// and the base has its own; a chain this long squashes in milliseconds.
pub const COMPACT_AT: usize = 48;

/// A snapshot's chain squashed into one layer.
#[derive(Debug, Clone, Serialize)]
pub struct Compacted {
    /// Layers above the base before.
    pub layers: usize,
    /// Size of the one layer that replaced them.
    pub bytes: u64,
    /// How much the store grew by it.
    pub new_bytes: u64,
    /// Milliseconds it took.
    pub ms: f64,
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
    /// Whether it was stored after the layer was captured, while the
    /// sandbox ran (the store had the image's listing); otherwise the
    /// capture waited for it.
    pub after_capture: bool,
}

/// What a restore (rewind, fork, `up` tier 2) did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// The sandbox, as recorded now.
    pub sandbox: SandboxRecord,
    /// The snapshot it runs from.
    pub snapshot: String,
    /// How the engine got the snapshot's image, or how the machine was
    /// rewound in place.
    pub image: ImageSource,
    /// Milliseconds from the start until its agent answered.
    pub ms: f64,
    /// When a rewind or a fork made a new machine: why the machine could
    /// not be rewound in place, or why no pool member could be taken.
    pub new_machine_because: Option<String>,
    /// When a fork took a started sandbox from a pool: the pool (one
    /// short now; see [`Silo::fill_pool`]).
    pub pool: Option<String>,
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
    /// No image and no new machine: the sandbox's agent put back, from
    /// the store's layers, what changed since the tree its machine last
    /// had (see `in_place`).
    InPlace(InPlace),
    /// There is no engine: the snapshot's layers above its base were
    /// applied by the agent onto a fresh machine from the template.
    Applied {
        /// Layers applied.
        layers: usize,
        /// Their bytes.
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
    /// Blobs the fleet's shared store held that nothing names, removed.
    pub shared_blobs_removed: usize,
    /// Bytes they took there.
    pub shared_bytes_freed: u64,
    /// Blobs the shared store keeps that this home's cache let go (the
    /// least recently used, past `SILO_CACHE_BYTES`).
    pub cache_evicted: usize,
    /// Bytes they took here.
    pub cache_bytes_evicted: u64,
}

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// This home's identity could not be read or made.
    #[error("cannot read or create this home's identity {path}")]
    HomeId {
        /// Its file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The sandbox's backend cannot snapshot.
    #[error(
        "sandbox {name:?} runs on the {backend} backend, which has no snapshots (docker, e2b and daytona have)"
    )]
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
    /// A sandbox on a remote backend has no recorded baseline (its agent
    /// could not be asked when its machine was made).
    #[error(
        "sandbox {name:?} has no record of the files its machine started with, so its changes \
         cannot be told apart; `silo up {name} --recreate` makes a fresh machine that has one"
    )]
    NoBaseline {
        /// The sandbox.
        name: String,
    },
    /// The machine a snapshot would restore onto may not hold the files the
    /// snapshot's base had.
    #[error(
        "snapshot {snapshot} stands on {base} ({}), but {target} {}: silo cannot tell that \
         they hold the same files. Build one image with `silo image base` or `silo image bake` \
         and make both the Docker image and the template from it",
        base_id.as_deref().map_or("no base id".to_owned(), |id| format!("base id {id}")),
        found.as_deref().map_or("carries no base id".to_owned(), |id| format!("carries base id {id}"))
    )]
    BaseMismatch {
        /// The snapshot.
        snapshot: String,
        /// Its base image.
        base: String,
        /// Its base's base id.
        base_id: Option<String>,
        /// What it would restore onto.
        target: String,
        /// The target's base id.
        found: Option<String>,
    },
    /// The base id file of a machine could not be read.
    #[error("reading the base id of sandbox {name:?} failed")]
    BaseIdUnreadable {
        /// The sandbox.
        name: String,
        /// Why.
        #[source]
        source: Box<crate::sandbox::FileError>,
    },
    /// No image on the engine holds the files a snapshot stands on.
    #[error(
        "snapshot {snapshot} was taken on a template with base id {base_id}, and no image on \
         the engine carries it; load or build the image the template was made from (or name it \
         with --image)"
    )]
    NoEngineImage {
        /// The snapshot.
        snapshot: String,
        /// The base id wanted.
        base_id: String,
    },
    /// More forks, or none, were asked of one call than it makes.
    #[error("forks are made 1 to {MAX_FORKS} at once, not {0}")]
    ForkCount(u32),
    /// A member of a pool standing on a snapshot could not be brought to
    /// it (the member was removed).
    #[error("a new member of pool {pool} could not be brought to snapshot {snapshot}: {why}")]
    PoolMember {
        /// The pool.
        pool: String,
        /// The snapshot it stands on.
        snapshot: String,
        /// Why the rewind in place failed.
        why: String,
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
    /// The fleet's shared store failed or did not answer in time; what
    /// needed it was not recorded.
    #[error(transparent)]
    Shared(Box<crate::store::SharedError>),
    /// The fleet's shared store did not answer within the wait.
    #[error(
        "the shared store at {url} did not take the blobs within {waited:?}, so nothing \
         was recorded; try again once it answers (SILO_STORE_WAIT_SECS sets the wait)"
    )]
    SharedUnavailable {
        /// The bucket's URL.
        url: String,
        /// How long it was waited for.
        waited: std::time::Duration,
        /// The last error.
        #[source]
        source: Box<crate::store::SharedError>,
    },
    /// The state database failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A stored layer or index could not be read.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A chain of layers could not be squashed.
    #[error(transparent)]
    Squash(#[from] crate::store::squash::SquashError),
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
    /// A diff against a sandbox's latest snapshot, of one that has none.
    #[error(
        "sandbox {name:?} has no snapshot to compare with; take one with `silo snapshot {name}`"
    )]
    NoSnapshots {
        /// The sandbox.
        name: String,
    },
    /// Two stored trees could not be compared.
    #[error(transparent)]
    Diff(#[from] crate::store::DiffError),
    /// A stored layer could not be read as a table of its entries.
    #[error(transparent)]
    Table(#[from] crate::store::table::TableError),
    /// A layer that puts back what the engine left out of a tree could not
    /// be made.
    #[error("putting back what the engine left out of the tree")]
    EngineGaps(#[from] crate::store::rewind::RestoreError),
    /// A blocking step panicked or was cancelled.
    #[error("a snapshot step failed to run: {0}")]
    Task(String),
}

impl From<crate::store::SharedError> for SnapshotError {
    fn from(error: crate::store::SharedError) -> Self {
        Self::Shared(Box::new(error))
    }
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

/// The store's shared lock, held from writing blobs until a row names
/// them, so gc cannot judge them unnamed in between.
async fn shared_lock(store: &Store) -> Result<SharedLock, SnapshotError> {
    let store = store.clone();
    blocking(move || Ok(store.shared_lock()?)).await
}

fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

impl Silo {
    /// The content-addressed store under this home (the cache of the
    /// fleet's shared store, when there is one).
    pub fn store(&self) -> Result<Store, SiloError> {
        let store = Store::open(self.home().store_dir()).map_err(SnapshotError::from)?;
        Ok(store.caching(self.shared_store().cloned()))
    }

    /// The engine `kind`'s machines are made from, for a snapshot that
    /// goes onto it as an image.
    fn engine_images(&self, kind: BackendKind) -> Result<EngineImages, SnapshotError> {
        self.backend(kind)
            .snapshots()
            .and_then(SnapshotWay::engine_images)
            .ok_or_else(|| SnapshotError::Inconsistent(format!("the {kind} backend has no engine")))
    }

    /// The labels this home's snapshot images carry: its identity, as the
    /// images its snapshots load carry it.
    fn snapshot_labels(&self) -> Result<SnapshotLabels, SnapshotError> {
        let home_id = HomeId::of(self.home());
        let id = home_id.get().map_err(|source| SnapshotError::HomeId {
            path: home_id.path().display().to_string(),
            source,
        })?;
        Ok(SnapshotLabels::new(id))
    }

    /// The stored image with this id, if every blob it names is in the store.
    async fn complete_image(
        &self,
        store: &Store,
        image_id: &str,
    ) -> Result<Option<StoredImage>, SnapshotError> {
        let Some(image) = self.db().stored_image(image_id)? else {
            return Ok(None);
        };
        // A row of a fleet's state names only blobs its shared store holds
        // (they are put there first): missing here, they are fetched.
        if store.shared().is_some() {
            return Ok(Some(image));
        }
        let blobs: Vec<String> = image
            .layers
            .iter()
            .cloned()
            .chain([image.index_blob.clone()])
            .collect();
        let store = store.clone();
        let complete = blocking(move || {
            for blob in blobs {
                if !store.has(&parse_digest(&blob)?)? {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await?;
        Ok(complete.then_some(image))
    }

    /// The sandbox's checkpoint: the snapshot its machine last had exactly,
    /// and the moment (machine clock) it did. `None` without one, or when
    /// that snapshot was deleted since (the next snapshot is then whole).
    fn checkpoint_of(
        &self,
        sandbox: &SandboxRecord,
    ) -> Result<Option<(i64, Snapshot)>, StateError> {
        let Some(checkpoint) = &sandbox.checkpoint else {
            return Ok(None);
        };
        match self.db().snapshot(&checkpoint.snapshot) {
            Ok(snapshot) => Ok(Some((checkpoint.stopped_at_ns, snapshot))),
            Err(StateError::UnknownSnapshot(_)) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// The stored image a snapshot stands on.
    fn base_of(&self, snapshot: &Snapshot) -> Result<StoredImage, SnapshotError> {
        self.db()
            .stored_image(&snapshot.base_image)?
            .ok_or_else(|| {
                SnapshotError::Inconsistent(format!(
                    "snapshot {} stands on image {}, which is not stored",
                    snapshot.id, snapshot.base_image
                ))
            })
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
        for engine_images in self.backends().engines() {
            match engine_images.remove_image(&image).await {
                Ok(_) | Err(DockerError::Unreachable { .. } | DockerError::Unresponsive { .. }) => {
                }
                Err(error) => tracing::warn!(snapshot = snapshot.id, "removing its image: {error}"),
            }
        }
        Ok(snapshot)
    }
}

/// The digests a snapshot's layers are named by.
fn digests(layers: &[String]) -> Result<Vec<Digest>, SnapshotError> {
    layers.iter().map(|layer| parse_digest(layer)).collect()
}

fn parse_digest(text: &str) -> Result<Digest, SnapshotError> {
    Digest::parse(text).map_err(|e| SnapshotError::Inconsistent(format!("{text:?}: {e}")))
}
