//! Every call into the `silo` library, and nothing else: when the
//! library's surface moves, this module (two files) is the one to change.
//!
//! A [`Home`] is one `$SILO_HOME`, a [`SandboxRef`] one sandbox in it.
//! Both keep the library's handles per process id: a child of `os.fork()`
//! must not use its parent's state connection (SQLite forbids carrying one
//! across a fork) nor its sockets, so the first call in a child opens its
//! own, and the parent's copies are left untouched (not even dropped).
//!
//! Results leave as the library's own types (a `RestoreReport`, a
//! `FileStat`); `crate::results` makes the Python objects of them.
//!
//! Layout: this file holds the home and its verbs (create, open, list,
//! lifecycle, fork, pools, push); `sandbox` one sandbox's (commands, files,
//! snapshots) and the events of a command.

mod sandbox;

pub use sandbox::{
    FileAnswer, FileOp, SandboxRef, Started, Step, close_stdin, next_step, write_stdin,
};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::PyResult;
use silo::silo_protocol::bundle::{FileEntry, FileSource};
use silo::{
    BackendKind, CreateRequest, FileSet, FillReport, ForkTarget, PoolStatus, PushOptions,
    PushReport, RestoreReport, SandboxRecord, SandboxSpec, Silo, SiloOptions, Snapshot, UpAction,
    UpOutcome, UpRequest,
};

use crate::errors::{invalid, to_py};

/// A value kept for the process that made it: another pid (a forked child)
/// gets a fresh one, and the stale one is forgotten, never dropped.
struct PerPid<T> {
    slot: Mutex<Option<(u32, T)>>,
}

impl<T: Clone> PerPid<T> {
    fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    fn get(&self) -> Option<T> {
        let pid = std::process::id();
        // A lock held by a thread of the parent at the fork is never
        // released in the child: such a child goes without the cache.
        let mut slot = self.slot.try_lock().ok()?;
        match slot.take() {
            Some((owner, value)) if owner == pid => {
                *slot = Some((owner, value.clone()));
                Some(value)
            }
            Some(stale) => {
                std::mem::forget(stale);
                None
            }
            None => None,
        }
    }

    fn set(&self, value: T) {
        if let Ok(mut slot) = self.slot.try_lock()
            && let Some(stale) = slot.replace((std::process::id(), value))
            && stale.0 != std::process::id()
        {
            std::mem::forget(stale);
        }
    }

    fn clear(&self) {
        if let Ok(mut slot) = self.slot.try_lock()
            && let Some(stale) = slot.take()
            && stale.0 != std::process::id()
        {
            std::mem::forget(stale);
        }
    }
}

/// One `$SILO_HOME`, shared with the `silo` command.
pub struct Home {
    path: Option<PathBuf>,
    silo: PerPid<Silo>,
}

impl Home {
    /// The home at `path`, or `$SILO_HOME`, or the default; opened on first use.
    pub fn new(path: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            path,
            silo: PerPid::new(),
        })
    }

    /// The library's handle on the home, for this process.
    pub fn silo(&self) -> PyResult<Silo> {
        if let Some(silo) = self.silo.get() {
            return Ok(silo);
        }
        let silo = Silo::open_with(SiloOptions {
            home: self.path.clone(),
            ..SiloOptions::default()
        })
        .map_err(|e| to_py(&e))?;
        self.silo.set(silo.clone());
        Ok(silo)
    }

    /// The root directory of the home.
    pub fn root(&self) -> PyResult<PathBuf> {
        Ok(self.silo()?.home().root().to_path_buf())
    }
}

/// A spec from its JSON form (the field names of `silo::SandboxSpec`).
pub fn spec_from_json(text: &str) -> PyResult<SandboxSpec> {
    let spec: SandboxSpec =
        serde_json::from_str(text).map_err(|e| invalid(format!("bad sandbox spec: {e}")))?;
    Ok(spec)
}

/// A backend by its name.
pub fn backend(name: &str) -> PyResult<BackendKind> {
    name.parse()
        .map_err(|e: silo::spec::UnknownBackend| invalid(e.to_string()))
}

