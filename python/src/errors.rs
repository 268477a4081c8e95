//! The one Python exception hierarchy, and the mapping from the library's
//! errors onto it.
//!
//! Every error that crosses into Python goes through [`to_py`]: it walks the
//! error's source chain for the first cause it can name (a sandbox that does
//! not exist, an agent that cannot be reached, a provider's refusal, ...),
//! and raises that class with the whole chain as its message, as the CLI
//! prints it. Walking the chain instead of matching one enum keeps the
//! mapping right however the library nests its errors.

use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::type_object::PyTypeInfo;
use pyo3::types::{PyDict, PyTuple, PyType};
use silo::ErrorKind;
use silo::client::ClientError;
use silo::spec::Machines;
use silo::{FileError, SiloError, StateError};
use silo_protocol::http::error_chain;

/// Declares every exception class once: the class itself and its line in
/// [`register`]. `_native.pyi` types them and `__init__.py` exports them;
/// a test checks that the three agree.
macro_rules! exceptions {
    ($($name:ident($base:ty): $doc:literal;)*) => {
        $(create_exception!(_native, $name, $base, $doc);)*

        /// Registers every class on the module.
        pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = module.py();
            $(module.add(stringify!($name), py.get_type::<$name>())?;)*
            let timeout = timeout_type(py)?;
            module.add("SiloTimeoutError", timeout.clone_ref(py))?;
            // The old name, for `from silo_sandbox import TimeoutError`;
            // left out of `__all__`, so a star import does not shadow the
            // builtin.
            module.add("TimeoutError", timeout)?;
            Ok(())
        }
    };
}

exceptions! {
    SiloException(PyException): "Every error silo raises.";
    SandboxNotFoundError(SiloException):
        "No sandbox by that name or id, it was removed, or its machine is gone.";
    SandboxNotRunningError(SiloException): "The sandbox exists but is stopped.";
    SpecDriftError(SiloException):
        "The sandbox exists with another spec and was not asked to be recreated.";
    InvalidArgumentError(SiloException):
        "A name, spec, path or option was refused before anything changed.";
    NotFoundError(SiloException):
        "A file, snapshot, pool, session or command that does not exist.";
    ImageNotFoundError(NotFoundError):
        "The image is not on the engine and could not be pulled.";
    CommandExitError(SiloException):
        "A command ended with a non-zero exit code (only `run` without `check=False`).";
    AgentUnreachableError(SiloException):
        "The sandbox's agent cannot be reached, or the connection was lost for good.";
    ProviderError(SiloException):
        "A backend (Docker, Podman, E2B, Daytona, local) refused or failed an operation.";
    BusyError(SiloException): "Another process or command holds the sandbox or session.";
    SnapshotError(SiloException): "A snapshot, rewind or fork cannot be done.";
    PushError(SiloException):
        "A push's bundle cannot be built (a failed target is in the report instead).";
}

/// `SiloTimeoutError`: a command's timeout ended it, or the agent did not
/// answer in time. Both a `SiloException` and a builtin `TimeoutError`, so
/// `except TimeoutError` catches it; made with two bases, which
/// `create_exception!` cannot do.
pub struct SiloTimeoutError;

/// The class, made once per interpreter by [`register`].
static TIMEOUT_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn timeout_type(py: Python<'_>) -> PyResult<Py<PyType>> {
    TIMEOUT_TYPE
        .get_or_try_init(py, || {
            let bases = PyTuple::new(
                py,
                [
                    py.get_type::<SiloException>(),
                    py.get_type::<PyTimeoutError>(),
                ],
            )?;
            let namespace = PyDict::new(py);
            namespace.set_item(
                "__doc__",
                "A command's timeout ended it, or the agent did not answer in time.",
            )?;
            namespace.set_item("__module__", "silo_sandbox._native")?;
            let made = py
                .get_type::<PyType>()
                .call1(("SiloTimeoutError", bases, namespace))?;
            Ok::<_, PyErr>(made.cast_into::<PyType>()?.unbind())
        })
        .map(|made| made.clone_ref(py))
}

// SAFETY: `type_object_raw` returns a type object that lives as long as
// the interpreter (held by `TIMEOUT_TYPE`), as the trait requires.
unsafe impl PyTypeInfo for SiloTimeoutError {
    fn type_object_raw(py: Python<'_>) -> *mut pyo3::ffi::PyTypeObject {
        // Made by `register` when the module was imported; should that have
        // failed, the error is raised as the base class instead.
        match timeout_type(py) {
            Ok(made) => made.as_ptr().cast(),
            Err(_) => py.get_type::<SiloException>().as_type_ptr(),
        }
    }
}

/// Which class an error is, by its first cause that names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    SandboxNotFound,
    NotRunning,
    SpecDrift,
    InvalidArgument,
    NotFound,
    ImageNotFound,
    Timeout,
    Unreachable,
    Provider,
    Busy,
    Snapshot,
    Push,
    Other,
}

/// The Python exception for a library error, its message the whole chain.
pub fn to_py(error: &(dyn std::error::Error + 'static)) -> PyErr {
    Failure::of(error).into()
}

/// A library error sorted into its Python class, without the GIL: what a
/// caller may look at before it becomes an exception.
pub struct Failure {
    class: Class,
    message: String,
}

impl Failure {
    /// Sorts `error` by its first cause that names a class.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Self {
        let message = error_chain(error);
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
        let mut class = Class::Other;
        while let Some(current) = cause {
            class = classify(current);
            if class != Class::Other {
                break;
            }
            cause = current.source();
        }
        Self { class, message }
    }

    /// An argument refused on this side of the boundary.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            class: Class::InvalidArgument,
            message: message.into(),
        }
    }

    /// The agent could not be reached: the sandbox may be down.
    pub fn is_unreachable(&self) -> bool {
        self.class == Class::Unreachable
    }
}

