//! envd, E2B's daemon inside each sandbox, reached through the sandbox
//! proxy on its port: silo uses it only to get its own agent running (upload
//! the agent and the key, start the agent in the background). Shapes follow
//! e2b-dev/infra's `packages/envd/spec/envd.yaml` (files) and
//! `packages/envd/spec/process/process.proto` (the `process.Process`
//! Connect service, JSON codec).
//!
//! A process envd starts outlives the request that started it; only a
//! `Connect-Timeout-Ms` deadline would end it, so silo sends none.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Buf, Bytes, BytesMut};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::json;

use super::E2bRef;
use super::config::E2bConfig;
use super::error::E2bError;
use crate::backend::remote::rest::{Call, Reply, Rest, encode};
use crate::client::{ClientError, transport};

/// envd's port.
pub const ENVD_PORT: u16 = 49983;
/// The header envd wants on secure sandboxes.
const ENVD_TOKEN_HEADER: &str = "X-Access-Token";
/// The user silo's files and agent belong to in a VM.
const USER: &str = "root";
/// A Connect envelope's header: one flags byte and a big-endian length.
const ENVELOPE_HEADER: usize = 5;
/// The flag of the envelope that ends a stream.
const END_STREAM: u8 = 0x02;
/// Largest envelope accepted from envd.
const MAX_ENVELOPE: usize = 4 << 20;

/// envd of one sandbox.
#[derive(Debug, Clone)]
pub struct Envd {
    rest: Rest,
}

/// How a process envd ran ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// Its exit code (0 when envd leaves it out, as proto3 JSON does).
    pub exit_code: i32,
    /// Its output, stdout and stderr together, for error messages.
    pub output: String,
}

impl Envd {
    /// envd of sandbox `e2b`, through the proxy `config` names, with the
    /// sandbox's access token when it has one.
    pub fn of(config: &E2bConfig, e2b: &E2bRef) -> Self {
        let headers = e2b
            .envd_token
            .iter()
            .map(|token| (ENVD_TOKEN_HEADER.to_owned(), token.clone()))
            .collect();
        let endpoint = config.route(
            ENVD_PORT,
            &e2b.sandbox_id,
            e2b.domain.as_deref(),
            Vec::new(),
        );
        let what = format!("envd of E2B sandbox {}", e2b.sandbox_id);
        Self {
            rest: Rest::at(what, endpoint, headers),
        }
    }

    /// Writes `bytes` to `path` in the sandbox, parents made, as root.
    pub async fn upload(&self, path: &str, bytes: Bytes) -> Result<(), E2bError> {
        let query = format!("/files?path={}&username={USER}", encode(path));
        let call = Call::new(Method::POST, &query).body("application/octet-stream", bytes);
        let reply = self.rest.send(&call).await?;
        match reply.status {
            StatusCode::OK => Ok(()),
            _ => Err(self.rest.refused(format!("upload {path}"), &reply).into()),
        }
    }

    /// Runs `argv` as root and waits for it to end.
    pub async fn run(&self, argv: &[String]) -> Result<Ended, E2bError> {
        let mut stream = self.start(argv, &BTreeMap::new()).await?;
        let mut output = String::new();
        loop {
            match stream.next().await? {
                Some(Event::Data(bytes)) => output.push_str(&String::from_utf8_lossy(&bytes)),
                Some(Event::End(exit_code)) => return Ok(Ended { exit_code, output }),
                Some(Event::Start | Event::Other) => {}
                None => {
                    return Err(E2bError::Envd(format!(
                        "the stream of {:?} ended before the process did",
                        argv.first()
                    )));
                }
            }
        }
    }

