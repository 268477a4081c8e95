//! A Daytona sandbox's toolbox: its daemon's API, reached through the
//! toolbox proxy (`{toolboxProxyUrl}/{sandboxId}/…`, a different host from
//! the control plane) with the same bearer key. silo uses it only to get
//! its own agent running: upload the agent and the key, and start the
//! agent in the background in a process session, which is never deleted
//! (deleting a session kills what runs in it). Routes and shapes follow
//! the generated `daytona-toolbox-api-client` named in `docs/providers.md`;
//! files go through `files/bulk-upload`, falling back to the older
//! `files/upload` on a daemon without it.

use bytes::{BufMut, Bytes, BytesMut};
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::api::DaytonaDialect;
use super::config::DaytonaConfig;
use super::error::DaytonaError;
use crate::backend::remote::api::Dialect;
use crate::backend::remote::rest::{Call, Reply, Rest, RestError, encode};

/// The boundary of upload bodies: never inside an agent binary or a key
/// that silo sends, which are all the toolbox is given.
const BOUNDARY: &str = "silo-upload-5f0c1e9b7a3d4c2e";
/// Seconds a plain `execute` may run (the benchmark's baseline).
const EXECUTE_TIMEOUT_SECS: u32 = 60;

/// A bulk upload's body: one `files[0].path` part naming where, one
/// `files[0].file` part with the bytes.
fn bulk_body(path: &str, data: &[u8]) -> Bytes {
    let mut body = BytesMut::with_capacity(data.len() + 512);
    put_part(&mut body, "files[0].path", None, path.as_bytes());
    put_part(&mut body, "files[0].file", Some("upload"), data);
    body.put_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body.freeze()
}

/// One multipart part (a file when it has a `filename`), its closing line
/// break included.
fn put_part(body: &mut BytesMut, name: &str, filename: Option<&str>, data: &[u8]) {
    let disposition = match filename {
        Some(file) => format!(
            "form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: application/octet-stream"
        ),
        None => format!("form-data; name=\"{name}\""),
    };
    body.put_slice(
        format!("--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n").as_bytes(),
    );
    body.put_slice(data);
    body.put_slice(b"\r\n");
}

/// `POST /process/session/{id}/exec`'s answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionExecuted {
    #[serde(rename = "cmdId")]
    cmd_id: String,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    output: Option<String>,
}

/// `GET /process/session/{id}`'s answer: its commands.
#[derive(Debug, Clone, Deserialize)]
struct SessionListed {
    #[serde(default)]
    commands: Vec<SessionCommand>,
}

/// One command of a session.
#[derive(Debug, Clone, Deserialize)]
struct SessionCommand {
    id: String,
}

/// `POST /process/execute`'s answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Executed {
    /// The exit code.
    #[serde(default)]
    pub exit_code: i32,
    /// Its output.
    pub result: String,
}

/// The toolbox of one sandbox.
#[derive(Debug, Clone)]
pub struct Toolbox {
    rest: Rest,
}

impl Toolbox {
    /// The toolbox of sandbox `id`, under `toolbox_url` (the sandbox's
    /// `toolboxProxyUrl`).
    pub fn new(config: &DaytonaConfig, toolbox_url: &str, id: &str) -> Result<Self, DaytonaError> {
        let key = config.api_key()?;
        let url = format!("{}/{}", toolbox_url.trim_end_matches('/'), encode(id));
        let rest = Rest::new(
            format!("the toolbox of Daytona sandbox {id}"),
            &url,
            config.ca_pem.clone(),
            // The control plane's key, sent the same way.
            vec![DaytonaDialect::auth_header(key)],
        )?
        .via(config.proxy.as_ref());
        Ok(Self { rest })
    }

    /// The error for an answer the toolbox gave instead of doing `what`.
    fn refused(&self, what: impl Into<String>, reply: &Reply) -> DaytonaError {
        self.rest.refused(what, reply).into()
    }

    /// Writes `data` to `path` in the sandbox through
    /// `POST /files/bulk-upload`, the route the current toolbox client
    /// moves files with; a toolbox without it (`404`, an older daemon, or a
    /// connection cut while the body went out) gets the older
    /// `POST /files/upload`.
    pub async fn upload(&self, path: &str, data: Bytes) -> Result<(), DaytonaError> {
        let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
        let call = Call::new(Method::POST, "/files/bulk-upload")
            .body(&content_type, bulk_body(path, &data));
        let sent = self.rest.send(&call).await;
        let reply = match sent {
            Ok(reply) => reply,
            // A daemon without the route may answer 404 before reading a
            // large body and close the connection, which this end sees as
            // a failed write: the older route is tried, as for a 404 read.
            Err(RestError::Unreachable { reason, .. }) => {
                tracing::debug!(%reason, "bulk upload cut off; trying files/upload");
                return self.upload_single(path, data).await;
            }
            Err(other) => return Err(other.into()),
        };
        match reply.status {
            // A bulk upload answers 400 with `errors` when any file failed.
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            StatusCode::NOT_FOUND => self.upload_single(path, data).await,
            _ => Err(self.refused(format!("upload {path}"), &reply)),
        }
    }

