//! `process.Process` as envd serves it (e2b-dev/infra
//! `packages/envd/spec/process/process.proto`): `Start` (server stream),
//! `SendSignal` and `List` (unary).
//!
//! A started process runs as a `docker exec` and outlives its stream: when
//! the client goes away the mock keeps reading the output (and drops it),
//! as envd runs processes under a background context. `Connect-Timeout-Ms`
//! above 0 is the process's lifetime: when it elapses the process gets
//! SIGKILL and the stream, if still open, ends with `deadline_exceeded`.
//! The engine reports a signalled exec as exit code `128 + n`; the mock
//! reports it as envd would (`signal: killed`, exit code -1) only when it
//! sent that signal itself (`SendSignal` or the timeout).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::connect::{
    Code, RpcError, end_stream, envelope, stream_error, stream_request, stream_response,
    unary_error, unary_ok, unary_request,
};
use super::{resolve_path, user_from_headers};
use crate::containers::Container;
use crate::containers::exec::{NotStarted, Output, SpawnRequest, Spawned};
use crate::e2b::store::Record;
use crate::http::Body;
use silo_protocol::http::error_chain;

/// Keepalive period when `Keepalive-Ping-Interval` is absent or unusable.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
/// Envelopes queued for a slow client before the process's output waits.
const EVENT_QUEUE: usize = 64;
/// Stands in for "no deadline" in the pump's timer.
const NO_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// `ProcessConfig`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessConfig {
    /// The program.
    #[serde(default)]
    pub cmd: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment added for it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<Value>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(Deserialize)]
struct SendSignalRequest {
    #[serde(default)]
    process: Option<Value>,
    #[serde(default)]
    signal: Value,
}

/// The signals `SendSignal` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Kill,
    Term,
}

impl Signal {
    fn number(self) -> i64 {
        match self {
            Signal::Kill => 9,
            Signal::Term => 15,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Signal::Kill => "KILL",
            Signal::Term => "TERM",
        }
    }

    /// Go's `ProcessState.String()` for a process it ended.
    fn status(self) -> &'static str {
        match self {
            Signal::Kill => "signal: killed",
            Signal::Term => "signal: terminated",
        }
    }
}

struct Entry {
    config: ProcessConfig,
    tag: Option<String>,
    signalled: Option<Signal>,
}

/// The processes of one sandbox started through envd, by pid.
#[derive(Default)]
pub struct ProcessTable {
    entries: Mutex<BTreeMap<u32, Entry>>,
}

impl ProcessTable {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pid a `ProcessSelector` (`{"pid":N}` or `{"tag":"…"}`) names.
    fn find(&self, selector: Option<&Value>) -> Result<u32, RpcError> {
        let entries = self.lock();
        if let Some(pid) = selector.and_then(|s| s.get("pid")) {
            let pid = pid
                .as_u64()
                .or_else(|| pid.as_str().and_then(|p| p.parse().ok()))
                .and_then(|p| u32::try_from(p).ok())
                .ok_or_else(|| RpcError::new(Code::InvalidArgument, "invalid pid"))?;
            return entries.contains_key(&pid).then_some(pid).ok_or_else(|| {
                RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
            });
        }
        let tag = selector
            .and_then(|s| s.get("tag"))
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::new(Code::InvalidArgument, "invalid process selector"))?;
        entries
            .iter()
            .find(|(_, e)| e.tag.as_deref() == Some(tag))
            .map(|(pid, _)| *pid)
            .ok_or_else(|| {
                RpcError::new(Code::NotFound, format!("process with tag {tag} not found"))
            })
    }
}

