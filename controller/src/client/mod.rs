//! `AgentClient`, the one way the controller talks to an agent.
//!
//! Every backend ends in an [`Endpoint`] and a sandbox key; from there, health
//! checks, execs, interrupts and re-attach work the same whatever the backend.
//! The client signs every request with the sandbox's key. Before its first
//! signed request it learns the agent's protocol versions, once per client
//! and its clones: from the answer to an exec upgrade that announced this
//! build's newest version (saving a round trip on every new process's
//! first exec), else from `/healthz`. It then announces the newest
//! version both speak, and refuses at once, naming what is missing, a
//! request that version lacks ([`ClientError::AgentTooOld`]).
//!
//! Layout: `transport` opens streams and makes one-shot HTTP requests
//! (bodies in memory, or streamed with a precomputed hash for pushes);
//! `negotiate` picks the version and checks features against it;
//! `connection` multiplexes execs over one WebSocket; `session` adds the
//! shell-session requests to it; `snapshot` asks for a snapshot and hands
//! back the layer as it streams; `layers` lists a machine's paths and
//! applies layers onto it; `rewind` begins an in-place rewind and finishes
//! it with the restoring layer; `baseline` sends the baseline of either by
//! digest, and by its paths to an agent that does not keep it; `suspend`
//! stops the sandbox and lets go of the host for a memory checkpoint.

mod baseline;
mod connection;
mod deadline;
mod layers;
mod negotiate;
mod rewind;
mod session;
mod snapshot;
mod suspend;
pub(crate) mod transport;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use silo_protocol::auth::{AuthError, EMPTY_BODY_SHA256, Key, sign};
use silo_protocol::exec::ExecSpec;
use silo_protocol::health::Health;
use silo_protocol::http::{HEADER_PROTOCOL, HEADER_PROTOCOL_MIN, PATH_EXEC, PATH_HEALTHZ};
use silo_protocol::version::VersionError;
use silo_protocol::{ErrorKind, Feature, Versions};
use tokio_tungstenite::{WebSocketStream, tungstenite};

use transport::Stream;

pub use baseline::{BaselinePaths, BaselineSent};
pub use connection::{
    Attached, DirWatch, ExecConnection, ExecEvent, ExecHandle, ExecOutput, WatchEvent,
};
pub use negotiate::{REBAKE_HINT, Spoken};
pub use rewind::RewindBegun;
pub use session::SessionOptions;
pub use snapshot::LayerAnswer;
#[doc(hidden)]
pub use transport::Response;
pub(crate) use transport::SentCallback;
pub use transport::{CONNECT_TIMEOUT, Endpoint};

/// Pause between health probes while waiting for an agent to come up.
const READY_POLL: Duration = Duration::from_millis(2);

/// A handle on one sandbox's agent. Cheap to clone; holds no connection.
#[derive(Debug, Clone)]
pub struct AgentClient {
    endpoint: Endpoint,
    key: Key,
    /// The protocol versions this client speaks.
    ours: Versions,
    /// The sandbox's name, for messages.
    sandbox: Option<String>,
    /// The agent's protocol versions, once learned; shared by clones.
    theirs: Arc<Mutex<Option<Versions>>>,
}

impl AgentClient {
    /// A client for the agent at `endpoint`, signing with the sandbox's `key`.
    pub fn new(endpoint: Endpoint, key: Key) -> Self {
        Self {
            endpoint,
            key,
            ours: Versions::OURS,
            sandbox: None,
            theirs: Arc::default(),
        }
    }

    /// The same client, naming the agent by its sandbox in messages.
    pub fn for_sandbox(mut self, name: impl Into<String>) -> Self {
        self.sandbox = Some(name.into());
        self
    }

    /// The same client, speaking at most protocol `max`, as a controller
    /// of that version would: for testing that agents keep serving older
    /// controllers. Fails for a version this build does not speak.
    pub fn with_max_protocol(mut self, max: u32) -> Result<Self, VersionError> {
        self.ours = Versions::capped(max)?;
        Ok(self)
    }

    /// Where the agent listens.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Asks the agent whether it is up (unsigned), and notes its protocol
    /// versions.
    pub async fn healthz(&self) -> Result<Health, ClientError> {
        let response = transport::request(
            &self.endpoint,
            None,
            self.ours.max,
            http::Method::GET,
            PATH_HEALTHZ,
            Default::default(),
        )
        .await?;
        if !response.status.is_success() {
            return Err(ClientError::Rejected {
                status: response.status.as_u16(),
                message: response.error_body().message,
            });
        }
        let health: Health = serde_json::from_slice(&response.body)
            .map_err(|e| ClientError::Protocol(format!("unreadable health answer: {e}")))?;
        *lock(&self.theirs) = Some(health.versions());
        Ok(health)
    }

