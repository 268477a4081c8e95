//! The tokio runtime calls run on, and the two ways a call waits for it:
//! blocking (the sync classes) or resolving an asyncio future (the async
//! classes).
//!
//! One runtime per process id, made on first use: a child of `os.fork()`
//! inherits the parent's memory but none of its threads, so the parent's
//! runtime would wait for ever on workers that do not exist there. The child
//! makes its own and never touches (nor drops) the parent's.
//!
//! A blocking call gives up the GIL while it waits, so other Python threads
//! run. A call that waits on a command also looks for pending signals every
//! [`SIGNAL_POLL`], so Ctrl-C raises `KeyboardInterrupt` in the middle of a
//! wait, as it does in any Python wait; lifecycle calls (create, snapshot,
//! rewind) are not cut in half and the interrupt is raised once they return.

use std::future::Future;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tokio::runtime::Runtime;

/// Worker threads of the runtime: the async classes' calls and the
/// connections' background tasks run on them (a blocking call runs its
/// own future on the caller's thread).
const WORKER_THREADS: usize = 2;
/// How often a blocking wait on a command looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// What a finished call hands back to Python, made once the GIL is held.
pub type Answer = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// Whether a blocking wait gives way to a pending Ctrl-C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signals {
    /// Raise `KeyboardInterrupt` as soon as it is pending (the future is dropped).
    Interrupt,
    /// Finish first; Python raises it right after the call returns.
    Defer,
}

struct PidRuntime {
    pid: u32,
    runtime: Runtime,
}

/// The runtime of this process, published once per pid and never freed.
static RUNTIME: AtomicPtr<PidRuntime> = AtomicPtr::new(std::ptr::null_mut());

/// This process's runtime, made on first use (again after a fork).
pub fn runtime() -> PyResult<&'static Runtime> {
    let pid = std::process::id();
    loop {
        let current = RUNTIME.load(Ordering::Acquire);
        // SAFETY: a non-null pointer in RUNTIME came from `Box::leak` below
        // and is never freed, so it is valid for 'static.
        if let Some(published) = unsafe { current.as_ref() }
            && published.pid == pid
        {
            return Ok(&published.runtime);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKER_THREADS)
            .thread_name("silo-python")
            .enable_all()
            .build()
            .map_err(|e| {
                crate::errors::SiloException::new_err(format!("cannot start a tokio runtime: {e}"))
            })?;
        let made = Box::into_raw(Box::new(PidRuntime { pid, runtime }));
        match RUNTIME.compare_exchange(current, made, Ordering::AcqRel, Ordering::Acquire) {
            // The one replaced belonged to the parent process (or is null):
            // leaked on purpose, its threads do not exist here.
            // SAFETY: `made` was just published and is never freed.
            Ok(_) => return Ok(unsafe { &(*made).runtime }),
            Err(_) => {
                // Another thread of this process published one first; ours
                // was never seen by anyone, so it is dropped here (outside
                // any runtime, as dropping one requires).
                // SAFETY: `made` came from `Box::into_raw` above and was not published.
                drop(unsafe { Box::from_raw(made) });
            }
        }
    }
}

/// Runs `work` to its end: blocking (GIL released) when `aio` is `None`,
/// else spawned, resolving the asyncio future `aio` names and answering
/// `None` at once. `aio` is `(loop, future, resolve)`: `resolve(future, ok,
/// value)` is called on the loop's thread.
pub fn dispatch<F>(
    py: Python<'_>,
    aio: Option<Bound<'_, PyTuple>>,
    signals: Signals,
    work: F,
) -> PyResult<Py<PyAny>>
where
    F: Future<Output = PyResult<Answer>> + Send + 'static,
{
    let runtime = runtime()?;
    let Some(aio) = aio else {
        let answer = py.detach(|| block_on(runtime, signals, work))?;
        return answer(py);
    };
    let (event_loop, future, resolve): (Py<PyAny>, Py<PyAny>, Py<PyAny>) = aio.extract()?;
    runtime.spawn(async move {
        let outcome = work.await;
        Python::attach(|py| {
            let (ok, value) = match outcome.and_then(|answer| answer(py)) {
                Ok(value) => (true, value),
                Err(error) => (false, error.into_value(py).into_any()),
            };
            // A closed loop has nobody waiting for the answer.
            let _ =
                event_loop.call_method1(py, "call_soon_threadsafe", (resolve, future, ok, value));
        });
    });
    Ok(py.None())
}

/// Blocks on `work` on the calling thread (which must not hold the GIL).
///
/// The calling thread may be one of the runtime's own: an output callback
/// (`on_stdout`) runs there, and may make a blocking call of its own. Such
/// a thread hands its other tasks to the runtime's other workers while it
/// waits (`block_in_place`), instead of panicking as a nested runtime
/// would.
pub fn block_on<T, F>(runtime: &Runtime, signals: Signals, work: F) -> PyResult<T>
where
    F: Future<Output = PyResult<T>>,
{
    let work = async {
        match signals {
            Signals::Defer => work.await,
            Signals::Interrupt => {
                tokio::select! {
                    biased;
                    done = work => done,
                    error = pending_signal() => Err(error),
                }
            }
        }
    };
    if tokio::runtime::Handle::try_current().is_ok() {
        return tokio::task::block_in_place(|| runtime.handle().block_on(work));
    }
    runtime.block_on(work)
}

/// Resolves with the exception a pending signal raised (KeyboardInterrupt
/// for Ctrl-C). Python runs signal handlers on the main thread only, so on
/// any other thread this never resolves.
async fn pending_signal() -> PyErr {
    loop {
        tokio::time::sleep(SIGNAL_POLL).await;
        if let Err(error) = Python::attach(|py| py.check_signals()) {
            return error;
        }
    }
}

/// An answer made by converting `value`.
pub fn value<T>(value: T) -> Answer
where
    T: for<'py> IntoPyObject<'py> + Send + 'static,
{
    Box::new(move |py| value.into_py_any(py))
}

/// An answer of JSON data, as `json.loads` makes it (dicts, lists, str,
/// int, float, bool, None).
pub fn json<T: serde::Serialize>(data: &T) -> PyResult<Answer> {
    let text = serde_json::to_string(data).map_err(|e| {
        crate::errors::SiloException::new_err(format!("unserialisable answer: {e}"))
    })?;
    Ok(Box::new(move |py| {
        let loads = py.import("json")?.getattr("loads")?;
        Ok(loads.call1((text,))?.unbind())
    }))
}
