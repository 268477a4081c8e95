//! The agent's transport: HTTP/1.1 on a Unix or TCP listener (TLS optional),
//! with a WebSocket upgrade for the exec channel.
//!
//! [`run`] takes a bound listener and the shutdown phase; every loop selects
//! its work against shutdown. Connections are limited by a semaphore permit
//! taken before `accept` and held until the connection (or the exec
//! connection it upgraded to) ends. Handlers only parse and check; the work
//! is done by the modules that own it (`commands`, `push`, `snapshot`,
//! `layers`, `rewind`, `files`).
//!
//! # Layout
//! - `listener`: binding Unix/TCP sockets, stale socket handling, accepting.
//! - `tls`: rustls acceptor from PEM files.
//! - `auth`: version check, then signature check, for every route but `/healthz`.
//! - `exec_ws`: `GET /v1/exec`: admission and the WebSocket handshake.
//! - `files`: `/v1/files/…`: the file API's admission, parsing and body plumbing for `crate::files`.
//! - `push`: `POST /v1/push`: admission and request parsing for `crate::push`.
//! - `snapshot`: `POST /v1/snapshot`: admission and request parsing for `crate::snapshot`.
//! - `layers`: `POST /v1/layers`: admission and request parsing for `crate::layers`.
//! - `index`: `POST /v1/index`: admission and request parsing for the path index.
//! - `rewind`: `POST /v1/rewind`: admission and request parsing for `crate::rewind`.
//! - `json_body`: a signed JSON request body, read whole and checked (snapshot, index, rewind).
//! - `connection`: one exec WebSocket connection after the upgrade.
//! - `sessions`: the shell-session requests of that connection (open, list, close, interrupt).
//! - `suspend`: `POST /v1/suspend` and `/v1/resume`: admission for `crate::suspend`.
//!
//! A suspend is the one time the agent serves without a listener: once
//! it is answered, [`run`] ends every connection, closes the listener
//! (its socket file goes last, which tells the client nothing of the host
//! is held any more), waits for the wake, takes the key it woke with and
//! binds the same address again.

pub mod auth;
mod connection;
mod deadline;
mod exec_ws;
mod files;
mod index;
mod json_body;
mod layers;
pub mod listener;
mod push;
mod rewind;
mod sessions;
mod snapshot;
mod suspend;
pub mod tls;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use silo_protocol::auth::Verifier;
use silo_protocol::health::Health;
use silo_protocol::http::{
    ErrorBody, HEADER_PROTOCOL, HEADER_PROTOCOL_MIN, PATH_DEADLINE, PATH_EXEC, PATH_HEALTHZ,
    PATH_INDEX, PATH_LAYERS, PATH_PUSH, PATH_RESUME, PATH_REWIND, PATH_SNAPSHOT, PATH_SUSPEND,
};
use silo_protocol::{ErrorKind, Versions};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use crate::activity::Activity;
use crate::commands::Commands;
use crate::deadline::Lifetime;
use crate::exec::ConnId;
use crate::files::Files;
use crate::layers::Applier;
use crate::push::Pusher;
use crate::rewind::Rewinder;
use crate::shutdown::{self, Phase};
use crate::snapshot::{LayerStream, Snapshotter};
use crate::suspend::{Suspender, Wake};
use listener::{Accepted, Listener};
pub use suspend::Suspends;

/// Most simultaneous connections, exec connections included.
pub const MAX_CONNECTIONS: usize = 256;
/// Time a client gets to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a client gets to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors) before retrying.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Response body type of every route but the snapshot's.
pub type Body = Full<Bytes>;
/// Response body type of the connection: a whole body, or a streamed one
/// (a snapshot's layer, a file or tree download).
pub type Reply = Either<Body, LayerStream>;

/// What every connection needs.
pub struct AgentState {
    /// Checks request signatures against this sandbox's key.
    pub verifier: Verifier,
    /// The protocol versions requests may announce, reported on every answer.
    pub protocols: Versions,
    /// The exec registry and the shell sessions.
    pub commands: Commands,
    /// The push service.
    pub pusher: Arc<Pusher>,
    /// The snapshot and path index service.
    pub snapshots: Snapshotter,
    /// The layer apply service.
    pub layers: Arc<Applier>,
    /// The in-place rewind service.
    pub rewinder: Rewinder,
    /// The file API.
    pub files: Files,
    /// The suspend for memory checkpoints.
    pub suspender: Arc<Suspender>,
    /// Suspends answered, for the serving loop.
    pub suspends: Suspends,
    /// Use tracking for the idle timeout.
    pub activity: Arc<Activity>,
    /// The lifetime deadline.
    pub lifetime: Lifetime,
    /// When the agent started, for `uptime_ms`.
    pub started: Instant,
    /// Random per boot, reported by `/healthz`.
    pub boot_id: String,
    next_conn: AtomicU64,
}