    /// The protocol version this client speaks with the agent, and the
    /// agent's versions; learned from `/healthz` on first use.
    pub async fn protocol(&self) -> Result<Spoken, ClientError> {
        let known = *lock(&self.theirs);
        let theirs = match known {
            Some(theirs) => theirs,
            None => self.healthz().await?.versions(),
        };
        Spoken::new(self.ours, theirs, self.describe())
    }

    /// The version to announce for a request that needs `feature`, or the
    /// error that says why the agent cannot serve it.
    async fn speak(&self, feature: Feature) -> Result<Spoken, ClientError> {
        let spoken = self.protocol().await?;
        spoken.require(feature)?;
        Ok(spoken)
    }

    /// The version to announce for a request to `path_and_query`.
    async fn speak_for(&self, path_and_query: &str) -> Result<Spoken, ClientError> {
        match Feature::of_path(path_and_query) {
            Some(feature) => self.speak(feature).await,
            None => self.protocol().await,
        }
    }

    /// The agent in messages.
    fn describe(&self) -> String {
        match &self.sandbox {
            Some(name) => format!("in sandbox {name}"),
            None => format!("at {}", self.endpoint),
        }
    }

    /// Polls [`AgentClient::healthz`] until it answers or `timeout` passes.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Health, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.healthz().await {
                Ok(health) => return Ok(health),
                Err(error) if Instant::now() >= deadline => {
                    return Err(ClientError::NotReady {
                        endpoint: self.endpoint.to_string(),
                        waited: timeout,
                        last: Box::new(error),
                    });
                }
                Err(_) => tokio::time::sleep(READY_POLL).await,
            }
        }
    }

    /// Sends one signed request and returns the agent's answer, whatever
    /// its status. A request to an endpoint the spoken version lacks
    /// ([`Feature::of_path`]) is refused without being sent.
    #[doc(hidden)]
    pub async fn request(
        &self,
        method: http::Method,
        path_and_query: &str,
        body: bytes::Bytes,
    ) -> Result<Response, ClientError> {
        let spoken = self.speak_for(path_and_query).await?;
        transport::request(
            &self.endpoint,
            Some(&self.key),
            spoken.version,
            method,
            path_and_query,
            body,
        )
        .await
    }

    /// Sends one signed request without a body and answers as soon as the
    /// status arrives, the body left to stream (a large file read).
    pub(crate) async fn get_for_stream(
        &self,
        path_and_query: &str,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        let spoken = self.speak_for(path_and_query).await?;
        transport::send_for_stream(
            &self.endpoint,
            Some((&self.key, silo_protocol::auth::EMPTY_BODY_SHA256)),
            spoken.version,
            http::Method::GET,
            path_and_query,
            http_body_util::Empty::<bytes::Bytes>::new(),
        )
        .await
    }

    /// Sends one signed request with a body whose SHA-256 is already known,
    /// streamed, with `sent` told of each chunk that goes out; refused
    /// without being sent like [`AgentClient::request`]. Hidden: the
    /// workspace's tests sign bodies they lie about with it; its types are
    /// the HTTP library's.
    #[doc(hidden)]
    pub async fn request_streamed(
        &self,
        method: http::Method,
        path_and_query: &str,
        body: bytes::Bytes,
        sha256: &str,
        sent: Option<SentCallback>,
    ) -> Result<Response, ClientError> {
        let spoken = self.speak_for(path_and_query).await?;
        transport::send(
            &self.endpoint,
            Some((&self.key, sha256)),
            spoken.version,
            method,
            path_and_query,
            transport::chunked(body, sent),
        )
        .await
    }

    /// Opens a signed, version-checked exec channel.
    ///
    /// A client that has not learned the agent's versions yet does not ask
    /// `/healthz` first: it announces its newest version on the upgrade
    /// itself and learns the agent's range from the headers every agent
    /// answer carries. Only an agent that refuses that version (an older
    /// one), or answers without the headers, costs the health check and a
    /// second try at the version both speak.
    pub async fn connect(&self) -> Result<ExecConnection, ClientError> {
        let known = *lock(&self.theirs);
        if known.is_none() && Feature::Exec.in_version(self.ours.max) {
            match self.upgrade(self.ours.max).await {
                Ok((socket, Some(theirs))) => {
                    *lock(&self.theirs) = Some(theirs);
                    let spoken = Spoken::new(self.ours, theirs, self.describe())?;
                    spoken.require(Feature::Exec)?;
                    if spoken.version == self.ours.max {
                        return Ok(ExecConnection::start(socket, spoken));
                    }
                    // The agent admitted a version it says it does not
                    // speak; start over at the one both do.
                }
                Ok((_, None)) | Err(ClientError::VersionMismatch(_)) => {}
                Err(other) => return Err(other),
            }
        }
        let spoken = self.speak(Feature::Exec).await?;
        let (socket, _) = self.upgrade(spoken.version).await?;
        Ok(ExecConnection::start(socket, spoken))
    }

    /// Opens the exec WebSocket announcing `version`; returns it with the
    /// agent's versions when its answer names them.
    async fn upgrade(
        &self,
        version: u32,
    ) -> Result<(WebSocketStream<Box<dyn Stream>>, Option<Versions>), ClientError> {
        let stream = transport::open(&self.endpoint).await?;
        let signed = sign(&self.key, "GET", PATH_EXEC, EMPTY_BODY_SHA256)?;
        let mut builder = http::Request::builder()
            .method("GET")
            .uri(format!("ws://{}{PATH_EXEC}", self.endpoint.host_header()))
            .header(http::header::HOST, self.endpoint.host_header())
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "websocket")
            .header(http::header::SEC_WEBSOCKET_VERSION, "13")
            .header(http::header::SEC_WEBSOCKET_KEY, websocket_key()?)
            .header(HEADER_PROTOCOL, version.to_string());
        for (name, value) in signed.pairs() {
            builder = builder.header(name, value);
        }
        for (name, value) in self.endpoint.extra_headers() {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let request = builder
            .body(())
            .map_err(|e| ClientError::Protocol(format!("building upgrade: {e}")))?;
        match tokio_tungstenite::client_async(request, stream).await {
            Ok((socket, response)) => Ok((socket, answered_versions(response.headers()))),
            Err(tungstenite::Error::Http(response)) => Err(rejection(
                response.status().as_u16(),
                response.body().as_deref(),
            )),
            Err(error) => Err(ClientError::Handshake(TransportError::new(error))),
        }
    }

    /// Runs one command on a fresh connection and collects its output.
    pub async fn run(&self, spec: ExecSpec) -> Result<ExecOutput, ClientError> {
        self.connect().await?.run(spec).await
    }
}

