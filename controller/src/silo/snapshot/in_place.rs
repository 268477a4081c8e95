//! Rewind in place: the sandbox's own agent brings its file system back to
//! a snapshot, on the same machine, instead of the engine making a new
//! one. Processes end, as in any rewind; the workload starts again.
//!
//! The controller knows the machine's tree exactly at one moment, the
//! *anchor*: what its next snapshot would build on (the sandbox's
//! checkpoint, the moment its last snapshot or in-place rewind left it
//! with a known tree; else the snapshot the machine was made from, or its
//! image, at the machine's start). It asks the agent what changed since
//! then, measured as a snapshot would measure it (the anchor's paths as the
//! baseline, named by digest when the agent kept that tree), and the agent
//! ends every process and answers the change list, holding the sandbox. From
//! the list and the store alone, [`crate::store::rewind`] makes the layer
//! that turns the live tree into the target's, and the agent applies it
//! (journaled, so an agent killed half way finishes it at its next boot) and
//! lets the sandbox go. The sandbox's checkpoint becomes the target at the
//! moment the layer was in place, so its next snapshot builds on the target
//! and stores only what changed after.
//!
//! Where the machine started is its strategy's to say
//! ([`SnapshotWay::machine_start`]): a container's creation and image, from
//! the engine; a VM's recorded baseline (its template's listing, or the
//! base of the snapshot it was made from, and the moment on its own clock
//! from which a change is the sandbox's). Past that the two are one path:
//! on E2B and Daytona, where the agent is the only way in, a rewind in
//! place saves a new VM.
//!
//! When the machine cannot be rewound in place (a backend whose machines
//! this cannot reach, a machine that is not running, an agent too old, a
//! snapshot on another image, or anything failing on the way) the caller
//! makes a new machine, and the report says why.

use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use serde_json::json;
use silo_protocol::http::error_chain;
use silo_protocol::snapshot::SnapshotRequest;

use super::take::CTIME_MARGIN_NS;
use super::{ImageSource, RestoreReport, SnapshotError, blocking, digests, ms_since, remembered};
use crate::backend::SnapshotWay;
use crate::client::BaselineSent;
use crate::faults;
use crate::silo::{Silo, SiloError};
use crate::state::{Checkpoint, PendingRewind, SandboxRecord, Snapshot, StoredImage};
use crate::store::Store;
use crate::store::rewind::{Restore, RestoreError, RestoreStats, restoring_layer};

/// What an in-place rewind did.
#[derive(Debug, Clone, Serialize)]
pub struct InPlace {
    /// The restoring layer's counts: paths the agent listed, entries put
    /// back, paths removed, bytes of file data.
    #[serde(flatten)]
    pub stats: RestoreStats,
    /// The restoring layer's size.
    pub layer_bytes: u64,
    /// Processes the agent ended beyond the workload, execs and sessions.
    pub processes_ended: u64,
    /// Milliseconds until the agent had ended the processes and listed
    /// what changed.
    pub listed_ms: f64,
    /// Milliseconds the restoring layer took to make from the store.
    pub computed_ms: f64,
    /// Milliseconds the agent took to place it.
    pub applied_ms: f64,
    /// How the anchor's tree reached the agent: by digest when the agent
    /// kept it from the last snapshot or rewind.
    pub baseline_sent: BaselineSent,
}

/// Why a rewind could not happen in place; the caller makes a new machine.
#[derive(Debug, Clone)]
pub(in crate::silo) struct NotInPlace(pub String);

impl<E: std::error::Error> From<E> for NotInPlace {
    fn from(error: E) -> Self {
        Self(error_chain(&error))
    }
}

/// What the machine had at the anchor: the tree's layers, its base, and
/// the request that measures changes since.
struct Anchor {
    layers: Vec<String>,
    base: StoredImage,
    request: SnapshotRequest,
}

impl Silo {
    /// Brings `sandbox` back to `snapshot` in place (see the module docs);
    /// `Ok(Err(why))` when it cannot, with the machine left for a new one
    /// to replace. Call with the sandbox's lease held. A `fork` (onto a
    /// pool member, see `pooled`) records the snapshot as the sandbox's
    /// origin.
    pub(in crate::silo) async fn rewind_in_place(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
        fork: bool,
    ) -> Result<Result<RestoreReport, NotInPlace>, SiloError> {
        self.in_place(sandbox, snapshot, fork, false).await
    }

