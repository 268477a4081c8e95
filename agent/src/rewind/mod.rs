//! Rewind in place: the sandbox brought back to one of its snapshots by
//! its own agent, without a new machine (see [`silo_protocol::rewind`]).
//!
//! [`Rewinder::begin`] owns the first half: it takes the snapshot slot
//! (no snapshot, apply or other rewind beside it), holds pushes and new
//! commands off, stops the workload without restarting it, ends every exec
//! and closes every session through their owners, then ends whatever else
//! runs in the agent's scope (`end`). With nothing left to write, it walks
//! the file system as a snapshot would and lists what changed (`changes`).
//! The walk's baseline is the request's paths, or the tree the agent kept
//! from its last snapshot or rewind when the request names it by digest; a
//! digest of no kept tree is refused before anything is ended. That
//! baseline rides in the hold, and the layer that finishes the rewind,
//! once placed, is applied to it to make the tree kept next.
//! Everything it took stays taken in a [`Hold`] under a fresh token, which
//! the layer apply that finishes the rewind takes over
//! ([`Rewinder::take`]). Dropping a hold, wherever that happens (the apply
//! ended, was refused, or its client went away; the hold expired after
//! [`HOLD_SECS`]), lets the sandbox go and starts the workload again.
//!
//! # Layout
//! - `end`: SIGKILL to every process of the sandbox but the agent, until none is left.
//! - `changes`: the snapshot walk's findings as the change list.

mod changes;
mod end;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use silo_protocol::ErrorKind;
use silo_protocol::http::error_chain;
use silo_protocol::rewind::HOLD_SECS;
use silo_protocol::snapshot::SnapshotRequest;
use tokio::sync::{OwnedRwLockWriteGuard, OwnedSemaphorePermit};
use tokio::task::AbortHandle;

use crate::commands::Commands;
use crate::paths::as_path;
use crate::process::ProcessOps;
use crate::push::Pusher;
use crate::snapshot::tree::{Changes, Kept, Source, Tree};
use crate::snapshot::walk::Baseline;
use crate::snapshot::{FreezeScope, SnapshotError, Snapshotter, excluded, give_back, walk_spec};
use crate::workload_handle::WorkloadHandle;
pub use end::{END_WITHIN, Ended};

/// How long the workload gets between SIGTERM and SIGKILL when a rewind
/// stops it: none, as a machine being replaced gives none.
const STOP_GRACE: Duration = Duration::ZERO;

/// The rewind service.
pub struct Rewinder {
    root: PathBuf,
    scope: Option<FreezeScope>,
    ops: Arc<dyn ProcessOps>,
    workload: Arc<WorkloadHandle>,
    commands: Commands,
    pusher: Arc<Pusher>,
    /// The rewind waiting for its layer, if any (the snapshot slot allows one).
    held: Arc<Mutex<Option<Hold>>>,
}

/// What a rewind holds from its start until its layer is placed: while it
/// lives nothing runs in the sandbox and nothing new starts. Dropped, it
/// lets the sandbox go and starts the workload again.
pub struct Hold {
    token: String,
    workload: Arc<WorkloadHandle>,
    /// The timer that lets the sandbox go if no layer comes; stopped when
    /// the layer's apply takes the hold.
    expiry: Option<AbortHandle>,
    /// The tree the change list was measured against, and where the tree
    /// after the layer is kept.
    base: Option<(Source, Baseline)>,
    kept: Kept,
    /// The machine's root, where the placed paths are looked at.
    root: PathBuf,
    _slot: OwnedSemaphorePermit,
    _pushes: OwnedSemaphorePermit,
    _starts: OwnedRwLockWriteGuard<()>,
    _writes: OwnedRwLockWriteGuard<()>,
}

impl Hold {
    /// The tree after the rewind's layer made `changes`, to be kept (none
    /// if it cannot be followed). Call once the layer is placed, before
    /// anything runs again.
    ///
    /// The placed paths are on new inodes, which the walk before the
    /// layer could not see; they are looked at here, so that the next
    /// snapshot or rewind finds them unchanged instead of counting every
    /// one as moved (a pool member brought to a snapshot would otherwise
    /// apply the whole snapshot again when claimed).
    pub fn keep_after(&mut self, mut changes: Changes) {
        if let Some((source, mut baseline)) = self.base.take() {
            let after: Option<(Tree, Baseline)> = source.after(&mut changes, &mut baseline);
            let after = after.map(|(tree, mut baseline)| {
                note_placed(&self.root, changes.added(), &mut baseline);
                (tree, baseline)
            });
            self.kept.put(after);
        }
    }
}

