//! `Sandbox`: the native handle on one sandbox, its commands, files and
//! snapshots. Each method takes plain values (an exec spec as JSON, paths,
//! bytes) and an optional asyncio triple (see `runtime::dispatch`), and
//! answers plain values or the result classes of `crate::results`.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use silo::client::{DirWatch, WatchEvent};
use silo::silo_protocol::exec::{StreamOffsets, WindowSize};
use silo::{ExecSpec, FileStream};

use crate::bind::{FileAnswer, FileOp, SandboxRef, Started};
use crate::errors::{Failure, invalid};
use crate::process::{Callbacks, ProcState, Process, seconds};
use crate::results::commands::{ProcessInfo, SessionInfo};
use crate::results::files::{CopyReport, EntryInfo, FilesystemEvent};
use crate::results::sandboxes::{PortUrl, SandboxRecord};
use crate::results::snapshots::{Diff, RewindReport, Snapshot};
use crate::results::{answer, answer_each};
use crate::runtime::{self, Answer, Signals};

/// One sandbox.
#[pyclass(frozen, module = "silo_sandbox._native")]
pub struct Sandbox {
    pub(crate) inner: Arc<SandboxRef>,
}

fn exec_spec(spec_json: &str) -> PyResult<ExecSpec> {
    serde_json::from_str(spec_json).map_err(|e| invalid(format!("bad command: {e}")))
}

