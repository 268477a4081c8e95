//! File push: a signed tar.gz bundle becomes the tree at a mount path, all
//! at once or not at all.
//!
//! [`Pusher::push`] owns one push from an admitted request to its answer:
//! the mount path is checked against the allowed roots, pushes to the same
//! mount queue on that mount's lock in arrival order (other mounts proceed
//! at the same time, up to [`MAX_ACTIVE_PUSHES`]), a bundle whose hash is
//! already live is answered "unchanged" without writing, and anything else
//! is streamed from the connection into a blocking extractor, verified,
//! committed as a new version and swapped in with one exchange of the
//! mount's link (see `store`). Retired versions are removed later by a
//! per-mount timer. Whatever fails, the
//! live tree is untouched and the partial version is removed (or handed to
//! [`crate::cleanup`] to retry) before the answer goes out.
//!
//! Admission comes before any work: a bundle whose declared entries or
//! unpacked size (see [`Declared`]) is over a cap is refused at once, and
//! the extract is then held to what was declared. A bundle that declares
//! neither, as any client but silo's own may send, is first read whole
//! into a spool beside its version, its headers counted against the caps
//! as it comes: an oversize one is refused at the speed of the network,
//! having written no file (writing 100,000 entries takes minutes on some
//! storage drivers), and only a bundle within the caps is extracted. A push gets at most the
//! push deadline (`--push-deadline-secs`) to extract and swap, so a mount
//! is never held longer; a push queued behind another waits at most
//! [`MAX_QUEUE_WAIT`] and is then answered `busy`, with how long the
//! holder may still take.
//!
//! # Layout
//! - `mount`: which mount paths are allowed, where they live, what is live.
//! - `body`: the bounded bridge from the async connection to the blocking extractor.
//! - `archive`: the reader chain of every signed archive body (hash, caps, gzip, tar).
//! - `extract`: the safe extractor (every reject reason lives there).
//! - `store`: version ids, commit and swap, garbage collection, leftovers.

pub mod archive;
pub mod extract;
mod mount;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use silo_protocol::ErrorKind;
use silo_protocol::bundle::BundleLimits;
use silo_protocol::push::{Declared, PushResponse, QueryError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use crate::body::{self, BODY_CHANNEL_CHUNKS, BodyError, ChannelReader};
use crate::fs_error::FsError;
use crate::shutdown::{self, Phase};
use extract::ExtractError;
use mount::{Live, Mount, MountError};
use store::VersionId;

/// Where mounts may live unless the agent is told otherwise.
pub const DEFAULT_PUSH_ROOT: &str = "/workspace/managed";
/// How long a retired version stays for readers that still use it.
pub const DEFAULT_VERSION_GRACE: Duration = Duration::from_secs(60);
/// Most retired versions kept per mount, whatever their age.
pub const DEFAULT_KEEP_VERSIONS: usize = 8;
/// Pushes extracting at once, across all mounts.
pub const MAX_ACTIVE_PUSHES: usize = 4;
/// Default time one push may take to extract and swap: below the
/// controller's 300 s request timeout, so the client hears why.
pub const DEFAULT_PUSH_DEADLINE: Duration = Duration::from_secs(240);
/// Longest a push waits for another push to the same mount to finish.
pub const MAX_QUEUE_WAIT: Duration = Duration::from_secs(60);
/// Mode of a staging directory while it fills: nobody else needs to look in.
const STAGING_MODE: u32 = 0o700;
/// Mode of a committed version's top directory.
const VERSION_MODE: u32 = 0o755;

/// How pushes are checked and kept.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// Roots (as seen in the sandbox) that mount paths must lie under.
    pub roots: Vec<PathBuf>,
    /// Directory that sandbox paths are placed under on disk (`/` in a container).
    pub base: PathBuf,
    /// Caps on bundles.
    pub limits: BundleLimits,
    /// How long retired versions stay.
    pub grace: Duration,
    /// Most retired versions kept per mount.
    pub keep: usize,
    /// Longest one push may extract and swap before it is cancelled.
    pub deadline: Duration,
}