/// Notes where each placed path is now, when the baseline knows inodes at
/// all (applying the layer to the tree forgot them). A path that cannot be
/// looked at stays forgotten, so it counts as moved: never missed, only
/// captured again.
fn note_placed(
    root: &std::path::Path,
    placed: &std::collections::BTreeSet<Vec<u8>>,
    baseline: &mut Baseline,
) {
    let Some(inodes) = baseline.inodes_mut() else {
        return;
    };
    for rel in placed {
        let rel = as_path(rel);
        match std::fs::symlink_metadata(root.join(rel)) {
            Ok(meta) => inodes.note(rel, &meta),
            Err(_) => inodes.forget(rel, false),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // A rewind that ends without its layer gives back the tree it took.
        if let Some((source, baseline)) = self.base.take() {
            give_back(&self.kept, source, baseline);
        }
        self.workload.resume();
    }
}

/// A rewind under way, as its first answer reports it.
#[derive(Debug)]
pub struct Begun {
    /// The token the finishing layer apply names.
    pub token: String,
    /// The change list.
    pub changes: Vec<u8>,
    /// What ending the processes did (the workload, execs and sessions
    /// stopped through their owners are not counted).
    pub ended: Ended,
}

impl Rewinder {
    /// The rewind service for the machine at `root`, ending the processes
    /// in `scope` (none: it refuses) through `ops`.
    pub fn new(
        root: PathBuf,
        scope: Option<FreezeScope>,
        ops: Arc<dyn ProcessOps>,
        workload: Arc<WorkloadHandle>,
        commands: Commands,
        pusher: Arc<Pusher>,
    ) -> Self {
        Self {
            root,
            scope,
            ops,
            workload,
            commands,
            pusher,
            held: Arc::default(),
        }
    }

    /// Ends the sandbox's processes, lists what changed since the request's
    /// moment and holds the sandbox until the layer comes (or the hold
    /// expires).
    pub async fn begin(
        &self,
        mut request: SnapshotRequest,
        snapshots: &Snapshotter,
    ) -> Result<Begun, RewindError> {
        let started = Instant::now();
        let Some(scope) = self.scope else {
            return Err(RewindError::Unsupported);
        };
        let excluded = excluded(&request.exclude).map_err(RewindError::Malformed)?;
        let slot = snapshots.try_hold().map_err(|_| RewindError::Busy)?;
        let token =
            crate::random_hex::<16>().map_err(|err| RewindError::Internal(err.to_string()))?;
        // Refused before anything is ended: the client sends the paths.
        let list = request.take_baseline();
        let kept = snapshots.kept().clone();
        let (baseline, source) = kept
            .against(request.baseline_digest.as_deref(), list)
            .map_err(RewindError::UnknownBaseline)?
            .split();
        let pushes = match self.pusher.hold_off().await {
            Ok(pushes) => pushes,
            Err(err) => {
                give_back(&kept, source, baseline);
                return Err(RewindError::Internal(error_chain(&err)));
            }
        };
        let mut hold = Hold {
            token,
            workload: Arc::clone(&self.workload),
            expiry: None,
            base: None,
            kept,
            root: self.root.clone(),
            _slot: slot,
            _pushes: pushes,
            _starts: snapshots.start_gate().close().await,
            _writes: snapshots.write_gate().close_to_replace().await,
        };
        let to = request.rewind_to.clone().unwrap_or_default();
        let block_sums = request.block_sums;
        tokio::join!(
            self.workload.pause(STOP_GRACE),
            self.commands.execs().end_for_rewind(STOP_GRACE, &to),
            self.commands.sessions().terminate_all(STOP_GRACE),
        );
        let (root, ops) = (self.root.clone(), Arc::clone(&self.ops));
        let listed = tokio::task::spawn_blocking(move || {
            let mut spec = match walk_spec(&root, request, excluded) {
                Ok(spec) => spec,
                Err(err) => return ((source, baseline), Err(err.into())),
            };
            spec.baseline = baseline;
            let mut listed = end::end_all(&*ops, scope, END_WITHIN)
                .map_err(|err| RewindError::Internal(error_chain(&err)))
                .and_then(|ended| Ok((ended, changes::list(&root, &spec, block_sums)?)));
            if let Ok((_, listed)) = &mut listed {
                // Nothing runs until the layer is placed: the tree after
                // it is on these inodes, but where the layer puts paths.
                spec.baseline.learn(std::mem::take(&mut listed.walked));
            }
            ((source, spec.baseline), listed)
        })
        .await
        .map_err(|err| RewindError::Internal(format!("rewind task failed: {err}")))?;
        let (base, listed) = listed;
        hold.base = Some(base);
        // On an error the hold is dropped here: nothing changed, the tree
        // taken is given back, and the workload starts again.
        let (ended, listed) = listed?;
        if ended.left > 0 {
            tracing::warn!(
                left = ended.left,
                "some processes were still alive after {END_WITHIN:?}; rewinding anyway"
            );
        }
        let token = hold.token.clone();
        hold.expiry = Some(self.expire_later(token.clone()));
        tracing::info!(
            killed = ended.killed,
            changed = listed.present,
            gone = listed.gone,
            summed = listed.summed,
            ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "rewind begun; waiting for its layer"
        );
        *self.slot() = Some(hold);
        Ok(Begun {
            token,
            changes: listed.body,
            ended,
        })
    }

    /// The hold of the rewind with `token`, for the layer that finishes it.
    pub fn take(&self, token: &str) -> Option<Hold> {
        let mut held = self.slot();
        let mut hold = match held.as_ref() {
            Some(hold) if hold.token == token => held.take()?,
            _ => return None,
        };
        if let Some(expiry) = hold.expiry.take() {
            expiry.abort();
        }
        Some(hold)
    }

    /// Lets the sandbox go unchanged if rewind `token` is still waiting
    /// when its time is up; the timer's handle, to stop it sooner.
    fn expire_later(&self, token: String) -> AbortHandle {
        let held = Arc::clone(&self.held);
        let timer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(HOLD_SECS)).await;
            let expired = {
                let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
                match held.as_ref() {
                    Some(hold) if hold.token == token => held.take(),
                    _ => None,
                }
            };
            if expired.is_some() {
                tracing::warn!(
                    "no layer came for the rewind within {HOLD_SECS} s; letting the sandbox go unchanged"
                );
            }
        });
        timer.abort_handle()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Hold>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why a rewind could not begin; [`RewindError::kind`] makes the answer.