/// `process.Process/Start`.
pub async fn start(
    record: &Record,
    request: Request<Incoming>,
    cancel: &CancellationToken,
) -> Response<Body> {
    let headers = request.headers().clone();
    let user = match user_from_headers(&headers) {
        Ok(user) => user,
        Err(error) => return stream_error(&error),
    };
    let timeout = match deadline_of(&headers) {
        Ok(timeout) => timeout,
        Err(error) => return stream_error(&error),
    };
    let message: StartRequest = match stream_request(request).await {
        Ok(Ok(message)) => message,
        Ok(Err(error)) => return stream_error(&error),
        Err(refused) => return refused,
    };
    if message.pty.is_some() {
        return stream_error(&RpcError::new(
            Code::Unimplemented,
            "the mock does not model PTYs",
        ));
    }
    let config = message.process;
    let cwd = resolve_path(config.cwd.as_deref().unwrap_or(""), user);
    let mut env = vec![
        ("HOME".to_owned(), user.home.to_owned()),
        ("USER".to_owned(), user.name.to_owned()),
    ];
    env.extend(config.envs.clone());
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.clone());
    let spawn = SpawnRequest {
        argv,
        env,
        cwd: cwd.clone(),
        stdin: message.stdin.unwrap_or(true),
        tty: false,
        size: None,
    };
    let spawned = match record.container.spawn(spawn).await {
        Ok(Ok(spawned)) => spawned,
        Ok(Err(refused)) => {
            return stream_error(&RpcError::new(
                Code::InvalidArgument,
                not_started(&refused, &config.cmd, &cwd),
            ));
        }
        Err(error) => {
            return stream_error(&RpcError::new(
                Code::Internal,
                format!("error starting process: {}", error_chain(&error)),
            ));
        }
    };
    record.processes.lock().insert(
        spawned.pid,
        Entry {
            config,
            tag: message.tag,
            signalled: None,
        },
    );
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    let pump = Pump {
        container: record.container.clone(),
        table: record.processes.clone(),
        client: Some(tx),
        keepalive: keepalive_of(&headers),
        timeout,
    };
    tokio::spawn(pump.run(spawned, cancel.clone()));
    stream_response(rx)
}

/// `process.Process/SendSignal`.
pub async fn send_signal(record: &Record, request: Request<Incoming>) -> Response<Body> {
    let message: SendSignalRequest = match unary_request(request).await {
        Ok(message) => message,
        Err(refused) => return refused,
    };
    let pid = match record.processes.find(message.process.as_ref()) {
        Ok(pid) => pid,
        Err(error) => return unary_error(error),
    };
    let signal = match &message.signal {
        Value::String(s) if s == "SIGNAL_SIGKILL" => Signal::Kill,
        Value::Number(n) if n.as_u64() == Some(9) => Signal::Kill,
        Value::String(s) if s == "SIGNAL_SIGTERM" => Signal::Term,
        Value::Number(n) if n.as_u64() == Some(15) => Signal::Term,
        other => {
            let name = other
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| other.to_string());
            return unary_error(RpcError::new(
                Code::Unimplemented,
                format!("invalid signal: {name}"),
            ));
        }
    };
    if let Some(entry) = record.processes.lock().get_mut(&pid) {
        entry.signalled = Some(signal);
    }
    match record.container.signal(pid, signal.name()).await {
        Ok(_) => unary_ok(&json!({})),
        Err(error) => unary_error(RpcError::new(
            Code::Internal,
            format!("error sending signal: {}", error_chain(&error)),
        )),
    }
}

/// `process.Process/List`.
pub async fn list(record: &Record, request: Request<Incoming>) -> Response<Body> {
    if let Err(refused) = unary_request::<Value>(request).await {
        return refused;
    }
    let processes: Vec<Value> = record
        .processes
        .lock()
        .iter()
        .map(|(pid, entry)| {
            let mut info = Map::new();
            info.insert("config".into(), json!(entry.config));
            info.insert("pid".into(), json!(pid));
            if let Some(tag) = &entry.tag {
                info.insert("tag".into(), json!(tag));
            }
            Value::Object(info)
        })
        .collect();
    if processes.is_empty() {
        return unary_ok(&json!({}));
    }
    unary_ok(&json!({ "processes": processes }))
}

/// Relays one process's events to its client while there is one, and
/// reads its output to the end either way.
struct Pump {
    container: Container,
    table: std::sync::Arc<ProcessTable>,
    client: Option<mpsc::Sender<Bytes>>,
    keepalive: Duration,
    timeout: Option<Duration>,
}

