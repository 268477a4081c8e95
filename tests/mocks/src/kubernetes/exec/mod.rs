//! The `exec` subresource of a pod (`GET`/`POST
//! …/pods/{name}/exec?command=…&container=…&stdin=…&stdout=…&stderr=…&tty=…`):
//! the request checked as the API server and the kubelet check it, the
//! connection upgraded, the command run in the pod's container
//! ([`process`]) and its streams carried one of two ways:
//!
//! - WebSocket channels ([`channels`]): `v5.channel.k8s.io` (kubectl's
//!   only offer since 1.30, answered as the API server's stream translator
//!   answers it), `v4.channel.k8s.io` (what the API server hands to the
//!   kubelet), and `channel.k8s.io` or no subprotocol (the kubelet's
//!   first version, errors as plain text).
//! - SPDY/3.1 ([`streams`]): `Upgrade: SPDY/3.1` with
//!   `X-Stream-Protocol-Version` `v5.channel.k8s.io` or
//!   `v4.channel.k8s.io`, kubectl's fallback when the WebSocket upgrade is
//!   refused (or `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`).
//!
//! Either way the command's end is reported as a `Status` on the error
//! stream ([`Exec::status`]), with the exit code as the `ExitCode` cause.

pub mod channels;
pub mod process;
pub mod streams;

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use self::process::{Command, Outcome};
use super::Cluster;
use super::model::Key;
use super::pods::PODS;
use super::status::{bad_request, failure, not_found};
use super::upgrade::{
    CHANNEL_V1, CHANNEL_V4, CHANNEL_V5, Offer, negotiate_spdy, offer, switch_to_spdy,
    switch_to_websocket,
};
use crate::http::{Body, query_value};

/// Most exec sessions running at once in one mock (each holds an engine
/// exec and its streams); more are refused as an overloaded API server
/// refuses requests.
pub const MAX_EXECS: usize = 64;
/// The stream protocols served over SPDY, the kubelet's newest two.
const SPDY_SERVED: &[&str] = &[CHANNEL_V5, CHANNEL_V4];

/// Who, in a real cluster, writes the error stream for this protocol;
/// their words differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// The API server's WebSocket translator (`v5`): it runs the command
    /// through its own SPDY client, so the kubelet's status comes back
    /// wrapped once more.
    Translator,
    /// The kubelet (`v4` over WebSocket, SPDY): a `Status` in JSON.
    Kubelet,
    /// The kubelet's first protocol: nothing on success, else the message.
    Text,
}

/// An exec that passed the checks: what to run and how to answer.
#[derive(Debug, Clone)]
pub struct Exec {
    /// The command and its stdin and terminal.
    pub command: Command,
    /// The client reads stdout.
    pub stdout: bool,
    /// The client reads stderr (never with a terminal: it merges both).
    pub stderr: bool,
    /// How the end is reported.
    pub dialect: Dialect,
}

/// A query flag as the API server converts it: absent, `0` or `false`
/// (any case) is false, anything else (even empty) is true.
fn flag(pairs: &[(String, String)], name: &str) -> bool {
    query_value(pairs, name).is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
}

impl Exec {
    /// Reads the query; what the kubelet refuses (a `400`).
    fn parse(pairs: &[(String, String)]) -> Result<Self, String> {
        let argv: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let tty = flag(pairs, "tty");
        let stdin = flag(pairs, "stdin");
        let stdout = flag(pairs, "stdout");
        // A terminal merges stderr into stdout; the kubelet drops the stream.
        let stderr = flag(pairs, "stderr") && !tty;
        if !stdin && !stdout && !stderr {
            return Err("you must specify at least 1 of stdin, stdout, stderr".to_owned());
        }
        if argv.is_empty() {
            return Err("you must specify at least one command for the container".to_owned());
        }
        Ok(Self {
            command: Command { argv, stdin, tty },
            stdout,
            stderr,
            dialect: Dialect::Kubelet,
        })
    }