#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    /// The agent may not end the sandbox's processes.
    #[error(
        "this agent is neither the sandbox's PID 1 nor started with --machine-agent, \
         so it cannot end the sandbox's processes"
    )]
    Unsupported,
    /// A snapshot, a layer apply or another rewind is under way.
    #[error("a snapshot, a layer apply or another rewind of this sandbox is under way")]
    Busy,
    /// The request cannot be read.
    #[error("{0}")]
    Malformed(String),
    /// The request named its baseline by a digest of no tree kept here.
    #[error("{0}")]
    UnknownBaseline(String),
    /// The request body was not taken whole.
    #[error(transparent)]
    Body(#[from] crate::body::BodyError),
    /// The change list is over its cap.
    #[error("more changed than a rewind in place lists ({0})")]
    TooManyChanges(String),
    /// The walk failed.
    #[error(transparent)]
    Walk(SnapshotError),
    /// The agent failed in a way the request could not cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<SnapshotError> for RewindError {
    fn from(err: SnapshotError) -> Self {
        match err {
            SnapshotError::Io(fs) if changes::over_cap(&fs.source) => {
                Self::TooManyChanges(fs.source.to_string())
            }
            other => Self::Walk(other),
        }
    }
}

impl RewindError {
    /// The error body's kind (which fixes the status).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Unsupported => ErrorKind::Unsupported,
            Self::Busy => ErrorKind::Busy,
            Self::Malformed(_) => ErrorKind::Malformed,
            Self::UnknownBaseline(_) => ErrorKind::UnknownBaseline,
            Self::Body(err) => err.kind(),
            Self::TooManyChanges(_) => ErrorKind::TooLarge,
            Self::Walk(err) => err.kind(),
            Self::Internal(_) => ErrorKind::Internal,
        }
    }
}
