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
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use silo::ErrorKind;
use silo::client::ClientError;
use silo::spec::Machines;
use silo::{FileError, SiloError, StateError};
use silo_protocol::http::error_chain;

create_exception!(
    _native,
    SiloException,
    PyException,
    "Every error silo raises."
);
create_exception!(
    _native,
    SandboxNotFoundError,
    SiloException,
    "No sandbox by that name or id, or its machine is gone."
);
create_exception!(
    _native,
    SandboxNotRunningError,
    SiloException,
    "The sandbox exists but is stopped."
);
create_exception!(
    _native,
    SpecDriftError,
    SiloException,
    "The sandbox exists with another spec and was not asked to be recreated."
);
create_exception!(
    _native,
    InvalidArgumentError,
    SiloException,
    "A name, spec, path or option was refused before anything changed."
);
create_exception!(
    _native,
    NotFoundError,
    SiloException,
    "A file, snapshot, pool, session or command that does not exist."
);
create_exception!(
    _native,
    CommandExitError,
    SiloException,
    "A command ended with a non-zero exit code (only `run` without `check=False`)."
);
create_exception!(
    _native,
    TimeoutError,
    SiloException,
    "A command's timeout ended it, or the agent did not answer in time."
);
create_exception!(
    _native,
    AgentUnreachableError,
    SiloException,
    "The sandbox's agent cannot be reached, or the connection was lost for good."
);
create_exception!(
    _native,
    ProviderError,
    SiloException,
    "A backend (Docker, Podman, E2B, Daytona, local) refused or failed an operation."
);
create_exception!(
    _native,
    BusyError,
    SiloException,
    "Another process or command holds the sandbox or session."
);
create_exception!(
    _native,
    SnapshotError,
    SiloException,
    "A snapshot, rewind or fork cannot be done."
);
create_exception!(
    _native,
    PushError,
    SiloException,
    "A push's bundle cannot be built (a failed target is in the report instead)."
);

/// Registers every class on the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("SiloException", py.get_type::<SiloException>())?;
    module.add(
        "SandboxNotFoundError",
        py.get_type::<SandboxNotFoundError>(),
    )?;
    module.add(
        "SandboxNotRunningError",
        py.get_type::<SandboxNotRunningError>(),
    )?;
    module.add("SpecDriftError", py.get_type::<SpecDriftError>())?;
    module.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    module.add("NotFoundError", py.get_type::<NotFoundError>())?;
    module.add("CommandExitError", py.get_type::<CommandExitError>())?;
    module.add("TimeoutError", py.get_type::<TimeoutError>())?;
    module.add(
        "AgentUnreachableError",
        py.get_type::<AgentUnreachableError>(),
    )?;
    module.add("ProviderError", py.get_type::<ProviderError>())?;
    module.add("BusyError", py.get_type::<BusyError>())?;
    module.add("SnapshotError", py.get_type::<SnapshotError>())?;
    module.add("PushError", py.get_type::<PushError>())?;
    Ok(())
}

/// Which class an error is, by its first cause that names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    SandboxNotFound,
    NotRunning,
    SpecDrift,
    InvalidArgument,
    NotFound,
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
    raise(class, message)
}

/// An argument refused on the Python side of the boundary.
pub fn invalid(message: impl Into<String>) -> PyErr {
    InvalidArgumentError::new_err(message.into())
}

fn raise(class: Class, message: String) -> PyErr {
    match class {
        Class::SandboxNotFound => SandboxNotFoundError::new_err(message),
        Class::NotRunning => SandboxNotRunningError::new_err(message),
        Class::SpecDrift => SpecDriftError::new_err(message),
        Class::InvalidArgument => InvalidArgumentError::new_err(message),
        Class::NotFound => NotFoundError::new_err(message),
        Class::Timeout => TimeoutError::new_err(message),
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
            SiloError::Backend { backend, .. } if backend.machines() == Machines::ProviderVm => {
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
