//! Layer apply: an image layer (a snapshot's, sent back by the controller)
//! made part of the machine's file system, all checked before any of it
//! goes live.
//!
//! [`Applier::apply`] owns one apply from an admitted request to its
//! answer. It takes the snapshot slot (a snapshot and an apply never
//! overlap; a second apply is refused as busy), streams the body through
//! the push reader chain (the signed hash, the size and entry caps) into a
//! fresh staging directory under `<root>/.silo/layers/`, with every entry
//! checked by `stage`; a refused, cut or mismatched layer is removed there
//! and the machine is as it was. Then it holds pushes off, writes the plan
//! down (`journal`) and `place` carries it out on the live tree. What
//! fails from then on leaves part of the layer in place, and says so
//! ([`ApplyError::Incomplete`]); an agent killed meanwhile finishes it at
//! its next boot. [`Applier::apply_held`] is the same for a rewind, which
//! holds the slot and the pushes already.
//! Execs are not held off: the apply stops no process, so a command that
//! runs meanwhile sees the tree change either way; the controller applies
//! onto a machine before handing it out.
//!
//! The root is `--apply-root` (by default the push base, itself `/`), so
//! a host-process agent (local backend) applies inside its sandbox
//! directory, and tests into a scratch one.
//!
//! # Layout
//! - `stage`: the layer into a staging directory and a plan; every reject.
//! - `journal`: the plan written down before placing, finished at the next
//!   boot if the agent died half way.
//! - `place`: the plan onto the live tree through directory descriptors.
//! - `placed`: the record of the last layer placed, kept across restarts.

mod byte_path;
pub mod journal;
mod place;
pub mod placed;
mod stage;

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use silo_protocol::ErrorKind;
use silo_protocol::bundle::BundleLimits;
use silo_protocol::http::error_chain;
use silo_protocol::layers::{ApplyResponse, MAX_LAYER_BYTES, MAX_LAYER_ENTRIES, PlacedLayer};
use silo_protocol::snapshot::CTIME_MARGIN_NS;
use tokio::sync::mpsc;

use crate::body::{self, BODY_CHANNEL_CHUNKS, BodyError, ChannelReader};
use crate::fs_error::FsError;
use crate::push::archive::{Packing, read_archive};
use crate::push::extract::ExtractError;
use crate::push::{CancelOnDrop, Pusher, is_disk_full};
use crate::rewind::Hold;
use crate::snapshot::Snapshotter;
use crate::snapshot::tree::Changes;
use crate::snapshot::walk::{SYSTEM_DIRS, mount_points};
use place::{Placed, Resume, Target};
use stage::{Plan, Stager};

use crate::paths::STATE_DIR;
/// Where staging directories live, under [`STATE_DIR`].
const STAGING_DIR: &str = "layers";
/// Mode of the state directory when the agent makes it.
const STATE_DIR_MODE: u32 = 0o755;
/// Mode of the staging directories: nobody else needs to look in.
const STAGING_MODE: u32 = 0o700;

/// One apply, as the handler parsed it.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    /// The signed hex SHA-256 of the body.
    pub sha256: String,
    /// The declared body size, when the client sent one.
    pub content_length: Option<u64>,
}

/// The layer apply service.
pub struct Applier {
    root: PathBuf,
    boot_id: String,
    next_tag: AtomicU64,
    /// The last layer placed, and the one being applied.
    last: Arc<placed::LastPlaced>,
}

impl Applier {
    /// Applies onto the file system at `root`; `boot_id` tags staging
    /// directories, so a later boot knows them for leftovers.
    pub fn new(root: PathBuf, boot_id: String) -> Self {
        Self {
            last: Arc::new(placed::LastPlaced::load(&root)),
            root,
            boot_id,
            next_tag: AtomicU64::new(1),
        }
    }

    /// The last layer placed on the machine, and the one being applied.
    pub fn last_placed(&self) -> (Option<PlacedLayer>, Option<String>) {
        self.last.get()
    }

