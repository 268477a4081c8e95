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
//!
//! The runtime's threads touch Python (to resolve a future, to call an
//! output callback) only through [`attach`]. A thread that takes the GIL
//! once the interpreter has begun to finalise is ended by Python in the
//! middle of Rust code, which aborts the process; so an `atexit` hook
//! ([`stand_down`]) closes that door first and waits for the threads already
//! inside to leave. After it, what a thread would hand Python is dropped.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
/// How long interpreter exit waits for threads inside Python (an output
/// callback still running) before it goes on without them.
const STAND_DOWN_WAIT: Duration = Duration::from_secs(2);
/// How often that wait looks.
const STAND_DOWN_POLL: Duration = Duration::from_millis(1);

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

/// Set by [`stand_down`]: the interpreter is finishing, and no thread of
/// the runtime may take the GIL any more.
static STOOD_DOWN: AtomicBool = AtomicBool::new(false);
/// Threads inside [`attach`] (or about to take the GIL there), with the pid
/// they were counted in: the high 32 bits are the pid, so a child of
/// `os.fork()` does not wait for its parent's threads.
static INSIDE: AtomicU64 = AtomicU64::new(0);

/// Runs `f` with the GIL, unless the interpreter is finishing (then `None`:
/// what `f` would have handed Python is dropped, nobody is left to take it).
pub fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    let pid = u64::from(std::process::id());
    let _ = INSIDE.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |tally| {
        Some(if tally >> 32 == pid {
            tally + 1
        } else {
            (pid << 32) | 1
        })
    });
    let left = Leave(pid);
    if STOOD_DOWN.load(Ordering::SeqCst) {
        return None;
    }
    let value = Python::attach(f);
    drop(left);
    Some(value)
}

/// Counts a thread out of [`attach`].
struct Leave(u64);

impl Drop for Leave {
    fn drop(&mut self) {
        let pid = self.0;
        let _ = INSIDE.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |tally| {
            (tally >> 32 == pid && tally & u64::from(u32::MAX) > 0).then(|| tally - 1)
        });
    }
}

/// Threads of this process inside [`attach`].
fn inside() -> u64 {
    let tally = INSIDE.load(Ordering::SeqCst);
    if tally >> 32 == u64::from(std::process::id()) {
        tally & u64::from(u32::MAX)
    } else {
        0
    }
}

/// The `atexit` hook: from now on no thread of the runtime takes the GIL;
/// waits (GIL released, so they can finish) for those already inside.
#[pyfunction]
pub fn stand_down(py: Python<'_>) {
    STOOD_DOWN.store(true, Ordering::SeqCst);
    py.detach(|| {
        let began = Instant::now();
        while inside() > 0 && began.elapsed() < STAND_DOWN_WAIT {
            std::thread::sleep(STAND_DOWN_POLL);
        }
    });
}

/// Registers [`stand_down`] with `atexit`.
pub fn register_stand_down(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(stand_down, module)?;
    module
        .py()
        .import("atexit")?
        .call_method1("register", (hook,))?;
    Ok(())
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
        // Run as a task of its own, so a panic in it comes back as an error
        // (the future is resolved) instead of ending this task unresolved.
        let outcome = match tokio::spawn(work).await {
            Ok(outcome) => outcome,
            Err(error) if error.is_panic() => Err(panicked(error.into_panic())),
            Err(error) => Err(crate::errors::SiloException::new_err(format!(
                "the call was cancelled: {error}"
            ))),
        };
        attach(|py| {
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
    // A panic is caught here, on the thread that polls the future, and
    // raised as an error: it never reaches Python as a `PanicException`.
    let caught = if tokio::runtime::Handle::try_current().is_ok() {
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            tokio::task::block_in_place(|| runtime.handle().block_on(work))
        }))
    } else {
        std::panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(work)))
    };
    caught.unwrap_or_else(|payload| Err(panicked(payload)))
}

/// The error a panic in the binding becomes: a `SiloException` naming it a
/// bug, with the panic's message.
fn panicked(payload: Box<dyn std::any::Any + Send>) -> PyErr {
    let message = payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    crate::errors::SiloException::new_err(format!(
        "internal error in silo (a bug; please report it): {message}"
    ))
}

/// Resolves with the exception a pending signal raised (KeyboardInterrupt
/// for Ctrl-C). Python runs signal handlers on the main thread only, so on
/// any other thread this never resolves.
async fn pending_signal() -> PyErr {
    loop {
        tokio::time::sleep(SIGNAL_POLL).await;
        if let Some(Err(error)) = attach(|py| py.check_signals()) {
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
/// int, float, bool, None); serialised before the GIL is taken.
pub fn json<T: serde::Serialize>(data: &T) -> PyResult<Answer> {
    let text = json_text(data)?;
    Ok(Box::new(move |py| Ok(json_loads(py, &text)?.unbind())))
}

/// JSON data as Python objects, as [`json`] makes them: for a free-form
/// field of a result (a spec, a whole report).
pub fn json_object<'py, T: serde::Serialize>(
    py: Python<'py>,
    data: &T,
) -> PyResult<Bound<'py, PyAny>> {
    json_loads(py, &json_text(data)?)
}

fn json_text<T: serde::Serialize>(data: &T) -> PyResult<String> {
    serde_json::to_string(data)
        .map_err(|e| crate::errors::SiloException::new_err(format!("unserialisable answer: {e}")))
}

/// The one way JSON data becomes Python objects: Python's own `json.loads`.
fn json_loads<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.getattr("loads")?.call1((text,))
}