/// The services that do the work the handlers admit and parse.
pub struct Services {
    /// The exec registry and the shell sessions.
    pub commands: Commands,
    /// The push service.
    pub pusher: Arc<Pusher>,
    /// The snapshot and path index service.
    pub snapshots: Snapshotter,
    /// The layer apply service.
    pub layers: Arc<Applier>,
    /// The in-place rewind service.
    pub rewinder: Rewinder,
    /// The file API.
    pub files: Files,
    /// The suspend for memory checkpoints.
    pub suspender: Arc<Suspender>,
}

impl AgentState {
    /// Bundles the shared state.
    pub fn new(
        verifier: Verifier,
        protocols: Versions,
        services: Services,
        boot_id: String,
    ) -> Self {
        let Services {
            commands,
            pusher,
            snapshots,
            layers,
            rewinder,
            files,
            suspender,
        } = services;
        Self {
            verifier,
            protocols,
            commands,
            pusher,
            snapshots,
            layers,
            rewinder,
            files,
            suspender,
            suspends: Suspends::default(),
            activity: Arc::new(Activity::default()),
            lifetime: Lifetime::default(),
            started: Instant::now(),
            boot_id,
            next_conn: AtomicU64::new(1),
        }
    }

    fn next_conn_id(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }
}

/// Held for a connection's life, including the exec connection it upgraded to.
pub struct ConnGuard {
    _permit: OwnedSemaphorePermit,
    /// Dropped last by the last connection, which lets [`run`] return.
    _done: mpsc::Sender<()>,
    /// The shutdown phase, which ends the connection.
    phase: watch::Receiver<Phase>,
}