#[pymethods]
impl Sandbox {
    /// Its stable id (`sbx-…`).
    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// Its name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Its record (backend, spec, labels): a `SandboxRecord`.
    #[pyo3(signature = (aio=None))]
    fn info(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(sandbox.record().await?, SandboxRecord::of))
        })
    }

    /// Runs a command to its end; answers its `CommandResult`.
    /// Ctrl-C during a blocking run interrupts the command in the sandbox.
    #[pyo3(signature = (spec_json, on_stdout=None, on_stderr=None, aio=None))]
    fn run(
        &self,
        py: Python<'_>,
        spec_json: &str,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let spec = exec_spec(spec_json)?;
        let sandbox = Arc::clone(&self.inner);
        let callbacks = Callbacks::new(on_stdout, on_stderr);
        if aio.is_some() {
            return runtime::dispatch(py, aio, Signals::Defer, async move {
                let execution = match sandbox.start(spec).await? {
                    Started::Running(execution) => *execution,
                    Started::Refused { code, message } => {
                        return Ok(ProcState::refused(code, &message).answer());
                    }
                };
                let id = execution.id();
                let mut state = ProcState::following(execution);
                state.finish(&sandbox, id, &callbacks).await?;
                Ok(state.answer())
            });
        }
        let answer = py.detach(|| -> PyResult<Answer> {
            let runtime = runtime::runtime()?;
            let execution = match runtime::block_on(runtime, Signals::Defer, sandbox.start(spec))? {
                Started::Running(execution) => *execution,
                Started::Refused { code, message } => {
                    return Ok(ProcState::refused(code, &message).answer());
                }
            };
            let process = Process::new(Arc::clone(&sandbox), execution);
            process.wait_blocking(&callbacks)
        })?;
        answer(py)
    }

    /// Starts a command and answers its `Process` without waiting.
    #[pyo3(signature = (spec_json, aio=None))]
    fn spawn(
        &self,
        py: Python<'_>,
        spec_json: &str,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let spec = exec_spec(spec_json)?;
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let execution = sandbox.spawn(spec).await?;
            Ok(process_answer(Process::new(sandbox, execution)))
        })
    }

    /// Follows a command started earlier (by any process) from output
    /// offset `offset` (0: everything the agent still holds), or, with
    /// `streams`, from `(stdout, stderr)` bytes already seen of each.
    #[pyo3(signature = (exec_id, offset=0, streams=None, aio=None))]
    fn attach(
        &self,
        py: Python<'_>,
        exec_id: u64,
        offset: u64,
        streams: Option<(u64, u64)>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let execution = match streams {
                Some((stdout, stderr)) => {
                    let have = StreamOffsets { stdout, stderr };
                    sandbox.attach_streams(exec_id, have).await?
                }
                None => sandbox.attach(exec_id, offset).await?,
            };
            Ok(process_answer(Process::new(sandbox, execution)))
        })
    }

    /// Interrupts a command by id: SIGINT, `grace` seconds, SIGKILL.
    #[pyo3(signature = (exec_id, grace=None, aio=None))]
    fn interrupt(
        &self,
        py: Python<'_>,
        exec_id: u64,
        grace: Option<f64>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let grace = grace.map(seconds).transpose()?;
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.interrupt(exec_id, grace).await?)
        })
    }

    /// The shell sessions: `SessionInfo`s.
    #[pyo3(signature = (aio=None))]
    fn sessions(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer_each(sandbox.sessions().await?, SessionInfo::of))
        })
    }

    /// A regular file's bytes.
    #[pyo3(signature = (path, aio=None))]
    fn read_file(
        &self,
        py: Python<'_>,
        path: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(py, aio, FileOp::Read(path))
    }

    /// A regular file's bytes as they arrive: a `FileReader`.
    #[pyo3(signature = (path, aio=None))]
    fn open_file(
        &self,
        py: Python<'_>,
        path: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let stream = sandbox.read_stream(&path).await?;
            Ok(object(FileReader::new(stream)))
        })
    }

    /// Writes a file atomically, making missing parents; answers its stat.
    #[pyo3(signature = (path, data, mode=None, aio=None))]
    fn write_file(
        &self,
        py: Python<'_>,
        path: String,
        data: Bound<'_, PyBytes>,
        mode: Option<u32>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let data = data.as_bytes().to_vec();
        self.file(py, aio, FileOp::Write { path, data, mode })
    }

    /// What is at `path`, a final symlink described, not followed.
    #[pyo3(signature = (path, aio=None))]
    fn stat(
        &self,
        py: Python<'_>,
        path: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(py, aio, FileOp::Stat(path))
    }

    /// Whether anything is at `path`.
    #[pyo3(signature = (path, aio=None))]
    fn exists(
        &self,
        py: Python<'_>,
        path: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(py, aio, FileOp::Exists(path))
    }

    /// A directory's entries, sorted by name.
    #[pyo3(signature = (path, aio=None))]
    fn list_dir(
        &self,
        py: Python<'_>,
        path: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(py, aio, FileOp::List(path))
    }

    /// Makes a directory and its parents.
    #[pyo3(signature = (path, mode=None, aio=None))]
    fn make_dir(
        &self,
        py: Python<'_>,
        path: String,
        mode: Option<u32>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(py, aio, FileOp::MakeDir { path, mode })
    }

    /// Removes a path (a non-empty directory only when `recursive`);
    /// answers how many paths went.
    #[pyo3(signature = (path, recursive=false, aio=None))]
    fn remove(
        &self,
        py: Python<'_>,
        path: String,
        recursive: bool,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(py, aio, FileOp::Remove { path, recursive })
    }

    /// Moves `path` to `to` in one step; answers the stat of `to`.
    #[pyo3(signature = (path, to, aio=None))]
    fn rename(
        &self,
        py: Python<'_>,
        path: String,
        to: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(py, aio, FileOp::Rename { from: path, to })
    }

    /// Copies host `host` into the sandbox at `path` (`docker cp`'s rules).
    #[pyo3(signature = (host, path, aio=None))]
    fn upload(
        &self,
        py: Python<'_>,
        host: PathBuf,
        path: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(
            py,
            aio,
            FileOp::Upload {
                host,
                sandbox: path,
            },
        )
    }

    /// Copies the sandbox's `path` to host `host` (`docker cp`'s rules).
    #[pyo3(signature = (path, host, aio=None))]
    fn download(
        &self,
        py: Python<'_>,
        path: String,
        host: PathBuf,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        self.file(
            py,
            aio,
            FileOp::Download {
                sandbox: path,
                host,
            },
        )
    }

    /// Watches the directory `path` (its subdirectories too with
    /// `recursive`): a `DirWatcher`.
    #[pyo3(signature = (path, recursive=false, aio=None))]
    fn watch(
        &self,
        py: Python<'_>,
        path: String,
        recursive: bool,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let watch = sandbox.watch(&path, recursive).await?;
            Ok(object(DirWatcher::new(watch)))
        })
    }

    /// Every command the agent holds, running and ended: `ProcessInfo`s.
    #[pyo3(signature = (aio=None))]
    fn commands(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer_each(sandbox.execs().await?, ProcessInfo::of))
        })
    }

    /// Sends bytes to a command's stdin by its id (a PTY's input); `None`
    /// closes it.
    #[pyo3(signature = (exec_id, data, aio=None))]
    fn send_input(
        &self,
        py: Python<'_>,
        exec_id: u64,
        data: Option<Bound<'_, PyBytes>>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let data = data.map(|d| d.as_bytes().to_vec());
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            sandbox.send_input(exec_id, data).await?;
            Ok(runtime::value(()))
        })
    }

    /// Changes a PTY command's window.
    #[pyo3(signature = (exec_id, rows, cols, aio=None))]
    fn resize(
        &self,
        py: Python<'_>,
        exec_id: u64,
        rows: u16,
        cols: u16,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            sandbox.resize(exec_id, WindowSize { rows, cols }).await?;
            Ok(runtime::value(()))
        })
    }

    /// Stops the sandbox `seconds` from now, whatever runs (`None`
    /// clears the deadline); answers the seconds left.
    #[pyo3(signature = (seconds, aio=None))]
    fn set_timeout(
        &self,
        py: Python<'_>,
        seconds: Option<f64>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let after = seconds.map(crate::process::seconds).transpose()?;
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let left = sandbox.set_timeout(after).await?;
            Ok(runtime::value(left.map(|left| left.as_secs_f64())))
        })
    }

    /// The seconds left before the sandbox stops by its deadline; `None`
    /// when none is set.
    #[pyo3(signature = (aio=None))]
    fn timeout(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let left = sandbox.timeout().await?;
            Ok(runtime::value(left.map(|left| left.as_secs_f64())))
        })
    }

    /// Takes a snapshot of its file system; answers the `Snapshot`, with
    /// the report of its taking.
    #[pyo3(signature = (message=None, aio=None))]
    fn snapshot(
        &self,
        py: Python<'_>,
        message: Option<String>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(sandbox.snapshot(message).await?, Snapshot::taken))
        })
    }

    /// Its snapshots, oldest first (a quick read of the state database).
    fn snapshots(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        answer_each(self.inner.snapshots()?, Snapshot::of)(py)
    }

    /// What differs between its files and `snapshot` (its latest when
    /// `None`), path by path: a `Diff`.
    #[pyo3(signature = (snapshot=None, aio=None))]
    fn diff(
        &self,
        py: Python<'_>,
        snapshot: Option<String>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(sandbox.diff(snapshot.as_deref()).await?, Diff::of))
        })
    }

    /// Puts it back to `snapshot`; answers a `RewindReport`.
    #[pyo3(signature = (snapshot, aio=None))]
    fn rewind(
        &self,
        py: Python<'_>,
        snapshot: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(sandbox.rewind(&snapshot).await?, RewindReport::of))
        })
    }

    /// Stops it (files kept); answers whether it was running.
    #[pyo3(signature = (aio=None))]
    fn stop(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(runtime::value(sandbox.stop().await?))
        })
    }

    /// Where `port` inside it is reached from the host, as its backend
    /// routes it: a `PortUrl`.
    #[pyo3(signature = (port, aio=None))]
    fn port_url(
        &self,
        py: Python<'_>,
        port: u16,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(sandbox.port_url(port).await?, PortUrl::of))
        })
    }

    /// Where its agent listens and its key (docs/protocol.md, "Connecting
    /// to a sandbox").
    #[pyo3(signature = (aio=None))]
    fn agent_address(
        &self,
        py: Python<'_>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.address().await?)
        })
    }
}