/// Creates a sandbox (a strict create: a taken name is an error), or takes
/// one from `pool`; answers its handle and what was done (created or
/// claimed).
pub async fn create(
    home: Arc<Home>,
    name: Option<String>,
    spec: SandboxSpec,
    pool: Option<String>,
) -> PyResult<(Arc<SandboxRef>, UpAction)> {
    let silo = home.silo()?;
    let (record, action) = match pool {
        Some(pool) => {
            let name = name.ok_or_else(|| invalid("a sandbox taken from a pool needs a name"))?;
            let outcome = silo
                .up_from_pool(&name, &pool)
                .await
                .map_err(|e| to_py(&e))?;
            (outcome.sandbox, outcome.action)
        }
        None => {
            let record = silo
                .create(CreateRequest { name, spec })
                .await
                .map_err(|e| to_py(&e))?;
            (record, UpAction::Created)
        }
    };
    let sandbox = silo
        .running_sandbox(&record.id)
        .await
        .map_err(|e| to_py(&e))?;
    Ok((SandboxRef::new(home, sandbox), action))
}

/// Opens the sandbox `name`, creating it when it does not exist (`silo up`).
pub async fn up(
    home: Arc<Home>,
    name: String,
    spec: Option<SandboxSpec>,
    recreate: bool,
) -> PyResult<(Arc<SandboxRef>, UpOutcome)> {
    let silo = home.silo()?;
    let (sandbox, outcome) = silo
        .up_sandbox(UpRequest {
            name,
            spec,
            recreate,
        })
        .await
        .map_err(|e| to_py(&e))?;
    Ok((SandboxRef::new(home, sandbox), outcome))
}

/// A handle on an existing sandbox; a stopped one is started when `start`.
pub async fn connect(home: Arc<Home>, name_or_id: &str, start: bool) -> PyResult<Arc<SandboxRef>> {
    let silo = home.silo()?;
    let sandbox = if start {
        silo.sandbox(name_or_id).await
    } else {
        silo.running_sandbox(name_or_id).await
    }
    .map_err(|e| to_py(&e))?;
    Ok(SandboxRef::new(home, sandbox))
}

/// Every sandbox of the home, with what its backend says of its machine
/// now (`running`, `stopped`, `missing`, or `unknown: ` and why).
pub async fn list(home: &Home) -> PyResult<Vec<(SandboxRecord, String)>> {
    let silo = home.silo()?;
    let records = silo.list().map_err(|e| to_py(&e))?;
    let mut rows = Vec::with_capacity(records.len());
    for record in records {
        // One at a time: `statuses`' concurrent future is not `Send`, and
        // the asyncio path runs this on the runtime's workers.
        let state = match silo.status(&record).await {
            Ok(state) => state.as_str().to_owned(),
            Err(error) => format!("unknown: {error}"),
        };
        rows.push((record, state));
    }
    Ok(rows)
}

/// Removes a sandbox by name or id; answers its record.
pub async fn kill(home: &Home, name_or_id: &str) -> PyResult<SandboxRecord> {
    home.silo()?.remove(name_or_id).await.map_err(|e| to_py(&e))
}

/// Pauses a sandbox by name or id (memory kept, e2b); answers whether it ran.
pub async fn pause(home: &Home, name_or_id: &str) -> PyResult<bool> {
    home.silo()?.pause(name_or_id).await.map_err(|e| to_py(&e))
}

/// Starts a sandbox by name or id; answers whether it was running already.
pub async fn start(home: &Home, name_or_id: &str) -> PyResult<bool> {
    let started = home
        .silo()?
        .start(name_or_id)
        .await
        .map_err(|e| to_py(&e))?;
    Ok(started.was_running)
}

/// Makes a sandbox `name` from `snapshot`, on another backend or image when given.
pub async fn fork(
    home: Arc<Home>,
    snapshot: &str,
    name: &str,
    backend: Option<BackendKind>,
    image: Option<String>,
) -> PyResult<(Arc<SandboxRef>, RestoreReport)> {
    let silo = home.silo()?;
    let target = ForkTarget { backend, image };
    let report = silo
        .fork(snapshot, name, &target, &silo::no_progress())
        .await
        .map_err(|e| to_py(&e))?;
    forked(&home, &silo, report).await
}

/// What Python gets of one fork: a handle on its running sandbox and the
/// report.
async fn forked(
    home: &Arc<Home>,
    silo: &Silo,
    report: RestoreReport,
) -> PyResult<(Arc<SandboxRef>, RestoreReport)> {
    let sandbox = silo
        .running_sandbox(&report.sandbox.id)
        .await
        .map_err(|e| to_py(&e))?;
    Ok((SandboxRef::new(Arc::clone(home), sandbox), report))
}

