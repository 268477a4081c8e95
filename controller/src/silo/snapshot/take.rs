//! Taking a snapshot, as one object: [`Snapshotter`], made for one sandbox
//! by [`Silo::snapshot`] (which leases the sandbox and hands over), holding
//! what the operation needs as values (the running agent's client, its
//! machine's [`SnapshotWay`], the store, the labels its image config
//! carries), with [`Silo`] as its context for the state database. Its
//! phases, in order, each a method:
//! - **plan**: what the snapshot builds on (the machine's last snapshot,
//!   else the snapshot it was made from, else the image its files came
//!   from, as its way says) and the tree its layer is measured against;
//! - **capture**: the agent's layer of what changed since, streamed into
//!   the store as it comes and checked as it comes (`layer`);
//! - **store**: the base image, when the first snapshot on an image the
//!   store lacked was captured against the image's listing, stored now,
//!   while the sandbox runs again;
//! - **record**: the row naming the base and every layer, and its event;
//! - **compact**: the chain squashed into one layer once it has grown to
//!   [`COMPACT_AT`].
//!
//! The layer is captured first whenever the store has something to
//! measure it against (the chain's tree, the image's index, or the image's
//! listing); only an image the store lacks, with no listing, is stored
//! before. That tree goes to the agent by its digest, and by its paths only
//! to an agent that did not keep it ([`crate::client::BaselineSent`]). A
//! snapshot is durable once its blobs are fsynced in the store and the row
//! is recorded, and it returns then: the engine image only a restore onto a
//! new container needs is made by that restore (or ahead of it, on
//! request).

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use serde_json::{Value, json};
use silo_protocol::snapshot::SnapshotRequest;

use super::base::image_index;
use super::baseline::listing_image_id;
use super::config::{snapshot_config, squashed_config};
use super::layer::store_layer;
use super::remembered::{self, KnownTree};
use super::strategy::StartImage;
use super::{
    BaseStored, COMPACT_AT, Compacted, SnapshotError, SnapshotProgress, SnapshotProgressFn,
    SnapshotReport, blocking, ms_since, parse_digest, shared_lock,
};
use crate::backend::{EngineImages, MachineState, SnapshotLabels, SnapshotWay};
use crate::client::{AgentClient, BaselineSent, Endpoint};
use crate::naming::new_snapshot_id;
use crate::silo::{Silo, SiloError};
use crate::state::{Checkpoint, SandboxRecord, Snapshot, StoredImage, now_ms};
use crate::store::squash::squash;
use crate::store::table::table;
use crate::store::{Index, LayerStats, Store, Written};

/// How far before a moment (a container's creation, a snapshot, a rewind)
/// a file's ctime still counts as changed; the agent settles a pool
/// member's rewind by the same margin.
pub(super) use silo_protocol::snapshot::CTIME_MARGIN_NS;

impl Silo {
    /// Snapshots a sandbox's file system (starting it first if it is
    /// stopped). See the module docs for what is captured and reported.
    pub(crate) async fn snapshot(
        &self,
        name_or_id: &str,
        message: Option<String>,
        progress: &SnapshotProgressFn,
    ) -> Result<SnapshotReport, SiloError> {
        let start = Instant::now();
        let (_lease, sandbox) = self.lease_sandbox(name_or_id, "snapshot").await?;
        Snapshotter::ready(self, sandbox, progress)
            .await?
            .take(start, message)
            .await
    }

    /// Snapshots a sandbox whose lease the caller holds (a stop that
    /// deletes the machine, which keeps its files this way).
    pub(crate) async fn snapshot_leased(
        &self,
        sandbox: SandboxRecord,
        message: Option<String>,
    ) -> Result<SnapshotReport, SiloError> {
        let start = Instant::now();
        Snapshotter::ready(self, sandbox, &super::no_progress())
            .await?
            .take(start, message)
            .await
    }
}

/// One snapshot of one sandbox, taken in named phases (see the module
/// docs). Made with the sandbox's lease held, and used once.
struct Snapshotter<'a> {
    /// The context: the state database, and the store's records.
    silo: &'a Silo,
    /// The sandbox, as recorded once its machine runs.
    sandbox: SandboxRecord,
    /// How its machine is snapshotted: where it started is the way's to say.
    way: SnapshotWay,
    /// Its agent, which writes the layer.
    client: AgentClient,
    /// Where the layer, and the base when it is not there yet, go.
    store: Store,
    /// What the snapshot's image config is labelled with.
    labels: SnapshotLabels,
    /// Where each long step reports.
    progress: SnapshotProgressFn,
}

