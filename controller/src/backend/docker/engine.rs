//! Reaching an engine that speaks the Docker Engine API: one connection
//! setup shared by the backends, image building, tests and benchmarks, so
//! all of them find the engine and negotiate the API version the same way.
//!
//! [`Flavor`] is what tells engines apart: which backend it serves, where
//! its socket is, what to do when nothing answers, and what its containers
//! need that Docker's do not. Docker's flavor is [`DOCKER`]; another engine
//! with the same API (Podman) names its own in its backend's folder and
//! reuses everything else here.
//!
//! The engine may be older than the API version bollard speaks by default
//! (this project's CI runs 20.10, API 1.41), so the client asks the engine
//! for its version first and steps down to it.

use std::time::Duration;

use bollard::Docker;
use futures_util::StreamExt;

use super::error::{DockerError, api};
use crate::spec::BackendKind;

/// Environment variable naming the engine (`unix://…`, `tcp://…`), as the docker CLI reads it.
pub const DOCKER_HOST_ENV: &str = "DOCKER_HOST";
/// The engine's address when `DOCKER_HOST` is unset.
const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";
/// How long the engine has to answer the version handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for any single Engine API answer (stopping a container waits
/// out its stop timeout, so this must exceed that).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for an image build or pull to *start* answering; the progress
/// stream itself is not cut short.
pub const LONG_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);
/// Lines of a container's output quoted in startup errors.
const LOG_TAIL_LINES: &str = "20";
/// Longest wait for a container's output when quoting it in an error.
const LOG_TIMEOUT: Duration = Duration::from_secs(5);

/// Which engine a container backend drives through the Docker Engine API,
/// and how it differs from Docker's.
#[derive(Debug, Clone, Copy)]
pub struct Flavor {
    /// The backend whose machines it holds.
    pub kind: BackendKind,
    /// Its name in messages ("docker", "podman").
    pub name: &'static str,
    /// Its address now (`unix://PATH`, or any `DOCKER_HOST` form for
    /// Docker), read from the environment on each call.
    pub host: fn() -> String,
    /// What a user does when nothing answers at that address.
    pub start_hint: &'static str,
    /// Resource limits every container is given explicitly, as (name,
    /// soft, hard): for an engine whose defaults fail to start one.
    pub ulimits: &'static [(&'static str, i64, i64)],
    /// Why a spec's `--runtime` is refused, for an engine whose API drops
    /// it (the container would run on its default runtime instead); `None`
    /// where the engine honours it.
    pub no_runtime: Option<&'static str>,
}

/// The Docker engine: `DOCKER_HOST`, else the local socket.
pub const DOCKER: Flavor = Flavor {
    kind: BackendKind::Docker,
    name: "docker",
    host: docker_host,
    start_hint: "is dockerd running? (set DOCKER_HOST to use another engine)",
    ulimits: &[],
    no_runtime: None,
};

/// The Docker engine's address in use, for messages.
pub fn engine_host() -> String {
    docker_host()
}

fn docker_host() -> String {
    std::env::var(DOCKER_HOST_ENV)
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| DEFAULT_HOST.to_owned())
}

/// Connects to the Docker engine named by `DOCKER_HOST` (or the local
/// socket) and settles the API version with it.
pub async fn connect() -> Result<Docker, DockerError> {
    connect_to(&DOCKER).await
}

/// Connects to `flavor`'s engine and settles the API version with it.
pub async fn connect_to(flavor: &Flavor) -> Result<Docker, DockerError> {
    let host = (flavor.host)();
    let unreachable = |source| DockerError::Unreachable {
        engine: flavor.name,
        host: host.clone(),
        hint: flavor.start_hint,
        source: Box::new(source),
    };
    // A socket path is reached directly; any other form (`tcp://`, TLS) is
    // Docker's own, read by bollard from `DOCKER_HOST`.
    let docker = match host.strip_prefix("unix://") {
        Some(path) => Docker::connect_with_unix(
            path,
            REQUEST_TIMEOUT.as_secs(),
            bollard::API_DEFAULT_VERSION,
        ),
        None => Docker::connect_with_defaults(),
    }
    .map_err(unreachable)?;
    let docker = tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version())
        .await
        .map_err(|_| DockerError::Unresponsive {
            engine: flavor.name,
            host: host.clone(),
            waited: CONNECT_TIMEOUT,
        })?
        .map_err(unreachable)?;
    Ok(docker.with_timeout(REQUEST_TIMEOUT))
}

/// The last lines of a container's output, for error messages; a note
/// instead when they cannot be read.
pub(super) async fn logs_tail(engine: &Docker, container: &str) -> String {
    let options = bollard::query_parameters::LogsOptionsBuilder::new()
        .stdout(true)
        .stderr(true)
        .tail(LOG_TAIL_LINES)
        .build();
    let collect = async {
        let mut text = String::new();
        let mut stream = engine.logs(container, Some(options));
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(output) => text.push_str(&String::from_utf8_lossy(output.as_ref())),
                Err(error) => return Err(api(format!("read the logs of {container}"))(error)),
            }
        }
        Ok(text)
    };
    match tokio::time::timeout(LOG_TIMEOUT, collect).await {
        Ok(Ok(text)) if text.trim().is_empty() => "it printed nothing".to_owned(),
        Ok(Ok(text)) => format!("its last output:\n{}", text.trim_end()),
        Ok(Err(error)) => format!("its output is unavailable ({error})"),
        Err(_) => "its output could not be read in time".to_owned(),
    }
}
