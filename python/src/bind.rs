//! Every call into the `silo` library, and nothing else: when the
//! library's surface moves, this file is the one to change.
//!
//! A [`Home`] is one `$SILO_HOME`, a [`SandboxRef`] one sandbox in it.
//! Both keep the library's handles per process id: a child of `os.fork()`
//! must not use its parent's state connection (SQLite forbids carrying one
//! across a fork) nor its sockets, so the first call in a child opens its
//! own, and the parent's copies are left untouched (not even dropped).
//!
//! Results that are plain records travel to Python as JSON data
//! (`runtime::json`); the pure-Python package gives them their types.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::PyResult;
use silo::client::{ClientError, ExecConnection};
use silo::push::PushOptions;
use silo::sandbox::{Event, Execution};
use silo::silo_protocol::bundle::{FileEntry, FileSource};
use silo::{
    BackendKind, CreateRequest, ExecSpec, FileSet, ForkTarget, SandboxSpec, Silo, SiloOptions,
    UpRequest,
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

/// The library's handle on a sandbox with the exec connection kept open
/// for the next command.
#[derive(Clone)]
struct Live {
    sandbox: silo::Sandbox,
    connection: Option<ExecConnection>,
}

/// One sandbox of a [`Home`].
pub struct SandboxRef {
    home: Arc<Home>,
    id: String,
    name: String,
    live: PerPid<Live>,
}

impl SandboxRef {
    fn new(home: Arc<Home>, sandbox: silo::Sandbox) -> Arc<Self> {
        let made = Arc::new(Self {
            home,
            id: sandbox.id().to_owned(),
            name: sandbox.name().to_owned(),
            live: PerPid::new(),
        });
        made.live.set(Live {
            sandbox,
            connection: None,
        });
        made
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its home.
    pub fn home(&self) -> &Arc<Home> {
        &self.home
    }

    async fn sandbox(&self) -> PyResult<silo::Sandbox> {
        if let Some(live) = self.live.get() {
            return Ok(live.sandbox);
        }
        let sandbox = self
            .home
            .silo()?
            .running_sandbox(&self.id)
            .await
            .map_err(|e| to_py(&e))?;
        self.live.set(Live {
            sandbox: sandbox.clone(),
            connection: None,
        });
        Ok(sandbox)
    }

    /// Forgets the handle, after an operation that may have changed the
    /// sandbox's machine (rewind) or its connection died.
    fn forget(&self) {
        self.live.clear();
    }

    /// The kept exec connection (and `true`), or a new one, kept for the
    /// next command (and `false`).
    async fn connection(&self) -> PyResult<(ExecConnection, bool)> {
        if let Some(Live {
            connection: Some(connection),
            ..
        }) = self.live.get()
        {
            return Ok((connection, true));
        }
        let sandbox = self.sandbox().await?;
        let silo = self.home.silo()?;
        let connection = silo
            .connect(sandbox.record())
            .await
            .map_err(|e| to_py(&e))?;
        self.live.set(Live {
            sandbox,
            connection: Some(connection.clone()),
        });
        Ok((connection, false))
    }

    /// Starts a command on the kept connection; once more on a fresh one
    /// when the kept one turns out closed (the agent restarted, a rewind
    /// in another process). A connection opened for this command is not
    /// tried twice: its failure is the agent's, and says so.
    pub async fn spawn(&self, spec: ExecSpec) -> PyResult<Execution> {
        let (connection, kept) = self.connection().await?;
        let sandbox = self.sandbox().await?;
        match sandbox.commands().spawn_on(connection, spec.clone()).await {
            Ok(execution) => Ok(execution),
            Err(ClientError::Disconnected | ClientError::Http(_) | ClientError::Handshake(_))
                if kept =>
            {
                self.forget();
                let (connection, _) = self.connection().await?;
                let sandbox = self.sandbox().await?;
                sandbox
                    .commands()
                    .spawn_on(connection, spec)
                    .await
                    .map_err(|e| to_py(&e))
            }
            Err(error) => Err(to_py(&error)),
        }
    }

    /// Follows a command started earlier, by this process or another.
    pub async fn attach(&self, exec_id: u64, from: u64) -> PyResult<Execution> {
        let sandbox = self.sandbox().await?;
        sandbox
            .commands()
            .attach(exec_id, from)
            .await
            .map_err(|e| to_py(&e))
    }

    /// SIGINT, `grace`, SIGKILL; answers the command's state as JSON.
    pub async fn interrupt(
        &self,
        exec_id: u64,
        grace: Option<Duration>,
    ) -> PyResult<serde_json::Value> {
        let sandbox = self.sandbox().await?;
        let state = sandbox
            .commands()
            .interrupt(exec_id, grace)
            .await
            .map_err(|e| to_py(&e))?;
        serde_json::to_value(state).map_err(|e| invalid(e.to_string()))
    }

    /// The sandbox's shell sessions.
    pub async fn sessions(&self) -> PyResult<serde_json::Value> {
        let sessions = self
            .sandbox()
            .await?
            .commands()
            .sessions()
            .await
            .map_err(|e| to_py(&e))?;
        serde_json::to_value(sessions).map_err(|e| invalid(e.to_string()))
    }

    /// One file operation, its answer as JSON (bytes for `read`).
    pub async fn file(&self, op: FileOp) -> PyResult<FileAnswer> {
        let sandbox = self.sandbox().await?;
        let files = sandbox.files();
        let json = |value: Result<serde_json::Value, serde_json::Error>| {
            value
                .map(FileAnswer::Json)
                .map_err(|e| invalid(e.to_string()))
        };
        match op {
            FileOp::Read(path) => files
                .read(&path)
                .await
                .map(|data| FileAnswer::Bytes(data.to_vec()))
                .map_err(|e| to_py(&e)),
            FileOp::Write { path, data, mode } => json(serde_json::to_value(
                files
                    .write(&path, data, mode)
                    .await
                    .map_err(|e| to_py(&e))?,
            )),
            FileOp::Stat(path) => json(serde_json::to_value(
                files.stat(&path).await.map_err(|e| to_py(&e))?,
            )),
            FileOp::Exists(path) => json(Ok(serde_json::Value::Bool(
                files.exists(&path).await.map_err(|e| to_py(&e))?,
            ))),
            FileOp::List(path) => json(serde_json::to_value(
                files.list(&path).await.map_err(|e| to_py(&e))?,
            )),
            FileOp::MakeDir { path, mode } => json(serde_json::to_value(
                files.mkdir(&path, mode).await.map_err(|e| to_py(&e))?,
            )),
            FileOp::Remove { path, recursive } => json(Ok(serde_json::Value::from(
                files
                    .remove(&path, recursive)
                    .await
                    .map_err(|e| to_py(&e))?,
            ))),
            FileOp::Upload { host, sandbox } => json(serde_json::to_value(
                files
                    .copy_in(&host, &sandbox)
                    .await
                    .map_err(|e| to_py(&e))?,
            )),
            FileOp::Download { sandbox, host } => json(serde_json::to_value(
                files
                    .copy_out(&sandbox, &host)
                    .await
                    .map_err(|e| to_py(&e))?,
            )),
        }
    }

    /// What the state database recorded of it.
    pub async fn record(&self) -> PyResult<serde_json::Value> {
        let sandbox = self.sandbox().await?;
        serde_json::to_value(sandbox.record()).map_err(|e| invalid(e.to_string()))
    }

    /// Takes a snapshot; answers its report.
    pub async fn snapshot(&self, message: Option<String>) -> PyResult<serde_json::Value> {
        let report = self
            .sandbox()
            .await?
            .snapshots()
            .take(message)
            .await
            .map_err(|e| to_py(&e))?;
        serde_json::to_value(report).map_err(|e| invalid(e.to_string()))
    }

    /// The sandbox's snapshots, oldest first.
    pub fn snapshots(&self) -> PyResult<serde_json::Value> {
        let list = self
            .home
            .silo()?
            .snapshots(Some(&self.id))
            .map_err(|e| to_py(&e))?;
        serde_json::to_value(list).map_err(|e| invalid(e.to_string()))
    }

    /// Puts the sandbox back to `snapshot`; answers the report.
    pub async fn rewind(&self, snapshot: &str) -> PyResult<serde_json::Value> {
        let report = self.sandbox().await?.snapshots().rewind(snapshot).await;
        // Its processes ended and its machine may be another: the kept
        // connection and record are stale either way.
        self.forget();
        let report = report.map_err(|e| to_py(&e))?;
        serde_json::to_value(report).map_err(|e| invalid(e.to_string()))
    }

    /// Stops it; answers whether it was running.
    pub async fn stop(&self) -> PyResult<bool> {
        let stopped = self.home.silo()?.stop(&self.id).await;
        self.forget();
        stopped.map_err(|e| to_py(&e))
    }

    /// What a third-party client needs to talk to its agent (see
    /// docs/protocol.md, "Connecting to a sandbox").
    pub async fn address(&self) -> PyResult<serde_json::Value> {
        let sandbox = self.sandbox().await?;
        let address = sandbox.agent_address().map_err(|e| to_py(&e))?;
        serde_json::to_value(address).map_err(|e| invalid(e.to_string()))
    }
}

/// A file operation.
pub enum FileOp {
    Read(String),
    Write {
        path: String,
        data: Vec<u8>,
        mode: Option<u32>,
    },
    Stat(String),
    Exists(String),
    List(String),
    MakeDir {
        path: String,
        mode: Option<u32>,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Upload {
        host: PathBuf,
        sandbox: String,
    },
    Download {
        sandbox: String,
        host: PathBuf,
    },
}

/// What a file operation answers.
pub enum FileAnswer {
    Bytes(Vec<u8>),
    Json(serde_json::Value),
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
/// one from `pool`; answers its handle and what was done, as JSON.
pub async fn create(
    home: Arc<Home>,
    name: Option<String>,
    spec: SandboxSpec,
    pool: Option<String>,
) -> PyResult<(Arc<SandboxRef>, serde_json::Value)> {
    let silo = home.silo()?;
    let (record, action) = match pool {
        Some(pool) => {
            let name = match name {
                Some(name) => name,
                None => silo::naming::generated_name(0).map_err(|e| to_py(&e))?,
            };
            let outcome = silo
                .up_from_pool(&name, &pool)
                .await
                .map_err(|e| to_py(&e))?;
            let action = serde_json::to_value(outcome.action).unwrap_or_default();
            (outcome.sandbox, action)
        }
        None => {
            let record = silo
                .create(CreateRequest { name, spec })
                .await
                .map_err(|e| to_py(&e))?;
            (record, serde_json::Value::from("created"))
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
) -> PyResult<(Arc<SandboxRef>, serde_json::Value)> {
    let silo = home.silo()?;
    let (sandbox, outcome) = silo
        .up_sandbox(UpRequest {
            name,
            spec,
            recreate,
        })
        .await
        .map_err(|e| to_py(&e))?;
    let outcome = serde_json::to_value(outcome).map_err(|e| invalid(e.to_string()))?;
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

/// Every sandbox of the home, with what its backend says of it now.
pub async fn list(home: &Home) -> PyResult<serde_json::Value> {
    let silo = home.silo()?;
    let records = silo.list().map_err(|e| to_py(&e))?;
    let mut rows = Vec::with_capacity(records.len());
    for record in &records {
        // One at a time: `statuses`' concurrent future is not `Send`, and
        // the asyncio path runs this on the runtime's workers.
        let state = silo.status(record).await;
        let mut row = serde_json::to_value(record).map_err(|e| invalid(e.to_string()))?;
        let state = match state {
            Ok(state) => serde_json::to_value(state).unwrap_or_default(),
            Err(error) => serde_json::Value::from(format!("unknown: {error}")),
        };
        if let Some(object) = row.as_object_mut() {
            object.insert("state".into(), state);
        }
        rows.push(row);
    }
    Ok(serde_json::Value::Array(rows))
}

/// A lifecycle verb on a sandbox by name or id: `kill`, `stop`, `start`, `pause`.
pub async fn lifecycle(home: &Home, verb: &str, name_or_id: &str) -> PyResult<serde_json::Value> {
    let silo = home.silo()?;
    let answer = match verb {
        "kill" => serde_json::to_value(silo.remove(name_or_id).await.map_err(|e| to_py(&e))?),
        "stop" => Ok(serde_json::Value::Bool(
            silo.stop(name_or_id).await.map_err(|e| to_py(&e))?,
        )),
        "pause" => Ok(serde_json::Value::Bool(
            silo.pause(name_or_id).await.map_err(|e| to_py(&e))?,
        )),
        "start" => serde_json::to_value(silo.start(name_or_id).await.map_err(|e| to_py(&e))?),
        other => return Err(invalid(format!("unknown lifecycle verb {other:?}"))),
    };
    answer.map_err(|e| invalid(e.to_string()))
}

/// Makes a sandbox `name` from `snapshot`, on another backend or image when given.
pub async fn fork(
    home: Arc<Home>,
    snapshot: &str,
    name: &str,
    backend: Option<BackendKind>,
    image: Option<String>,
) -> PyResult<(Arc<SandboxRef>, serde_json::Value)> {
    let silo = home.silo()?;
    let target = ForkTarget { backend, image };
    let report = silo
        .fork_to(snapshot, name, &target, &silo::silo::no_progress())
        .await
        .map_err(|e| to_py(&e))?;
    let json = serde_json::to_value(&report).map_err(|e| invalid(e.to_string()))?;
    let sandbox = silo
        .running_sandbox(&report.sandbox.id)
        .await
        .map_err(|e| to_py(&e))?;
    Ok((SandboxRef::new(home, sandbox), json))
}

/// Removes a snapshot (refused while another builds on it).
pub async fn remove_snapshot(home: &Home, id: &str) -> PyResult<serde_json::Value> {
    let removed = home
        .silo()?
        .remove_snapshot(id)
        .await
        .map_err(|e| to_py(&e))?;
    serde_json::to_value(removed).map_err(|e| invalid(e.to_string()))
}

/// Every snapshot of the home (of every sandbox).
pub fn all_snapshots(home: &Home) -> PyResult<serde_json::Value> {
    let list = home.silo()?.snapshots(None).map_err(|e| to_py(&e))?;
    serde_json::to_value(list).map_err(|e| invalid(e.to_string()))
}

/// A pool verb: `create` (with spec and size), `fill`, `remove`, `list`.
pub async fn pool(
    home: &Home,
    verb: &str,
    name: &str,
    spec: Option<SandboxSpec>,
    size: u32,
) -> PyResult<serde_json::Value> {
    let silo = home.silo()?;
    let to_json = |value: Result<serde_json::Value, serde_json::Error>| {
        value.map_err(|e| invalid(e.to_string()))
    };
    match verb {
        "create" => {
            let spec = spec.ok_or_else(|| invalid("a pool needs a spec"))?;
            to_json(serde_json::to_value(
                silo.create_pool(name, spec, size).map_err(|e| to_py(&e))?,
            ))
        }
        "fill" => to_json(serde_json::to_value(
            silo.fill_pool(name).await.map_err(|e| to_py(&e))?,
        )),
        "remove" => Ok(serde_json::Value::from(
            silo.remove_pool(name).await.map_err(|e| to_py(&e))?,
        )),
        "list" => to_json(serde_json::to_value(silo.pools().map_err(|e| to_py(&e))?)),
        other => Err(invalid(format!("unknown pool verb {other:?}"))),
    }
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
) -> PyResult<serde_json::Value> {
    let silo = home.silo()?;
    let mut resolved = Vec::with_capacity(targets.len());
    for (name_or_id, files) in targets {
        resolved.push((silo.get(&name_or_id).map_err(|e| to_py(&e))?, files));
    }
    let mut options = PushOptions::default();
    if let Some(concurrency) = concurrency {
        options.concurrency = concurrency;
    }
    let report = silo
        .push_to_sandboxes(mount, resolved, &options)
        .await
        .map_err(|e| to_py(&e))?;
    serde_json::to_value(report).map_err(|e| invalid(e.to_string()))
}

/// An execution's event in the shape the native module hands out.
pub enum Step {
    Output {
        stderr: bool,
        offset: u64,
        data: Vec<u8>,
    },
    Lost {
        offset: u64,
        bytes: u64,
    },
    Exit(serde_json::Value),
}

/// The next event of an execution; `None` after its exit.
pub async fn next_step(execution: &mut Execution) -> PyResult<Option<Step>> {
    let event = execution.next().await.map_err(|e| to_py(&e))?;
    Ok(event.map(|event| match event {
        Event::Output {
            channel,
            offset,
            data,
        } => Step::Output {
            stderr: channel == silo::silo_protocol::exec::Channel::Stderr,
            offset,
            data,
        },
        Event::Lost { offset, bytes } => Step::Lost { offset, bytes },
        Event::Exit(exit) => Step::Exit(serde_json::to_value(exit).unwrap_or_default()),
    }))
}