    /// Starts `argv` as root in the background with `envs` added to its
    /// environment: answers once envd says it started, and leaves it running
    /// when the stream is dropped.
    pub async fn spawn(
        &self,
        argv: &[String],
        envs: &BTreeMap<String, String>,
    ) -> Result<(), E2bError> {
        let mut stream = self.start(argv, envs).await?;
        loop {
            match stream.next().await? {
                Some(Event::Start) => return Ok(()),
                Some(Event::End(code)) => {
                    return Err(E2bError::Envd(format!(
                        "{:?} exited at once with status {code}",
                        argv.first()
                    )));
                }
                Some(Event::Data(_) | Event::Other) => {}
                None => return Err(E2bError::Envd("the process stream ended at once".into())),
            }
        }
    }

    /// Starts `argv` like [`Envd::spawn`], then races its end against
    /// `ready`: `Ok(value)` once `ready` gives it with the process still
    /// running (which then runs on), `Err(code)` if the process ended first.
    pub async fn spawn_racing<R>(
        &self,
        argv: &[String],
        envs: &BTreeMap<String, String>,
        ready: impl std::future::Future<Output = R>,
    ) -> Result<Result<R, i32>, E2bError> {
        let mut stream = self.start(argv, envs).await?;
        let ended = async {
            loop {
                match stream.next().await? {
                    Some(Event::End(code)) => return Ok(code),
                    Some(_) => {}
                    None => {
                        return Err(E2bError::Envd(
                            "the process stream ended before the process did".into(),
                        ));
                    }
                }
            }
        };
        tokio::select! {
            value = ready => Ok(Ok(value)),
            code = ended => Ok(Err(code?)),
        }
    }

    async fn start(
        &self,
        argv: &[String],
        envs: &BTreeMap<String, String>,
    ) -> Result<ProcessStream, E2bError> {
        let (cmd, args) = argv
            .split_first()
            .ok_or_else(|| E2bError::Envd("nothing to run".into()))?;
        let request = json!({
            "process": { "cmd": cmd, "args": args, "envs": envs },
            "stdin": false,
        });
        let body = envelope(&serde_json::to_vec(&request).unwrap_or_default());
        let auth = format!("Basic {}", basic_user(USER));
        let call = Call::new(Method::POST, "/process.Process/Start")
            .body("application/connect+json", body)
            .header("Connect-Protocol-Version", "1")
            .header("Authorization", &auth);
        let response =
            self.rest
                .open_stream(&call)
                .await
                .map_err(|source| E2bError::EnvdUnreachable {
                    what: self.rest.what().to_owned(),
                    source,
                })?;
        if response.status() != StatusCode::OK {
            let (head, body) = response.into_parts();
            // The body is only for the refusal's message: one cut off
            // leaves the message empty, not the refusal untold.
            let body = transport::whole(body).await.unwrap_or_default();
            let reply = Reply {
                status: head.status,
                headers: head.headers,
                body,
            };
            return Err(self.rest.refused("start a process", &reply).into());
        }
        Ok(ProcessStream {
            body: response.into_body(),
            buffer: BytesMut::new(),
        })
    }
}

/// One event of a process stream, as much of it as silo needs.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Start,
    Data(Vec<u8>),
    End(i32),
    Other,
}

/// A `Start` answer: Connect envelopes of `{"event": …}` messages.
struct ProcessStream {
    body: hyper::body::Incoming,
    buffer: BytesMut,
}

impl ProcessStream {
    async fn next(&mut self) -> Result<Option<Event>, E2bError> {
        loop {
            if let Some((flags, payload)) = take_envelope(&mut self.buffer)? {
                if flags & END_STREAM != 0 {
                    return end_of_stream(&payload).map(|()| None);
                }
                return parse_event(&payload).map(Some);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(error)) => {
                    return Err(E2bError::EnvdUnreachable {
                        what: "envd's process stream".into(),
                        source: ClientError::http(error),
                    });
                }
                None => return Ok(None),
            }
        }
    }
}