/// Makes `count` sandboxes `name-1`.. from `snapshot` at once (see
/// `Silo::fork_many`); the first failure is raised, the forks made are left.
pub async fn fork_many(
    home: Arc<Home>,
    snapshot: &str,
    name: &str,
    count: u32,
    backend: Option<BackendKind>,
    image: Option<String>,
) -> PyResult<Vec<(Arc<SandboxRef>, RestoreReport)>> {
    let silo = home.silo()?;
    let target = ForkTarget { backend, image };
    let mut made = Vec::new();
    let outcomes = silo
        .fork_many(snapshot, name, count, &target)
        .await
        .map_err(|e| to_py(&e))?;
    for (_, outcome) in outcomes {
        let report = outcome.map_err(|e| to_py(&e))?;
        made.push(forked(&home, &silo, report).await?);
    }
    Ok(made)
}

/// Removes a snapshot (refused while another builds on it); answers it.
pub async fn remove_snapshot(home: &Home, id: &str) -> PyResult<Snapshot> {
    home.silo()?
        .remove_snapshot(id)
        .await
        .map_err(|e| to_py(&e))
}

/// Every snapshot of the home (of every sandbox).
pub fn all_snapshots(home: &Home) -> PyResult<Vec<Snapshot>> {
    home.silo()?.snapshots(None).map_err(|e| to_py(&e))
}

/// Records pool `name` of `size`: of `spec`, or (with `snapshot`) of
/// forks of that snapshot; then, when `fill`, makes its members. Answers
/// the pool, as many members ready as the fill made, and the fill.
pub async fn create_pool(
    home: &Home,
    name: &str,
    spec: Option<SandboxSpec>,
    size: u32,
    snapshot: Option<&str>,
    fill: bool,
) -> PyResult<(PoolStatus, Option<FillReport>)> {
    let silo = home.silo()?;
    let made = match (snapshot, spec) {
        (Some(snapshot), _) => silo.create_pool_on_snapshot(name, snapshot, size),
        (None, Some(spec)) => silo.create_pool(name, spec, size),
        (None, None) => return Err(invalid("a pool needs a spec or a snapshot")),
    };
    let mut status = PoolStatus {
        pool: made.map_err(|e| to_py(&e))?,
        ready: 0,
        members: Vec::new(),
    };
    if !fill {
        return Ok((status, None));
    }
    let filled = fill_pool(home, name).await?;
    status.ready = filled.made;
    Ok((status, Some(filled)))
}

/// Makes the members pool `name` lacks; answers the report.
pub async fn fill_pool(home: &Home, name: &str) -> PyResult<FillReport> {
    home.silo()?.fill_pool(name).await.map_err(|e| to_py(&e))
}

/// Every pool with its ready members.
pub fn pools(home: &Home) -> PyResult<Vec<PoolStatus>> {
    home.silo()?.pools().map_err(|e| to_py(&e))
}

/// Removes pool `name` and its members; answers how many it had.
pub async fn remove_pool(home: &Home, name: &str) -> PyResult<u64> {
    let removed = home
        .silo()?
        .remove_pool(name)
        .await
        .map_err(|e| to_py(&e))?;
    Ok(u64::try_from(removed).unwrap_or(u64::MAX))
}

/// One entry of a file set to push.
pub enum PushEntry {
    Bytes(Vec<u8>, bool),
    Path(PathBuf, bool),
    Dir,
}

/// A file set from its entries, refusing bad paths by name.
pub fn file_set(entries: Vec<(String, PushEntry)>) -> PyResult<FileSet> {
    let mut set = FileSet::new();
    for (path, entry) in entries {
        let entry = match entry {
            PushEntry::Bytes(bytes, executable) => FileEntry::File {
                source: FileSource::Bytes(bytes.into()),
                executable,
            },
            PushEntry::Path(host, executable) => FileEntry::File {
                source: FileSource::Path(host),
                executable,
            },
            PushEntry::Dir => FileEntry::Dir,
        };
        set.insert(&path, entry)
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(set)
}

/// Pushes each target's files to `mount`; answers the fan-out's report.
pub async fn push(
    home: &Home,
    mount: &str,
    targets: Vec<(String, FileSet)>,
    concurrency: Option<usize>,
) -> PyResult<PushReport> {
    let silo = home.silo()?;
    let mut resolved = Vec::with_capacity(targets.len());
    for (name_or_id, files) in targets {
        resolved.push((silo.get(&name_or_id).map_err(|e| to_py(&e))?, files));
    }
    let mut options = PushOptions::default();
    if let Some(concurrency) = concurrency {
        options.concurrency = concurrency;
    }
    silo.push_to_sandboxes(mount, resolved, &options)
        .await
        .map_err(|e| to_py(&e))
}
