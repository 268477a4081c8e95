//! One sandbox of a home: its library handle and kept exec connection
//! (per process id, see the parent module), and the verbs on it.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::{PyErr, PyResult};
use silo::client::{ClientError, DirWatch, ExecConnection};
use silo::silo_protocol::exec::{ExecSummary, StreamOffsets, WindowSize};
use silo::silo_protocol::session::SessionInfo;
use silo::{CommandEvent, Copied, Execution, ExitInfo, FileStat, FileStream, Files};
use silo::{
    DiffReport, ErrorKind, ExecSpec, PortUrl, RestoreReport, SandboxRecord, Snapshot,
    SnapshotReport,
};

use super::{Home, PerPid};
use crate::errors::{Failure, invalid, to_py};

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
    pub(super) fn new(home: Arc<Home>, sandbox: silo::Sandbox) -> Arc<Self> {
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
        self.try_spawn(spec).await?.map_err(|e| to_py(&e))
    }

    /// Starts a command to wait for: a program that cannot be started is
    /// answered as a shell answers it (exit 127 when not found, 126 when not
    /// executable, the reason on stderr), so a list command and a shell line
    /// fail alike, and `check=False` gets a result, not an exception.
    pub async fn start(&self, spec: ExecSpec) -> PyResult<Started> {
        match self.try_spawn(spec).await? {
            Ok(execution) => Ok(Started::Running(Box::new(execution))),
            Err(ClientError::Agent { kind, message }) => match kind {
                ErrorKind::CommandNotFound => Ok(Started::Refused { code: 127, message }),
                ErrorKind::NotExecutable => Ok(Started::Refused { code: 126, message }),
                kind => Err(to_py(&ClientError::Agent { kind, message })),
            },
            Err(error) => Err(to_py(&error)),
        }
    }

    /// Spawns on the kept connection, once more on a new one when the kept
    /// one turned out dead; the outer error is the sandbox's, the inner the
    /// spawn's.
    async fn try_spawn(&self, spec: ExecSpec) -> PyResult<Result<Execution, ClientError>> {
        let (connection, kept) = self.connection().await?;
        let sandbox = self.sandbox().await?;
        match sandbox.commands().spawn_on(connection, spec.clone()).await {
            Err(error) if kept && went_away(&error) => {
                self.forget();
                let (connection, _) = self.connection().await?;
                let sandbox = self.sandbox().await?;
                Ok(sandbox.commands().spawn_on(connection, spec).await)
            }
            spawned => Ok(spawned),
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

    /// Follows a command from where each stream stands for the caller.
    pub async fn attach_streams(&self, exec_id: u64, have: StreamOffsets) -> PyResult<Execution> {
        let sandbox = self.sandbox().await?;
        sandbox
            .commands()
            .attach_streams(exec_id, have)
            .await
            .map_err(|e| to_py(&e))
    }

    /// Runs `call` on the kept exec connection; once more on a fresh one
    /// when the kept one turns out closed.
    async fn on_connection<T, F, Fut>(&self, call: F) -> PyResult<T>
    where
        F: Fn(ExecConnection) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let (connection, kept) = self.connection().await?;
        match call(connection).await {
            Err(error) if kept && went_away(&error) => {
                self.forget();
                let (connection, _) = self.connection().await?;
                call(connection).await.map_err(|e| to_py(&e))
            }
            done => done.map_err(|e| to_py(&e)),
        }
    }

    /// Every command the agent holds, by id.
    pub async fn execs(&self) -> PyResult<Vec<ExecSummary>> {
        self.on_connection(|connection| async move { connection.list().await })
            .await
    }

    /// Sends bytes to a command's stdin by its id; `None` closes it.
    pub async fn send_input(&self, exec_id: u64, data: Option<Vec<u8>>) -> PyResult<()> {
        self.on_connection(|connection| {
            let data = data.clone();
            async move {
                match data {
                    Some(data) => connection.write_stdin(exec_id, &data).await,
                    None => connection.close_stdin(exec_id).await,
                }
            }
        })
        .await
    }

    /// Changes a PTY command's window by its id.
    pub async fn resize(&self, exec_id: u64, window: WindowSize) -> PyResult<()> {
        self.on_connection(|connection| async move { connection.resize(exec_id, window).await })
            .await
    }

    /// Sets (or, with `None`, clears) the lifetime deadline; answers the
    /// time left.
    pub async fn set_timeout(&self, after: Option<Duration>) -> PyResult<Option<Duration>> {
        let sandbox = self.sandbox().await?;
        sandbox.set_timeout(after).await.map_err(|e| to_py(&e))
    }

    /// The time left before the lifetime deadline, if one is set.
    pub async fn timeout(&self) -> PyResult<Option<Duration>> {
        let sandbox = self.sandbox().await?;
        sandbox.timeout().await.map_err(|e| to_py(&e))
    }

    /// Watches a directory on a connection of its own.
    pub async fn watch(&self, path: &str, recursive: bool) -> PyResult<DirWatch> {
        let sandbox = self.sandbox().await?;
        match sandbox.files().watch(path, recursive).await {
            Ok(watch) => Ok(watch),
            Err(error) => Err(self.file_failure(&sandbox, Failure::of(&error)).await),
        }
    }

    /// A file's bytes as they arrive.
    pub async fn read_stream(&self, path: &str) -> PyResult<FileStream> {
        let sandbox = self.sandbox().await?;
        match sandbox.files().read_stream(path).await {
            Ok(stream) => Ok(stream),
            Err(error) => Err(self.file_failure(&sandbox, Failure::of(&error)).await),
        }
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
    pub async fn sessions(&self) -> PyResult<Vec<SessionInfo>> {
        self.sandbox()
            .await?
            .commands()
            .sessions()
            .await
            .map_err(|e| to_py(&e))
    }

    /// One file operation and its answer. When the agent cannot be
    /// reached, the error says why when the sandbox is down (removed,
    /// stopped, its machine gone).
    pub async fn file(&self, op: FileOp) -> PyResult<FileAnswer> {
        let sandbox = self.sandbox().await?;
        match file_op(sandbox.files(), op).await {
            Ok(answer) => Ok(answer),
            Err(failure) => Err(self.file_failure(&sandbox, failure).await),
        }
    }

    /// A failed file call as Python sees it: when the agent could not be
    /// reached, why, if the sandbox is down (removed, stopped, its
    /// machine gone).
    async fn file_failure(&self, sandbox: &silo::Sandbox, failure: Failure) -> PyErr {
        if !failure.is_unreachable() {
            return failure.into();
        }
        self.forget();
        match sandbox.down().await {
            Some(why) => to_py(&why),
            None => failure.into(),
        }
    }

    /// What the state database recorded of it.
    pub async fn record(&self) -> PyResult<SandboxRecord> {
        Ok(self.sandbox().await?.record().clone())
    }

    /// Takes a snapshot; answers its report.
    pub async fn snapshot(&self, message: Option<String>) -> PyResult<SnapshotReport> {
        self.sandbox()
            .await?
            .snapshots()
            .take(message)
            .await
            .map_err(|e| to_py(&e))
    }

    /// The sandbox's snapshots, oldest first.
    pub fn snapshots(&self) -> PyResult<Vec<Snapshot>> {
        self.home
            .silo()?
            .snapshots(Some(&self.id))
            .map_err(|e| to_py(&e))
    }

    /// What differs between its live tree and `snapshot` (its latest when
    /// `None`); answers the report.
    pub async fn diff(&self, snapshot: Option<&str>) -> PyResult<DiffReport> {
        let report = self.sandbox().await?.snapshots().diff(snapshot).await;
        report.map_err(|e| to_py(&e))
    }

    /// Puts the sandbox back to `snapshot`; answers the report.
    pub async fn rewind(&self, snapshot: &str) -> PyResult<RestoreReport> {
        let report = self.sandbox().await?.snapshots().rewind(snapshot).await;
        // Its processes ended and its machine may be another: the kept
        // connection and record are stale either way.
        self.forget();
        report.map_err(|e| to_py(&e))
    }

    /// Stops it; answers whether it was running.
    pub async fn stop(&self) -> PyResult<bool> {
        let stopped = self.home.silo()?.stop(&self.id).await;
        self.forget();
        stopped.map_err(|e| to_py(&e))
    }

    /// Where `port` inside it is reached from the host: `host`, `url` and
    /// the `headers` a client must send.
    pub async fn port_url(&self, port: u16) -> PyResult<PortUrl> {
        let sandbox = self.sandbox().await?;
        sandbox.port_url(port).await.map_err(|e| to_py(&e))
    }

    /// What a third-party client needs to talk to its agent (see
    /// docs/protocol.md, "Connecting to a sandbox").
    pub async fn address(&self) -> PyResult<serde_json::Value> {
        let sandbox = self.sandbox().await?;
        let address = sandbox.agent_address().map_err(|e| to_py(&e))?;
        serde_json::to_value(address).map_err(|e| invalid(e.to_string()))
    }
}

/// Whether a request on the kept connection failed because that
/// connection is gone (the agent restarted, a rewind in another process),
/// so a fresh one is worth one more try.
fn went_away(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Disconnected | ClientError::Http(_) | ClientError::Handshake(_)
    )
}

