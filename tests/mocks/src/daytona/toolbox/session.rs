//! The toolbox's sessions: a long-lived shell per session, commands run
//! in it one after the other, as the daemon runs them.
//!
//! A session is `sh` started with its stdin held open (a `docker exec`
//! whose pid is a process group leader, like the daemon's `Setpgid`
//! shell). Each command is written to that stdin as one block that ends
//! by printing a marker with a per-session random nonce and the exit
//! status ([`super::shell`]); a reader task splits the shell's output at
//! the markers and files it under the command at the head of the queue. As in
//! the daemon, a command runs in the session shell itself (`cd` and
//! exports persist), a `runAsync` command answers `202` at once and keeps
//! running in the background of the HTTP exchange, and the next command
//! waits until it ends. Deleting a session sends SIGTERM to the shell's
//! group and process tree, waits up to [`TERMINATION_GRACE`] and then
//! SIGKILLs what is left: a client that deletes the session that started
//! its agent kills the agent.
//!
//! Output comes as the client's `X-Daytona-SDK-Version` asks
//! ([`LogShape`]): combined without markers for none (or one before
//! 0.27.0), labelled for 0.27.0 up to 0.167.0, and split into `stdout` and
//! `stderr` by the mock for 0.167.0 and later (JSON logs then); a last
//! line without a newline gets one, as the daemon's line reader gives it.
//! stdout and stderr lines interleave as their readers get them, as in
//! the daemon. A command that ends the shell (`exit`) ends with the shell's
//! status; commands queued behind it never run.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use silo_protocol::http::error_chain;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Call;
use super::shell::{Event, LogShape, Markers, block, demux, output_text, raw_text};
use crate::containers::Container;
use crate::containers::exec::{Output, SpawnRequest, Spawned};
use crate::daytona::model::{CommandInfo, SessionExecuteResponse, SessionInfo};
use crate::daytona::reply::{GoError, aborted, go_fallback};
use crate::http::{Body, full, json_as, read_body, status, with_body};
use crate::secret::{HEX, random_text, uuid_v4};

/// How long a deleted session's processes get between SIGTERM and SIGKILL
/// (the daemon's `DAYTONA_TERMINATION_GRACE_PERIOD` default).
pub const TERMINATION_GRACE: Duration = Duration::from_secs(5);
/// Most output kept per command; older output is dropped past it.
pub const MAX_COMMAND_LOG_BYTES: usize = 4 << 20;
/// The session id the daemon keeps for the sandbox's entrypoint.
const ENTRYPOINT_SESSION: &str = "entrypoint";
/// Largest request body read.
const MAX_JSON_BYTES: usize = 1 << 20;
/// Length of a session's marker nonce.
const NONCE_LEN: usize = 24;
/// JSON answers, as gin labels them.
const JSON_UTF8: &str = "application/json; charset=utf-8";

/// One command sent to a session.
struct CommandEntry {
    id: String,
    command: String,
    exit_code: Option<i64>,
    log: Vec<u8>,
}

#[derive(Default)]
struct SessionState {
    commands: Vec<CommandEntry>,
    /// Indices of commands written to the shell and not yet ended, in order.
    queue: VecDeque<usize>,
    /// The shell is gone (it exited, or the session was deleted).
    ended: bool,
    /// The session was deleted: waiters fail as the daemon's do.
    cancelled: bool,
}

/// One session: its shell and its commands.
pub struct Session {
    id: String,
    pid: u32,
    nonce: String,
    input: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    state: Mutex<SessionState>,
    /// Bumped whenever a command ends or the shell goes.
    changed: watch::Sender<u64>,
}

impl Session {
    fn state(&self) -> MutexGuard<'_, SessionState> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn info(&self) -> SessionInfo {
        SessionInfo {
            session_id: self.id.clone(),
            commands: self.state().commands.iter().map(command_info).collect(),
        }
    }
}

#[derive(Deserialize)]
struct CreateRequest {
    #[serde(default, rename = "sessionId")]
    session_id: String,
}

