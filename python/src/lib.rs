//! `silo_sandbox._native`: the `silo` library as a Python extension module.
//!
//! This is the private half of the `silo_sandbox` package. It answers plain
//! values and the package's result classes (frozen, made here from the
//! library's reports) and raises its exception classes; the pure-Python
//! half in front of it gives E2B's names, the arguments' checks, docstrings
//! and the async classes. Every call takes an optional last argument `aio`,
//! an asyncio `(loop, future, resolve)` triple: without it the call blocks
//! (the GIL released), with it the call returns at once and resolves the
//! future from the runtime.
//!
//! # Layout
//! - `bind`: every call into the `silo` library (the one module to adapt when
//!   its surface moves), and the per-process handles that make a forked
//!   child safe.
//! - `runtime`: the tokio runtime per process id, blocking and asyncio waits,
//!   Ctrl-C during a wait.
//! - `errors`: the exception hierarchy and the mapping onto it.
//! - `results`: the result classes (`CommandResult`, `EntryInfo`, ...),
//!   each made from the library's own report.
//! - `sandbox`: the `Sandbox` class (commands, files, snapshots).
//! - `process`: the `Process` class (one command: events, wait, interrupt).

mod bind;
mod errors;
mod process;
mod results;
mod runtime;
mod sandbox;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::bind::PushEntry;
use crate::errors::invalid;
use crate::results::pools::{FillReport, PoolInfo};
use crate::results::push::PushReport;
use crate::results::sandboxes::{ForkReport, OpenReport, SandboxInfo, SandboxRecord, action_name};
use crate::results::snapshots::Snapshot;
use crate::results::{answer, answer_each};
use crate::runtime::{Answer, Signals};
use crate::sandbox::Sandbox;

/// One silo home (`$SILO_HOME`), shared with the `silo` command.
#[pyclass(frozen, module = "silo_sandbox._native")]
struct Home {
    inner: Arc<bind::Home>,
}

