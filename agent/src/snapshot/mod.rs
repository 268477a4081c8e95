//! Snapshots: the sandbox's changes since its image, streamed as one image
//! layer while every process but the agent is stopped.
//!
//! [`Snapshotter::start`] owns one snapshot from a parsed request to the
//! first byte of its answer: it refuses unless the agent has a freeze scope
//! (PID 1, or `--machine-agent`: anywhere else stopping "every other
//! process" would stop the host's), takes the one snapshot slot (a second
//! request, or a layer apply, is told the agent is busy), and hands
//! a blocking thread the rest: index the baseline, read the mount table,
//! stop the sandbox's processes, then walk and write the layer into a
//! bounded channel whose other end is the response body. The baseline is the
//! request's paths, or the tree kept from the last snapshot or rewind when
//! the request names it by digest (`tree`); either way the tree after the
//! layer is kept for the next request, once the processes run again. Errors
//! before the layer starts are answered with their own status; after, the
//! body is cut off without the tar end marker. The processes are continued
//! as soon as the last file is read, on every path, by the freeze's guard.
//!
//! Pushes are held off while a snapshot reads: the caller passes the push
//! service's permits (`Pusher::hold_off`), which `take` keeps until the
//! layer is read, so a snapshot sees each mount before a push or after it.
//! New commands are held off the same way, by the [`StartGate`]: a process
//! started after the freeze's last pass would run, and write, while the
//! layer is read. So are the file API's writes, by the [`WriteGate`]: no
//! layer holds a half-written file or one of silo's temporary names, and a
//! write that waited while a rewind replaced the tree is refused rather
//! than made on the tree the rewind left.
//!
//! The same walk, taking every path, answers the path index
//! ([`Snapshotter::index`]): the baseline of a machine's first snapshot.
//!
//! # Layout
//! - `freeze`: stopping and continuing the sandbox's processes (`/proc`, signals),
//!   in the agent's [`FreezeScope`].
//! - `walk`: what changed, what is excluded, what was deleted, in layer order.
//! - `index`: every path of the machine, sorted, NUL-terminated.
//! - `layer`: the tar writer (hard links, devices, whiteouts, the end marker).
//! - `stream`: the bounded bridge from the blocking writer to the response body.
//! - `tree`: the tree kept from the last snapshot or rewind, named by digest.

pub(crate) mod freeze;
mod index;
pub(crate) mod layer;
pub mod stream;
pub mod tree;
pub mod walk;

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use silo_protocol::ErrorKind;
use silo_protocol::http::error_chain;
use silo_protocol::snapshot::SnapshotRequest;
use tokio::runtime::Handle;
use tokio::sync::{
    OwnedRwLockReadGuard, OwnedRwLockWriteGuard, OwnedSemaphorePermit, RwLock, Semaphore, oneshot,
};

use crate::fs_error::FsError;
use crate::process::ProcessOps;
pub use freeze::FreezeScope;
pub use index::IndexError;
pub use stream::LayerStream;
use tree::{Against, Changes, Kept, Recording, Source};
use walk::{Baseline, Hint, WalkSpec};

/// Snapshots taken at once: one, since each stops the whole sandbox.
pub const MAX_ACTIVE_SNAPSHOTS: usize = 1;
/// Path indexes taken at once: each walks the whole file system.
pub const MAX_ACTIVE_INDEXES: usize = 1;

/// The snapshot service.
pub struct Snapshotter {
    /// The machine's file system as the agent sees it (`/` but in tests).
    root: PathBuf,
    /// Which processes a freeze stops; `None`: snapshots are refused.
    scope: Option<FreezeScope>,
    ops: Arc<dyn ProcessOps>,
    active: Arc<Semaphore>,
    indexes: Arc<Semaphore>,
    starts: StartGate,
    writes: WriteGate,
    /// The tree of the last snapshot or rewind, shared with the rewinds.
    kept: Kept,
}

/// Where requests that start processes (execs, session shells) wait while
/// a snapshot has the sandbox stopped. Each start passes through it and
/// holds its pass only while spawning: a process spawned before the freeze
/// is stopped by it, and one spawned after waits for the thaw.
#[derive(Debug, Clone, Default)]
pub struct StartGate(Arc<RwLock<()>>);

