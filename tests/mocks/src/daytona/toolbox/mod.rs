//! The toolbox, the daemon in every Daytona sandbox, served by the mock
//! itself and acting on the sandbox's container. Requests reach it through
//! the proxy as `{toolboxProxyUrl}/{sandboxId}/{path}` (see `gateway`),
//! which strips the prefix: the paths here are the daemon's own, as in
//! daytonaio/daytona `libs/toolbox-api-client-go/api/openapi.yaml`.
//!
//! Modelled: `files/upload`, `files/download`, `files/permissions`
//! ([`files`]); `files/bulk-upload`, `files/bulk-download` and the listing
//! `GET /files` ([`bulk`]); `user-home-dir` and `work-dir` (the user's
//! home); `process/execute` ([`execute`]); sessions: create, list,
//! get, delete, exec (sync or `runAsync`), a command and its logs
//! ([`session`], with what it writes to and reads from the shell in
//! [`shell`]). Other daemon routes answer `501` so a client notices it
//! left the model; unknown ones answer gin's `404 page not found`.
//!
//! Paths that are not absolute resolve against the home of the sandbox's
//! user, the daemon's working directory. Every process runs as the
//! container's user (root in `silo-base`) with `HOME` and `USER` of the
//! sandbox's user; files are written as that user (uid 0).

pub mod bulk;
pub mod execute;
pub mod files;
pub mod session;
pub mod shell;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

use self::session::Session;
use super::reply::{GoError, go_error, unmodelled};
use super::store::Record;
use crate::containers::files::clean_path;
use crate::http::{Body, full, json_as, with_body};

/// Route prefixes of daemon features the mock does not model.
const UNMODELLED: [&str; 9] = [
    "/files",
    "/process",
    "/git",
    "/lsp",
    "/computeruse",
    "/port",
    "/version",
    "/project-dir",
    "/init",
];

/// The toolbox's state in one sandbox: its sessions. A stop ends the
/// processes, so the sandbox gets a fresh one.
#[derive(Default)]
pub struct Toolbox {
    sessions: Mutex<BTreeMap<String, Arc<Session>>>,
}

impl Toolbox {
    fn sessions(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One toolbox request: the sandbox, the daemon path, the method.
pub struct Call<'a> {
    /// The sandbox.
    pub record: &'a Record,
    /// The daemon's path (`/process/execute`).
    pub path: &'a str,
    /// The method.
    pub method: Method,
    /// Ends session pumps at shutdown.
    pub cancel: &'a CancellationToken,
}

impl Call<'_> {
    /// A typed error with this call's path and method.
    pub fn error(&self, kind: GoError, reason: &str) -> Response<Body> {
        go_error(kind, reason, self.path, &self.method)
    }

    /// `path` as the daemon resolves it (`filepath.Abs` from the home).
    pub fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') {
            clean_path(path)
        } else {
            clean_path(&format!("{}/{path}", self.record.home()))
        }
    }

    /// `HOME` and `USER` of the sandbox's user, for every process.
    pub fn user_env(&self) -> Vec<(String, String)> {
        vec![
            ("HOME".to_owned(), self.record.home()),
            ("USER".to_owned(), self.record.user.clone()),
        ]
    }
}

/// Serves one toolbox request for `record` at the daemon path `path`;
/// `without_bulk_upload` answers `files/bulk-upload` as a daemon from
/// before it did (the unknown route's `404`).
pub async fn handle(
    record: &Record,
    path: &str,
    request: Request<Incoming>,
    cancel: &CancellationToken,
    without_bulk_upload: bool,
) -> Response<Body> {
    let call = Call {
        record,
        path,
        method: request.method().clone(),
        cancel,
    };
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (&call.method, segments.as_slice()) {
        (&Method::GET, ["files"]) => bulk::list(&call, request).await,
        (&Method::POST, ["files", "upload"]) => files::upload(&call, request).await,
        (&Method::POST, ["files", "bulk-upload"]) if without_bulk_upload => not_found(),
        (&Method::POST, ["files", "bulk-upload"]) => bulk::upload(&call, request).await,
        (&Method::POST, ["files", "bulk-download"]) => bulk::download(&call, request).await,
        (&Method::GET, ["user-home-dir" | "work-dir"]) => json_as(
            StatusCode::OK,
            "application/json; charset=utf-8",
            &serde_json::json!({ "dir": call.record.home() }),
        ),
        (&Method::GET, ["files", "download"]) => files::download(&call, request).await,
        (&Method::POST, ["files", "permissions"]) => files::permissions(&call, request).await,
        (&Method::POST, ["process", "execute"]) => execute::execute(&call, request).await,
        (&Method::GET, ["process", "session"]) => session::list(&call),
        (&Method::POST, ["process", "session"]) => session::create(&call, request).await,
        (&Method::GET, ["process", "session", id]) => session::get(&call, id),
        (&Method::DELETE, ["process", "session", id]) => session::delete(&call, id).await,
        (&Method::POST, ["process", "session", id, "exec"]) => {
            session::exec(&call, id, request).await
        }
        (&Method::GET, ["process", "session", id, "command", command]) => {
            session::command(&call, id, command)
        }
        (&Method::GET, ["process", "session", id, "command", command, "logs"]) => {
            session::logs(&call, id, command, request.headers())
        }
        _ if UNMODELLED
            .iter()
            .any(|p| path == *p || path.starts_with(&format!("{p}/"))) =>
        {
            unmodelled(path, &call.method)
        }
        _ => not_found(),
    }
}

/// The daemon's answer to a route it does not have.
fn not_found() -> Response<Body> {
    with_body(
        StatusCode::NOT_FOUND,
        "text/plain",
        full("404 page not found"),
    )
}
