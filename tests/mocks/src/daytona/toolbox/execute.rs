//! The toolbox's `POST /process/execute`: one command through the shell,
//! its combined output and exit code in one answer.
//!
//! As the daemon: `command` runs in `sh` (the daemon pipes it to the
//! shell's stdin; the mock passes it as `sh -c` after joining stderr to
//! stdout, so their order is kept as in the daemon's one buffer), in `cwd`
//! (default: the home), with `envs` added; both together are `result`. A
//! `cwd` that does not exist answers `200` with exit code -1 and the
//! `chdir` error as `result`. `timeout` (seconds, 0 or absent: none) kills
//! the command's process tree when it elapses and answers `408`.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use silo_protocol::http::error_chain;

use super::Call;
use crate::containers::exec::{NotStarted, Output, SpawnRequest};
use crate::daytona::model::ExecuteResponse;
use crate::daytona::reply::{GoError, go_fallback};
use crate::http::{Body, json_as, read_body};

/// Largest request body read.
const MAX_JSON_BYTES: usize = 1 << 20;
/// Most output kept for `result`; more is dropped (the daemon keeps all).
pub const MAX_RESULT_BYTES: usize = 16 << 20;
/// Stands in for "no timeout" in the timer.
const NO_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// `ExecuteRequest`.
#[derive(Deserialize)]
struct ExecuteRequest {
    #[serde(default)]
    command: String,
    timeout: Option<u32>,
    cwd: Option<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
}

/// `POST /process/execute`.
pub async fn execute(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let body = match read_body(request.into_body(), MAX_JSON_BYTES).await {
        Ok(body) => body,
        Err(error) => return bad_body(call, &error.to_string()),
    };
    let parsed: ExecuteRequest = match serde_json::from_slice(&body) {
        Ok(parsed) => parsed,
        Err(error) => return bad_body(call, &error.to_string()),
    };
    if parsed.command.is_empty() {
        return bad_body(
            call,
            "Key: 'ExecuteRequest.Command' Error:Field validation for 'Command' failed on the 'required' tag",
        );
    }
    if parsed.command.trim().is_empty() {
        return call.error(
            GoError::BadRequest,
            "command cannot be empty or whitespace-only",
        );
    }
    let cwd = match &parsed.cwd {
        Some(cwd) => call.resolve(cwd),
        None => call.record.home(),
    };
    let mut env = call.user_env();
    env.extend(parsed.envs);
    let spawn = SpawnRequest {
        // One pipe for both streams, as the daemon's one buffer keeps their order.
        argv: vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!("exec 2>&1; {}", parsed.command),
        ],
        env,
        cwd: cwd.clone(),
        stdin: false,
        tty: false,
        size: None,
    };
    let container = &call.record.container;
    let mut spawned = match container.spawn(spawn).await {
        Ok(Ok(spawned)) => spawned,
        Ok(Err(NotStarted::NoDirectory)) => {
            return answer(-1, format!("chdir {cwd}: no such file or directory"));
        }
        Ok(Err(_)) => {
            return answer(
                -1,
                "exec: \"sh\": executable file not found in $PATH".into(),
            );
        }
        Err(error) => return go_fallback(&error_chain(&error)),
    };
    let limit = parsed
        .timeout
        .filter(|t| *t > 0)
        .map(|t| Duration::from_secs(u64::from(t)));
    let deadline = tokio::time::sleep(limit.unwrap_or(NO_TIMEOUT));
    tokio::pin!(deadline);
    let mut result = Vec::new();
    loop {
        tokio::select! {
            chunk = spawned.next() => match chunk {
                Some(Ok(Output::Stdout(bytes) | Output::Stderr(bytes))) => {
                    let room = MAX_RESULT_BYTES.saturating_sub(result.len());
                    result.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Some(Err(error)) => return go_fallback(&error_chain(&error)),
                None => break,
            },
            () = &mut deadline, if limit.is_some() => {
                if let Err(error) = container.signal_tree(spawned.pid, "KILL").await {
                    tracing::warn!(error = %error_chain(&error), "killing a timed-out command failed");
                }
                return call.error(GoError::RequestTimeout, "command execution timeout");
            }
        }
    }
    match container.exit_code(&spawned.exec_id).await {
        Ok(code) => answer(code, String::from_utf8_lossy(&result).into_owned()),
        Err(error) => go_fallback(&error_chain(&error)),
    }
}

fn answer(exit_code: i64, result: String) -> Response<Body> {
    json_as(
        StatusCode::OK,
        "application/json; charset=utf-8",
        &ExecuteResponse { exit_code, result },
    )
}

fn bad_body(call: &Call<'_>, reason: &str) -> Response<Body> {
    call.error(
        GoError::BadRequest,
        &format!("invalid request body: {reason}"),
    )
}