impl Default for PushConfig {
    fn default() -> Self {
        Self {
            roots: vec![PathBuf::from(DEFAULT_PUSH_ROOT)],
            base: PathBuf::from("/"),
            limits: BundleLimits::default(),
            grace: DEFAULT_VERSION_GRACE,
            keep: DEFAULT_KEEP_VERSIONS,
            deadline: DEFAULT_PUSH_DEADLINE,
        }
    }
}

/// One push, as the handler parsed it.
#[derive(Debug, Clone)]
pub struct PushRequest {
    /// The mount path, decoded from the query.
    pub mount: String,
    /// The signed hex SHA-256 of the body.
    pub sha256: String,
    /// The declared body size, when the client sent one.
    pub content_length: Option<u64>,
    /// What the client declared of the bundle.
    pub declared: Declared,
}

/// Per-mount state: the lock that orders its pushes, and its retired versions.
///
/// The lock is taken as an owned guard and moved into the extract job, so
/// it is held until the job is really over, even if the client goes away
/// and the request future is dropped while the job finishes on its own.
#[derive(Default)]
struct Slot {
    state: Arc<tokio::sync::Mutex<SlotState>>,
    /// When the push holding the lock must be done, for those waiting.
    held_until: Mutex<Option<Instant>>,
}

/// A mount's state with its lock held.
type SlotGuard = tokio::sync::OwnedMutexGuard<SlotState>;

/// A push admitted to its mount, holding what it needs for its extract.
struct Admitted {
    /// The caps, tightened to what the client declared.
    limits: BundleLimits,
    /// Where it goes.
    mount: Mount,
    /// The mount's slot, and its state with the lock held.
    slot: Arc<Slot>,
    state: SlotGuard,
    /// One of the pushes that may extract at once.
    permit: OwnedSemaphorePermit,
    /// What the mount holds now.
    live: Live,
}

#[derive(Default)]
struct SlotState {
    live: Option<VersionId>,
    /// Retired version seq → when it stopped being live.
    retired: BTreeMap<u64, Instant>,
    /// A cleanup timer is pending for this mount.
    timer: bool,
}

/// The push service.
pub struct Pusher {
    config: PushConfig,
    boot_id: String,
    next_tag: AtomicU64,
    /// One slot per mount pushed to since boot (never pruned: it is small, and
    /// it holds the retirement times the grace period is measured from).
    slots: Mutex<HashMap<PathBuf, Arc<Slot>>>,
    active: Arc<Semaphore>,
    phase: watch::Receiver<Phase>,
}

impl Pusher {
    /// A pusher; `boot_id` tags its temporary files, `phase` ends its timers.
    pub fn new(config: PushConfig, boot_id: String, phase: watch::Receiver<Phase>) -> Arc<Self> {
        Arc::new(Self {
            config,
            boot_id,
            next_tag: AtomicU64::new(1),
            slots: Mutex::new(HashMap::new()),
            active: Arc::new(Semaphore::new(MAX_ACTIVE_PUSHES)),
            phase,
        })
    }

    /// Holds every push off until the returned permit is dropped: extracts,
    /// swaps and version cleanups each hold one of [`MAX_ACTIVE_PUSHES`]
    /// permits, so this waits for those under way and keeps new ones
    /// waiting. A snapshot holds it while it reads, so it never captures a
    /// push half done.
    pub async fn hold_off(&self) -> Result<OwnedSemaphorePermit, PushError> {
        let all = u32::try_from(MAX_ACTIVE_PUSHES).unwrap_or(u32::MAX);
        Arc::clone(&self.active)
            .acquire_many_owned(all)
            .await
            .map_err(|_| PushError::Internal("push permits closed".into()))
    }

    /// Removes what pushes interrupted in earlier boots left behind (blocking).
    pub fn clean_leftovers(&self) -> usize {
        let roots: Vec<PathBuf> = self
            .config
            .roots
            .iter()
            .map(|root| mount::physical(&self.config.base, root))
            .collect();
        store::clean_leftovers(&roots, &self.boot_id)
    }