impl StartGate {
    /// Waits while a snapshot reads; hold the pass until the spawn returns.
    pub async fn pass(&self) -> OwnedRwLockReadGuard<()> {
        Arc::clone(&self.0).read_owned().await
    }

    /// Waits for starts under way and holds new ones until dropped.
    pub(crate) async fn close(&self) -> OwnedRwLockWriteGuard<()> {
        Arc::clone(&self.0).write_owned().await
    }
}

/// Where the file API's writes (files, trees, directories, removals) wait
/// while a snapshot reads the tree or a rewind or layer apply replaces it.
/// Each write holds its pass from before its first change to after its
/// last (a temporary file renamed into place, a staged tree merged), so a
/// layer never holds one half done. A write that waited while a rewind
/// replaced the tree is refused: made afterwards, it would change the tree
/// the rewind just reported exact.
#[derive(Debug, Clone, Default)]
pub struct WriteGate {
    lock: Arc<RwLock<()>>,
    /// Rewinds (and layer applies) that closed the gate since boot.
    replaced: Arc<AtomicU64>,
}

/// A write waited while the tree was replaced under it.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "the sandbox was rewound (or a snapshot applied) while this write waited; \
     nothing was written"
)]
pub struct Replaced;

impl WriteGate {
    /// Waits while the tree is read or replaced; hold the pass until the
    /// write's last change is made.
    pub async fn pass(&self) -> Result<OwnedRwLockReadGuard<()>, Replaced> {
        let before = self.replaced.load(Ordering::Acquire);
        let pass = Arc::clone(&self.lock).read_owned().await;
        match self.replaced.load(Ordering::Acquire) == before {
            true => Ok(pass),
            false => Err(Replaced),
        }
    }

    /// Waits for writes under way and holds new ones until dropped.
    pub(crate) async fn close(&self) -> OwnedRwLockWriteGuard<()> {
        Arc::clone(&self.lock).write_owned().await
    }

    /// As [`WriteGate::close`], for work that replaces the tree: every
    /// write waiting now is refused once the gate opens.
    pub(crate) async fn close_to_replace(&self) -> OwnedRwLockWriteGuard<()> {
        let closed = self.close().await;
        self.replaced.fetch_add(1, Ordering::AcqRel);
        closed
    }
}

/// What one snapshot holds until its layer is read, released after the thaw.
struct Held {
    _slot: OwnedSemaphorePermit,
    _pushes: OwnedSemaphorePermit,
    _starts: OwnedRwLockWriteGuard<()>,
    _writes: OwnedRwLockWriteGuard<()>,
}

impl Snapshotter {
    /// The snapshot service for the file system at `root`, stopping the
    /// processes in `scope` (none: it refuses) and listing them through `ops`.
    pub fn new(root: PathBuf, scope: Option<FreezeScope>, ops: Arc<dyn ProcessOps>) -> Self {
        Self {
            root,
            scope,
            ops,
            active: Arc::new(Semaphore::new(MAX_ACTIVE_SNAPSHOTS)),
            indexes: Arc::new(Semaphore::new(MAX_ACTIVE_INDEXES)),
            starts: StartGate::default(),
            writes: WriteGate::default(),
            kept: Kept::default(),
        }
    }

    /// The tree kept from the last snapshot or rewind.
    pub fn kept(&self) -> &Kept {
        &self.kept
    }

    /// The snapshot slot, for work that must never overlap a snapshot (a
    /// layer apply): a snapshot asked for meanwhile is told the agent is
    /// busy, and this fails the same way while one is taken.
    pub fn try_hold(&self) -> Result<OwnedSemaphorePermit, SnapshotError> {
        Arc::clone(&self.active)
            .try_acquire_owned()
            .map_err(|_| SnapshotError::Busy)
    }

    /// The gate execs and session shells pass before they spawn.
    pub fn start_gate(&self) -> StartGate {
        self.starts.clone()
    }

    /// The gate the file API's writes pass.
    pub fn write_gate(&self) -> WriteGate {
        self.writes.clone()
    }

