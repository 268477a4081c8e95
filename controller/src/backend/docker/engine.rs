//! Reaching the Docker engine: one connection setup shared by the backend,
//! image building, tests and benchmarks, so all of them honour `DOCKER_HOST`
//! and negotiate the API version the same way.
//!
//! The engine may be older than the API version bollard speaks by default
//! (this project's CI runs 20.10, API 1.41), so the client asks the engine
//! for its version first and steps down to it.

use std::time::Duration;

use bollard::Docker;
use futures_util::StreamExt;

use super::error::{DockerError, api};

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

/// The engine address in use, for messages.
pub fn engine_host() -> String {
    std::env::var(DOCKER_HOST_ENV)
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| DEFAULT_HOST.to_owned())
}

/// Connects to the engine named by `DOCKER_HOST` (or the local socket) and
/// settles the API version with it.
pub async fn connect() -> Result<Docker, DockerError> {
    let host = engine_host();
    let unreachable = |source| DockerError::Unreachable {
        host: host.clone(),
        source: Box::new(source),
    };
    let explicit = std::env::var(DOCKER_HOST_ENV).is_ok_and(|h| !h.is_empty());
    let docker = if explicit {
        Docker::connect_with_defaults()
    } else {
        Docker::connect_with_local_defaults()
    }
    .map_err(unreachable)?;
    let docker = tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version())
        .await
        .map_err(|_| DockerError::Unresponsive {
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