impl From<Failure> for PyErr {
    fn from(failure: Failure) -> Self {
        raise(failure.class, failure.message)
    }
}

/// An argument refused on the Python side of the boundary.
pub fn invalid(message: impl Into<String>) -> PyErr {
    Failure::invalid(message).into()
}

fn raise(class: Class, message: String) -> PyErr {
    match class {
        Class::SandboxNotFound => SandboxNotFoundError::new_err(message),
        Class::NotRunning => SandboxNotRunningError::new_err(message),
        Class::SpecDrift => SpecDriftError::new_err(message),
        Class::InvalidArgument => InvalidArgumentError::new_err(message),
        Class::NotFound => NotFoundError::new_err(message),
        Class::Timeout => PyErr::new::<SiloTimeoutError, _>(message),
        Class::ImageNotFound => ImageNotFoundError::new_err(message),
        Class::Unreachable => AgentUnreachableError::new_err(message),
        Class::Provider => ProviderError::new_err(message),
        Class::Busy => BusyError::new_err(message),
        Class::Snapshot => SnapshotError::new_err(message),
        Class::Push => PushError::new_err(message),
        Class::Other => SiloException::new_err(message),
    }
}

fn classify(error: &(dyn std::error::Error + 'static)) -> Class {
    if let Some(error) = error.downcast_ref::<SiloError>() {
        return match error {
            SiloError::Missing { .. } | SiloError::Removed { .. } => Class::SandboxNotFound,
            SiloError::Replaced { .. } => Class::Unreachable,
            SiloError::NotRunning { .. } => Class::NotRunning,
            SiloError::SpecDrift { .. } => Class::SpecDrift,
            SiloError::Naming(_)
            | SiloError::Spec(_)
            | SiloError::NeedsSpec { .. }
            | SiloError::Pool(_)
            | SiloError::NoPause { .. }
            | SiloError::NoPortRoute(_) => Class::InvalidArgument,
            // Host processes and containers fail for the host's reasons; a
            // provider's VM is a provider refusing, with its hint in the chain.
            _ if error.is_missing_image() => Class::ImageNotFound,
            SiloError::Backend { backend, .. }
                if matches!(backend.machines(), Machines::ProviderVm | Machines::Pod) =>
            {
                Class::Provider
            }
            SiloError::Busy { .. } => Class::Busy,
            SiloError::Snapshot(_) => Class::Snapshot,
            // Transparent: its message is the inner error's, and so is its
            // source, so the walk would never meet the inner error itself.
            SiloError::State(error) => state(error),
            _ => Class::Other,
        };
    }
    if let Some(error) = error.downcast_ref::<StateError>() {
        return state(error);
    }
    // A boxed `#[source]` is seen as the box, not what it holds.
    if let Some(error) = error.downcast_ref::<FileError>() {
        return match error {
            FileError::Refused { kind, .. } => agent_kind(kind),
            // Transparent, as `SiloError::State` is.
            FileError::Client(error) => client(error),
            _ => Class::Other,
        };
    }
    if let Some(error) = error.downcast_ref::<Box<ClientError>>() {
        return client(error);
    }
    if let Some(error) = error.downcast_ref::<ClientError>() {
        return client(error);
    }
    if error.downcast_ref::<silo::PushError>().is_some() {
        return Class::Push;
    }
    Class::Other
}

fn state(error: &StateError) -> Class {
    match error {
        StateError::UnknownSandbox(_) => Class::SandboxNotFound,
        StateError::UnknownSnapshot(_) | StateError::UnknownPool(_) => Class::NotFound,
        StateError::AmbiguousSnapshot(_) | StateError::NameTaken(_) | StateError::PoolExists(_) => {
            Class::InvalidArgument
        }
        _ => Class::Other,
    }
}

fn client(error: &ClientError) -> Class {
    match error {
        ClientError::Connect { .. }
        | ClientError::NotReady { .. }
        | ClientError::Handshake(_)
        | ClientError::Disconnected
        | ClientError::VersionMismatch(_)
        | ClientError::NoCommonVersion { .. }
        | ClientError::AgentTooOld { .. } => Class::Unreachable,
        ClientError::Timeout { .. } => Class::Timeout,
        ClientError::Agent { kind, .. } => agent_kind(kind),
        _ => Class::Other,
    }
}

/// The class of one of the protocol's error kinds.
fn agent_kind(kind: &ErrorKind) -> Class {
    match kind {
        ErrorKind::NotFound
        | ErrorKind::UnknownExec
        | ErrorKind::UnknownSession
        | ErrorKind::CommandNotFound => Class::NotFound,
        ErrorKind::Busy | ErrorKind::LimitReached => Class::Busy,
        ErrorKind::Malformed
        | ErrorKind::BadRequest
        | ErrorKind::RejectedEntry
        | ErrorKind::MountNotAllowed
        | ErrorKind::OutsideConfine
        | ErrorKind::PermissionDenied
        | ErrorKind::IsADirectory
        | ErrorKind::NotADirectory
        | ErrorKind::NotEmpty
        | ErrorKind::TooLarge
        | ErrorKind::NotExecutable => Class::InvalidArgument,
        _ => Class::Other,
    }
}