    /// Carries out one push, reading `body` to its end in every case but an
    /// oversize declared length, so the client always gets the answer.
    pub async fn push(
        self: &Arc<Self>,
        request: PushRequest,
        body: Incoming,
    ) -> Result<PushResponse, PushError> {
        let cap = self.config.limits.max_bundle_bytes;
        if let Some(declared) = request.content_length.filter(|len| *len > cap) {
            return Err(BodyError::TooLarge {
                declared: Some(declared),
                limit: cap,
            }
            .into());
        }
        // A push refused before its extract still reads the body, at the
        // network's pace, not the disk's, so the client hears the refusal
        // instead of a reset while still sending.
        let admitted = match self.admit(&request).await {
            Ok(admitted) => admitted,
            Err(err) => {
                let _ = body::drain(body, cap).await;
                return Err(err);
            }
        };
        if let Live::Version(current) = &admitted.live {
            if current.sha256 == request.sha256 {
                let mut state = admitted.state;
                state.live = Some(current.clone());
                let _ = body::drain(body, cap).await;
                return Ok(PushResponse {
                    version: current.to_string(),
                    sha256: current.sha256.clone(),
                    files: 0,
                    bytes: 0,
                    unchanged: true,
                });
            }
        }
        let (slot, mount, live) = (
            Arc::clone(&admitted.slot),
            admitted.mount.clone(),
            admitted.live.clone(),
        );
        let (state, id, extracted) = self.extract(&request, body, admitted).await?;
        Ok(self.commit(&slot, &mount, state, live, id, extracted).await)
    }

    /// Admits `request` to its mount: the caps tightened to what it
    /// declared, the mount resolved, its lock taken (waiting at most
    /// [`MAX_QUEUE_WAIT`]), a push permit, and the mount's store ready.
    async fn admit(&self, request: &PushRequest) -> Result<Admitted, PushError> {
        let limits = admit(&self.config.limits, request.declared)?;
        let mount = mount::resolve(&request.mount, &self.config)?;
        let slot = self.slot(&mount);
        let queued = tokio::time::timeout(MAX_QUEUE_WAIT, Arc::clone(&slot.state).lock_owned());
        let Ok(state) = queued.await else {
            let left = slot.held_until().map_or(Duration::ZERO, |until| {
                until.saturating_duration_since(Instant::now())
            });
            return Err(PushError::MountBusy {
                mount: request.mount.clone(),
                waited: MAX_QUEUE_WAIT,
                left,
            });
        };
        slot.set_held_until(Instant::now() + self.config.deadline);
        let permit = Arc::clone(&self.active)
            .acquire_owned()
            .await
            .map_err(|_| PushError::Internal("push permits closed".into()))?;
        let live = {
            let mount = mount.clone();
            blocking(move || mount::prepare(&mount)).await??
        };
        Ok(Admitted {
            limits,
            mount,
            slot,
            state,
            permit,
            live,
        })
    }