/// Serves until `phase` reaches [`Phase::Draining`], then waits for every
/// connection to end (exec connections end at [`Phase::Closing`]). A
/// suspend ends every connection and the listener, and after the wake the
/// same address is bound again (see the module's docs).
pub async fn run(
    mut listener: Listener,
    rebind: Rebind,
    state: Arc<AgentState>,
    phase: watch::Receiver<Phase>,
) {
    loop {
        let Some(wake_after) = serve_round(listener, &state, &phase).await else {
            return;
        };
        match state.suspender.wake(wake_after).await {
            Wake::Restored(key) => {
                state.verifier.rekey(key);
                state.suspender.release_after_hold();
                tracing::info!("woke from a checkpoint with the key the restore left");
            }
            Wake::TimedOut => {
                let continued = state.suspender.resume();
                tracing::warn!(
                    continued,
                    "no checkpoint came; woke and continued the processes"
                );
            }
        }
        listener = loop {
            match Listener::bind(&rebind.addr, rebind.tls.clone()).await {
                Ok(listener) => break listener,
                Err(err) => {
                    tracing::error!(%err, "cannot listen again after a suspend");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        };
    }
}

/// What a woken agent binds again.
#[derive(Clone)]
pub struct Rebind {
    /// The address it listened on.
    pub addr: crate::config::ListenAddr,
    /// TLS, when configured.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Serves on `listener` until shutdown (answers `None`) or a suspend
/// (answers how long to wait for the wake), with every connection ended
/// and the listener closed either way.
async fn serve_round(
    listener: Listener,
    state: &Arc<AgentState>,
    phase: &watch::Receiver<Phase>,
) -> Option<Duration> {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    // Connections follow the agent's phase, or end at once on a suspend.
    let (conn_phase_tx, conn_phase_rx) = watch::channel(*phase.borrow());
    let forward = {
        let mut phase = phase.clone();
        let conn_phase_tx = conn_phase_tx.clone();
        tokio::spawn(async move {
            while phase.changed().await.is_ok() {
                let now = *phase.borrow();
                conn_phase_tx.send_if_modified(|p| {
                    let later = now > *p;
                    if later {
                        *p = now;
                    }
                    later
                });
            }
        })
    };
    let mut shutdown = phase.clone();
    let mut suspends = state.suspends.subscribe();
    let mut suspended = None;
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&limit).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shutdown::reached(&mut shutdown, Phase::Draining) => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown::reached(&mut shutdown, Phase::Draining) => break,
            Ok(wake_after) = suspends.wait_for(Option::is_some) => {
                suspended = *wake_after;
                break;
            }
        };
        match accepted {
            Ok(conn) => {
                let guard = ConnGuard {
                    _permit: permit,
                    _done: done_tx.clone(),
                    phase: conn_phase_rx.clone(),
                };
                tokio::spawn(serve(conn, Arc::clone(state), guard));
            }
            Err(err) => {
                tracing::warn!(%err, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    if suspended.is_some() {
        state.suspends.taken();
        conn_phase_tx.send_replace(Phase::Closing);
    }
    drop(done_tx);
    let _ = done_rx.recv().await;
    forward.abort();
    // Last, so the socket file's going means nothing of the host is held.
    listener.close();
    suspended
}

/// Any connection stream. Serving through one boxed type keeps a single copy
/// of hyper's connection machinery in the binary instead of one per transport.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn serve(conn: Accepted, state: Arc<AgentState>, guard: ConnGuard) {
    let io: Box<dyn Io> = match conn {
        Accepted::Unix(stream) => Box::new(stream),
        Accepted::Tcp(stream) => Box::new(stream),
        Accepted::Tls(stream, acceptor) => {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(err)) => return tracing::debug!(%err, "tls handshake failed"),
                Err(_) => return tracing::debug!("tls handshake timed out"),
            }
        }
    };
    serve_http(io, state, guard).await;
}

async fn serve_http(io: Box<dyn Io>, state: Arc<AgentState>, guard: ConnGuard) {
    let mut phase = guard.phase.clone();
    let guard = Arc::new(guard);
    let service = service_fn(move |req| {
        let state = Arc::clone(&state);
        let guard = Arc::clone(&guard);
        async move { Ok::<_, Infallible>(route(req, &state, &guard).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(err) = result {
                tracing::debug!(%err, "connection ended with an error");
            }
        }
        () = shutdown::reached(&mut phase, Phase::Draining) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Maps a request to its handler.
async fn route(
    req: Request<Incoming>,
    state: &Arc<AgentState>,
    guard: &Arc<ConnGuard>,
) -> Response<Reply> {
    let post = req.method() == Method::POST;
    let mut response = if post && req.uri().path() == PATH_SNAPSHOT {
        snapshot::handle(req, state).await
    } else if post && req.uri().path() == PATH_INDEX {
        index::handle(req, state).await
    } else if files::owns(req.uri().path()) {
        files::handle(req, state).await
    } else {
        route_whole(req, state, guard).await.map(Either::Left)
    };
    let headers = response.headers_mut();
    headers.insert(HEADER_PROTOCOL, HeaderValue::from(state.protocols.max));
    headers.insert(HEADER_PROTOCOL_MIN, HeaderValue::from(state.protocols.min));
    response
}

/// Maps a request whose answer is a whole body to its handler.
async fn route_whole(
    req: Request<Incoming>,
    state: &Arc<AgentState>,
    guard: &Arc<ConnGuard>,
) -> Response<Body> {
    let method = req.method().clone();
    match (req.uri().path(), method) {
        (PATH_HEALTHZ, Method::GET) => health(state),
        (PATH_EXEC, Method::GET) => exec_ws::upgrade(req, state, guard),
        (PATH_PUSH, Method::POST) => push::handle(req, state).await,
        (PATH_LAYERS, Method::POST) => layers::handle(req, state).await,
        (PATH_REWIND, Method::POST) => rewind::handle(req, state).await,
        (PATH_DEADLINE, Method::GET | Method::PUT) => deadline::handle(req, state).await,
        (PATH_SUSPEND, Method::POST) => suspend::suspend(req, state).await,
        (PATH_RESUME, Method::POST) => suspend::resume(req, state).await,
        (
            PATH_HEALTHZ | PATH_EXEC | PATH_PUSH | PATH_SNAPSHOT | PATH_LAYERS | PATH_INDEX
            | PATH_REWIND | PATH_DEADLINE | PATH_SUSPEND | PATH_RESUME,
            _,
        ) => error_response(
            ErrorKind::MethodNotAllowed,
            format!("{} does not take {}", req.uri().path(), req.method()),
        ),
        (path, _) => error_response(ErrorKind::NotFound, format!("no route for {path}")),
    }
}

fn health(state: &AgentState) -> Response<Body> {
    let (last_layer, applying) = state.layers.last_placed();
    json_response(
        StatusCode::OK,
        &Health {
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol_version: state.protocols.max,
            protocol_min: Some(state.protocols.min),
            uptime_ms: u64::try_from(state.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            unix_ms: crate::clock::unix_ms_now(),
            boot_id: state.boot_id.clone(),
            pid: std::process::id(),
            last_layer,
            applying,
        },
    )
}

/// The body length a request declares, if it declares a readable one; each
/// endpoint refuses a declared body over its cap before reading a byte.
pub fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A JSON response.
pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(json) => {
            let mut response = Response::new(Full::new(Bytes::from(json)));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(err) => {
            tracing::error!(%err, "cannot encode a response");
            let mut response = Response::new(Full::default());
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

/// A JSON [`ErrorBody`] response, with the status of its kind.
pub fn error_response(kind: ErrorKind, message: impl Into<String>) -> Response<Body> {
    let status = kind
        .status()
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(
        status,
        &ErrorBody {
            kind,
            message: message.into(),
        },
    )
}

/// Logs a refused or failed request: an internal failure as an error,
/// anything the request caused as information.
pub fn log_failure(what: &str, kind: &ErrorKind, reason: &str) {
    if *kind == ErrorKind::Internal {
        tracing::error!("{what} failed: {reason}");
    } else {
        tracing::info!("{what} refused: {reason}");
    }
}
