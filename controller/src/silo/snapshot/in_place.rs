//! Rewind in place: the sandbox's own agent brings its file system back to
//! a snapshot, on the same machine, instead of the engine making a new
//! one. Processes end, as in any rewind; the workload starts again.
//!
//! The controller knows the machine's tree exactly at one moment, the
//! *anchor*: what its next snapshot would build on (the sandbox's
//! checkpoint, the moment its last snapshot or in-place rewind left it
//! with a known tree; else the snapshot the machine was made from, or its
//! image, at the machine's start). It asks the agent what changed since
//! then, measured as a snapshot would measure it (the anchor's paths as
//! the baseline), and the agent ends every process and answers the change
//! list, holding the sandbox. From the list and the store alone,
//! [`crate::store::rewind`] makes the layer that turns the live tree into
//! the target's, and the agent applies it (journaled, so an agent killed
//! half way finishes it at its next boot) and lets the sandbox go. The
//! sandbox's checkpoint becomes the target at the moment the layer was in
//! place, so its next snapshot builds on the target and stores only what
//! changed after.
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
use super::{
    ImageSource, RestoreReport, SnapshotError, blocking, ms_since, parse_digest, remembered,
};
use crate::silo::{Silo, SiloError};
use crate::state::{Checkpoint, SandboxRecord, Snapshot, StoredImage};
use crate::store::rewind::{Restore, RestoreStats, restoring_layer};
use crate::store::{Digest, Store};

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
}

/// Why a rewind could not happen in place; the caller makes a new machine.
#[derive(Debug, Clone)]
pub(super) struct NotInPlace(pub String);

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
    /// to replace. Call with the sandbox's lease held.
    pub(super) async fn rewind_in_place(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
    ) -> Result<Result<RestoreReport, NotInPlace>, SiloError> {
        let start = Instant::now();
        let placed = match self.place_back(sandbox, snapshot).await {
            Ok(placed) => placed,
            Err(why) => return Ok(Err(why)),
        };
        let (applied_at_ns, in_place) = placed;
        let detail = json!({
            "snapshot": snapshot.id,
            "reason": "rewind",
            "in_place": true,
            "restored": in_place.stats.restored,
            "removed": in_place.stats.removed,
        });
        let checkpoint = Checkpoint {
            snapshot: snapshot.id.clone(),
            stopped_at_ns: applied_at_ns,
        };
        // A container's files are now the snapshot's, on a stored image:
        // the listing it may have started from is needed no more.
        let sandbox = self
            .db()
            .rewound_in_place(sandbox, &checkpoint, None, &detail)?;
        Ok(Ok(RestoreReport {
            sandbox,
            snapshot: snapshot.id.clone(),
            image: ImageSource::InPlace(in_place),
            ms: ms_since(start),
            new_machine_because: None,
        }))
    }

    /// The rewind's work on the machine: the change list, the restoring
    /// layer, its apply. Answers the moment it was in place.
    async fn place_back(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
    ) -> Result<(i64, InPlace), NotInPlace> {
        let start = Instant::now();
        if !self
            .strategy(sandbox.backend)
            .is_some_and(|strategy| strategy.rewinds_in_place())
        {
            return Err(NotInPlace(format!(
                "the {} backend's machines are rewound by making them again",
                sandbox.backend
            )));
        }
        // The agent first: a stopped machine or an old agent says so at once.
        let client = self.client(sandbox)?;
        client
            .protocol()
            .await?
            .require(silo_protocol::Feature::Rewind)?;
        let store = self.store()?;
        let anchor = self.anchor(sandbox, &store).await?;
        if anchor.base.image_id != snapshot.base_image {
            return Err(NotInPlace(format!(
                "snapshot {} stands on image {}, and the machine on {}",
                snapshot.id, snapshot.base_image, anchor.base.image_id
            )));
        }
        let mut request = anchor.request;
        request.baseline = remembered::index(&store, &anchor.base, &anchor.layers)
            .await?
            .to_vec();
        let excluded: Vec<Vec<u8>> = request
            .exclude
            .iter()
            .map(|path| path.trim_start_matches('/').as_bytes().to_vec())
            .collect();

        let begun = client.begin_rewind(&request).await?;
        let listed_ms = ms_since(start);
        let from = digests(&anchor.layers)?;
        let to = digests(&snapshot.layers)?;
        let (restoring, computed_ms) = {
            let begun = begun.clone();
            let store = store.clone();
            blocking(move || {
                let computing = Instant::now();
                let changes = begun.changes();
                let restore = Restore {
                    from: &from,
                    to: &to,
                    changes: &changes,
                    excluded: &excluded,
                };
                let restoring = restoring_layer(&store, &restore)
                    .map_err(|e| SnapshotError::Task(error_chain(&e)))?;
                Ok((restoring, ms_since(computing)))
            })
            .await?
        };
        let applying = Instant::now();
        let layer_bytes = restoring.layer.len() as u64;
        let applied = client
            .finish_rewind(&begun.token, Bytes::from(restoring.layer))
            .await?;
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
            },
        ))
    }

    /// What the machine's next snapshot would build on, and the request
    /// that measures what changed since (the baseline left to fill).
    async fn anchor(&self, sandbox: &SandboxRecord, store: &Store) -> Result<Anchor, NotInPlace> {
        let facts = match remembered::facts(sandbox) {
            Some(facts) => facts,
            None => {
                let facts = self.container_facts(sandbox, "rewind").await?;
                remembered::remember_facts(sandbox, facts)
            }
        };
        let started_ns = facts.created_ns.saturating_sub(CTIME_MARGIN_NS);
        let request = |changed_since_ns, descend_since_ns| SnapshotRequest {
            changed_since_ns,
            prune_unchanged_dirs: facts.overlay,
            descend_since_ns,
            exclude: facts.exclude.clone(),
            baseline: Vec::new(),
        };
        let (snapshot, request) = match (self.checkpoint_of(sandbox)?, &sandbox.origin_snapshot) {
            (Some((stopped_at_ns, snapshot)), _) => {
                let since = stopped_at_ns.saturating_sub(CTIME_MARGIN_NS);
                (snapshot, request(since, Some(started_ns)))
            }
            (None, Some(origin)) => (self.db().snapshot(origin)?, request(started_ns, None)),
            (None, None) => {
                let base = self
                    .complete_image(store, &facts.image_id)
                    .await?
                    .ok_or_else(|| {
                        NotInPlace(format!(
                            "the image the machine was made from ({}) is not stored yet",
                            facts.image_id
                        ))
                    })?;
                return Ok(Anchor {
                    layers: base.layers.clone(),
                    base,
                    request: request(started_ns, None),
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

fn digests(layers: &[String]) -> Result<Vec<Digest>, SnapshotError> {
    layers.iter().map(|layer| parse_digest(layer)).collect()
}
