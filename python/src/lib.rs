//! `silo_sandbox._native`: the `silo` library as a Python extension module.
//!
//! This is the private half of the `silo_sandbox` package. It answers plain
//! values (bytes, tuples, JSON data) and raises the package's exception
//! classes; the pure-Python half in front of it gives them E2B's names,
//! types, docstrings and the async classes. Every call takes an optional
//! last argument `aio`, an asyncio `(loop, future, resolve)` triple: without
//! it the call blocks (the GIL released), with it the call returns at once
//! and resolves the future from the runtime.
//!
//! # Layout
//! - `bind`: every call into the `silo` library (the one module to adapt when
//!   its surface moves), and the per-process handles that make a forked
//!   child safe.
//! - `runtime`: the tokio runtime per process id, blocking and asyncio waits,
//!   Ctrl-C during a wait.
//! - `errors`: the exception hierarchy and the mapping onto it.
//! - `sandbox`: the `Sandbox` class (commands, files, snapshots).
//! - `process`: the `Process` class (one command: events, wait, interrupt).

mod bind;
mod errors;
mod process;
mod runtime;
mod sandbox;

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::bind::PushEntry;
use crate::errors::invalid;
use crate::runtime::{Answer, Signals};
use crate::sandbox::Sandbox;

/// One silo home (`$SILO_HOME`), shared with the `silo` command.
#[pyclass(frozen, module = "silo_sandbox._native")]
struct Home {
    inner: Arc<bind::Home>,
}

/// A sandbox handle and the JSON data that came with it.
fn with_sandbox(made: (Arc<bind::SandboxRef>, serde_json::Value)) -> PyResult<Answer> {
    let (inner, data) = made;
    let data = runtime::json(&data)?;
    Ok(Box::new(move |py| {
        let sandbox = Py::new(py, Sandbox { inner })?;
        Ok((sandbox, data(py)?).into_pyobject(py)?.into_any().unbind())
    }))
}

/// Sandbox handles with their JSON data, as a list of pairs.
fn with_sandboxes(made: Vec<(Arc<bind::SandboxRef>, serde_json::Value)>) -> PyResult<Answer> {
    let made = made
        .into_iter()
        .map(|(inner, data)| Ok((inner, runtime::json(&data)?)))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Box::new(move |py| {
        let pairs = made
            .into_iter()
            .map(|(inner, data)| {
                let sandbox = Py::new(py, Sandbox { inner })?;
                Ok((sandbox, data(py)?).into_pyobject(py)?.into_any().unbind())
            })
            .collect::<PyResult<Vec<Py<PyAny>>>>()?;
        Ok(pairs.into_pyobject(py)?.into_any().unbind())
    }))
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
    /// warm `pool`; answers `(Sandbox, action)`.
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
            with_sandbox(bind::create(home, name, spec, pool).await?)
        })
    }

    /// Opens the sandbox `name`, or creates it (`silo up`); answers
    /// `(Sandbox, outcome)`.
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
            with_sandbox(bind::up(home, name, spec, recreate).await?)
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

    /// Every sandbox, with its machine's state, as JSON data.
    #[pyo3(signature = (aio=None))]
    fn list(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&bind::list(&home).await?)
        })
    }

    /// Removes a sandbox by name or id; answers its record as JSON data.
    #[pyo3(signature = (name_or_id, aio=None))]
    fn kill(
        &self,
        py: Python<'_>,
        name_or_id: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&bind::kill(&home, &name_or_id).await?)
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

    /// Starts a stopped or paused sandbox; answers what starting did as
    /// JSON data.
    #[pyo3(signature = (name_or_id, aio=None))]
    fn start(
        &self,
        py: Python<'_>,
        name_or_id: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&bind::start(&home, &name_or_id).await?)
        })
    }

    /// Makes sandbox `name` from `snapshot`, on `backend`/`image` when
    /// given; answers `(Sandbox, report)`.
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
            with_sandbox(bind::fork(home, &snapshot, &name, backend, image).await?)
        })
    }

    /// Makes `count` sandboxes `name-1`.. from `snapshot` at once, on
    /// `backend`/`image` when given; answers `[(Sandbox, report)]`.
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
            with_sandboxes(bind::fork_many(home, &snapshot, &name, count, backend, image).await?)
        })
    }

    /// Every snapshot of the home, as JSON data.
    fn snapshots(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        runtime::json(&bind::all_snapshots(&self.inner)?)?(py)
    }

    /// Removes a snapshot; answers it.
    #[pyo3(signature = (snapshot, aio=None))]
    fn remove_snapshot(
        &self,
        py: Python<'_>,
        snapshot: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&bind::remove_snapshot(&home, &snapshot).await?)
        })
    }

    /// Records pool `name` of `size` sandboxes of `spec_json`, or (with
    /// `snapshot`) of forks of it; answers it as JSON data.
    #[pyo3(signature = (name, size, spec_json=None, snapshot=None))]
    fn create_pool(
        &self,
        py: Python<'_>,
        name: &str,
        size: u32,
        spec_json: Option<&str>,
        snapshot: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let spec = spec(spec_json)?;
        runtime::json(&bind::create_pool(&self.inner, name, spec, size, snapshot)?)?(py)
    }

    /// Makes the members pool `name` lacks; answers the report as JSON data.
    #[pyo3(signature = (name, aio=None))]
    fn fill_pool(
        &self,
        py: Python<'_>,
        name: String,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let home = Arc::clone(&self.inner);
        runtime::dispatch(py, aio, Signals::Defer, async move {
            runtime::json(&bind::fill_pool(&home, &name).await?)
        })
    }

    /// Every pool with its ready members, as JSON data.
    fn pools(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        runtime::json(&bind::pools(&self.inner)?)?(py)
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
    /// library's rules, as `silo push` reads one). Answers the report as
    /// JSON data.
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
            runtime::json(&bind::push(&home, &mount, sets, concurrency).await?)
        })
    }
}

/// The module: the classes and the exception hierarchy.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Home>()?;
    module.add_class::<Sandbox>()?;
    module.add_class::<process::Process>()?;
    module.add_class::<sandbox::FileReader>()?;
    module.add_class::<sandbox::DirWatcher>()?;
    module.add("AGENT_TARGET", silo_embedded_agent::TARGET)?;
    runtime::register_stand_down(module)?;
    errors::register(module)
}