impl Sandbox {
    /// Runs one file operation: its answer is bytes (a read), an
    /// `EntryInfo` or a list of them, a bool, a count, or a `CopyReport`.
    fn file(
        &self,
        py: Python<'_>,
        aio: Option<Bound<'_, PyTuple>>,
        op: FileOp,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(match sandbox.file(op).await? {
                FileAnswer::Bytes(data) => {
                    Box::new(move |py: Python<'_>| Ok(PyBytes::new(py, &data).into_any().unbind()))
                        as Answer
                }
                FileAnswer::Stat(stat) => answer(stat, EntryInfo::of),
                FileAnswer::Listing(stats) => answer_each(stats, EntryInfo::of),
                FileAnswer::Exists(exists) => runtime::value(exists),
                FileAnswer::Removed(count) => runtime::value(count),
                FileAnswer::Copied(copied) => answer(copied, CopyReport::of),
            })
        })
    }
}

/// A file read as it arrives (`Sandbox.open_file`).
#[pyclass(frozen, module = "silo_sandbox._native")]
pub struct FileReader {
    stream: Arc<tokio::sync::Mutex<FileStream>>,
}

impl FileReader {
    fn new(stream: FileStream) -> Self {
        Self {
            stream: Arc::new(tokio::sync::Mutex::new(stream)),
        }
    }
}