#[derive(Deserialize)]
struct ExecRequest {
    #[serde(default)]
    command: String,
    #[serde(default, rename = "runAsync")]
    run_async: bool,
    #[serde(default, rename = "async")]
    is_async: bool,
}

/// `POST /process/session`: `201`, no body.
pub async fn create(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let parsed: CreateRequest = match read_json(request).await {
        Ok(parsed) => parsed,
        Err(reason) => return call.error(GoError::InvalidBody, &reason),
    };
    if parsed.session_id.is_empty() {
        return call.error(
            GoError::InvalidBody,
            "Key: 'CreateSessionRequest.SessionId' Error:Field validation for 'SessionId' failed on the 'required' tag",
        );
    }
    if parsed.session_id == ENTRYPOINT_SESSION {
        return call.error(
            GoError::BadRequest,
            "provided session ID is reserved and cannot be created/overridden",
        );
    }
    let toolbox = &call.record.toolbox;
    if toolbox.sessions().contains_key(&parsed.session_id) {
        return call.error(GoError::Conflict, "session already exists");
    }
    let spawn = SpawnRequest {
        argv: vec!["sh".to_owned()],
        env: call.user_env(),
        cwd: call.record.home(),
        stdin: true,
        tty: false,
        size: None,
    };
    let container = &call.record.container;
    let mut spawned = match container.spawn(spawn).await {
        Ok(Ok(spawned)) => spawned,
        Ok(Err(refused)) => {
            return go_fallback(&format!("starting the session shell: {refused:?}"));
        }
        Err(error) => return go_fallback(&error_chain(&error)),
    };
    let Some(input) = spawned.input.take() else {
        return go_fallback("the session shell has no stdin");
    };
    let nonce = match random_text(NONCE_LEN, HEX) {
        Ok(nonce) => nonce,
        Err(error) => return go_fallback(&error.to_string()),
    };
    let session = Arc::new(Session {
        id: parsed.session_id.clone(),
        pid: spawned.pid,
        nonce,
        input: tokio::sync::Mutex::new(input),
        state: Mutex::default(),
        changed: watch::Sender::new(0),
    });
    let raced = match toolbox.sessions().entry(parsed.session_id) {
        std::collections::btree_map::Entry::Occupied(_) => true,
        std::collections::btree_map::Entry::Vacant(slot) => {
            slot.insert(session.clone());
            false
        }
    };
    if raced {
        container.signal_tree(spawned.pid, "KILL").await.ok();
        return call.error(GoError::Conflict, "session already exists");
    }
    tokio::spawn(pump(
        session,
        spawned,
        container.clone(),
        call.cancel.clone(),
    ));
    status(StatusCode::CREATED)
}

/// `GET /process/session`: every session.
pub fn list(call: &Call<'_>) -> Response<Body> {
    let sessions: Vec<Arc<Session>> = call.record.toolbox.sessions().values().cloned().collect();
    let infos: Vec<SessionInfo> = sessions.iter().map(|s| s.info()).collect();
    json_as(StatusCode::OK, JSON_UTF8, &infos)
}

/// `GET /process/session/{id}`.
pub fn get(call: &Call<'_>, id: &str) -> Response<Body> {
    match find(call, id) {
        Some(session) => json_as(StatusCode::OK, JSON_UTF8, &session.info()),
        None => call.error(GoError::NotFound, "session not found"),
    }
}

/// `DELETE /process/session/{id}`: ends the shell and everything it
/// started; `204`.
pub async fn delete(call: &Call<'_>, id: &str) -> Response<Body> {
    if id == ENTRYPOINT_SESSION {
        return call.error(GoError::BadRequest, "can't delete entrypoint session");
    }
    let Some(session) = call.record.toolbox.sessions().remove(id) else {
        return call.error(GoError::NotFound, "session not found");
    };
    {
        let mut state = session.state();
        state.ended = true;
        state.cancelled = true;
        state.queue.clear();
    }
    session.bump();
    if let Err(error) = call
        .record
        .container
        .terminate_tree(session.pid, TERMINATION_GRACE)
        .await
    {
        tracing::warn!(session = %id, error = %error_chain(&error), "ending a session's processes failed");
    }
    status(StatusCode::NO_CONTENT)
}