/// Locks state that is plain data: a panic elsewhere while holding the
/// lock leaves nothing half-done behind, so keep using it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The versions an agent's answer names in its protocol headers, if it names them.
fn answered_versions(headers: &http::HeaderMap) -> Option<Versions> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<u32>().ok();
    let max = number(HEADER_PROTOCOL)?;
    let min = number(HEADER_PROTOCOL_MIN).unwrap_or(max).min(max);
    Some(Versions { min, max })
}

/// Turns a refused upgrade into the error that names why.
/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64, drawn straight
/// from the operating system, as the request's nonce is. tungstenite's own
/// helper seeds a user-space generator first, work a new CLI process does
/// once and throws away.
fn websocket_key() -> Result<String, ClientError> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|_| AuthError::NoRandomness)?;
    Ok(BASE64.encode(nonce))
}

fn rejection(status: u16, body: Option<&[u8]>) -> ClientError {
    let body: silo_protocol::http::ErrorBody = body
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_else(|| transport::stand_in_error(format!("agent answered HTTP {status}")));
    match body.kind {
        ErrorKind::VersionMismatch => ClientError::VersionMismatch(body.message),
        ErrorKind::Unauthorized => ClientError::Unauthorized(body.message),
        ErrorKind::ClockSkew => ClientError::ClockSkew(body.message),
        ErrorKind::UnknownBaseline => ClientError::UnknownBaseline(body.message),
        _ => ClientError::Rejected {
            status,
            message: body.message,
        },
    }
}

