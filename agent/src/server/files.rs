//! The file API (`/v1/files/…`): admission, parsing and body plumbing only.
//!
//! The method is checked first, then the request is admitted like any other
//! (version, then signature over the claimed body hash), its query is read
//! into a [`Target`], and `crate::files` does the work on the blocking
//! pool. Upload bodies are pumped to it through the push body bridge, so a
//! slow disk pushes back on the client; downloads come back through the
//! snapshot's layer channel, so a large tree is never held in memory.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::Either;
use hyper::body::Incoming;
use silo_protocol::ErrorKind;
use silo_protocol::files::{
    FileQuery, MAX_FILE_WRITE, PATH_FILE, PATH_LIST, PATH_MKDIR, PATH_RENAME, PATH_STAT, PATH_TREE,
};
use silo_protocol::http::error_chain;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::{AgentState, Reply, auth, declared_length, error_response, json_response, log_failure};
use crate::body::{self, BODY_CHANNEL_CHUNKS, BodyError, ChannelReader};
use crate::files::{self, FilesError, Target, WriteSpec};
use crate::push::CancelOnDrop;
use crate::snapshot::stream;

/// Content type of a file's bytes.
const OCTET_STREAM: &str = "application/octet-stream";
/// Content type of a tree download.
const TAR: &str = "application/x-tar";

/// What a file request does.
#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Write,
    Remove,
    Stat,
    List,
    Mkdir,
    Rename,
    Download,
    Upload,
}

/// Whether `path` belongs to the file API.
pub fn owns(path: &str) -> bool {
    [
        PATH_FILE,
        PATH_STAT,
        PATH_LIST,
        PATH_MKDIR,
        PATH_RENAME,
        PATH_TREE,
    ]
    .contains(&path)
}

/// Handles one file request.
pub async fn handle(req: Request<Incoming>, state: &AgentState) -> Response<Reply> {
    let op = match (req.uri().path(), req.method()) {
        (PATH_FILE, &Method::GET) => Op::Read,
        (PATH_FILE, &Method::PUT) => Op::Write,
        (PATH_FILE, &Method::DELETE) => Op::Remove,
        (PATH_STAT, &Method::GET) => Op::Stat,
        (PATH_LIST, &Method::GET) => Op::List,
        (PATH_MKDIR, &Method::POST) => Op::Mkdir,
        (PATH_RENAME, &Method::POST) => Op::Rename,
        (PATH_TREE, &Method::GET) => Op::Download,
        (PATH_TREE, &Method::PUT) => Op::Upload,
        (path, method) => {
            return whole(error_response(
                ErrorKind::MethodNotAllowed,
                format!("{path} does not take {method}"),
            ));
        }
    };
    let signed = match auth::admit(&req, &state.verifier, state.protocols) {
        Ok(signed) => signed,
        Err(err) => return whole(err.response()),
    };
    // Counts as a session until answered (a download: until sent).
    let busy = state.activity.busy();
    let query = match FileQuery::parse(req.uri().query()) {
        Ok(query) => query,
        Err(err) => return failure(&err.into()),
    };
    let target = match Target::resolve(&query, &state.files.config.workdir) {
        Ok(target) => target,
        Err(err) => return failure(&err),
    };
    let permit = match state.files.admit().await {
        Ok(permit) => permit,
        Err(err) => return failure(&err),
    };
    // A change to the tree waits while a snapshot reads it or a rewind
    // replaces it, and holds its pass until done (see `WriteGate`).
    let _writing = match op {
        Op::Mkdir | Op::Remove | Op::Write | Op::Upload | Op::Rename => {
            match state.snapshots.write_gate().pass().await {
                Ok(pass) => Some(pass),
                Err(replaced) => return failure(&replaced.into()),
            }
        }
        Op::Stat | Op::List | Op::Read | Op::Download => None,
    };
    let sha256 = signed.content_sha256;
    let (parts, body) = req.into_parts();
    let answer = match op {
        Op::Stat => json(blocking(move || files::stat(&target)).await),
        Op::List => json(blocking(move || files::list(&target)).await),
        Op::Mkdir => {
            json(blocking(move || files::make_dir(&target, query.mode, query.parents)).await)
        }
        Op::Remove => json(blocking(move || files::remove(&target, query.recursive)).await),
        Op::Rename => {
            let to = match rename_target(&query, state) {
                Ok(to) => to,
                Err(err) => return failure(&err),
            };
            json(blocking(move || files::rename(&target, &to, query.parents)).await)
        }
        Op::Write => {
            let how = WriteSpec {
                mode: query.mode,
                parents: query.parents,
                sha256,
                limit: MAX_FILE_WRITE,
            };
            json(write(&parts.headers, body, target, how).await)
        }
        Op::Upload => {
            json(upload(&parts.headers, body, state, target, query.parents, sha256).await)
        }
        Op::Read | Op::Download => {
            return stream_out(op, target, (busy, permit)).await;
        }
    };
    drop(permit);
    answer
}