/// What the capture builds on, and against what it measures.
struct Plan {
    /// The snapshot or image the new one builds on.
    on: On,
    /// The tree of `on`: what the agent compares the live tree with.
    baseline: Arc<KnownTree>,
    /// What counts as changed, and where to look.
    request: SnapshotRequest,
}

/// What a snapshot builds on.
enum On {
    /// An earlier snapshot (the machine's checkpoint, or what it was made
    /// from), with its base.
    Snapshot(Box<Snapshot>, StoredImage),
    /// The image the machine was made from.
    Base(StartBase),
}

/// The image a machine's files came from, as a first snapshot of it
/// stands on it.
enum StartBase {
    /// In the store (with what storing it took, when this snapshot did).
    Stored(StoredImage, Option<BaseStored>),
    /// Not in the store yet: the machine's own listing (a blob's digest)
    /// stands in for its paths until the image is stored from `images`
    /// after the capture.
    Pending {
        images: EngineImages,
        image_id: String,
        listing: String,
    },
}

/// The agent's layer, in the store, and what the agent said of it.
struct Captured {
    /// The layer's blob.
    written: Written,
    /// What it holds.
    stats: LayerStats,
    /// Processes stopped while it was read.
    processes_stopped: u64,
    /// Processes that had not stopped when it started.
    processes_unsettled: u64,
    /// When they had all stopped (machine clock): the next snapshot's
    /// checkpoint.
    stopped_at_ns: Option<i64>,
    /// How the baseline reached the agent.
    baseline_sent: BaselineSent,
}

/// What a snapshot stands on once its base is in the store: the rest of
/// its row, but for its own layer.
struct Footing {
    /// The stored base image.
    base: StoredImage,
    /// The layers below its own: the base's, then its chain's.
    layers: Vec<String>,
    /// The image config it extends.
    config: Value,
    /// The snapshot it builds on, if any.
    parent: Option<String>,
    /// What storing the base took, when this snapshot stored it.
    base_stored: Option<BaseStored>,
}

impl Footing {
    /// A first snapshot's footing on an image.
    fn image(base: StoredImage, base_stored: Option<BaseStored>) -> Self {
        Self {
            layers: base.layers.clone(),
            config: base.config.clone(),
            base,
            parent: None,
            base_stored,
        }
    }
}

impl<'a> Snapshotter<'a> {
    /// The snapshotter of `sandbox`, whose lease the caller holds: its way
    /// (or why it has none), its machine running (started when stopped),
    /// its agent's client, and the store.
    async fn ready(
        silo: &'a Silo,
        sandbox: SandboxRecord,
        progress: &SnapshotProgressFn,
    ) -> Result<Self, SiloError> {
        let way = silo.strategy_of(&sandbox)?;
        let (sandbox, client) = running(silo, sandbox).await?;
        let store = silo.store()?;
        let labels = silo.snapshot_labels()?;
        Ok(Self {
            silo,
            sandbox,
            way,
            client,
            store,
            labels,
            progress: Arc::clone(progress),
        })
    }

    /// Takes the snapshot, `start` being when it was asked for: its phases
    /// in turn, under the store's shared lock from before the first blob is
    /// written until the row names them all, so gc cannot judge them
    /// unnamed in between.
    async fn take(
        self,
        start: Instant,
        message: Option<String>,
    ) -> Result<SnapshotReport, SiloError> {
        let lock = shared_lock(&self.store).await?;
        let plan = self.plan().await?;
        let captured = self.capture(plan.request, &plan.baseline).await?;
        let captured_ms = ms_since(start);
        let footing = self.store_base(plan.on).await?;
        // Durable in the fleet's shared store before the row names it.
        let _hold = self
            .silo
            .publish(&self.store, std::slice::from_ref(&captured.written.digest))
            .await?;
        let unchanged = self.unchanged(&footing, &captured).await?;
        let snapshot = self.record(&footing, &captured, unchanged, message)?;
        let durable_ms = ms_since(start);
        let (snapshot, compacted) = self.compact(&footing.base, snapshot).await;
        drop(lock);
        // The engine image a recreate restore needs is not made here: most
        // restores are in place and never need it, and the one that does
        // makes it from the store (see `restore`).
        Ok(SnapshotReport {
            snapshot,
            base_stored: footing.base_stored,
            captured_ms,
            durable_ms,
            entries: captured.stats.entries,
            deletions: captured.stats.whiteouts,
            processes_stopped: captured.processes_stopped,
            processes_unsettled: captured.processes_unsettled,
            compacted,
            baseline_sent: captured.baseline_sent,
        })
    }