    /// Streams `body` into a new version of the admitted mount and swaps it
    /// in, within the push deadline. On failure the mount's lock goes as
    /// soon as the extract has failed (a client that stops sending must not
    /// hold off other pushes to the mount, nor may the removal of what it
    /// wrote), while the body is still drained for a clean answer.
    async fn extract(
        &self,
        request: &PushRequest,
        body: Incoming,
        admitted: Admitted,
    ) -> Result<(SlotGuard, VersionId, extract::Extracted), PushError> {
        let cap = self.config.limits.max_bundle_bytes;
        let tag = format!(
            "{}-{}",
            self.boot_id,
            self.next_tag.fetch_add(1, Ordering::Relaxed)
        );
        let (tx, rx) = mpsc::channel(BODY_CHANNEL_CHUNKS);
        // Set when this request ends, answered or not: hyper drops the
        // request when its client goes away, and the extract, which cannot
        // be cancelled from outside its thread, stops at the next entry.
        let cancelled = CancelOnDrop::default();
        let timed_out = Arc::new(AtomicBool::new(false));
        let _deadline = AbortOnDrop(tokio::spawn({
            let (cancelled, timed_out) = (Arc::clone(&cancelled.0), Arc::clone(&timed_out));
            let deadline = self.config.deadline;
            async move {
                tokio::time::sleep(deadline).await;
                timed_out.store(true, Ordering::Relaxed);
                cancelled.store(true, Ordering::Relaxed);
            }
        }));
        let bundle = Bundle {
            claimed: request.sha256.clone(),
            limits: admitted.limits,
            count_first: request.declared.entries.is_none() || request.declared.unpacked.is_none(),
        };
        let Admitted {
            mount,
            state,
            permit,
            ..
        } = admitted;
        let flag = Arc::clone(&cancelled.0);
        let job = tokio::task::spawn_blocking(move || {
            let reader = ChannelReader::new(rx);
            match stage_and_swap(&mount, &tag, reader, &bundle, &flag) {
                Ok((id, extracted)) => Ok((state, id, extracted)),
                // What the extract wrote is removed on this thread, not in
                // the request (which a departed client's connection drops),
                // after the lock goes but under the push permit (a snapshot
                // must not read it half removed), and before the answer, so
                // a refusal leaves nothing behind.
                Err(failed) => {
                    drop(state);
                    remove_leftovers(&failed.leftovers);
                    // A store no version ever reached goes too: a refused
                    // first push leaves nothing.
                    let _ = std::fs::remove_dir(mount.store());
                    drop(permit);
                    Err(failed.error)
                }
            }
        });
        let extracted = async {
            job.await
                .map_err(|e| PushError::Internal(format!("extract task failed: {e}")))
        };
        let (pumped, joined) = tokio::join!(body::pump(body, tx, cap), extracted);
        match (pumped, joined?) {
            (_, Ok(done)) => Ok(done),
            (_, Err(_)) if timed_out.load(Ordering::Relaxed) => {
                Err(PushError::DeadlinePassed(self.config.deadline))
            }
            // A body that did not arrive whole is the answer, whatever the
            // extract made of what did.
            (pumped, Err(err)) => Err(pumped.error(cap).map_or(err, PushError::from)),
        }
    }

    /// Records version `id` as the mount's live one, the one it replaced
    /// as retired, and has retired versions collected as their grace ends.
    async fn commit(
        self: &Arc<Self>,
        slot: &Arc<Slot>,
        mount: &Mount,
        mut state: SlotGuard,
        replaced: Live,
        id: VersionId,
        extracted: extract::Extracted,
    ) -> PushResponse {
        if let Live::Version(previous) = replaced {
            state.retired.insert(previous.seq, Instant::now());
        }
        state.live = Some(id.clone());
        let due = self.collect(mount, &mut state).await;
        if let Some(due) = due.filter(|_| !state.timer) {
            state.timer = true;
            tokio::spawn(Arc::clone(self).clean_later(Arc::clone(slot), mount.clone(), due));
        }
        tracing::info!(mount = %mount.path, version = %id, files = extracted.files, bytes = extracted.bytes, "pushed");
        PushResponse {
            version: id.to_string(),
            sha256: extracted.sha256,
            files: extracted.files,
            bytes: extracted.bytes,
            unchanged: false,
        }
    }

    /// The slot of `mount`.
    fn slot(&self, mount: &Mount) -> Arc<Slot> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(slots.entry(mount.link()).or_default())
    }

    /// Runs garbage collection for a mount whose lock the caller holds.
    async fn collect(&self, mount: &Mount, state: &mut SlotState) -> Option<Instant> {
        // Removing versions changes the file system like an extract does, so
        // it too waits while a snapshot reads (see [`Pusher::hold_off`]).
        let Ok(_permit) = self.active.acquire().await else {
            return None;
        };
        let store = mount.store();
        let live = state.live.clone();
        let mut retired = std::mem::take(&mut state.retired);
        let (grace, keep) = (self.config.grace, self.config.keep);
        let result = blocking(move || {
            let due = store::collect_garbage(
                &store,
                live.as_ref(),
                &mut retired,
                grace,
                keep,
                Instant::now(),
            );
            (due, retired)
        })
        .await;
        match result {
            Ok((due, retired)) => {
                state.retired = retired;
                due
            }
            Err(err) => {
                tracing::warn!(%err, "version cleanup failed");
                None
            }
        }
    }

    /// Removes a mount's retired versions as their grace runs out.
    async fn clean_later(self: Arc<Self>, slot: Arc<Slot>, mount: Mount, mut due: Instant) {
        let mut phase = self.phase.clone();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(due.into()) => {}
                () = shutdown::reached(&mut phase, Phase::Draining) => return,
            }
            let mut state = slot.state.lock().await;
            match self.collect(&mount, &mut state).await {
                Some(next) => due = next,
                None => {
                    state.timer = false;
                    return;
                }
            }
        }
    }
}