/// Why talking to an agent failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The agent's socket could not be reached.
    #[error("cannot reach agent at {endpoint}")]
    Connect {
        /// Where we tried.
        endpoint: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Something took too long.
    #[error("timed out {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
    },
    /// The agent never answered its health check.
    #[error("agent at {endpoint} not ready after {waited:?}")]
    NotReady {
        /// Where we polled.
        endpoint: String,
        /// How long.
        waited: Duration,
        /// The last failure seen.
        #[source]
        last: Box<ClientError>,
    },
    /// The agent refused the protocol version this client announced.
    #[error("{0}")]
    VersionMismatch(String),
    /// The agent's protocol version lacks what the request needs; nothing
    /// was sent.
    #[error(
        "the agent {agent} speaks protocol {speaks}, which has no {feature} \
         (needs protocol {needs}); {REBAKE_HINT}",
        needs = feature.since()
    )]
    AgentTooOld {
        /// The agent: "in sandbox NAME" or "at ENDPOINT".
        agent: String,
        /// The newest version the agent speaks.
        speaks: u32,
        /// What the request needs.
        feature: Feature,
    },
    /// This client is pinned to a protocol version that lacks what the
    /// request needs ([`AgentClient::with_max_protocol`]); nothing was sent.
    #[error(
        "this client is pinned to protocol {speaks}, which has no {feature} \
         (needs protocol {needs})",
        needs = feature.since()
    )]
    ClientPinned {
        /// The newest version the client speaks.
        speaks: u32,
        /// What the request needs.
        feature: Feature,
    },
    /// The agent and this client share no protocol version.
    #[error(
        "the agent {agent} speaks protocol {theirs} and this silo {ours}, none in common; {hint}"
    )]
    NoCommonVersion {
        /// The agent: "in sandbox NAME" or "at ENDPOINT".
        agent: String,
        /// What this client speaks.
        ours: Versions,
        /// What the agent speaks.
        theirs: Versions,
        /// Which side to upgrade.
        hint: String,
    },
    /// The agent refused our signature.
    #[error("agent refused the request: {0}")]
    Unauthorized(String),
    /// The agent refused our signature's timestamp: this host's clock and
    /// the machine's disagree.
    #[error(
        "this host's clock and the sandbox's disagree, so the agent refuses signed requests \
         ({0}); set both clocks right (NTP)"
    )]
    ClockSkew(String),
    /// The agent keeps no tree with the digest a request named its
    /// baseline by; the request can be sent again with the paths.
    #[error("the agent does not keep the baseline named: {0}")]
    UnknownBaseline(String),
    /// The agent answered with another error status.
    #[error("agent answered HTTP {status}: {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The agent's explanation.
        message: String,
    },
    /// The agent reported a failed request.
    #[error("agent error ({kind}): {message}")]
    Agent {
        /// Category.
        kind: ErrorKind,
        /// Explanation.
        message: String,
    },
    /// The WebSocket upgrade failed for a transport reason.
    #[error("websocket handshake with agent failed")]
    Handshake(#[source] TransportError),
    /// HTTP-level failure.
    #[error("http exchange with agent failed")]
    Http(#[source] TransportError),
    /// Signing failed.
    #[error("signing the request failed")]
    Sign(#[from] AuthError),
    /// The agent said something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The connection closed before the answer arrived.
    #[error("connection to agent closed")]
    Disconnected,
}

impl ClientError {
    /// An HTTP-level failure of the transport.
    pub(crate) fn http(error: hyper::Error) -> Self {
        Self::Http(TransportError::new(error))
    }
}

/// A failure of the HTTP or WebSocket machinery, kept opaque so that the
/// crates silo speaks HTTP with are not part of its API; its message and
/// source chain say what happened.
#[derive(Debug)]
pub struct TransportError(Box<dyn std::error::Error + Send + Sync>);

impl TransportError {
    fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(error))
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_kind_where_a_user_acts_on_it() {
        let body = |kind: &str| format!(r#"{{"kind":"{kind}","message":"m"}}"#);
        assert!(matches!(
            rejection(401, Some(body("clock_skew").as_bytes())),
            ClientError::ClockSkew(m) if m == "m"
        ));
        assert!(matches!(
            rejection(401, Some(body("unauthorized").as_bytes())),
            ClientError::Unauthorized(_)
        ));
        let skew = rejection(401, Some(body("clock_skew").as_bytes())).to_string();
        assert!(skew.contains("clock") && skew.contains("NTP"), "{skew}");
        assert!(matches!(
            rejection(502, Some(b"<html>bad gateway</html>")),
            ClientError::Rejected { status: 502, .. }
        ));
    }
}