    /// What the snapshot builds on: the newest snapshot of this machine,
    /// else the snapshot the machine was made from, else its image. The
    /// layer is measured against the tree of what it builds on, or, before
    /// its image is stored, the machine's own listing.
    async fn plan(&self) -> Result<Plan, SiloError> {
        let silo = self.silo;
        let checkpoint = silo.checkpoint_of(&self.sandbox)?;
        let standing_on = match (&checkpoint, &self.sandbox.origin_snapshot) {
            (Some((_, snapshot)), _) => Some(snapshot.clone()),
            (None, Some(origin)) => Some(silo.db().snapshot(origin)?),
            (None, None) => None,
        };
        let start = self.way.start_point(silo, &self.sandbox).await?;
        let (on, baseline) = match standing_on {
            Some(snapshot) => {
                let base = silo.base_of(&snapshot)?;
                // A process that checkpoints again and again applies only
                // the newest layer to the tree it remembers, not the base's
                // index and every layer of the chain each time.
                let index = remembered::index(&self.store, &base, &snapshot.layers).await?;
                (On::Snapshot(Box::new(snapshot), base), index)
            }
            None => {
                let base = self.start_base(start.image).await?;
                let index = self.base_index(&base).await?;
                (On::Base(base), index)
            }
        };
        let mut request = start.request;
        if let Some((stopped_at_ns, _)) = checkpoint {
            // Changed since the last snapshot, but walked into as far as
            // anything changed since the machine started (see the field).
            request.descend_since_ns = Some(request.changed_since_ns);
            request.changed_since_ns = stopped_at_ns.saturating_sub(CTIME_MARGIN_NS);
        }
        Ok(Plan {
            on,
            baseline,
            request,
        })
    }

    /// The image a machine's files came from, for a first snapshot on it:
    /// stored already, or pending when the store has the image's listing to
    /// measure the layer against (the image is stored after the capture),
    /// or else stored now.
    async fn start_base(&self, image: StartImage) -> Result<StartBase, SnapshotError> {
        let (images, image_id, exclude) = match image {
            StartImage::Stored(image) => return Ok(StartBase::Stored(image, None)),
            StartImage::Engine {
                images,
                image_id,
                exclude,
            } => (images, image_id, exclude),
        };
        let (silo, store) = (self.silo, &self.store);
        if let Some(image) = silo.complete_image(store, &image_id).await? {
            return Ok(StartBase::Stored(image, None));
        }
        let listing = listing_image_id(&image_id, &exclude);
        if let Some(listing) = silo.complete_image(store, &listing).await? {
            return Ok(StartBase::Pending {
                images,
                image_id,
                listing: listing.index_blob,
            });
        }
        let (image, stored) = silo
            .store_base_image(&images, store, &image_id, &self.progress)
            .await?;
        Ok(StartBase::Stored(image, stored))
    }

    /// The paths of a first snapshot's base: the stored image's index, or
    /// the machine's listing while the image is pending.
    async fn base_index(&self, base: &StartBase) -> Result<Arc<KnownTree>, SnapshotError> {
        let store = self.store.clone();
        let tree = match base {
            StartBase::Stored(base, _) => {
                let base = base.clone();
                blocking(move || Ok(KnownTree::new(image_index(&store, &base, &base.layers)?)))
                    .await?
            }
            StartBase::Pending { listing, .. } => {
                let listing = listing.clone();
                blocking(move || {
                    let blob = store.open_blob(&parse_digest(&listing)?)?;
                    Ok(KnownTree::new(Index::read_from(blob)?))
                })
                .await?
            }
        };
        Ok(Arc::new(tree))
    }

