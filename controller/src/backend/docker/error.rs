//! [`DockerError`]: every way the Docker backend can fail, each naming the
//! container, image or file involved and what the user can do about it.

use std::path::PathBuf;
use std::time::Duration;

use crate::agent_binary::AgentBinaryError;

/// Why the Docker backend failed.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// A memory checkpoint of a sandbox whose runtime cannot take one.
    #[error(
        "its runtime is {runtime}, which silo cannot checkpoint with its memory; \
         make the sandbox with --runtime runsc (gVisor) for memory snapshots"
    )]
    NoMemoryRuntime {
        /// The sandbox's runtime.
        runtime: String,
    },
    /// The engine's checkpoint API is off.
    #[error(
        "the engine's checkpoint API is off: it needs the engine's experimental mode \
         (\"experimental\": true in /etc/docker/daemon.json, then restart dockerd)"
    )]
    NoCheckpoints,
    /// The engine keeps its containers where this host cannot read them.
    #[error(
        "the engine keeps its containers under {}, which is not on this host; \
         memory snapshots need a local engine", root.display()
    )]
    RemoteCheckpoints {
        /// The engine's root directory.
        root: PathBuf,
    },
    /// A suspended agent kept its socket.
    #[error("the agent did not let go of its socket {} for the checkpoint", socket.display())]
    NotReleased {
        /// The socket.
        socket: PathBuf,
    },
    /// No engine answers at the configured address.
    #[error("cannot reach the {engine} engine at {host}; {hint}")]
    Unreachable {
        /// Which engine ("docker", "podman").
        engine: &'static str,
        /// Where we looked.
        host: String,
        /// What to do about it.
        hint: &'static str,
        /// Why it failed.
        #[source]
        source: Box<bollard::errors::Error>,
    },
    /// The engine did not answer its version handshake in time.
    #[error("the {engine} engine at {host} did not answer within {waited:?}")]
    Unresponsive {
        /// Which engine ("docker", "podman").
        engine: &'static str,
        /// Where we looked.
        host: String,
        /// How long we waited.
        waited: Duration,
    },
    /// An Engine API call failed (on Docker's engine or Podman's, which the
    /// backend in the message's context names).
    #[error("engine API: cannot {what}")]
    Api {
        /// The call, in words ("start container silo-sbx-…").
        what: String,
        /// The engine's answer.
        #[source]
        source: Box<bollard::errors::Error>,
    },
    /// The image is not on the engine and could not be pulled.
    #[error(
        "image {image:?} is not on the {backend} engine and pulling it failed; build it \
         (`silo image base --backend {backend}` makes a registry-free one) or load it, \
         then try again"
    )]
    ImageUnavailable {
        /// The image.
        image: String,
        /// The backend whose engine lacks it ("docker", "podman").
        backend: &'static str,
        /// Why the pull failed.
        #[source]
        source: Box<bollard::errors::Error>,
    },
    /// The spec names a container runtime the engine does not have.
    #[error(
        "the docker engine has no runtime {runtime:?}; register it under \"runtimes\" in \
         /etc/docker/daemon.json and send dockerd a SIGHUP (for gVisor: \
         \"runsc\": {{\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\", \
         \"--host-uds=all\"]}}), then check `docker info`"
    )]
    UnknownRuntime {
        /// The runtime asked for.
        runtime: String,
    },
    /// The spec asks for something this backend cannot do.
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    /// `--workload image` on an image with nothing to run.
    #[error("image {0:?} has no entrypoint or command to supervise as its workload")]
    NoImageWorkload(String),
    /// A file operation under `$SILO_HOME` failed.
    #[error("cannot {what} {}", path.display())]
    Io {
        /// The operation.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No agent binary to mount.
    #[error(transparent)]
    AgentBinary(#[from] AgentBinaryError),
    /// The agent binary would not run inside an arbitrary image.
    #[error(
        "agent {} is not a static binary, so it cannot run inside a container image; \
         use the agent embedded in silo (drop --agent / SILO_AGENT) or a musl build",
        path.display()
    )]
    AgentNotStatic {
        /// The binary.
        path: PathBuf,
    },
    /// A bind mount's host side does not exist.
    #[error("bind mount source {} does not exist on the host", path.display())]
    BindSource {
        /// The host path.
        path: PathBuf,
    },
    /// The socket path would exceed the kernel's limit.
    #[error(
        "agent socket path {} is {len} bytes, over the {max}-byte limit of Unix sockets; \
         use a shorter SILO_HOME",
        path.display()
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Something other than a socket sits where the agent's socket should be.
    #[error(
        "{} is not a socket (replaced from inside the sandbox?); refusing to connect through it",
        path.display()
    )]
    SocketReplaced {
        /// The path.
        path: PathBuf,
    },
    /// The sandbox's container is gone.
    #[error("container {container} is gone (removed outside silo?)")]
    Missing {
        /// The container name.
        container: String,
    },
    /// A container with the sandbox's name belongs to another silo home.
    #[error("container {container} belongs to another silo home ({owner}); refusing to touch it")]
    Foreign {
        /// The container name.
        container: String,
        /// The other home's identity label.
        owner: String,
    },
    /// The container stopped before its agent answered.
    #[error("container {container} exited during startup ({status}); {logs}")]
    Exited {
        /// The container name.
        container: String,
        /// Its exit code or state.
        status: String,
        /// The end of its output.
        logs: String,
    },
    /// The agent did not answer in time (the container has been stopped).
    #[error(
        "the agent in container {container} did not answer within {waited:?} \
         (last probe: {last}); {logs}"
    )]
    NotReady {
        /// The container name.
        container: String,
        /// How long we waited.
        waited: Duration,
        /// Why the last probe failed.
        last: String,
        /// The end of its output.
        logs: String,
    },
    /// The engine answered with something silo cannot use.
    #[error("unexpected answer from the engine: {what}")]
    Unexpected {
        /// What was wrong.
        what: String,
    },
}

/// Wraps an Engine API error with the call it came from.
pub(super) fn api(what: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> DockerError {
    let what = what.into();
    move |source| DockerError::Api {
        what,
        source: Box::new(source),
    }
}

/// Wraps an I/O error with the operation and file.
pub(super) fn io(
    what: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> DockerError {
    let path = path.to_owned();
    move |source| DockerError::Io { what, path, source }
}

/// Whether the engine answered 404 (no such container or image).
pub(crate) fn is_not_found(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Whether the engine answered 409 (a name already taken, a removal in progress).
pub(super) fn is_conflict(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}

/// Whether a container create failed because the engine lacks the runtime.
pub(super) fn is_unknown_runtime(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 400,
            message,
        } if message.contains("Unknown runtime")
    )
}

/// Whether a container create failed because its image is not on the engine.
pub(super) fn is_missing_image(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            message,
        } if message.contains("image")
    )
}