    /// [`Silo::rewind_in_place`] of a pool member made ahead onto
    /// `snapshot`, as a fork: the agent holds it for the clock margin once
    /// the layer is in place, so a claim finds every path it placed
    /// unchanged instead of taking those of the last 20 ms again.
    pub(in crate::silo) async fn fill_in_place(
        &self,
        member: &SandboxRecord,
        snapshot: &Snapshot,
    ) -> Result<Result<RestoreReport, NotInPlace>, SiloError> {
        self.in_place(member, snapshot, true, true).await
    }

    async fn in_place(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
        fork: bool,
        settle: bool,
    ) -> Result<Result<RestoreReport, NotInPlace>, SiloError> {
        let start = Instant::now();
        let Some(strategy) = self.strategy(sandbox.backend) else {
            return Ok(Err(NotInPlace(format!(
                "the {} backend's machines have no snapshots",
                sandbox.backend
            ))));
        };
        let placed = match self
            .place_back(&strategy, sandbox, snapshot, (fork, settle))
            .await
        {
            Ok(placed) => placed,
            Err(why) => return Ok(Err(why)),
        };
        let (applied_at_ns, in_place) = placed;
        let detail = json!({
            "snapshot": snapshot.id,
            "reason": if fork { "fork" } else { "rewind" },
            "in_place": true,
            "restored": in_place.stats.restored,
            "removed": in_place.stats.removed,
        });
        let sandbox = self.record_in_place(
            &strategy,
            sandbox,
            (&snapshot.id, fork),
            applied_at_ns,
            &detail,
        )?;
        Ok(Ok(RestoreReport {
            sandbox,
            snapshot: snapshot.id.clone(),
            image: ImageSource::InPlace(in_place),
            ms: ms_since(start),
            new_machine_because: None,
            pool: None,
        }))
    }

    /// Records that `sandbox`'s machine holds snapshot `to.0`'s tree since
    /// `applied_at_ns` (a fork onto a pool member, `to.1`, takes it as its
    /// origin), logging `rewound` with `detail`.
    pub(super) fn record_in_place(
        &self,
        strategy: &SnapshotWay,
        sandbox: &SandboxRecord,
        to: (&str, bool),
        applied_at_ns: i64,
        detail: &serde_json::Value,
    ) -> Result<SandboxRecord, SiloError> {
        let (snapshot, fork) = to;
        let checkpoint = Checkpoint {
            snapshot: snapshot.to_owned(),
            stopped_at_ns: applied_at_ns,
        };
        let baseline = strategy.baseline_after_in_place(sandbox);
        let origin = fork.then_some(snapshot);
        Ok(self
            .db()
            .rewound_in_place(sandbox, &checkpoint, baseline.as_ref(), origin, detail)?)
    }