    /// Asks the agent for the layer of what changed, measured against
    /// `baseline`, and streams it into the store as it comes (checked as
    /// it comes). The agent stops the sandbox's processes while it reads;
    /// they run again by the time the layer is in.
    async fn capture(
        &self,
        request: SnapshotRequest,
        baseline: &KnownTree,
    ) -> Result<Captured, SiloError> {
        let sandbox = &self.sandbox;
        (self.progress)(SnapshotProgress::Step {
            label: "capturing",
            total: None,
        });
        let incremental = request.descend_since_ns.is_some();
        let (answer, baseline_sent) = self
            .client
            .snapshot_against(request, baseline)
            .await
            .map_err(|source| SnapshotError::Agent {
                name: sandbox.name.clone(),
                source: Box::new(source),
            })?;
        if incremental && answer.stopped_at_ns.is_none() {
            // Only an agent that stamps its snapshots knows the field; one
            // that does not may have pruned away changes. The machine's
            // agent was replaced by an older one since the last snapshot.
            return Err(SnapshotError::Inconsistent(format!(
                "the agent of {} no longer says when it stopped the sandbox's processes, \
                 so the snapshot cannot build on the last one; run `silo rewind {} {}` \
                 or recreate the sandbox",
                sandbox.name,
                sandbox.name,
                sandbox
                    .checkpoint
                    .as_ref()
                    .map_or("", |checkpoint| checkpoint.snapshot.as_str())
            ))
            .into());
        }
        if answer.unsettled > 0 {
            tracing::warn!(
                sandbox = %sandbox.name,
                unsettled = answer.unsettled,
                "processes had not stopped when the layer started; their writes under way may be half in it"
            );
        }
        let (processes_stopped, processes_unsettled) = (answer.stopped, answer.unsettled);
        let stopped_at_ns = answer.stopped_at_ns;
        let body = answer.body.into_data_stream();
        let (written, stats) =
            store_layer(body, &self.store, &self.progress, &sandbox.name).await?;
        Ok(Captured {
            written,
            stats,
            processes_stopped,
            processes_unsettled,
            stopped_at_ns,
            baseline_sent,
        })
    }

    /// What the snapshot stands on, with its base in the store: a first
    /// snapshot on an image the store lacked stores the image now, after
    /// the capture, while the sandbox runs, and is durable once it is in.
    async fn store_base(&self, on: On) -> Result<Footing, SnapshotError> {
        match on {
            On::Snapshot(snapshot, base) => {
                let config: Value = serde_json::from_str(&snapshot.config).map_err(|e| {
                    SnapshotError::Inconsistent(format!("config of {}: {e}", snapshot.id))
                })?;
                let Snapshot { id, layers, .. } = *snapshot;
                Ok(Footing {
                    base,
                    layers,
                    config,
                    parent: Some(id),
                    base_stored: None,
                })
            }
            On::Base(StartBase::Stored(base, stored)) => Ok(Footing::image(base, stored)),
            On::Base(StartBase::Pending {
                images, image_id, ..
            }) => {
                let (base, stored) = self
                    .silo
                    .store_base_image(&images, &self.store, &image_id, &self.progress)
                    .await?;
                let stored = stored.map(|stored| BaseStored {
                    after_capture: true,
                    ..stored
                });
                Ok(Footing::image(base, stored))
            }
        }
    }

    /// Whether the captured layer changes nothing of the snapshot it builds
    /// on: no path, no deletion, and the root's own metadata as that
    /// snapshot's top layer has it, its time aside as any directory's (a
    /// layer with no root entry, from an older agent, says nothing of the
    /// root).
    async fn unchanged(
        &self,
        footing: &Footing,
        captured: &Captured,
    ) -> Result<bool, SnapshotError> {
        let stats = &captured.stats;
        let Some(top) = footing.layers.last().filter(|_| footing.parent.is_some()) else {
            return Ok(false);
        };
        if stats.entries > 0 || stats.whiteouts > 0 {
            return Ok(false);
        }
        let (store, top) = (self.store.clone(), parse_digest(top)?);
        let new = captured.written.digest.clone();
        blocking(move || {
            let now = table(&store, &new)?;
            let Some(root) = now.root() else {
                return Ok(true);
            };
            Ok(table(&store, &top)?
                .root()
                .is_some_and(|was| was.same_as(root)))
        })
        .await
    }