    /// Removes staging directories earlier boots left behind (blocking).
    pub fn clean_leftovers(&self) -> usize {
        let dir = self.root.join(STATE_DIR).join(STAGING_DIR);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return 0;
        };
        let ours = format!("{}-", self.boot_id);
        let mut removed = 0;
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&ours)
                || journal::exists(&entry.path())
            {
                continue;
            }
            if crate::cleanup::global().remove(&entry.path()) {
                removed += 1;
            }
        }
        removed
    }

    /// Carries out one apply, reading `body` to its end in every case but
    /// an oversize declared length, so the client always gets the answer.
    pub async fn apply(
        &self,
        request: ApplyRequest,
        body: Incoming,
        snapshots: &Snapshotter,
        pusher: &Pusher,
    ) -> Result<ApplyResponse, ApplyError> {
        let started = Instant::now();
        check_declared(&request)?;
        let Ok(slot) = snapshots.try_hold() else {
            let _ = body::drain(body, MAX_LAYER_BYTES).await;
            return Err(ApplyError::Busy);
        };
        let (slot, staged) = self.stage_body(request, body, slot).await?;
        let pushes = match pusher.hold_off().await {
            Ok(pushes) => pushes,
            Err(err) => {
                tokio::task::spawn_blocking(move || staged.discard());
                return Err(ApplyError::Internal(error_chain(&err)));
            }
        };
        let writes = snapshots.write_gate().close_to_replace().await;
        self.place_staged(staged, (slot, pushes, writes), started)
            .await
    }

    /// [`Applier::apply`] for a rewind, whose hold has the snapshot slot
    /// and the pushes already: the hold lasts until the layer is placed or
    /// refused, even if the client goes away meanwhile, and once the layer
    /// is placed it keeps the tree the layer made. With `settle` the hold
    /// also lasts the clock margin after the layer is in place, and the
    /// answer's moment is read after it: every path placed then has a
    /// ctime before the next snapshot's margin (see
    /// `silo_protocol::rewind::QUERY_SETTLE`). Nothing can write meanwhile:
    /// the sandbox's processes are ended and its writes and starts wait.
    pub async fn apply_held(
        &self,
        request: ApplyRequest,
        body: Incoming,
        held: Hold,
        settle: bool,
    ) -> Result<ApplyResponse, ApplyError> {
        let started = Instant::now();
        check_declared(&request)?;
        let (held, staged) = self.stage_body(request, body, held).await?;
        self.place_staged(staged, KeepAfter { held, settle }, started)
            .await
    }

    /// Streams `body` into a fresh staging directory and checks it, with
    /// `held` kept by the staging task (and handed back) so it outlasts a
    /// client that goes away.
    async fn stage_body<H: Send + 'static>(
        &self,
        request: ApplyRequest,
        body: Incoming,
        held: H,
    ) -> Result<(H, Staged), ApplyError> {
        let tag = format!(
            "{}-{}",
            self.boot_id,
            self.next_tag.fetch_add(1, Ordering::Relaxed)
        );
        let (tx, rx) = mpsc::channel(BODY_CHANNEL_CHUNKS);
        // Set when this request ends, answered or not, so a staging whose
        // client went away stops at its next entry.
        let cancelled = CancelOnDrop::default();
        let job = {
            let root = self.root.clone();
            let flag = Arc::clone(&cancelled.0);
            let claimed = request.sha256;
            tokio::task::spawn_blocking(move || {
                let body = ChannelReader::new(rx);
                let staged = stage(&root, &tag, body, &claimed, &layer_limits(), &flag);
                (held, staged)
            })
        };
        let (pumped, joined) = tokio::join!(body::pump(body, tx, MAX_LAYER_BYTES), job);
        let (held, staged) =
            joined.map_err(|e| ApplyError::Internal(format!("staging task failed: {e}")))?;
        match (pumped, staged) {
            (_, Ok(staged)) => Ok((held, staged)),
            // A body that did not arrive whole is the answer.
            (pumped, Err(err)) => Err(pumped.error(MAX_LAYER_BYTES).map_or(err, ApplyError::from)),
        }
    }

    /// Places a staged layer with `held` kept until it is done.
    async fn place_staged<H: Placing>(
        &self,
        staged: Staged,
        held: H,
        started: Instant,
    ) -> Result<ApplyResponse, ApplyError> {
        // The holds move into the task, so they last until it is over
        // even if the client goes away meanwhile.
        let root = self.root.clone();
        let last = Arc::clone(&self.last);
        last.applying(&staged.sha256);
        let placed = tokio::task::spawn_blocking(move || {
            let mut held = held;
            let mut placed = staged.place(&root);
            match &mut placed {
                Ok(placed) => {
                    held.placed(&placed.changes);
                    if let Some(margin) = held.settle() {
                        std::thread::sleep(margin);
                        placed.applied_at_ns = crate::clock::unix_ns_now().unwrap_or(0);
                    }
                    last.placed(PlacedLayer {
                        sha256: placed.sha256.clone(),
                        applied_at_ns: placed.applied_at_ns,
                    });
                }
                Err(_) => last.done(),
            }
            placed
        })
        .await
        .map_err(|e| ApplyError::Internal(format!("placing task failed: {e}")))??;
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            files = placed.placed.files,
            bytes = placed.placed.bytes,
            whiteouts = placed.placed.whiteouts,
            skipped = placed.skipped_count,
            ms,
            "layer applied"
        );
        Ok(placed.answer(ms))
    }
}

