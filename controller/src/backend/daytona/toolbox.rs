//! A Daytona sandbox's toolbox: its daemon's API, reached through the
//! toolbox proxy (`{toolboxProxyUrl}/{sandboxId}/…`, a different host from
//! the control plane) with the same bearer key. silo uses it only to get
//! its own agent running: upload the agent and the key, and start the
//! agent in the background in a process session, which is never deleted
//! (deleting a session kills what runs in it). Shapes follow the toolbox's
//! spec in Daytona's public repository (`libs/toolbox-api-client-go/api/
//! openapi.yaml`).

use bytes::{BufMut, Bytes, BytesMut};
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::api::{encode, error_message};
use super::config::DaytonaConfig;
use super::error::DaytonaError;
use crate::backend::remote::rest::{Reply, Rest};

/// The boundary of upload bodies: never inside an agent binary or a key
/// that silo sends, which are all the toolbox is given.
const BOUNDARY: &str = "silo-upload-5f0c1e9b7a3d4c2e";
/// Seconds a plain `execute` may run (the benchmark's baseline).
const EXECUTE_TIMEOUT_SECS: u32 = 60;

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
    id: String,
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
            vec![("Authorization".to_owned(), format!("Bearer {key}"))],
        )?
        .via(config.proxy.as_ref());
        Ok(Self {
            rest,
            id: id.to_owned(),
        })
    }

    /// The error for an answer the toolbox gave instead of doing `what`.
    fn refused(&self, what: impl Into<String>, reply: &Reply) -> DaytonaError {
        DaytonaError::ToolboxRefused {
            id: self.id.clone(),
            what: what.into(),
            status: reply.status.as_u16(),
            message: error_message(reply),
        }
    }

    /// Writes `data` to `path` in the sandbox (`multipart/form-data`, field
    /// `file`).
    pub async fn upload(&self, path: &str, data: Bytes) -> Result<(), DaytonaError> {
        let mut body = BytesMut::with_capacity(data.len() + 256);
        body.put_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; \
                 filename=\"upload\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.put_slice(&data);
        body.put_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
        let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
        let reply = self
            .rest
            .send(
                Method::POST,
                &format!("/files/upload?path={}", encode(path)),
                Some(&content_type),
                &[],
                body.freeze(),
            )
            .await?;
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