    /// The rewind's work on the machine: the change list, the restoring
    /// layer, its apply. Answers the moment it was in place. The layer is
    /// recorded as under way before it goes out, so that whoever opens the
    /// sandbox next can settle it if this process dies before its outcome
    /// is recorded (`settle`).
    async fn place_back(
        &self,
        strategy: &SnapshotWay,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
        (fork, settle): (bool, bool),
    ) -> Result<(i64, InPlace), NotInPlace> {
        let start = Instant::now();
        // The agent first: a stopped machine or an old agent says so at once.
        let client = self.client(sandbox)?;
        let spoken = client.protocol().await?;
        spoken.require(silo_protocol::Feature::Rewind)?;
        let root = spoken.require(silo_protocol::Feature::RootEntry).is_ok();
        let block_sums = spoken.require(silo_protocol::Feature::BlockRewind).is_ok();
        let store = self.store()?;
        let anchor = self.anchor(strategy, sandbox, &store).await?;
        if anchor.base.image_id != snapshot.base_image {
            return Err(NotInPlace(format!(
                "snapshot {} stands on image {}, and the machine on {}",
                snapshot.id, snapshot.base_image, anchor.base.image_id
            )));
        }
        // The commands the rewind ends say so, and to what.
        let request = SnapshotRequest {
            rewind_to: Some(snapshot.id.clone()),
            block_sums,
            ..anchor.request
        };
        let baseline = remembered::index(&store, &anchor.base, &anchor.layers).await?;
        let excluded: Vec<Vec<u8>> = request
            .exclude
            .iter()
            .map(|path| path.trim_start_matches('/').as_bytes().to_vec())
            .collect();

        // A base of paths alone (a provider's template): what the target
        // has from it can be reached only where the live tree kept it.
        let unheld_base = match anchor.base.layers.is_empty() {
            true => Some(remembered::index(&store, &anchor.base, &snapshot.layers).await?),
            false => None,
        };

        let (begun, baseline_sent) = client
            .begin_rewind_against(request, &*baseline)
            .await
            .map_err(|e| NotInPlace(format!("listing what changed: {}", error_chain(&e))))?;
        let listed_ms = ms_since(start);
        let from = digests(&anchor.layers)?;
        let to = digests(&snapshot.layers)?;
        let (restoring, computed_ms) = {
            let begun = begun.clone();
            let store = store.clone();
            blocking(move || {
                let computing = Instant::now();
                let changes = begun.changes();
                let sums = begun.sums();
                let restore = Restore {
                    from: &from,
                    to: &to,
                    changes: &changes,
                    excluded: &excluded,
                    unheld_base: unheld_base.as_ref().map(|tree| &tree.index),
                    root,
                    sums: &sums,
                };
                match restoring_layer(&store, &restore) {
                    Ok(restoring) => Ok(Ok((restoring, ms_since(computing)))),
                    Err(not_held @ RestoreError::NotHeld { .. }) => {
                        Ok(Err(NotInPlace(not_held.to_string())))
                    }
                    Err(other) => Err(SnapshotError::Task(error_chain(&other))),
                }
            })
            .await??
        };
        let applying = Instant::now();
        let layer_bytes = restoring.layer.len() as u64;
        self.db()
            .begin_pending_rewind(&PendingRewind {
                sandbox_id: sandbox.id.clone(),
                snapshot: snapshot.id.clone(),
                layer_sha256: silo_protocol::auth::body_sha256(&restoring.layer),
                fork,
                at_ms: crate::state::now_ms(),
            })
            .map_err(|e| NotInPlace(format!("recording the rewind under way: {e}")))?;
        faults::reached(faults::Point::RewindSending);
        let applied = client
            .finish_rewind_with(&begun.token, Bytes::from(restoring.layer), settle)
            .await
            .map_err(|e| NotInPlace(format!("placing the layer: {}", error_chain(&e))))?;
        faults::reached(faults::Point::RewindPlaced);
        let applied_at_ns = applied.applied_at_ns.ok_or_else(|| {
            NotInPlace("the agent did not say when the layer was in place".into())
        })?;
        Ok((
            applied_at_ns,
            InPlace {
                stats: restoring.stats,
                layer_bytes,
                processes_ended: begun.ended,
                listed_ms,
                computed_ms,
                applied_ms: ms_since(applying),
                baseline_sent,
            },
        ))
    }

    /// What the machine's next snapshot would build on, and the request
    /// that measures what changed since (the baseline left to fill).
    async fn anchor(
        &self,
        strategy: &SnapshotWay,
        sandbox: &SandboxRecord,
        store: &Store,
    ) -> Result<Anchor, NotInPlace> {
        let start = strategy.machine_start(self, sandbox).await?;
        let request = |changed_since_ns, descend_since_ns| SnapshotRequest {
            changed_since_ns,
            prune_unchanged_dirs: false,
            descend_since_ns,
            exclude: start.exclude.clone(),
            baseline: Vec::new(),
            baseline_raw: Vec::new(),
            baseline_digest: None,
            walk_hint: start.walk_hint.clone(),
            rewind_to: None,
            block_sums: false,
        };
        let (snapshot, request) = match (self.checkpoint_of(sandbox)?, &sandbox.origin_snapshot) {
            (Some((stopped_at_ns, snapshot)), _) => {
                let since = stopped_at_ns.saturating_sub(CTIME_MARGIN_NS);
                (snapshot, request(since, Some(start.started_ns)))
            }
            (None, Some(origin)) => (self.db().snapshot(origin)?, request(start.started_ns, None)),
            (None, None) => {
                let base = self
                    .complete_image(store, &start.image_id)
                    .await?
                    .ok_or_else(|| {
                        NotInPlace(format!(
                            "the image the machine was made from ({}) is not stored yet",
                            start.image_id
                        ))
                    })?;
                return Ok(Anchor {
                    layers: base.layers.clone(),
                    base,
                    request: request(start.started_ns, None),
                });
            }
        };
        Ok(Anchor {
            base: self.base_of(&snapshot)?,
            layers: snapshot.layers,
            request,
        })
    }
}
