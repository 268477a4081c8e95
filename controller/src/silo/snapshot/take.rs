//! Taking a snapshot: the base the sandbox's machine stands on (stored once
//! per image), the agent's layer of what changed since, and the row that
//! names them all. The layer is captured first whenever the store has
//! something to measure it against (the chain's tree, the image's index,
//! or the image's listing); a base image the store lacks is stored after
//! the capture, while the sandbox runs. That tree goes to the agent by its
//! digest, and by its paths only to an agent that did not keep it
//! ([`crate::client::BaselineSent`]). A snapshot is durable once its
//! blobs are fsynced in the store and the row is recorded, and it returns
//! then: the engine image only a restore onto a new container needs is
//! made by that restore (or ahead of it, on request).

use std::io;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use serde_json::{Value, json};
use silo_protocol::snapshot::SnapshotRequest;

use super::baseline::listing_image_id;
use super::layer::{CountingReader, Received, receive_layer};
use super::remembered::{self, KnownTree};
use super::{
    BaseStored, COMPACT_AT, Compacted, SnapshotError, SnapshotProgress, SnapshotProgressFn,
    SnapshotReport, blocking, engine, ms_since, parse_digest, shared_lock,
};
use crate::backend::labels::LABEL_HOME;
use crate::backend::{BackendError, MachineState};
use crate::backend::{ContainerFacts, EngineImages, LABEL_SNAPSHOT};
use crate::bridge;
use crate::client::{AgentClient, Endpoint};
use crate::image::base_id_of;
use crate::naming::new_snapshot_id;
use crate::silo::{Silo, SiloError, backend_error, machine};
use crate::state::{Checkpoint, SandboxRecord, Snapshot, StoredImage, now_ms};
use crate::store::squash::squash;
use crate::store::{Index, Store, save_archive};
use crate::timestamp::unix_ms_to_rfc3339;

/// How far before its container's creation a file's ctime still counts as
/// changed. File times come from a clock that ticks a few milliseconds
/// behind the one the engine stamps containers with; a margin can only make
/// a snapshot larger, never miss a change.
pub(super) const CTIME_MARGIN_NS: i64 = 20_000_000;

impl Silo {
    /// A client of the sandbox's agent if it answers on a socket of this
    /// host now: then its machine runs, with no need to ask the backend
    /// (an engine inspect and a health check of its own), and the client
    /// has learned the agent's versions, so the capture is one more
    /// connection rather than two. A socket answers or refuses at once; a
    /// provider's machine is asked through its backend as before.
    async fn answering(&self, sandbox: &SandboxRecord) -> Option<AgentClient> {
        let client = self.client(sandbox).ok()?;
        if !matches!(client.endpoint(), Endpoint::Unix(_)) {
            return None;
        }
        client.healthz().await.ok()?;
        Some(client)
    }

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
        let strategy = self.strategy_of(&sandbox)?;
        let (sandbox, client) = match self.answering(&sandbox).await {
            Some(client) => (sandbox, client),
            None => {
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
                let client = self.client(&sandbox)?;
                (sandbox, client)
            }
        };
        let store = self.store()?;
        let lock = shared_lock(&store).await?;
        // What the snapshot builds on: the newest snapshot of this machine,
        // else the snapshot the machine was made from, else its image.
        let checkpoint = self.checkpoint_of(&sandbox)?;
        let standing_on = match (&checkpoint, &sandbox.origin_snapshot) {
            (Some((_, snapshot)), _) => Some(snapshot.clone()),
            (None, Some(origin)) => Some(self.db().snapshot(origin)?),
            (None, None) => None,
        };
        let start_point = strategy
            .start_point(self, &sandbox, standing_on.is_none(), &store, progress)
            .await?;
        // What the layer is measured against: the tree of what it builds
        // on, or, before its image is stored, the machine's own listing.
        let (on, baseline) = match (standing_on, start_point.base) {
            (Some(snapshot), _) => {
                let base = self.base_of(&snapshot)?;
                // A process that checkpoints again and again applies only
                // the newest layer to the tree it remembers, not the base's
                // index and every layer of the chain each time.
                let index = remembered::index(&store, &base, &snapshot.layers).await?;
                (On::Snapshot(Box::new(snapshot), base), index)
            }
            (None, Some(start)) => {
                let index = match &start {
                    StartBase::Stored(base, _) => {
                        Arc::new(chain_index(&store, base, &base.layers).await?)
                    }
                    StartBase::Pending { listing, .. } => {
                        let (store, listing) = (store.clone(), listing.clone());
                        Arc::new(
                            blocking(move || {
                                let blob = store.open_blob(&parse_digest(&listing)?)?;
                                Ok(KnownTree::new(Index::read_from(blob)?))
                            })
                            .await?,
                        )
                    }
                };
                (On::Base(start), index)
            }
            (None, None) => {
                return Err(SnapshotError::Inconsistent(
                    "no base for a machine made from an image".into(),
                )
                .into());
            }
        };
        let mut request = start_point.request;
        if let Some((stopped_at_ns, _)) = checkpoint {
            // Changed since the last snapshot, but walked into as far as
            // anything changed since the machine started (see the field).
            request.descend_since_ns = Some(request.changed_since_ns);
            request.changed_since_ns = stopped_at_ns.saturating_sub(CTIME_MARGIN_NS);
        }

