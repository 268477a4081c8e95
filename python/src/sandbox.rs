//! `Sandbox`: the native handle on one sandbox, its commands, files and
//! snapshots. Each method takes plain values (an exec spec as JSON, paths,
//! bytes) and an optional asyncio triple; see `runtime::dispatch`.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use silo::ExecSpec;

use crate::bind::{FileAnswer, FileOp, SandboxRef, Started};
use crate::errors::invalid;
use crate::process::{Callbacks, ProcState, Process, seconds};
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

    /// Its record (backend, spec, labels), as JSON data.
    #[pyo3(signature = (aio=None))]
    fn info(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.record().await?)
        })
    }

    /// Runs a command to its end; answers `(stdout, stderr, lost, exit)`.
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
    /// offset `offset` (0: everything the agent still holds).
    #[pyo3(signature = (exec_id, offset=0, aio=None))]
    fn attach(
        &self,
        py: Python<'_>,
        exec_id: u64,
        offset: u64,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let execution = sandbox.attach(exec_id, offset).await?;
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

    /// The shell sessions, as JSON data.
    #[pyo3(signature = (aio=None))]
    fn sessions(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.sessions().await?)
        })
    }

    /// One file operation: `read`, `write`, `stat`, `exists`, `list`,
    /// `make_dir`, `remove`, `upload` (host `other` into `path`) or
    /// `download` (`path` to host `other`).
    #[pyo3(signature = (op, path, data=None, mode=None, recursive=false, other=None, aio=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "one entry point for every file verb"
    )]
    fn file(
        &self,
        py: Python<'_>,
        op: &str,
        path: String,
        data: Option<Bound<'_, PyBytes>>,
        mode: Option<u32>,
        recursive: bool,
        other: Option<PathBuf>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let host = || {
            other
                .clone()
                .ok_or_else(|| invalid(format!("{op} needs a host path")))
        };
        let op = match op {
            "read" => FileOp::Read(path),
            "write" => FileOp::Write {
                path,
                data: data.map(|d| d.as_bytes().to_vec()).unwrap_or_default(),
                mode,
            },
            "stat" => FileOp::Stat(path),
            "exists" => FileOp::Exists(path),
            "list" => FileOp::List(path),
            "make_dir" => FileOp::MakeDir { path, mode },
            "remove" => FileOp::Remove { path, recursive },
            "upload" => FileOp::Upload {
                host: host()?,
                sandbox: path,
            },
            "download" => FileOp::Download {
                sandbox: path,
                host: host()?,
            },
            other => return Err(invalid(format!("unknown file operation {other:?}"))),
        };
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            match sandbox.file(op).await? {
                FileAnswer::Bytes(data) => Ok(Box::new(move |py: Python<'_>| {
                    Ok(PyBytes::new(py, &data).into_any().unbind())
                }) as Answer),
                FileAnswer::Json(value) => runtime::json(&value),
            }
        })
    }

    /// Takes a snapshot of its file system; answers the report.
    #[pyo3(signature = (message=None, aio=None))]
    fn snapshot(
        &self,
        py: Python<'_>,
        message: Option<String>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.snapshot(message).await?)
        })
    }

    /// Its snapshots, oldest first (a quick read of the state database).
    fn snapshots(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        runtime::json(&self.inner.snapshots()?)?(py)
    }

    /// What differs between its files and `snapshot` (its latest when
    /// `None`), path by path; answers the report.
    #[pyo3(signature = (snapshot=None, aio=None))]
    fn diff(
        &self,
        py: Python<'_>,
        snapshot: Option<String>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.diff(snapshot.as_deref()).await?)
        })
    }

    /// Puts it back to `snapshot`; answers the report.
    #[pyo3(signature = (snapshot, aio=None))]
    fn rewind(
        &self,
        py: Python<'_>,
        snapshot: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.rewind(&snapshot).await?)
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

    /// Where `port` inside it is reached from the host (`host`, `url`,
    /// `headers`), as its backend routes it.
    #[pyo3(signature = (port, aio=None))]
    fn port_url(
        &self,
        py: Python<'_>,
        port: u16,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&sandbox.port_url(port).await?)
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