/// What an apply holds while it places, told what the placed layer did.
trait Placing: Send + 'static {
    /// The layer is in place, with these changes to the tree.
    fn placed(&mut self, changes: &Changes);

    /// How long to go on holding once the layer is in place, if at all.
    fn settle(&self) -> Option<Duration> {
        None
    }
}

impl Placing
    for (
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedRwLockWriteGuard<()>,
    )
{
    fn placed(&mut self, _changes: &Changes) {}
}

/// A rewind's hold, which keeps the tree after its layer (and, settling,
/// lasts the clock margin past it).
struct KeepAfter {
    held: Hold,
    settle: bool,
}

impl Placing for KeepAfter {
    fn placed(&mut self, changes: &Changes) {
        self.held.keep_after(changes.clone());
    }

    fn settle(&self) -> Option<Duration> {
        let margin = u64::try_from(CTIME_MARGIN_NS).unwrap_or(0);
        self.settle
            .then(|| Duration::from_nanos(margin) + Duration::from_millis(1))
    }
}

/// Refuses a declared body over the layer cap before reading any of it.
fn check_declared(request: &ApplyRequest) -> Result<(), ApplyError> {
    match request.content_length.filter(|len| *len > MAX_LAYER_BYTES) {
        Some(declared) => Err(BodyError::TooLarge {
            declared: Some(declared),
            limit: MAX_LAYER_BYTES,
        }
        .into()),
        None => Ok(()),
    }
}

/// A layer staged and checked, with its hash; removed when placed or discarded.
#[derive(Debug)]
struct Staged {
    staging: PathBuf,
    excluded: HashSet<PathBuf>,
    plan: Plan,
    sha256: String,
}

/// A placed layer, for the answer.
#[derive(Debug)]
struct Applied {
    placed: Placed,
    sha256: String,
    skipped_count: u64,
    skipped: Vec<silo_protocol::layers::Skipped>,
    owners: bool,
    /// What the layer did to the tree, by the index's rules.
    changes: Changes,
    /// Unix ns once it was in place.
    applied_at_ns: i64,
}

impl Staged {
    /// Carries out the plan on the machine at `root` (blocking), journaled:
    /// if it fails half way the staging directory and its journal stay, and
    /// the agent's next boot finishes it.
    fn place(self, root: &Path) -> Result<Applied, ApplyError> {
        if let Err(err) = journal::write(&self.staging, &self.plan) {
            remove_staging(&self.staging);
            return Err(err.into());
        }
        let target = Target {
            root,
            staging: &self.staging,
            excluded: &self.excluded,
        };
        let placed = place::place(&self.plan, target, Resume::default(), || {
            journal::mark_removed(&self.staging)
        })
        .map_err(ApplyError::Incomplete)?;
        remove_staging(&self.staging);
        let changes = self.plan.changes();
        Ok(Applied {
            changes,
            applied_at_ns: crate::clock::unix_ns_now().unwrap_or(0),
            placed,
            sha256: self.sha256,
            skipped_count: self.plan.skipped_count,
            skipped: self.plan.skipped,
            owners: self.plan.owners,
        })
    }

    /// Removes what was staged, for a layer that will not be placed (blocking).
    fn discard(self) {
        remove_staging(&self.staging);
    }
}

impl Applied {
    fn answer(self, ms: u64) -> ApplyResponse {
        let p = self.placed;
        ApplyResponse {
            sha256: self.sha256,
            entries: p.dirs + p.files + p.symlinks + p.fifos + p.hard_links + p.whiteouts,
            dirs: p.dirs,
            files: p.files,
            bytes: p.bytes,
            symlinks: p.symlinks,
            hard_links: p.hard_links,
            fifos: p.fifos,
            whiteouts: p.whiteouts,
            skipped_count: self.skipped_count,
            skipped: self.skipped,
            owners_applied: self.owners,
            ms,
            applied_at_ns: Some(self.applied_at_ns),
        }
    }
}