    /// Starts one snapshot; on success the layer streams through the answer.
    /// `hold_pushes` (once this snapshot has the slot) waits for pushes under
    /// way and keeps new ones waiting until the layer has been read; new
    /// commands wait likewise at the [`StartGate`].
    pub async fn start<H>(
        &self,
        mut request: SnapshotRequest,
        hold_pushes: H,
    ) -> Result<(LayerStream, StopCounts), SnapshotError>
    where
        H: Future<Output = Result<OwnedSemaphorePermit, SnapshotError>>,
    {
        let Some(scope) = self.scope else {
            return Err(SnapshotError::Unsupported);
        };
        let excluded = excluded(&request.exclude).map_err(SnapshotError::Malformed)?;
        let slot = self.try_hold()?;
        let held = Held {
            _slot: slot,
            _pushes: hold_pushes.await?,
            _starts: self.starts.close().await,
            _writes: self.writes.close().await,
        };
        // Refused before anything is stopped: the client sends the paths.
        let list = request.take_baseline();
        let against = self
            .kept
            .against(request.baseline_digest.as_deref(), list)
            .map_err(SnapshotError::UnknownBaseline)?;
        let (writer, layer) = stream::channel(Handle::current());
        let (ready_tx, ready_rx) = oneshot::channel();
        let machine = Machine {
            root: self.root.clone(),
            scope,
            ops: Arc::clone(&self.ops),
            kept: self.kept.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let request = Measure {
                request,
                against,
                excluded,
            };
            take(held, &machine, request, writer, ready_tx);
        });
        match ready_rx.await {
            Ok(Ok(stopped)) => Ok((layer, stopped)),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(SnapshotError::Internal(
                "the snapshot task ended before the layer started".into(),
            )),
        }
    }
}

/// What the freeze stopped for one layer, told to the client as the
/// layer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopCounts {
    /// Processes stopped.
    pub processes: usize,
    /// Of those, the ones that had not reached the stopped state in time.
    pub unsettled: usize,
    /// Unix ns on this machine's clock once they had stopped, before the
    /// first path was read (`None` if the clock reads before 1970).
    pub at_ns: Option<i64>,
}

/// A request's exclusions, relative to `/`; the message names a bad one.
pub(crate) fn excluded(paths: &[String]) -> Result<HashSet<PathBuf>, String> {
    paths
        .iter()
        .map(|path| {
            let rel = Path::new(path)
                .is_absolute()
                .then(|| walk::relative(Path::new(path)))
                .flatten();
            rel.ok_or_else(|| format!("exclude path {path:?} must be absolute, without `..`"))
        })
        .collect()
}

/// The machine a snapshot reads, the processes it stops, and where the
/// tree after the layer is kept.
struct Machine {
    root: PathBuf,
    scope: FreezeScope,
    ops: Arc<dyn ProcessOps>,
    kept: Kept,
}

/// What one snapshot measures: the request, its baseline, its exclusions.
struct Measure {
    request: SnapshotRequest,
    against: Against,
    excluded: HashSet<PathBuf>,
}

