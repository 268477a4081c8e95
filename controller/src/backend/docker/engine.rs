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
//! for its version first and steps down to it. A backend with a home
//! remembers the version it settled on there ([`connect_remembering`]), so
//! a new `silo` process that needs the engine skips that round trip
//! (`GET /version`, 1 to 6 ms, docs/benchmarks.md).

use std::path::Path;
use std::time::Duration;

use bollard::{ClientVersion, Docker};
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
    negotiate(flavor, &(flavor.host)()).await
}

/// [`connect_to`], with the API version settled by an earlier process kept
/// in the file `remembered`. Only an engine on a Unix socket is
/// remembered, and only for the socket it answered on: an engine that
/// restarts (an upgrade, a downgrade) makes its socket anew, and a socket
/// of another inode or time no longer matches. The version kept is one
/// that engine agreed to, so while the same socket is up it still serves
/// it. An unreadable or stale file is negotiated again and replaced; one
/// that cannot be written costs the next process the round trip, nothing
/// else.
pub async fn connect_remembering(
    flavor: &Flavor,
    remembered: &Path,
) -> Result<Docker, DockerError> {
    let host = (flavor.host)();
    let Some(socket) = host.strip_prefix("unix://") else {
        return negotiate(flavor, &host).await;
    };
    let identity = socket_identity(Path::new(socket));
    if let Some(identity) = &identity
        && let Some(version) = read_remembered(remembered, identity)
    {
        return Docker::connect_with_unix(socket, REQUEST_TIMEOUT.as_secs(), &version)
            .map_err(|source| unreachable_error(flavor, &host, source));
    }
    let docker = negotiate(flavor, &host).await?;
    if let Some(identity) = identity {
        let text = format!("{identity}\n{}\n", docker.client_version());
        if let Err(error) = crate::fsutil::write_atomic(remembered, text.as_bytes(), 0o600) {
            tracing::debug!(%error, path = %remembered.display(), "cannot remember the engine's API version");
        }
    }
    Ok(docker)
}

/// What tells one engine's socket from the next one at the same path.
fn socket_identity(socket: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(socket).ok()?;
    Some(format!(
        "{} {} {} {}.{}",
        socket.display(),
        meta.dev(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

/// The version kept in `path` for the socket `identity`, if it is there.
fn read_remembered(path: &Path, identity: &str) -> Option<ClientVersion> {
    let text = std::fs::read_to_string(path).ok()?;
    let (kept, version) = text.split_once('\n')?;
    if kept != identity {
        return None;
    }
    let (major, minor) = version.trim().split_once('.')?;
    Some(ClientVersion {
        major_version: major.parse().ok()?,
        minor_version: minor.parse().ok()?,
    })
}

fn unreachable_error(flavor: &Flavor, host: &str, source: bollard::errors::Error) -> DockerError {
    DockerError::Unreachable {
        engine: flavor.name,
        host: host.to_owned(),
        hint: flavor.start_hint,
        source: Box::new(source),
    }
}

/// Asks the engine at `host` for its API version (`GET /version`) and
/// steps down to it.
async fn negotiate(flavor: &Flavor, host: &str) -> Result<Docker, DockerError> {
    let host = host.to_owned();
    let unreachable = |source| unreachable_error(flavor, &host, source);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_remembered_version_holds_only_for_the_same_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("engine.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let identity = socket_identity(&socket).unwrap();
        let file = dir.path().join("engine-api-docker");
        std::fs::write(&file, format!("{identity}\n1.41\n")).unwrap();
        let version = read_remembered(&file, &identity).unwrap();
        assert_eq!((version.major_version, version.minor_version), (1, 41));

        // The engine restarted: its socket is a new file (made while the
        // old one still exists, so it cannot reuse its inode).
        let next = dir.path().join("next.sock");
        let _again = std::os::unix::net::UnixListener::bind(&next).unwrap();
        std::fs::rename(&next, &socket).unwrap();
        let renewed = socket_identity(&socket).unwrap();
        assert_ne!(renewed, identity);
        assert!(read_remembered(&file, &renewed).is_none());

        for garbage in [
            "",
            "\n",
            &format!("{renewed}\n1\n"),
            &format!("{renewed}\nx.y\n"),
        ] {
            std::fs::write(&file, garbage).unwrap();
            assert!(read_remembered(&file, &renewed).is_none(), "{garbage:?}");
        }
        assert!(read_remembered(&dir.path().join("absent"), &renewed).is_none());
    }
}