    /// What the error stream carries when the command ended so; `None`:
    /// nothing (success in the first protocol).
    pub fn status(&self, outcome: &Outcome) -> Option<Vec<u8>> {
        let status = match outcome {
            Outcome::Exited(0) => Status {
                status: Some("Success".to_owned()),
                ..Default::default()
            },
            Outcome::Exited(code) => {
                let cause = match self.dialect {
                    // client-go's reading of the kubelet's status.
                    Dialect::Translator => format!("command terminated with exit code {code}"),
                    // containerd's error, Go printing the command as a slice.
                    Dialect::Kubelet | Dialect::Text => format!(
                        "error executing command [{}], exit code {code}",
                        self.command.argv.join(" ")
                    ),
                };
                Status {
                    status: Some("Failure".to_owned()),
                    reason: Some("NonZeroExitCode".to_owned()),
                    message: Some(format!(
                        "command terminated with non-zero exit code: {cause}"
                    )),
                    details: Some(StatusDetails {
                        causes: Some(vec![StatusCause {
                            reason: Some("ExitCode".to_owned()),
                            message: Some(code.to_string()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            }
            Outcome::Failed(error) => {
                let mut error = format!("error executing command in container: {error}");
                if self.dialect == Dialect::Translator {
                    // The translator's client turns the kubelet's status
                    // back into a plain error and wraps that in turn.
                    error = format!("Internal error occurred: {error}");
                }
                internal(&error)
            }
        };
        match self.dialect {
            Dialect::Text if status.status.as_deref() == Some("Success") => None,
            Dialect::Text => Some(status.message.unwrap_or_default().into_bytes()),
            Dialect::Translator | Dialect::Kubelet => Some(bare_json(&status)),
        }
    }
}

/// The API's `InternalError` for `error`.
fn internal(error: &str) -> Status {
    Status {
        status: Some("Failure".to_owned()),
        code: Some(i32::from(StatusCode::INTERNAL_SERVER_ERROR.as_u16())),
        reason: Some("InternalError".to_owned()),
        message: Some(format!("Internal error occurred: {error}")),
        details: Some(StatusDetails {
            causes: Some(vec![StatusCause {
                message: Some(error.to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A `Status` as the error stream carries it: the kubelet marshals the
/// bare struct, without `kind` and `apiVersion`
/// (`{"metadata":{},"status":"Success"}`).
fn bare_json(status: &Status) -> Vec<u8> {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        fields.remove("kind");
        fields.remove("apiVersion");
    }
    serde_json::to_vec(&value).unwrap_or_default()
}

/// The container to run in: the one named, else the pod's only one; what
/// the API server refuses (a `400`) otherwise.
fn container_name(pod: &Pod, pod_name: &str, asked: Option<&str>) -> Result<String, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let names = |containers: &[k8s_openapi::api::core::v1::Container]| {
        containers
            .iter()
            .map(|c| c.name.clone())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let inits = spec.init_containers.clone().unwrap_or_default();
    match asked {
        Some(name) if spec.containers.iter().chain(&inits).any(|c| c.name == name) => {
            Ok(name.to_owned())
        }
        Some(name) => Err(format!("container {name} is not valid for pod {pod_name}")),
        None => match spec.containers.as_slice() {
            [only] => Ok(only.name.clone()),
            [] => Err(format!(
                "a container name must be specified for pod {pod_name}"
            )),
            many => {
                let mut message = format!(
                    "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                    names(many)
                );
                if !inits.is_empty() {
                    message.push_str(&format!(
                        " or one of the init containers: [{}]",
                        names(&inits)
                    ));
                }
                Err(message)
            }
        },
    }
}

/// The engine id of `name` if it is running now.
fn running(pod: &Pod, name: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == name && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("docker://"))
        .map(str::to_owned)
}

/// Answers an exec request for the pod under `key`.
pub fn handle(
    cluster: &Arc<Cluster>,
    key: &Key,
    mut request: Request<Incoming>,
    pairs: &[(String, String)],
) -> Response<Body> {
    let Some(pod) = cluster.store.pod(key) else {
        return not_found(&PODS, &key.name);
    };
    let asked = query_value(pairs, "container").filter(|c| !c.is_empty());
    let name = match container_name(&pod, &key.name, asked) {
        Ok(name) => name,
        Err(message) => return bad_request(message),
    };
    let mut exec = match Exec::parse(pairs) {
        Ok(exec) => exec,
        Err(message) => return bad_request(message),
    };
    let Some(id) = running(&pod, &name) else {
        // The kubelet finds no running container of that name; the
        // message is the one clients print for a pod not (yet) running.
        return bad_request(format!(
            "unable to upgrade connection: container not found ({name:?})"
        ));
    };
    let Ok(permit) = cluster.execs.clone().try_acquire_owned() else {
        return failure(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "Too many requests, please try again later.".to_owned(),
            None,
        );
    };
    let container = cluster.engine.container(&id);
    let cancel = cluster.cancel.clone();
    let upgrade = hyper::upgrade::on(&mut request);
    match offer(&request) {
        Ok(Offer::Spdy(versions)) => {
            let version = match negotiate_spdy(&versions, SPDY_SERVED) {
                Ok(version) => version,
                Err(refusal) => return refusal.answer(),
            };
            tokio::spawn(async move {
                match upgrade.await {
                    Ok(upgraded) => {
                        streams::serve(TokioIo::new(upgraded), exec, container, cancel).await;
                    }
                    Err(error) => tracing::debug!(%error, "an exec upgrade failed"),
                }
                drop(permit);
            });
            switch_to_spdy(version)
        }
        Ok(Offer::WebSocket(offers)) => {
            let has = |p: &str| offers.iter().any(|o| o == p);
            let (chosen, dialect) = if has(CHANNEL_V5) {
                (Some(CHANNEL_V5), Dialect::Translator)
            } else if has(CHANNEL_V4) {
                (Some(CHANNEL_V4), Dialect::Kubelet)
            } else if has(CHANNEL_V1) {
                (Some(CHANNEL_V1), Dialect::Text)
            } else if offers.is_empty() {
                (None, Dialect::Text)
            } else {
                return bad_request(format!(
                    "unable to upgrade: none of the offered subprotocols {offers:?} is served ({CHANNEL_V5}, {CHANNEL_V4}, {CHANNEL_V1})"
                ));
            };
            exec.dialect = dialect;
            let response = match switch_to_websocket(&request, chosen) {
                Ok(response) => response,
                Err(refusal) => return refusal.answer(),
            };
            tokio::spawn(async move {
                match upgrade.await {
                    Ok(upgraded) => {
                        let io = TokioIo::new(upgraded);
                        let socket = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
                        channels::serve(socket, exec, container, cancel).await;
                    }
                    Err(error) => tracing::debug!(%error, "an exec upgrade failed"),
                }
                drop(permit);
            });
            response
        }
        Err(refusal) => refusal.answer(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn exec(dialect: Dialect) -> Exec {
        let mut exec = Exec::parse(&pairs(&[
            ("command", "sh"),
            ("command", "-c"),
            ("command", "exit 3"),
            ("stdout", "true"),
        ]))
        .unwrap();
        exec.dialect = dialect;
        exec
    }

    fn json(bytes: Option<Vec<u8>>) -> serde_json::Value {
        serde_json::from_slice(&bytes.unwrap()).unwrap()
    }

    #[test]
    fn flags_read_as_the_api_server_reads_them() {
        let read = Exec::parse(&pairs(&[
            ("command", "true"),
            ("stdin", "False"),
            ("stdout", "1"),
            ("stderr", ""),
            ("tty", "0"),
        ]))
        .unwrap();
        assert!(!read.command.stdin && read.stdout && read.stderr && !read.command.tty);
        let tty = Exec::parse(&pairs(&[
            ("command", "sh"),
            ("stderr", "true"),
            ("tty", "true"),
        ]));
        assert_eq!(
            tty.unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
        assert!(Exec::parse(&pairs(&[("stdout", "true")])).is_err());
    }

    #[test]
    fn the_end_is_reported_as_each_server_reports_it() {
        let kubelet = exec(Dialect::Kubelet);
        assert_eq!(
            json(kubelet.status(&Outcome::Exited(0))),
            serde_json::json!({"metadata": {}, "status": "Success"})
        );
        assert_eq!(
            json(kubelet.status(&Outcome::Exited(3))),
            serde_json::json!({
                "metadata": {},
                "status": "Failure",
                "message": "command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
            })
        );
        let translator = json(exec(Dialect::Translator).status(&Outcome::Exited(3)));
        assert_eq!(
            translator["message"],
            "command terminated with non-zero exit code: command terminated with exit code 3"
        );
        let failed = json(exec(Dialect::Translator).status(&Outcome::Failed("boom".into())));
        assert_eq!(failed["code"], 500);
        assert_eq!(
            failed["message"],
            "Internal error occurred: Internal error occurred: error executing command in container: boom"
        );
        let text = exec(Dialect::Text);
        assert_eq!(text.status(&Outcome::Exited(0)), None);
        assert!(
            String::from_utf8(text.status(&Outcome::Exited(3)).unwrap())
                .unwrap()
                .ends_with("exit code 3")
        );
    }
}