impl Slot {
    fn held_until(&self) -> Option<Instant> {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_held_until(&self, until: Instant) {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }
}

/// The caps one push's extract is held to: the agent's, tightened to what
/// the client declared; a declaration over a cap is refused before
/// anything is read or locked.
fn admit(caps: &BundleLimits, declared: Declared) -> Result<BundleLimits, PushError> {
    let mut limits = *caps;
    if let Some(entries) = declared.entries {
        if entries > caps.max_entries {
            return Err(PushError::DeclaredOver {
                what: "entries",
                declared: entries,
                limit: caps.max_entries,
            });
        }
        limits.max_entries = entries;
    }
    if let Some(unpacked) = declared.unpacked {
        if unpacked > caps.max_unpacked_bytes {
            return Err(PushError::DeclaredOver {
                what: "unpacked bytes",
                declared: unpacked,
                limit: caps.max_unpacked_bytes,
            });
        }
        limits.max_unpacked_bytes = unpacked;
    }
    Ok(limits)
}

/// Aborts its task when dropped: a push's deadline timer ends with the push.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Removes the directories a failed push made, or has them retried until
/// they are gone (a reader in the tree can stop a removal on
/// fuse-overlayfs).
fn remove_leftovers(leftovers: &[PathBuf]) {
    for dir in leftovers {
        crate::cleanup::global().remove(dir);
    }
}

/// A push that failed, and the directories it made, for removal.
struct Failed {
    error: PushError,
    leftovers: Vec<PathBuf>,
}

/// Sets its flag when dropped.
#[derive(Default)]
pub(crate) struct CancelOnDrop(pub(crate) Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What one push's body is checked against.
struct Bundle {
    /// The SHA-256 the request was signed over.
    claimed: String,
    /// The caps, tightened to what the client declared.
    limits: BundleLimits,
    /// The client declared no entries or unpacked size: count the bundle
    /// from a spool before writing any of it.
    count_first: bool,
}

/// Extracts into a fresh staging directory, commits it as the next version
/// and swaps it in. On failure it names what it made, for the caller to
/// remove once the mount is released.
fn stage_and_swap(
    mount: &Mount,
    tag: &str,
    body: ChannelReader,
    bundle: &Bundle,
    cancelled: &AtomicBool,
) -> Result<(VersionId, extract::Extracted), Failed> {
    let failed = |error: PushError| Failed {
        error,
        leftovers: Vec::new(),
    };
    let store = mount.store();
    let seq = store::versions(&store)
        .map_err(FsError::at("list versions in", &store))
        .map_err(|e| failed(e.into()))?
        .last()
        .map_or(1, |v| v.seq + 1);
    let staging = store::staging_path(&store, tag);
    std::fs::DirBuilder::new()
        .mode(STAGING_MODE)
        .create(&staging)
        .map_err(FsError::at("create", &staging))
        .map_err(|e| failed(e.into()))?;
    let spool = staging.with_extension("bundle");
    let mut made = None;
    let result = (|| {
        let (claimed, limits) = (&bundle.claimed, &bundle.limits);
        let extracted = if bundle.count_first {
            let spooled = spool_and_count(body, &spool, limits, claimed, cancelled)?;
            extract::extract(spooled, &staging, limits, claimed, cancelled)?
        } else {
            extract::extract(body, &staging, limits, claimed, cancelled)?
        };
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(VERSION_MODE))
            .map_err(FsError::at("chmod", &staging))?;
        let id = VersionId {
            seq,
            sha256: extracted.sha256.clone(),
        };
        made = Some(store.join(id.to_string()));
        store::commit_and_swap(&staging, &store, &mount.link(), &mount.name, &id, tag)?;
        Ok((id, extracted))
    })();
    if bundle.count_first {
        let _ = std::fs::remove_file(&spool);
    }
    result.map_err(|error| Failed {
        error,
        leftovers: std::iter::once(staging).chain(made).collect(),
    })
}

/// Reads the whole body into `spool` while counting it against `limits`
/// ([`extract::count`]); the spool, read from its start, once it is within
/// them.
fn spool_and_count(
    body: ChannelReader,
    spool: &std::path::Path,
    limits: &BundleLimits,
    claimed: &str,
    cancelled: &AtomicBool,
) -> Result<std::fs::File, PushError> {
    use std::io::{Seek, Write};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(STAGING_MODE)
        .open(spool)
        .map_err(FsError::at("create", spool))?;
    let mut tee = Tee {
        inner: body,
        copy: io::BufWriter::new(&mut file),
    };
    let counted = extract::count(&mut tee, limits, claimed, cancelled)?;
    tee.copy.flush().map_err(FsError::at("write", spool))?;
    drop(tee);
    tracing::debug!(
        entries = counted.entries,
        unpacked = counted.unpacked,
        "undeclared bundle counted"
    );
    file.rewind().map_err(FsError::at("read", spool))?;
    Ok(file)
}

/// A reader that writes what it reads to `copy` as well.
struct Tee<R, W> {
    inner: R,
    copy: W,
}

impl<R: io::Read, W: io::Write> io::Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.copy.write_all(&buf[..n])?;
        Ok(n)
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PushError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PushError::Internal(format!("blocking task failed: {e}")))
}