        progress(SnapshotProgress::Step {
            label: "capturing",
            total: None,
        });
        let agent_error = |source| SnapshotError::Agent {
            name: sandbox.name.clone(),
            source: Box::new(source),
        };
        let incremental = request.descend_since_ns.is_some();
        let (answer, baseline_sent) = client
            .snapshot_against(request, &*baseline)
            .await
            .map_err(agent_error)?;
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
        let (processes_stopped, processes_unsettled) = (answer.stopped, answer.unsettled);
        let stopped_at_ns = answer.stopped_at_ns;
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

        // The sandbox runs again; a first snapshot on an image the store
        // lacked stores the image now, and is durable once it is in.
        let (base, layers, config, parent, base_stored) = match on {
            On::Snapshot(snapshot, base) => {
                let config: Value = serde_json::from_str(&snapshot.config).map_err(|e| {
                    SnapshotError::Inconsistent(format!("config of {}: {e}", snapshot.id))
                })?;
                let Snapshot { id, layers, .. } = *snapshot;
                (base, layers, config, Some(id), None)
            }
            On::Base(StartBase::Stored(base, stored)) => on_image(base, stored),
            On::Base(StartBase::Pending { image_id, .. }) => {
                let images = self.engine_images(sandbox.backend)?;
                let (base, stored) = self
                    .store_base_image(&images, &store, &image_id, progress)
                    .await?;
                let stored = stored.map(|stored| BaseStored {
                    after_capture: true,
                    ..stored
                });
                on_image(base, stored)
            }
        };

        let id = new_snapshot_id()?;
        let mut layers = layers;
        // Nothing changed since the snapshot this one builds on: it restores
        // to the same files with the same layers, and the chain stays short.
        let unchanged = parent.is_some() && stats.entries == 0 && stats.whiteouts == 0;
        if !unchanged {
            layers.push(written.digest.to_string());
        }
        let config = snapshot_config(
            config,
            &layers,
            (&id, !unchanged),
            message.as_deref(),
            &self.home_id()?,
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
        let checkpoint = stopped_at_ns.map(|stopped_at_ns| Checkpoint {
            snapshot: snapshot.id.clone(),
            stopped_at_ns,
        });
        self.db()
            .insert_snapshot(&snapshot, checkpoint.as_ref(), &detail)?;
        let durable_ms = ms_since(start);
        let chain = snapshot.layers.len().saturating_sub(base.layers.len());
        let (snapshot, compacted) = match chain >= COMPACT_AT {
            true => match self.compact(&store, &base, &snapshot).await {
                Ok((compacted_snapshot, compacted)) => (compacted_snapshot, Some(compacted)),
                // Still durable as it is; the next snapshot tries again.
                Err(error) => {
                    let error = silo_protocol::http::error_chain(&error);
                    tracing::warn!(snapshot = snapshot.id, "squashing its chain: {error}");
                    (snapshot, None)
                }
            },
            false => (snapshot, None),
        };
        drop(lock);
        // The engine image a recreate restore needs is not made here: most
        // restores are in place and never need it, and the one that does
        // makes it from the store (see `restore`).
        Ok(SnapshotReport {
            snapshot,
            base_stored,
            captured_ms,
            durable_ms,
            entries: stats.entries,
            deletions: stats.whiteouts,
            processes_stopped,
            processes_unsettled,
            compacted,
            baseline_sent,
        })
    }