/// The blocking part of one snapshot. `ready` hears whether the layer
/// starts; after that, errors can only cut the layer short.
fn take(
    held: Held,
    machine: &Machine,
    measure: Measure,
    mut out: stream::ChannelWriter,
    ready: oneshot::Sender<Result<StopCounts, SnapshotError>>,
) {
    // `held` is released after the thaw and before the layer's end goes
    // out (below); on an earlier return, after `frozen`'s own thaw.
    let started = Instant::now();
    let (baseline, source) = measure.against.split();
    let mut spec = match walk_spec(&machine.root, measure.request, measure.excluded) {
        Ok(spec) => spec,
        Err(err) => {
            give_back(&machine.kept, source, baseline);
            let _ = ready.send(Err(err));
            return;
        }
    };
    spec.baseline = baseline;
    let mut frozen = match freeze::freeze(&*machine.ops, machine.scope) {
        Ok(frozen) => frozen,
        Err(err) => {
            give_back(&machine.kept, source, spec.baseline);
            let _ = ready.send(Err(match err {
                freeze::FreezeError::NotPid1 => SnapshotError::Unsupported,
                freeze::FreezeError::Proc(source) => {
                    FsError::new("list", Path::new("/proc"), source).into()
                }
            }));
            return;
        }
    };
    if frozen.unsettled > 0 {
        tracing::warn!(
            unsettled = frozen.unsettled,
            "some processes had not stopped in time; taking the snapshot anyway"
        );
    }
    let stopped = StopCounts {
        processes: frozen.count(),
        unsettled: frozen.unsettled,
        at_ns: crate::clock::unix_ns_now(),
    };
    if ready.send(Ok(stopped)).is_err() {
        tracing::info!("snapshot abandoned: the client went away");
        give_back(&machine.kept, source, spec.baseline);
        return;
    }
    let written = write_layer(&machine.root, &spec, &mut out);
    // Every file is read: the sandbox may go on while the last chunks go out.
    frozen.thaw();
    // The tree after this layer is kept before the layer's end goes out, so
    // the request that follows it finds the tree.
    let written = match written {
        Ok((stats, mut changes)) => {
            let after = source.after(&mut changes, &mut spec.baseline);
            machine.kept.put(after);
            Ok(stats)
        }
        Err(err) => {
            give_back(&machine.kept, source, spec.baseline);
            Err(err)
        }
    };
    // A client that has read the whole layer may ask for the next snapshot
    // or a rewind at once; were the slot still held when the end marker
    // reached it, that request would be told the agent is busy.
    drop(held);
    let stopped = stopped.processes;
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match written {
        Ok(stats) => match out.complete() {
            Ok(()) => tracing::info!(
                stopped,
                entries = stats.entries,
                bytes = stats.bytes,
                ms,
                "snapshot taken"
            ),
            Err(err) => tracing::info!(%err, "snapshot not delivered"),
        },
        Err(err) => {
            tracing::warn!(stopped, ms, "snapshot cut short: {}", error_chain(&err));
            out.abort();
        }
    }
}

/// Puts back the kept tree a failed request took out (one that carried its
/// paths took none).
pub(crate) fn give_back(kept: &Kept, source: Source, baseline: Baseline) {
    if let Source::Tree(tree) = source {
        kept.put(Some((tree, baseline)));
    }
}

/// The walk a request asks for on the machine at `root` (blocking: it reads
/// the mount table, whose mount points are left out besides `excluded`, as
/// is the agent's own directory, which no layer may carry). Its baseline is
/// left empty, for the caller to set.
pub(crate) fn walk_spec(
    root: &Path,
    request: SnapshotRequest,
    mut excluded: HashSet<PathBuf>,
) -> Result<WalkSpec, SnapshotError> {
    excluded.extend(walk::mount_points(root)?);
    excluded.insert(PathBuf::from(crate::paths::STATE_DIR));
    Ok(WalkSpec {
        changed_since_ns: request.changed_since_ns,
        excluded,
        baseline: Baseline::default(),
        hint: Hint::of(request.walk_hint),
    })
}

/// Walks `root` and writes its layer (with the end marker) to `out`; what
/// the layer does to the baseline's tree.
fn write_layer(
    root: &Path,
    spec: &WalkSpec,
    out: &mut impl io::Write,
) -> Result<(layer::LayerStats, Changes), SnapshotError> {
    let mut layer = layer::Layer::new(root, out);
    let mut recording = Recording {
        inner: &mut layer,
        changes: Changes::default(),
    };
    walk::walk(root, spec, &mut recording)?;
    let changes = recording.changes;
    let stats = layer
        .finish()
        .map_err(|e| FsError::new("finish the layer of", root, e))?;
    Ok((stats, changes))
}

/// Why a snapshot failed; [`SnapshotError::kind`] makes the answer.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The agent has no freeze scope, so it cannot stop the sandbox's processes.
    #[error(
        "this agent is neither the sandbox's PID 1 nor started with --machine-agent, \
         so it cannot stop the sandbox's processes"
    )]
    Unsupported,
    /// Another snapshot is being taken, or a layer applied.
    #[error("another snapshot of this sandbox or a layer apply is under way")]
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
    /// A file system operation failed.
    #[error(transparent)]
    Io(#[from] FsError),
    /// The agent failed in a way the request could not cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl SnapshotError {
    /// The error body's kind (which fixes the answer's status).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Unsupported => ErrorKind::Unsupported,
            Self::Busy => ErrorKind::Busy,
            Self::Malformed(_) => ErrorKind::Malformed,
            Self::UnknownBaseline(_) => ErrorKind::UnknownBaseline,
            Self::Body(err) => err.kind(),
            Self::Io(_) | Self::Internal(_) => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests;