/// `POST /process/session/{id}/exec`: `200` with the result, or `202` at
/// once for `runAsync` (or `async`).
pub async fn exec(call: &Call<'_>, id: &str, request: Request<Incoming>) -> Response<Body> {
    if id == ENTRYPOINT_SESSION {
        return call.error(
            GoError::BadRequest,
            "can't execute command in entrypoint session",
        );
    }
    let shape = LogShape::of(request.headers());
    let Ok(parsed) = read_json::<ExecRequest>(request).await else {
        return aborted(StatusCode::BAD_REQUEST);
    };
    if parsed.command.trim().is_empty() {
        return aborted(StatusCode::BAD_REQUEST);
    }
    let failed = |reason: &str| go_fallback(&format!("failed to execute command: {reason}"));
    let Some(session) = find(call, id) else {
        return failed(&GoError::NotFound.message("session not found"));
    };
    let command_id = match uuid_v4() {
        Ok(id) => id,
        Err(error) => return failed(&error.to_string()),
    };
    let mut changes = session.changed.subscribe();
    let index = {
        let mut input = session.input.lock().await;
        let index = {
            let mut state = session.state();
            if state.ended {
                return failed(&GoError::BadRequest.message("session cancelled"));
            }
            state.commands.push(CommandEntry {
                id: command_id.clone(),
                command: parsed.command.clone(),
                exit_code: None,
                log: Vec::new(),
            });
            let index = state.commands.len() - 1;
            state.queue.push_back(index);
            index
        };
        let block = block(&session.nonce, &parsed.command);
        let written = async {
            input.write_all(block.as_bytes()).await?;
            input.flush().await
        };
        if let Err(error) = written.await {
            session.state().queue.retain(|i| *i != index);
            return failed(
                &GoError::BadRequest.message(&format!("failed to write command: {error}")),
            );
        }
        index
    };
    if parsed.run_async || parsed.is_async {
        let answer = SessionExecuteResponse {
            cmd_id: command_id,
            output: None,
            stdout: None,
            stderr: None,
            exit_code: None,
        };
        return json_as(StatusCode::ACCEPTED, JSON_UTF8, &answer);
    }
    loop {
        {
            let mut state = session.state();
            let cancelled = state.cancelled;
            let ended = state.ended;
            let Some(command) = state.commands.get_mut(index) else {
                return failed(&GoError::BadRequest.message("command not found"));
            };
            if let Some(code) = command.exit_code {
                let (output, split) = match shape {
                    LogShape::Combined => (output_text(&command.log), None),
                    LogShape::Labelled => (raw_text(&command.log), None),
                    LogShape::Split => (raw_text(&command.log), Some(demux(&command.log))),
                };
                let (stdout, stderr) = split.unzip();
                let answer = SessionExecuteResponse {
                    cmd_id: command_id,
                    output: Some(output),
                    stdout,
                    stderr,
                    exit_code: Some(code),
                };
                return json_as(StatusCode::OK, JSON_UTF8, &answer);
            }
            if ended {
                if cancelled {
                    // As the daemon marks the command it was waiting for.
                    command.exit_code = Some(1);
                }
                return failed(&GoError::BadRequest.message("session cancelled"));
            }
        }
        if changes.changed().await.is_err() {
            return failed(&GoError::BadRequest.message("session cancelled"));
        }
    }
}

/// `GET /process/session/{id}/command/{commandId}`.
pub fn command(call: &Call<'_>, id: &str, command_id: &str) -> Response<Body> {
    let Some(session) = find(call, id) else {
        return call.error(GoError::NotFound, "session not found");
    };
    let state = session.state();
    match state.commands.iter().find(|c| c.id == command_id) {
        Some(command) => json_as(StatusCode::OK, JSON_UTF8, &command_info(command)),
        None => call.error(GoError::NotFound, "command not found"),
    }
}