    /// Squashes the snapshot's layers above its base into one, which
    /// restores to the same files (see [`COMPACT_AT`]). The caller holds
    /// the store's shared lock.
    async fn compact(
        &self,
        store: &Store,
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
            let store = store.clone();
            blocking(move || Ok(squash(&store, &above)?)).await?
        };
        let mut layers = base.layers.clone();
        layers.push(squashed.digest.to_string());
        let mut config: Value = serde_json::from_str(&snapshot.config)
            .map_err(|e| SnapshotError::Inconsistent(format!("config of {}: {e}", snapshot.id)))?;
        set_diff_ids(&mut config, &layers)?;
        merge_history(&mut config, count);
        let config = serde_json::to_string(&config)
            .map_err(|e| SnapshotError::Inconsistent(e.to_string()))?;
        let snapshot = self
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

    /// What the engine says of a sandbox's container that its snapshots
    /// need; `action` names the operation in an error.
    pub(super) async fn container_facts(
        &self,
        sandbox: &SandboxRecord,
        action: &'static str,
    ) -> Result<ContainerFacts, SiloError> {
        let key = self.sandbox_key(sandbox);
        self.engine_images(sandbox.backend)?
            .container_facts(machine(sandbox, &key))
            .await
            .map_err(|e| backend_error(action, sandbox, BackendError::from(e)))
    }

    /// The image a container was made from: stored already, or pending
    /// when the store has its listing to measure the layer against (the
    /// image is stored after the capture), or else stored now.
    pub(super) async fn container_base(
        &self,
        sandbox: &SandboxRecord,
        facts: &ContainerFacts,
        store: &Store,
        progress: &SnapshotProgressFn,
    ) -> Result<StartBase, SnapshotError> {
        if let Some(image) = self.complete_image(store, &facts.image_id).await? {
            return Ok(StartBase::Stored(image, None));
        }
        let listing = listing_image_id(&facts.image_id, &facts.exclude);
        if let Some(listing) = self.complete_image(store, &listing).await? {
            return Ok(StartBase::Pending {
                image_id: facts.image_id.clone(),
                listing: listing.index_blob,
            });
        }
        let (image, stored) = self
            .store_base_image(
                &self.engine_images(sandbox.backend)?,
                store,
                &facts.image_id,
                progress,
            )
            .await?;
        Ok(StartBase::Stored(image, stored))
    }

    /// The base image, stored: from the records when its layers are in the
    /// store already, else exported from the engine into the store now.
    pub(super) async fn store_base_image(
        &self,
        images: &EngineImages,
        store: &Store,
        image_id: &str,
        progress: &SnapshotProgressFn,
    ) -> Result<(StoredImage, Option<BaseStored>), SnapshotError> {
        if let Some(image) = self.complete_image(store, image_id).await? {
            return Ok((image, None));
        }
        let start = Instant::now();
        progress(SnapshotProgress::Step {
            label: "storing the base image",
            total: None,
        });
        let export = images
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
        let labels = &saved.config["config"]["Labels"];
        let identity = base_id_of(
            |name| labels[name].as_str().map(str::to_owned),
            saved.layers.len(),
        );
        let image = StoredImage {
            image_id: image_id.to_owned(),
            identity,
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
            after_capture: false,
        };
        Ok((image, Some(stored)))
    }
}