    /// Writes `data` to `path` through the older `POST /files/upload?path=`
    /// (one part named `file`).
    async fn upload_single(&self, path: &str, data: Bytes) -> Result<(), DaytonaError> {
        let mut body = BytesMut::with_capacity(data.len() + 256);
        put_part(&mut body, "file", Some("upload"), &data);
        body.put_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
        let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
        let route = format!("/files/upload?path={}", encode(path));
        let call = Call::new(Method::POST, &route).body(&content_type, body.freeze());
        let reply = self.rest.send(&call).await?;
        match reply.status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            _ => Err(self.refused(format!("upload {path}"), &reply)),
        }
    }

    /// Runs the shell line `command` in the background in process session
    /// `session` (made if missing): its life is the session's, not the
    /// request's. Answers once the toolbox has started it.
    pub async fn run_in_background(
        &self,
        session: &str,
        command: &str,
    ) -> Result<(), DaytonaError> {
        let made = self
            .rest
            .json(
                Method::POST,
                "/process/session",
                Some(&json!({ "sessionId": session })),
            )
            .await?;
        // A session of that name from an earlier start is as good.
        if !made.status.is_success() && made.status != StatusCode::CONFLICT {
            let exists = self
                .rest
                .json(
                    Method::GET,
                    &format!("/process/session/{}", encode(session)),
                    None,
                )
                .await?;
            if !exists.status.is_success() {
                return Err(self.refused("make a process session", &made));
            }
        }
        let reply = self
            .rest
            .json(
                Method::POST,
                &format!("/process/session/{}/exec", encode(session)),
                Some(&json!({ "command": command, "runAsync": true, "async": true })),
            )
            .await?;
        if !reply.status.is_success() {
            return Err(self.refused("start a command in a session", &reply));
        }
        let started: SessionExecuted = reply.json("a started command")?;
        match started.exit_code {
            // Run in the background, a command has no exit code yet; one
            // that has one ended at once.
            Some(code) if code != 0 => Err(DaytonaError::Unexpected {
                what: "the agent's start",
                why: format!(
                    "command {} exited at once with status {code}: {}",
                    started.cmd_id,
                    started.output.unwrap_or_default()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// What every command of process session `session` has written so
    /// far, in the order they were sent: where the agent's own log goes
    /// when it was started in one.
    pub async fn session_output(&self, session: &str) -> Result<String, DaytonaError> {
        let path = format!("/process/session/{}", encode(session));
        let reply = self.rest.json(Method::GET, &path, None).await?;
        if !reply.status.is_success() {
            return Err(self.refused("list a session's commands", &reply));
        }
        let listed: SessionListed = reply.json("a process session")?;
        let mut output = String::new();
        for command in listed.commands {
            let logs = format!("{path}/command/{}/logs", encode(&command.id));
            let reply = self.rest.json(Method::GET, &logs, None).await?;
            if !reply.status.is_success() {
                return Err(self.refused("read a command's output", &reply));
            }
            output.push_str(&String::from_utf8_lossy(&reply.body));
        }
        Ok(output)
    }

    /// Runs the shell line `command` to its end (the benchmark's baseline).
    pub async fn execute(&self, command: &str) -> Result<Executed, DaytonaError> {
        let reply = self
            .rest
            .json(
                Method::POST,
                "/process/execute",
                Some(&json!({ "command": command, "timeout": EXECUTE_TIMEOUT_SECS })),
            )
            .await?;
        match reply.status {
            StatusCode::OK => Ok(reply.json("a command's result")?),
            _ => Err(self.refused("run a command", &reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_upload_names_the_path_then_the_file() {
        let body = bulk_body("/.silo/key", b"abc");
        let text = String::from_utf8_lossy(&body);
        let path = text.find("name=\"files[0].path\"\r\n\r\n/.silo/key\r\n");
        let file = text.find("name=\"files[0].file\"; filename=\"upload\"");
        assert!(path.is_some() && file.is_some() && path < file, "{text}");
        assert!(text.contains("\r\n\r\nabc\r\n--"), "{text}");
        assert!(text.ends_with(&format!("--{BOUNDARY}--\r\n")), "{text}");
    }
}