/// The caps a layer body meets: its size and entry count (it is a plain
/// tar, so no file or total can be larger than the body).
fn layer_limits() -> BundleLimits {
    BundleLimits {
        max_file_bytes: MAX_LAYER_BYTES,
        max_bundle_bytes: MAX_LAYER_BYTES,
        max_unpacked_bytes: MAX_LAYER_BYTES,
        max_entries: MAX_LAYER_ENTRIES,
        max_ratio: u64::MAX,
    }
}

/// Reads the layer in `body` into a fresh staging directory under `root`
/// and checks it (blocking); on failure nothing of it is left.
fn stage(
    root: &Path,
    tag: &str,
    body: impl Read,
    claimed: &str,
    limits: &BundleLimits,
    cancelled: &AtomicBool,
) -> Result<Staged, ApplyError> {
    let excluded = excluded_roots(root)?;
    let staging = make_staging(root, tag)?;
    let owners = nix::unistd::geteuid().is_root();
    let mut stager = Stager::new(root, &staging, &excluded, owners);
    match read_archive(Packing::Tar, body, limits, claimed, cancelled, &mut stager) {
        Ok(sha256) => {
            let mut plan = stager.finish();
            plan.sha256.clone_from(&sha256);
            Ok(Staged {
                plan,
                staging,
                excluded,
                sha256,
            })
        }
        Err(err) => {
            remove_staging(&staging);
            Err(err.into())
        }
    }
}

/// What a layer may never touch, relative to `root`: the kernel's file
/// systems, the agent's own directory and every mount point below `root`.
pub fn excluded_roots(root: &Path) -> Result<HashSet<PathBuf>, ApplyError> {
    let mounts = mount_points(root).map_err(|err| ApplyError::Internal(error_chain(&err)))?;
    Ok(SYSTEM_DIRS
        .iter()
        .chain(&[STATE_DIR])
        .map(PathBuf::from)
        .chain(mounts)
        .collect())
}

/// Makes `<root>/.silo/layers/<tag>`, refusing a symlink on the way.
fn make_staging(root: &Path, tag: &str) -> Result<PathBuf, FsError> {
    let state = root.join(STATE_DIR);
    let layers = state.join(STAGING_DIR);
    ensure_real_dir(&state, STATE_DIR_MODE)?;
    ensure_real_dir(&layers, STAGING_MODE)?;
    let staging = layers.join(tag);
    std::fs::DirBuilder::new()
        .mode(STAGING_MODE)
        .create(&staging)
        .map_err(FsError::at("create", &staging))?;
    Ok(staging)
}

/// Makes `dir` with `mode` if it is missing; refuses anything but a real directory.
fn ensure_real_dir(dir: &Path, mode: u32) -> Result<(), FsError> {
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => return Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(FsError::new("create", dir, err)),
    }
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(FsError::new(
            "use",
            dir,
            std::io::Error::other("is not a directory (a symlink is refused)"),
        )),
        Err(err) => Err(FsError::new("inspect", dir, err)),
    }
}

pub(crate) fn remove_staging(staging: &Path) {
    crate::cleanup::global().remove(staging);
}

/// Why an apply failed; [`ApplyError::kind`] makes the answer.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The signed content hash is not a SHA-256.
    #[error("x-silo-content-sha256 must be 64 lowercase hex digits for a layer")]
    BadHash,
    /// The request body was not taken whole.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// A snapshot or another apply holds the slot.
    #[error("a snapshot or another layer apply is under way")]
    Busy,
    /// The layer is refused or could not be staged; nothing live changed.
    #[error(transparent)]
    Stage(#[from] ExtractError),
    /// Staging could not be set up; nothing live changed.
    #[error(transparent)]
    Io(#[from] FsError),
    /// Placing failed: part of the layer is in place.
    #[error("the layer was only partly applied")]
    Incomplete(#[source] FsError),
    /// The agent failed in a way the request could not cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApplyError {
    /// The error body's kind (which fixes the status).
    pub fn kind(&self) -> ErrorKind {
        let disk = |source: &std::io::Error| {
            if is_disk_full(source) {
                ErrorKind::DiskFull
            } else {
                ErrorKind::Internal
            }
        };
        match self {
            Self::BadHash => ErrorKind::Malformed,
            Self::Body(err) => err.kind(),
            Self::Busy => ErrorKind::Busy,
            Self::Stage(err) => err.kind(ErrorKind::RejectedEntry, disk),
            Self::Io(err) => disk(&err.source),
            Self::Incomplete(_) => ErrorKind::Incomplete,
            Self::Internal(_) => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests;