/// A sandbox handle and the result `make` builds of what came with it.
fn with_sandbox<T: Send + 'static, R: for<'py> IntoPyObject<'py> + 'static>(
    (inner, made): (Arc<bind::SandboxRef>, T),
    make: fn(Python<'_>, &T) -> PyResult<R>,
) -> Answer {
    Box::new(move |py| {
        let sandbox = Py::new(py, Sandbox { inner })?;
        (sandbox, make(py, &made)?).into_py_any(py)
    })
}

/// Sandbox handles with the results `make` builds, as a list of pairs.
fn with_sandboxes<T: Send + 'static, R: for<'py> IntoPyObject<'py> + 'static>(
    made: Vec<(Arc<bind::SandboxRef>, T)>,
    make: fn(Python<'_>, &T) -> PyResult<R>,
) -> Answer {
    Box::new(move |py| {
        let pairs = made
            .into_iter()
            .map(|(inner, made)| Ok((Py::new(py, Sandbox { inner })?, make(py, &made)?)))
            .collect::<PyResult<Vec<_>>>()?;
        pairs.into_py_any(py)
    })
}

fn spec(spec_json: Option<&str>) -> PyResult<Option<silo::SandboxSpec>> {
    spec_json.map(bind::spec_from_json).transpose()
}

#[pymethods]
impl Home {
    /// The home at `path`, else `$SILO_HOME`, else `~/.local/share/silo`.
    #[new]
    #[pyo3(signature = (path=None))]
    fn new(path: Option<PathBuf>) -> Self {
        Self {
            inner: bind::Home::new(path),
        }
    }

    /// Its directory (opening it, and making it on first use).
    fn root(&self) -> PyResult<PathBuf> {
        self.inner.root()
    }

    /// Creates a sandbox (a taken name is an error), or takes one from a
    /// warm `pool`; answers `(Sandbox, action)`, the action `created` or
    /// `claimed`.
    #[pyo3(signature = (name=None, spec_json=None, pool=None, aio=None))]
    fn create(
        &self,
        py: Python<'_>,
        name: Option<String>,
        spec_json: Option<&str>,
        pool: Option<String>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let spec = spec(spec_json)?.unwrap_or_default();
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let (inner, action) = bind::create(home, name, spec, pool).await?;
            Ok(with_sandbox((inner, action), |_, action| {
                Ok(action_name(*action))
            }))
        })
    }

    /// Opens the sandbox `name`, or creates it (`silo up`); answers
    /// `(Sandbox, OpenReport)`.
    #[pyo3(signature = (name, spec_json=None, recreate=false, aio=None))]
    fn up(
        &self,
        py: Python<'_>,
        name: String,
        spec_json: Option<&str>,
        recreate: bool,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let spec = spec(spec_json)?;
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let begun = Instant::now();
            let (inner, outcome) = bind::up(home, name, spec, recreate).await?;
            let ms = begun.elapsed().as_secs_f64() * 1000.0;
            Ok(with_sandbox((inner, (outcome, ms)), OpenReport::of))
        })
    }

    /// A handle on an existing sandbox; started first when stopped if `start`.
    #[pyo3(signature = (name_or_id, start=true, aio=None))]
    fn connect(
        &self,
        py: Python<'_>,
        name_or_id: String,
        start: bool,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let inner = bind::connect(home, &name_or_id, start).await?;
            Ok(sandbox::object(Sandbox { inner }))
        })
    }

    /// Every sandbox, with its machine's state: `SandboxInfo`s.
    #[pyo3(signature = (aio=None))]
    fn list(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer_each(bind::list(&home).await?, SandboxInfo::of))
        })
    }

    /// Removes a sandbox by name or id; answers its `SandboxRecord`.
    #[pyo3(signature = (name_or_id, aio=None))]
    fn kill(
        &self,
        py: Python<'_>,
        name_or_id: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(
                bind::kill(&home, &name_or_id).await?,
                SandboxRecord::of,
            ))
        })
    }

    /// Pauses a sandbox with its memory (e2b); answers whether it ran.
    #[pyo3(signature = (name_or_id, aio=None))]
    fn pause(
        &self,
        py: Python<'_>,
        name_or_id: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(runtime::value(bind::pause(&home, &name_or_id).await?))
        })
    }

    /// Starts a stopped or paused sandbox; answers whether it was running
    /// already.
    #[pyo3(signature = (name_or_id, aio=None))]
    fn start(
        &self,
        py: Python<'_>,
        name_or_id: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(runtime::value(bind::start(&home, &name_or_id).await?))
        })
    }

    /// Makes sandbox `name` from `snapshot`, on `backend`/`image` when
    /// given; answers `(Sandbox, ForkReport)`.
    #[pyo3(signature = (snapshot, name, backend=None, image=None, aio=None))]
    fn fork(
        &self,
        py: Python<'_>,
        snapshot: String,
        name: String,
        backend: Option<&str>,
        image: Option<String>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let backend = backend.map(bind::backend).transpose()?;
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let made = bind::fork(home, &snapshot, &name, backend, image).await?;
            Ok(with_sandbox(made, ForkReport::of))
        })
    }

    /// Makes `count` sandboxes `name-1`.. from `snapshot` at once, on
    /// `backend`/`image` when given; answers `[(Sandbox, ForkReport)]`.
    #[pyo3(signature = (snapshot, name, count, backend=None, image=None, aio=None))]
    #[allow(clippy::too_many_arguments, reason = "Python's keyword arguments")]
    fn fork_many(
        &self,
        py: Python<'_>,
        snapshot: String,
        name: String,
        count: u32,
        backend: Option<&str>,
        image: Option<String>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let backend = backend.map(bind::backend).transpose()?;
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let made = bind::fork_many(home, &snapshot, &name, count, backend, image).await?;
            Ok(with_sandboxes(made, ForkReport::of))
        })
    }

    /// Every snapshot of the home: `Snapshot`s.
    fn snapshots(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        answer_each(bind::all_snapshots(&self.inner)?, Snapshot::of)(py)
    }

    /// Removes a snapshot; answers its `Snapshot`.
    #[pyo3(signature = (snapshot, aio=None))]
    fn remove_snapshot(
        &self,
        py: Python<'_>,
        snapshot: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(
                bind::remove_snapshot(&home, &snapshot).await?,
                Snapshot::of,
            ))
        })
    }

    /// Records pool `name` of `size` sandboxes of `spec_json`, or (with
    /// `snapshot`) of forks of it, and (`fill`) makes its members; answers
    /// its `PoolInfo`, with the fill's report.
    #[pyo3(signature = (name, size, spec_json=None, snapshot=None, fill=true, aio=None))]
    #[allow(clippy::too_many_arguments, reason = "Python's keyword arguments")]
    fn create_pool(
        &self,
        py: Python<'_>,
        name: String,
        size: u32,
        spec_json: Option<&str>,
        snapshot: Option<String>,
        fill: bool,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let spec = spec(spec_json)?;
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let made =
                bind::create_pool(&home, &name, spec, size, snapshot.as_deref(), fill).await?;
            Ok(answer(made, PoolInfo::made))
        })
    }

    /// Makes the members pool `name` lacks; answers a `FillReport`.
    #[pyo3(signature = (name, aio=None))]
    fn fill_pool(
        &self,
        py: Python<'_>,
        name: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(bind::fill_pool(&home, &name).await?, FillReport::of))
        })
    }

    /// Every pool with its ready members: `PoolInfo`s.
    fn pools(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        answer_each(bind::pools(&self.inner)?, PoolInfo::of)(py)
    }

    /// Removes pool `name` and its members; answers how many it had.
    #[pyo3(signature = (name, aio=None))]
    fn remove_pool(
        &self,
        py: Python<'_>,
        name: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(runtime::value(bind::remove_pool(&home, &name).await?))
        })
    }

    /// Pushes files to `mount` in each sandbox: `targets` is a list of
    /// `(name_or_id, [(path, kind, payload, executable)])` with kind
    /// `bytes` (payload bytes), `path` (payload a host path), `dir`, or
    /// `tree` (payload a host directory whose whole tree is read by the
    /// library's rules, as `silo push` reads one). Answers a `PushReport`.
    #[pyo3(signature = (mount, targets, concurrency=None, aio=None))]
    #[allow(clippy::type_complexity, reason = "the plain shape Python hands over")]
    fn push(
        &self,
        py: Python<'_>,
        mount: String,
        targets: Vec<(String, Vec<(String, String, Bound<'_, PyAny>, bool)>)>,
        concurrency: Option<usize>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let mut sets = Vec::with_capacity(targets.len());
        for (sandbox, entries) in targets {
            if let [(_, kind, payload, _)] = entries.as_slice()
                && kind == "tree"
            {
                let dir = payload.extract::<PathBuf>()?;
                let set = silo::files_from_dir(&dir).map_err(|e| invalid(e.to_string()))?;
                sets.push((sandbox, set));
                continue;
            }
            let mut converted = Vec::with_capacity(entries.len());
            for (path, kind, payload, executable) in entries {
                let entry = match kind.as_str() {
                    "bytes" => {
                        PushEntry::Bytes(payload.cast::<PyBytes>()?.as_bytes().to_vec(), executable)
                    }
                    "path" => PushEntry::Path(payload.extract::<PathBuf>()?, executable),
                    "dir" => PushEntry::Dir,
                    other => {
                        return Err(invalid(format!("unknown file kind {other:?} for {path}")));
                    }
                };
                converted.push((path, entry));
            }
            sets.push((sandbox, bind::file_set(converted)?));
        }
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            Ok(answer(
                bind::push(&home, &mount, sets, concurrency).await?,
                PushReport::of,
            ))
        })
    }
}

/// The module: the classes, the result classes and the exception hierarchy.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Home>()?;
    module.add_class::<Sandbox>()?;
    module.add_class::<process::Process>()?;
    module.add_class::<sandbox::FileReader>()?;
    module.add_class::<sandbox::DirWatcher>()?;
    results::register(module)?;
    module.add("AGENT_TARGET", silo_embedded_agent::TARGET)?;
    runtime::register_stand_down(module)?;
    errors::register(module)
}