#[pymethods]
impl FileReader {
    /// The next chunk of bytes; `None` at the end of the file.
    #[pyo3(signature = (aio=None))]
    fn next(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let stream = Arc::clone(&self.stream);
        runtime::dispatch(py, aio, Signals::Interrupt, async move {
            let chunk = stream
                .lock()
                .await
                .next_chunk()
                .await
                .map_err(|e| PyErr::from(Failure::of(&e)))?;
            Ok(Box::new(move |py: Python<'_>| {
                Ok(match chunk {
                    Some(data) => PyBytes::new(py, &data).into_any().unbind(),
                    None => py.None(),
                })
            }) as Answer)
        })
    }
}

/// A directory watch (`Sandbox.watch`). Each step is `(events, ended)`:
/// the `FilesystemEvent`s received, and why the watch ended once it has
/// (its directory went away, or the connection to the agent did), else
/// `None`.
#[pyclass(frozen, module = "silo_sandbox._native")]
pub struct DirWatcher {
    watch: Arc<tokio::sync::Mutex<Option<DirWatch>>>,
}

impl DirWatcher {
    fn new(watch: DirWatch) -> Self {
        Self {
            watch: Arc::new(tokio::sync::Mutex::new(Some(watch))),
        }
    }
}

#[pymethods]
impl DirWatcher {
    /// The next step, waiting for it.
    #[pyo3(signature = (aio=None))]
    fn next(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let watch = Arc::clone(&self.watch);
        runtime::dispatch(py, aio, Signals::Interrupt, async move {
            let mut watch = watch.lock().await;
            let step = match watch.as_mut() {
                Some(running) => running.next().await,
                None => None,
            };
            Ok(watch_step(step))
        })
    }

    /// The steps already received, without waiting (none while another
    /// call waits for one).
    fn take(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let mut steps = Vec::new();
        if let Ok(mut watch) = self.watch.try_lock()
            && let Some(running) = watch.as_mut()
        {
            while let Some(step) = running.try_next() {
                steps.push(watch_step(Some(step))(py)?);
            }
        }
        Ok(steps)
    }

    /// Ends the watch on the agent.
    #[pyo3(signature = (aio=None))]
    fn stop(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let watch = Arc::clone(&self.watch);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            if let Some(running) = watch.lock().await.take() {
                // A connection already gone has ended the watch with it.
                let _ = running.stop().await;
            }
            Ok(runtime::value(()))
        })
    }
}

/// A watch's step as Python sees it: `(events, ended)`.
fn watch_step(step: Option<WatchEvent>) -> Answer {
    Box::new(move |py| {
        let (events, ended) = match step {
            None => (Vec::new(), Some(GONE.to_owned())),
            Some(WatchEvent::Ended(reason)) => (Vec::new(), Some(reason)),
            Some(WatchEvent::Changes(events)) => (events, None),
        };
        let events = events
            .iter()
            .map(|event| FilesystemEvent::of(py, event))
            .collect::<PyResult<Vec<_>>>()?;
        (events, ended).into_py_any(py)
    })
}

/// Why a watch ended when its connection did.
const GONE: &str = "the connection to the sandbox's agent was lost";

/// An answer of a new native object.
pub fn object<T>(value: T) -> Answer
where
    T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>> + Send + 'static,
{
    Box::new(move |py| Ok(Py::new(py, value)?.into_any()))
}

fn process_answer(process: Process) -> Answer {
    object(process)
}