impl Pump {
    async fn run(mut self, mut spawned: Spawned, cancel: CancellationToken) {
        let pid = spawned.pid;
        self.send(envelope(&json!({"event": {"start": {"pid": pid}}})))
            .await;
        let deadline = tokio::time::sleep(self.timeout.unwrap_or(NO_DEADLINE));
        tokio::pin!(deadline);
        let mut armed = self.timeout.is_some();
        let mut keepalive =
            tokio::time::interval_at(tokio::time::Instant::now() + self.keepalive, self.keepalive);
        loop {
            tokio::select! {
                chunk = spawned.next() => match chunk {
                    None => break,
                    Some(Ok(output)) => {
                        let (stream, bytes) = match output {
                            Output::Stdout(b) => ("stdout", b),
                            Output::Stderr(b) => ("stderr", b),
                        };
                        let event = json!({"event": {"data": {stream: STANDARD.encode(&bytes)}}});
                        self.send(envelope(&event)).await;
                        keepalive.reset();
                    }
                    Some(Err(error)) => {
                        tracing::debug!(pid, error = %error_chain(&error), "process output broke off");
                        break;
                    }
                },
                _ = keepalive.tick(), if self.client.is_some() => {
                    self.send(envelope(&json!({"event": {"keepalive": {}}}))).await;
                }
                () = &mut deadline, if armed => {
                    armed = false;
                    if let Some(entry) = self.table.lock().get_mut(&pid) {
                        entry.signalled = Some(Signal::Kill);
                    }
                    if let Err(error) = self.container.signal(pid, Signal::Kill.name()).await {
                        tracing::warn!(pid, error = %error_chain(&error), "killing a timed-out process failed");
                    }
                    let error = RpcError::new(Code::DeadlineExceeded, "context deadline exceeded");
                    self.send(end_stream(Some(&error))).await;
                    self.client = None;
                }
                () = cancel.cancelled() => return,
            }
        }
        let signalled = self.table.lock().remove(&pid).and_then(|e| e.signalled);
        match self.container.exit_code(&spawned.exec_id).await {
            Ok(code) => {
                self.send(envelope(
                    &json!({"event": {"end": end_event(code, signalled)}}),
                ))
                .await;
                self.send(end_stream(None)).await;
            }
            Err(error) => {
                let error = RpcError::new(Code::Internal, error_chain(&error));
                self.send(end_stream(Some(&error))).await;
            }
        }
    }

    /// Sends to the client while it listens; after that, nothing.
    async fn send(&mut self, bytes: Bytes) {
        let Some(client) = &self.client else {
            return;
        };
        if client.send(bytes).await.is_err() {
            self.client = None;
        }
    }
}

/// The `end` event, with default values left out as protojson does.
fn end_event(code: i64, signalled: Option<Signal>) -> Value {
    let mut end = Map::new();
    match signalled.filter(|s| code == 128 + s.number()) {
        Some(signal) => {
            end.insert("exitCode".into(), json!(-1));
            end.insert("status".into(), json!(signal.status()));
            end.insert("error".into(), json!(signal.status()));
        }
        None => {
            let status = format!("exit status {code}");
            if code != 0 {
                end.insert("exitCode".into(), json!(code));
                end.insert("error".into(), json!(status));
            }
            end.insert("exited".into(), json!(true));
            end.insert("status".into(), json!(status));
        }
    }
    Value::Object(end)
}

/// Go's message for a process that could not start.
fn not_started(reason: &NotStarted, cmd: &str, cwd: &str) -> String {
    match reason {
        NotStarted::NoDirectory => {
            format!("error starting process: chdir {cwd}: no such file or directory")
        }
        NotStarted::NoProgram if cmd.contains('/') => {
            format!("error starting process: fork/exec {cmd}: no such file or directory")
        }
        NotStarted::NoProgram => {
            format!("error starting process: exec: {cmd:?}: executable file not found in $PATH")
        }
        NotStarted::NotExecutable => {
            format!("error starting process: fork/exec {cmd}: permission denied")
        }
    }
}

/// `Connect-Timeout-Ms`: `None` when absent or 0.
fn deadline_of(headers: &HeaderMap) -> Result<Option<Duration>, RpcError> {
    let Some(value) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default();
    let ms: i64 = text.parse().map_err(|_| {
        RpcError::new(
            Code::InvalidArgument,
            format!("strconv.Atoi: parsing {text:?}: invalid syntax"),
        )
    })?;
    Ok((ms > 0).then(|| Duration::from_millis(ms.unsigned_abs())))
}

/// `Keepalive-Ping-Interval` in seconds, or the default.
fn keepalive_of(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_KEEPALIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_leave_defaults_out() {
        assert_eq!(
            end_event(0, None),
            json!({"exited": true, "status": "exit status 0"})
        );
        assert_eq!(
            end_event(2, None),
            json!({"exitCode": 2, "exited": true, "status": "exit status 2", "error": "exit status 2"})
        );
        assert_eq!(
            end_event(137, Some(Signal::Kill)),
            json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"})
        );
        assert_eq!(end_event(137, None)["exitCode"], json!(137));
    }

    #[test]
    fn deadlines_follow_the_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(deadline_of(&headers), Ok(None));
        headers.insert("connect-timeout-ms", "0".parse().unwrap());
        assert_eq!(deadline_of(&headers), Ok(None));
        headers.insert("connect-timeout-ms", "1500".parse().unwrap());
        assert_eq!(deadline_of(&headers), Ok(Some(Duration::from_millis(1500))));
        headers.insert("connect-timeout-ms", "soon".parse().unwrap());
        assert!(deadline_of(&headers).is_err());
    }
}