    /// Records the snapshot: its row, naming the base and every layer, its
    /// `snapshot` event and the sandbox's new checkpoint, in one
    /// transaction. From here it is durable.
    fn record(
        &self,
        footing: &Footing,
        captured: &Captured,
        unchanged: bool,
        message: Option<String>,
    ) -> Result<Snapshot, SiloError> {
        let (sandbox, written) = (&self.sandbox, &captured.written);
        let id = new_snapshot_id()?;
        let mut layers = footing.layers.clone();
        // Nothing changed since the snapshot this one builds on: it restores
        // to the same files with the same layers, and the chain stays short.
        if !unchanged {
            layers.push(written.digest.to_string());
        }
        let config = snapshot_config(
            footing.config.clone(),
            &layers,
            (&id, !unchanged),
            message.as_deref(),
            &self.labels,
        )?;
        let base_bytes = footing.base_stored.as_ref().map_or(0, |b| b.bytes);
        let snapshot = Snapshot {
            id,
            sandbox_id: sandbox.id.clone(),
            sandbox_name: sandbox.name.clone(),
            parent: footing.parent.clone(),
            spec: sandbox.spec.clone(),
            base_image: footing.base.image_id.clone(),
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
        let checkpoint = captured.stopped_at_ns.map(|stopped_at_ns| Checkpoint {
            snapshot: snapshot.id.clone(),
            stopped_at_ns,
        });
        self.silo
            .db()
            .insert_snapshot(&snapshot, checkpoint.as_ref(), &detail)?;
        Ok(snapshot)
    }

    /// The recorded snapshot, its chain squashed into one layer once it has
    /// grown to [`COMPACT_AT`] layers above its base. A failed squash
    /// leaves it as recorded, still durable; the next snapshot tries again.
    async fn compact(
        &self,
        base: &StoredImage,
        snapshot: Snapshot,
    ) -> (Snapshot, Option<Compacted>) {
        let chain = snapshot.layers.len().saturating_sub(base.layers.len());
        if chain < COMPACT_AT {
            return (snapshot, None);
        }
        match self.squash_chain(base, &snapshot).await {
            Ok((squashed, compacted)) => (squashed, Some(compacted)),
            Err(error) => {
                let error = silo_protocol::http::error_chain(&error);
                tracing::warn!(snapshot = snapshot.id, "squashing its chain: {error}");
                (snapshot, None)
            }
        }
    }

    /// Squashes the snapshot's layers above its base into one, which
    /// restores to the same files, and records it so.
    async fn squash_chain(
        &self,
        base: &StoredImage,
        snapshot: &Snapshot,
    ) -> Result<(Snapshot, Compacted), SnapshotError> {
        let start = Instant::now();
        let Some(above) = snapshot.layers.strip_prefix(base.layers.as_slice()) else {
            return Err(SnapshotError::Inconsistent(format!(
                "layers of {} do not start with those of image {}",
                snapshot.id, base.image_id
            )));
        };
        let above = above
            .iter()
            .map(|layer| parse_digest(layer))
            .collect::<Result<Vec<_>, _>>()?;
        let count = above.len();
        let squashed = {
            let store = self.store.clone();
            blocking(move || Ok(squash(&store, &above)?)).await?
        };
        let mut layers = base.layers.clone();
        layers.push(squashed.digest.to_string());
        let config = squashed_config(snapshot, &layers, count)?;
        let _hold = self
            .silo
            .publish(&self.store, std::slice::from_ref(&squashed.digest))
            .await?;
        let snapshot = self
            .silo
            .db()
            .replace_snapshot_layers(snapshot, &layers, &config)?;
        let compacted = Compacted {
            layers: count,
            bytes: squashed.size,
            new_bytes: if squashed.new { squashed.size } else { 0 },
            ms: ms_since(start),
        };
        Ok((snapshot, compacted))
    }
}

/// The sandbox with its machine running, and its agent's client. An agent
/// that answers on a socket of this host now needs no backend asked (an
/// engine inspect and a health check of its own), and its client has
/// learned the agent's versions, so the capture is one more connection
/// rather than two; a socket answers or refuses at once. Otherwise the
/// backend says whether the machine runs, and a stopped one is started.
async fn running(
    silo: &Silo,
    sandbox: SandboxRecord,
) -> Result<(SandboxRecord, AgentClient), SiloError> {
    if let Ok(client) = silo.client(&sandbox) {
        if matches!(client.endpoint(), Endpoint::Unix(_)) && client.healthz().await.is_ok() {
            return Ok((sandbox, client));
        }
    }
    let sandbox = match silo.status(&sandbox).await? {
        MachineState::Running => sandbox,
        MachineState::Stopped => silo.start_sandbox(&sandbox).await?,
        MachineState::Missing => return Err(silo.gone(&sandbox)),
    };
    let client = silo.client(&sandbox)?;
    Ok((sandbox, client))
}