/// ENOSPC or EDQUOT: the answer is 507, and retrying will not help.
pub fn is_disk_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Why a push failed; [`PushError::kind`] makes the answer.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The query does not name a mount.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The signed content hash is not a SHA-256.
    #[error("x-silo-content-sha256 must be 64 lowercase hex digits for a push")]
    BadHash,
    /// The mount path is refused.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// The request body was not taken whole.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// The bundle was refused or could not be written.
    #[error(transparent)]
    Extract(#[from] ExtractError),
    /// The client declared a bundle over a cap.
    #[error("bundle declares {declared} {what}, over the limit of {limit}")]
    DeclaredOver {
        /// Which cap.
        what: &'static str,
        /// What the client declared.
        declared: u64,
        /// The cap.
        limit: u64,
    },
    /// Extracting took longer than the push deadline; nothing changed.
    #[error(
        "push not done within the agent's push deadline of {0:?} and cancelled; push fewer files at once or raise --push-deadline-secs"
    )]
    DeadlinePassed(Duration),
    /// Another push held the mount for longer than a push waits.
    #[error(
        "mount {mount} is busy: another push held it for {waited:?} and may hold it {left:?} more"
    )]
    MountBusy {
        /// The mount path.
        mount: String,
        /// How long this push waited.
        waited: Duration,
        /// The most the holder may still take (its deadline).
        left: Duration,
    },
    /// The file system failed outside the extract.
    #[error(transparent)]
    Io(#[from] FsError),
    /// The agent failed in a way the request could not cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl PushError {
    /// The error body's kind (which fixes the answer's status).
    pub fn kind(&self) -> ErrorKind {
        let disk = |source: &io::Error| {
            if is_disk_full(source) {
                ErrorKind::DiskFull
            } else {
                ErrorKind::Internal
            }
        };
        match self {
            Self::Body(err) => err.kind(),
            Self::Query(_) | Self::BadHash => ErrorKind::Malformed,
            Self::Mount(MountError::Invalid { .. }) => ErrorKind::Malformed,
            Self::Mount(MountError::NotAllowed { .. }) => ErrorKind::MountNotAllowed,
            Self::Mount(MountError::Conflict { .. } | MountError::Blocked { .. }) => {
                ErrorKind::MountConflict
            }
            Self::Mount(MountError::Io(err)) => disk(&err.source),
            Self::DeclaredOver { .. } | Self::DeadlinePassed(_) => ErrorKind::TooLarge,
            Self::MountBusy { .. } => ErrorKind::Busy,
            Self::Extract(err) => err.kind(ErrorKind::RejectedEntry, disk),
            Self::Io(err) => disk(&err.source),
            Self::Internal(_) => ErrorKind::Internal,
        }
    }
}