/// Where a machine started, as a snapshot of it needs to know.
pub(super) struct StartPoint {
    /// The image its files came from; `None` for a machine made from a
    /// snapshot, whose base is the snapshot's.
    pub(super) base: Option<StartBase>,
    /// What counts as changed (the baseline is filled in later).
    pub(super) request: SnapshotRequest,
}

/// The image a machine's files came from.
pub(super) enum StartBase {
    /// In the store (with what storing it took, when this snapshot did).
    Stored(StoredImage, Option<BaseStored>),
    /// Not in the store yet: the machine's own listing (a blob's digest)
    /// stands in for its paths until the image is stored after the capture.
    Pending { image_id: String, listing: String },
}

/// What a snapshot builds on.
enum On {
    /// An earlier snapshot (the machine's checkpoint, or what it was made
    /// from), with its base.
    Snapshot(Box<Snapshot>, StoredImage),
    /// The image the machine was made from.
    Base(StartBase),
}

/// The base, layers, config, parent and stored base of a first snapshot on
/// an image.
fn on_image(
    base: StoredImage,
    stored: Option<BaseStored>,
) -> (
    StoredImage,
    Vec<String>,
    Value,
    Option<String>,
    Option<BaseStored>,
) {
    let (layers, config) = (base.layers.clone(), base.config.clone());
    (base, layers, config, None, stored)
}

/// [`image_index`] with its digest, off the async threads.
async fn chain_index(
    store: &Store,
    base: &StoredImage,
    layers: &[String],
) -> Result<KnownTree, SnapshotError> {
    let (store, base, layers) = (store.clone(), base.clone(), layers.to_vec());
    blocking(move || Ok(KnownTree::new(image_index(&store, &base, &layers)?))).await
}

/// The paths of an image made of `layers`: the base image's stored index,
/// then each layer above the base's applied in order.
pub(super) fn image_index(
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

/// Marks the history entries of the `squashed` topmost layers but the last
/// as making no layer: engines refuse a config whose history names more
/// layers than its `rootfs` has.
fn merge_history(config: &mut Value, squashed: usize) {
    let Some(history) = config.get_mut("history").and_then(Value::as_array_mut) else {
        return;
    };
    let makes_layer = |entry: &Value| entry["empty_layer"] != Value::Bool(true);
    let tops: Vec<usize> = (0..history.len())
        .rev()
        .filter(|&i| makes_layer(&history[i]))
        .take(squashed)
        .collect();
    // `tops` runs from the newest down; the newest keeps its layer.
    for &i in tops.iter().skip(1) {
        if let Some(entry) = history[i].as_object_mut() {
            entry.insert("empty_layer".into(), Value::Bool(true));
        }
    }
}

/// Sets an image config's layers (`rootfs.diff_ids`).
fn set_diff_ids(config: &mut Value, layers: &[String]) -> Result<(), SnapshotError> {
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
    Ok(())
}

/// The image config of a snapshot: its parent's (or the base image's),
/// with its layers, a history entry (marked as adding no layer unless it
/// does), and the labels that find it again.
pub(super) fn snapshot_config(
    mut config: Value,
    layers: &[String],
    (id, adds_layer): (&str, bool),
    message: Option<&str>,
    home_id: &str,
) -> Result<String, SnapshotError> {
    set_diff_ids(&mut config, layers)?;
    let Some(object) = config.as_object_mut() else {
        return Err(SnapshotError::Inconsistent(
            "image config is not an object".into(),
        ));
    };
    object.insert(
        "created".into(),
        Value::String(unix_ms_to_rfc3339(now_ms())),
    );
    let history = object
        .entry("history")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Some(history) = history.as_array_mut() {
        let mut entry = json!({
            "created": unix_ms_to_rfc3339(now_ms()),
            "created_by": format!("silo snapshot {id}"),
            "comment": message.unwrap_or_default(),
        });
        // Engines refuse a history naming more layers than the image has.
        if !adds_layer {
            entry["empty_layer"] = Value::Bool(true);
        }
        history.push(entry);
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

#[cfg(test)]
mod tests {
    use super::*;

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
            ("snap-000000000001", true),
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