/// Where a rename goes: `to`, under the same confinement as `path`.
fn rename_target(query: &FileQuery, state: &AgentState) -> Result<Target, FilesError> {
    let to = query.to.clone().ok_or_else(|| FilesError::BadPath {
        path: query.path.clone(),
        reason: "a rename needs `to`, the new name",
    })?;
    let query = FileQuery {
        path: to,
        confine: query.confine.clone(),
        ..FileQuery::default()
    };
    Target::resolve(&query, &state.files.config.workdir)
}

/// Streams a file's bytes or a tree's tar from a blocking writer.
async fn stream_out(op: Op, target: Target, hold: impl Send + 'static) -> Response<Reply> {
    // What can be refused is refused before the first byte, as a JSON error.
    let opened = match op {
        Op::Read => {
            let target = target.clone();
            blocking(move || files::open_read(&target).map(Some)).await
        }
        _ => {
            let target = target.clone();
            blocking(move || files::check_download(&target).map(|_| None)).await
        }
    };
    let opened = match opened {
        Ok(opened) => opened,
        Err(err) => return failure(&err),
    };
    let (mut writer, layer) = stream::channel(Handle::current());
    tokio::task::spawn_blocking(move || {
        let sent = match opened {
            Some(mut file) => std::io::copy(&mut file, &mut writer)
                .map(drop)
                .map_err(|e| e.to_string()),
            None => files::download(&target, &mut writer).map_err(|e| error_chain(&e)),
        };
        match sent.and_then(|()| writer.complete().map_err(|e| e.to_string())) {
            Ok(()) => {}
            Err(err) => {
                tracing::info!(path = %target.path.display(), "file download cut off: {err}");
            }
        }
    });
    let mut response = Response::new(Either::Right(layer.hold(hold)));
    let content_type = if matches!(op, Op::Read) {
        OCTET_STREAM
    } else {
        TAR
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Pumps the body into an atomic file write.
async fn write(
    headers: &HeaderMap,
    body: Incoming,
    target: Target,
    how: WriteSpec,
) -> Result<silo_protocol::files::FileStat, FilesError> {
    let limit = how.limit;
    if declared_length(headers).is_some_and(|len| len > limit) {
        return Err(BodyError::over(limit).into());
    }
    let (tx, rx) = mpsc::channel(BODY_CHANNEL_CHUNKS);
    let job = tokio::task::spawn_blocking(move || {
        files::write_file(&target, &how, ChannelReader::new(rx))
    });
    pumped(body, tx, limit, job).await
}

/// Pumps the body into a staged tree upload.
async fn upload(
    headers: &HeaderMap,
    body: Incoming,
    state: &AgentState,
    target: Target,
    parents: bool,
    sha256: String,
) -> Result<silo_protocol::files::TreeWritten, FilesError> {
    let limits = state.files.config.tree_limits;
    let cap = limits.max_bundle_bytes;
    if declared_length(headers).is_some_and(|len| len > cap) {
        return Err(BodyError::over(cap).into());
    }
    let (tx, rx) = mpsc::channel(BODY_CHANNEL_CHUNKS);
    // Set when this request ends, answered or not, so an extract whose
    // client went away stops at its next entry.
    let cancelled = CancelOnDrop::default();
    let flag = Arc::clone(&cancelled.0);
    let job = tokio::task::spawn_blocking(move || {
        let how = files::Upload {
            parents,
            sha256: &sha256,
            limits: &limits,
            cancelled: &flag,
        };
        files::upload(&target, &how, ChannelReader::new(rx))
    });
    pumped(body, tx, cap, job).await
}

/// Runs the body pump beside a blocking job that reads it, and gives the
/// job's answer unless the body itself failed.
async fn pumped<T>(
    body: Incoming,
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    cap: u64,
    job: tokio::task::JoinHandle<Result<T, FilesError>>,
) -> Result<T, FilesError> {
    let job = async {
        job.await
            .map_err(|e| FilesError::Internal(format!("file task failed: {e}")))
    };
    let (pumped, joined) = tokio::join!(body::pump(body, tx, cap), job);
    match (pumped, joined?) {
        (_, Ok(done)) => Ok(done),
        (pumped, Err(err)) => Err(pumped.error(cap).map_or(err, FilesError::from)),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FilesError> + Send + 'static,
) -> Result<T, FilesError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| FilesError::Internal(format!("file task failed: {e}")))?
}

fn json<T: serde::Serialize>(result: Result<T, FilesError>) -> Response<Reply> {
    match result {
        Ok(value) => whole(json_response(StatusCode::OK, &value)),
        Err(err) => failure(&err),
    }
}

fn whole(response: Response<super::Body>) -> Response<Reply> {
    response.map(Either::Left)
}

fn failure(err: &FilesError) -> Response<Reply> {
    let (kind, reason) = (err.kind(), error_chain(err));
    log_failure("file request", &kind, &reason);
    whole(error_response(kind, reason))
}