/// `GET /process/session/{id}/command/{commandId}/logs`: the output so far
/// as text, or as JSON `{output, stdout, stderr}` for a current SDK
/// (`follow` is not modelled: the answer ends with what is there).
pub fn logs(
    call: &Call<'_>,
    id: &str,
    command_id: &str,
    headers: &http::HeaderMap,
) -> Response<Body> {
    let Some(session) = find(call, id) else {
        return call.error(GoError::NotFound, "session not found");
    };
    let state = session.state();
    let Some(command) = state.commands.iter().find(|c| c.id == command_id) else {
        return call.error(GoError::NotFound, "command not found");
    };
    let text = |body: String| with_body(StatusCode::OK, "text/plain; charset=utf-8", full(body));
    match LogShape::of(headers) {
        LogShape::Combined => text(output_text(&command.log)),
        LogShape::Labelled => text(raw_text(&command.log)),
        LogShape::Split => {
            let (stdout, stderr) = demux(&command.log);
            json_as(
                StatusCode::OK,
                JSON_UTF8,
                &serde_json::json!({
                    "output": raw_text(&command.log),
                    "stdout": stdout,
                    "stderr": stderr,
                }),
            )
        }
    }
}

fn find(call: &Call<'_>, id: &str) -> Option<Arc<Session>> {
    call.record.toolbox.sessions().get(id).cloned()
}

fn command_info(command: &CommandEntry) -> CommandInfo {
    CommandInfo {
        id: command.id.clone(),
        command: command.command.clone(),
        exit_code: command.exit_code,
    }
}

async fn read_json<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, String> {
    let body = read_body(request.into_body(), MAX_JSON_BYTES)
        .await
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// Reads the session shell's output to its end, filing it under the
/// running command and ending commands at their markers.
async fn pump(
    session: Arc<Session>,
    mut spawned: Spawned,
    container: Container,
    cancel: CancellationToken,
) {
    let mut parser = Markers::new(&session.nonce);
    loop {
        let chunk = tokio::select! {
            chunk = spawned.next() => chunk,
            () = cancel.cancelled() => return,
        };
        match chunk {
            Some(Ok(Output::Stdout(bytes))) => {
                for event in parser.feed(&bytes) {
                    apply(&session, event);
                }
            }
            Some(Ok(Output::Stderr(bytes))) => apply(&session, Event::Output(bytes.to_vec())),
            Some(Err(error)) => {
                tracing::debug!(error = %error_chain(&error), "a session shell's output broke off");
                break;
            }
            None => break,
        }
    }
    apply(&session, Event::Output(parser.rest()));
    let code = container.exit_code(&spawned.exec_id).await.ok();
    {
        let mut state = session.state();
        state.ended = true;
        if state.cancelled {
            drop(state);
            session.bump();
            return;
        }
        if let Some(index) = state.queue.pop_front() {
            if let (Some(command), Some(code)) = (state.commands.get_mut(index), code) {
                command.exit_code.get_or_insert(code);
            }
        }
    }
    session.bump();
}

fn apply(session: &Session, event: Event) {
    let mut state = session.state();
    let Some(&index) = state.queue.front() else {
        return;
    };
    match event {
        Event::Output(bytes) => {
            if let Some(command) = state.commands.get_mut(index) {
                command.log.extend_from_slice(&bytes);
                // Trimmed in steps, so a chatty command does not move the log on every chunk.
                if command.log.len() > 2 * MAX_COMMAND_LOG_BYTES {
                    let excess = command.log.len() - MAX_COMMAND_LOG_BYTES;
                    command.log.drain(..excess);
                }
            }
        }
        Event::End(code) => {
            if let Some(command) = state.commands.get_mut(index) {
                command.exit_code = Some(code);
            }
            state.queue.pop_front();
            drop(state);
            session.bump();
        }
    }
}