/// A command [`SandboxRef::start`] started, or the exit a shell would
/// have given a program that could not be.
pub enum Started {
    /// Running.
    Running(Box<Execution>),
    /// Not started.
    Refused {
        /// The shell's exit code for it (127 or 126).
        code: i32,
        /// Why, for stderr.
        message: String,
    },
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
    Rename {
        from: String,
        to: String,
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
    /// A file's contents.
    Bytes(Vec<u8>),
    /// One path described (stat, write, mkdir, rename).
    Stat(FileStat),
    /// A directory's entries.
    Listing(Vec<FileStat>),
    /// Whether anything is at a path.
    Exists(bool),
    /// Paths removed.
    Removed(u64),
    /// What a copy moved.
    Copied(Copied),
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
    Exit(ExitInfo),
}

/// The next event of an execution; `None` after its exit.
pub async fn next_step(execution: &mut Execution) -> PyResult<Option<Step>> {
    let event = execution.next().await.map_err(|e| to_py(&e))?;
    Ok(event.map(|event| match event {
        CommandEvent::Output {
            channel,
            offset,
            data,
        } => Step::Output {
            stderr: channel == silo::silo_protocol::exec::Channel::Stderr,
            offset,
            data,
        },
        CommandEvent::Lost { offset, bytes } => Step::Lost { offset, bytes },
        CommandEvent::Exit(exit) => Step::Exit(exit),
    }))
}

/// Sends bytes to an execution's stdin.
pub async fn write_stdin(execution: &Execution, data: &[u8]) -> PyResult<()> {
    execution.write_stdin(data).await.map_err(|e| to_py(&e))
}

/// Closes an execution's stdin.
pub async fn close_stdin(execution: &Execution) -> PyResult<()> {
    execution.close_stdin().await.map_err(|e| to_py(&e))
}

/// Runs one file operation.
async fn file_op(files: &Files, op: FileOp) -> Result<FileAnswer, Failure> {
    let failed = |error: &(dyn std::error::Error + 'static)| Failure::of(error);
    let answer = match op {
        FileOp::Read(path) => {
            FileAnswer::Bytes(files.read(&path).await.map_err(|e| failed(&e))?.to_vec())
        }
        FileOp::Write { path, data, mode } => FileAnswer::Stat(
            files
                .write(&path, data, mode)
                .await
                .map_err(|e| failed(&e))?,
        ),
        FileOp::Stat(path) => FileAnswer::Stat(files.stat(&path).await.map_err(|e| failed(&e))?),
        FileOp::Exists(path) => {
            FileAnswer::Exists(files.exists(&path).await.map_err(|e| failed(&e))?)
        }
        FileOp::List(path) => FileAnswer::Listing(files.list(&path).await.map_err(|e| failed(&e))?),
        FileOp::MakeDir { path, mode } => {
            FileAnswer::Stat(files.mkdir(&path, mode).await.map_err(|e| failed(&e))?)
        }
        FileOp::Remove { path, recursive } => FileAnswer::Removed(
            files
                .remove(&path, recursive)
                .await
                .map_err(|e| failed(&e))?,
        ),
        FileOp::Rename { from, to } => {
            FileAnswer::Stat(files.rename(&from, &to).await.map_err(|e| failed(&e))?)
        }
        FileOp::Upload { host, sandbox } => FileAnswer::Copied(
            files
                .copy_in(&host, &sandbox)
                .await
                .map_err(|e| failed(&e))?,
        ),
        FileOp::Download { sandbox, host } => FileAnswer::Copied(
            files
                .copy_out(&sandbox, &host)
                .await
                .map_err(|e| failed(&e))?,
        ),
    };
    Ok(answer)
}