/// A message in a Connect envelope.
fn envelope(payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(ENVELOPE_HEADER + payload.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.freeze()
}

/// The next whole envelope in `buffer`, if there is one.
fn take_envelope(buffer: &mut BytesMut) -> Result<Option<(u8, Bytes)>, E2bError> {
    if buffer.len() < ENVELOPE_HEADER {
        return Ok(None);
    }
    let flags = buffer[0];
    let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
    if len > MAX_ENVELOPE {
        return Err(E2bError::Envd(format!(
            "an envelope of {len} bytes is too large"
        )));
    }
    if buffer.len() < ENVELOPE_HEADER + len {
        return Ok(None);
    }
    buffer.advance(ENVELOPE_HEADER);
    Ok(Some((flags, buffer.split_to(len).freeze())))
}

#[derive(Deserialize)]
struct StartResponse {
    #[serde(default)]
    event: Option<ProcessEvent>,
}

#[derive(Deserialize)]
struct ProcessEvent {
    #[serde(default)]
    start: Option<serde_json::Value>,
    #[serde(default)]
    data: Option<DataEvent>,
    #[serde(default)]
    end: Option<EndEvent>,
}

#[derive(Deserialize)]
struct DataEvent {
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EndEvent {
    #[serde(default)]
    exit_code: i32,
}

fn parse_event(payload: &[u8]) -> Result<Event, E2bError> {
    let message: StartResponse = serde_json::from_slice(payload)
        .map_err(|e| E2bError::Envd(format!("an unreadable process event: {e}")))?;
    let Some(event) = message.event else {
        return Ok(Event::Other);
    };
    if event.start.is_some() {
        return Ok(Event::Start);
    }
    if let Some(end) = event.end {
        return Ok(Event::End(end.exit_code));
    }
    if let Some(data) = event.data {
        let text = data.stdout.or(data.stderr).unwrap_or_default();
        // Output is only ever shown in messages: unreadable bytes are dropped.
        return Ok(Event::Data(BASE64.decode(text).unwrap_or_default()));
    }
    Ok(Event::Other)
}

/// The end-stream message: `{}`, or `{"error": {code, message}}`.
fn end_of_stream(payload: &[u8]) -> Result<(), E2bError> {
    let value: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
    match value.get("error") {
        None => Ok(()),
        Some(error) => Err(E2bError::Envd(format!(
            "{}: {}",
            error
                .get("code")
                .and_then(|c| c.as_str())
                .unwrap_or("error"),
            error.get("message").and_then(|m| m.as_str()).unwrap_or("")
        ))),
    }
}

/// `user:` in base64, envd's way of naming the user of a process.
fn basic_user(user: &str) -> String {
    BASE64.encode(format!("{user}:"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn envelopes_frame_and_unframe() {
        let mut buffer = BytesMut::new();
        buffer.extend_from_slice(&envelope(br#"{"event":{"start":{"pid":7}}}"#));
        buffer.extend_from_slice(&envelope(br#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#));
        buffer.extend_from_slice(&envelope(br#"{"event":{"end":{"exited":true}}}"#));
        let mut end = BytesMut::new();
        end.extend_from_slice(&[END_STREAM, 0, 0, 0, 2]);
        end.extend_from_slice(b"{}");
        buffer.extend_from_slice(&end);
        buffer.extend_from_slice(&[0, 0]); // a partial header waits for more

        let mut events = Vec::new();
        while let Some((flags, payload)) = take_envelope(&mut buffer).unwrap() {
            if flags & END_STREAM != 0 {
                end_of_stream(&payload).unwrap();
                break;
            }
            events.push(parse_event(&payload).unwrap());
        }
        assert_eq!(
            events,
            [
                Event::Start,
                Event::Data(b"hello\n".to_vec()),
                Event::End(0)
            ]
        );
        assert_eq!(buffer.len(), 2);
        let err = end_of_stream(br#"{"error":{"code":"not_found","message":"no"}}"#);
        assert!(err.unwrap_err().to_string().contains("not_found"));
    }

    #[test]
    fn the_user_goes_in_basic_auth_with_an_empty_password() {
        assert_eq!(basic_user("root"), "cm9vdDo=");
    }
}
