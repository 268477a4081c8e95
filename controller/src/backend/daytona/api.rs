//! Daytona's control plane (`Authorization: Bearer`): create, look at, find
//! by labels, start, stop and delete sandboxes, and the preview URL of a
//! port. Field names, statuses and query shapes follow the last published
//! spec of Daytona's public repository (`libs/api-client-go/api/
//! openapi.yaml`; the repository stopped receiving updates in June 2026).
//!
//! Per-sandbox work (files, processes) is not here: it goes to the sandbox's
//! toolbox, another host ([`super::toolbox`]).

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Method, StatusCode};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use super::config::DaytonaConfig;
use super::error::DaytonaError;
use crate::backend::remote::rest::{Reply, Rest};
use crate::retry::Deadline;

/// How long `silo doctor`'s check of the key may retry.
const CHECK_BUDGET: Duration = Duration::from_secs(3);
/// Most sandboxes asked for per page when listing (the spec's maximum).
const PAGE_LIMIT: u32 = 200;
/// Most pages followed when listing (40,000 sandboxes).
const MAX_PAGES: usize = 200;
/// Longest wait for a sandbox to reach a state (a snapshot being pulled
/// onto a runner takes a while).
pub const STATE_TIMEOUT: Duration = Duration::from_secs(300);
/// Pause between looks at a sandbox changing state.
const STATE_POLL: Duration = Duration::from_millis(100);

/// `POST /sandbox`'s body (`CreateSandbox`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// The snapshot (template) to make it from; Daytona's default when
    /// `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Environment variables of the sandbox.
    pub env: BTreeMap<String, String>,
    /// What silo finds it by again.
    pub labels: BTreeMap<String, String>,
    /// Whether its previews are open to anyone (never, for silo).
    pub public: bool,
    /// Block all network access.
    pub network_block_all: bool,
    /// The only IPv4 blocks outbound traffic may reach, comma-separated
    /// (`--allow-out`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_allow_list: Option<String>,
    /// The only host names outbound traffic may reach, comma-separated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_allow_list: Option<String>,
    /// Minutes of inactivity before Daytona stops it (0: never).
    pub auto_stop_interval: u32,
    /// The target (region).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// `POST /sandbox/{id}/network-settings`'s body
/// (`UpdateSandboxNetworkSettings`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSettings {
    /// Block all network access.
    pub network_block_all: bool,
    /// The only IPv4 blocks outbound traffic may reach, comma-separated;
    /// empty for none.
    pub network_allow_list: String,
    /// The only host names it may reach, comma-separated; empty for none.
    pub domain_allow_list: String,
}

/// A sandbox as the API shows it (`Sandbox`, `SandboxListItem`): the fields
/// silo reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// Its id.
    pub id: String,
    /// The snapshot it was made from.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Its state (`SandboxState`: `started`, `stopped`, `creating`, …).
    #[serde(default)]
    pub state: Option<String>,
    /// Why it is in `error` or `build_failed`.
    #[serde(default)]
    pub error_reason: Option<String>,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Where its toolbox answers (`{toolboxProxyUrl}/{id}/…`).
    #[serde(default)]
    pub toolbox_proxy_url: Option<String>,
    /// `SandboxClass`: `container` or `linux-vm` (only a VM pauses).
    #[serde(default)]
    pub sandbox_class: Option<String>,
}

/// The class of sandbox Daytona can pause, memory and processes kept.
pub const PAUSABLE_CLASS: &str = "linux-vm";

impl Sandbox {
    /// Whether Daytona can pause it (a VM) rather than only stop it.
    pub fn pausable(&self) -> bool {
        self.sandbox_class.as_deref() == Some(PAUSABLE_CLASS)
    }

    /// Its state, `unknown` when the API left it out.
    pub fn state(&self) -> &str {
        self.state.as_deref().unwrap_or("unknown")
    }
}

/// `GET /sandbox`'s answer (`ListSandboxesResponse`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SandboxPage {
    items: Vec<Sandbox>,
    #[serde(default)]
    next_cursor: Option<String>,
}

/// A port's preview URL and the token its proxy wants (`PortPreviewUrl`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewUrl {
    /// `https://{port}-{sandboxId}.{proxyDomain}`.
    pub url: String,
    /// The value of `x-daytona-preview-token`; a new one each start.
    pub token: String,
}

/// States a sandbox passes through on its way to `started` or `stopped`.
const TRANSITIONS: &[&str] = &[
    "creating",
    "restoring",
    "starting",
    "stopping",
    "pulling_snapshot",
    "pending_build",
    "building_snapshot",
    "resuming",
    "pausing",
    "resizing",
    "snapshotting",
    "forking",
    "archiving",
    "unknown",
];

/// The control plane, with this home's key.
#[derive(Debug, Clone)]
pub struct Api {
    rest: Rest,
}

impl Api {
    /// A client for the control plane `config` names.
    pub fn new(config: &DaytonaConfig) -> Result<Self, DaytonaError> {
        let key = config.api_key()?;
        let rest = Rest::new(
            "the Daytona API",
            &config.api_url,
            config.ca_pem.clone(),
            vec![("Authorization".to_owned(), format!("Bearer {key}"))],
        )?;
        Ok(Self { rest })
    }

    /// Makes a sandbox (Daytona answers at once, before it has started).
    pub async fn create(&self, new: &NewSandbox) -> Result<Sandbox, DaytonaError> {
        let body = serde_json::to_value(new).unwrap_or_default();
        let reply = self
            .rest
            .json(Method::POST, "/sandbox", Some(&body))
            .await?;
        match reply.status {
            StatusCode::OK | StatusCode::CREATED => Ok(reply.json("the created sandbox")?),
            _ => Err(refused("create a sandbox", &reply)),
        }
    }

    /// The sandbox now: `None` when Daytona does not know it.
    pub async fn get(&self, id: &str) -> Result<Option<Sandbox>, DaytonaError> {
        let reply = self
            .rest
            .json(Method::GET, &format!("/sandbox/{}", encode(id)), None)
            .await?;
        match reply.status {
            StatusCode::OK => {
                let sandbox: Sandbox = reply.json("a sandbox")?;
                // A deleted sandbox may linger in the API as `destroyed`.
                Ok(Some(sandbox).filter(|s| !matches!(s.state(), "destroyed" | "destroying")))
            }
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(refused("look at a sandbox", &reply)),
        }
    }

    /// Every sandbox whose labels include all of `labels`: one JSON object
    /// as one query parameter, cursor by cursor.
    pub async fn find(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<Sandbox>, DaytonaError> {
        let filter = serde_json::to_string(labels).unwrap_or_default();
        let mut found = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query = format!("/sandbox?labels={}&limit={PAGE_LIMIT}", encode(&filter));
            if let Some(cursor) = &cursor {
                query.push_str(&format!("&cursor={}", encode(cursor)));
            }
            let reply = self.rest.json(Method::GET, &query, None).await?;
            if reply.status != StatusCode::OK {
                return Err(refused("list sandboxes", &reply));
            }
            let page: SandboxPage = reply.json("the sandbox list")?;
            found.extend(
                page.items
                    .into_iter()
                    .filter(|s| !matches!(s.state(), "destroyed" | "destroying")),
            );
            cursor = page.next_cursor.filter(|c| !c.is_empty());
            if cursor.is_none() {
                break;
            }
        }
        Ok(found)
    }

    /// The same client, retrying for `budget` at most: for work that can
    /// wait for the next run (gc's sweep), so an unreachable API costs
    /// seconds, not the full retry budget.
    pub fn with_retry_budget(mut self, budget: std::time::Duration) -> Self {
        self.rest = self.rest.with_retry_budget(budget);
        self
    }

    /// Whether the key is accepted: one list call of one sandbox, retried
    /// for a few seconds at most.
    pub async fn check(&self) -> Result<(), DaytonaError> {
        let reply = self
            .rest
            .clone()
            .with_retry_budget(CHECK_BUDGET)
            .json(Method::GET, "/sandbox?limit=1", None)
            .await?;
        match reply.status {
            StatusCode::OK => Ok(()),
            _ => Err(refused("list sandboxes", &reply)),
        }
    }

    /// Starts a stopped sandbox (one already started is left as it is).
    pub async fn start(&self, id: &str) -> Result<(), DaytonaError> {
        self.transition(id, "start", "start a sandbox").await
    }

    /// Pauses a VM sandbox: memory and processes kept, resumed by a start.
    pub async fn pause(&self, id: &str) -> Result<(), DaytonaError> {
        self.transition(id, "pause", "pause a sandbox").await
    }

    /// Stops a sandbox: its processes end, its files stay.
    pub async fn stop(&self, id: &str) -> Result<(), DaytonaError> {
        self.transition(id, "stop", "stop a sandbox").await
    }

    async fn transition(
        &self,
        id: &str,
        action: &str,
        what: &'static str,
    ) -> Result<(), DaytonaError> {
        let path = format!("/sandbox/{}/{action}", encode(id));
        let reply = self.rest.json(Method::POST, &path, None).await?;
        match reply.status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            StatusCode::NOT_FOUND => Err(DaytonaError::Gone(id.to_owned())),
            _ => Err(refused(what, &reply)),
        }
    }

    /// Replaces a sandbox's outbound rules
    /// (`POST /sandbox/{id}/network-settings`, `UpdateSandboxNetworkSettings`):
    /// every field is sent, a blank list clearing its rule.
    pub async fn update_network(
        &self,
        id: &str,
        settings: &NetworkSettings,
    ) -> Result<(), DaytonaError> {
        let path = format!("/sandbox/{}/network-settings", encode(id));
        let body = serde_json::to_value(settings).unwrap_or_default();
        let reply = self.rest.json(Method::POST, &path, Some(&body)).await?;
        match reply.status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            StatusCode::NOT_FOUND => Err(DaytonaError::Gone(id.to_owned())),
            _ => Err(refused("change a sandbox's network rules", &reply)),
        }
    }

    /// Deletes a sandbox; one Daytona no longer knows is not an error.
    pub async fn delete(&self, id: &str) -> Result<(), DaytonaError> {
        let path = format!("/sandbox/{}", encode(id));
        let reply = self.rest.json(Method::DELETE, &path, None).await?;
        match reply.status {
            StatusCode::OK | StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => Ok(()),
            _ => Err(refused("delete a sandbox", &reply)),
        }
    }

    /// The preview URL of `port` and its token (new after every start).
    pub async fn preview_url(&self, id: &str, port: u16) -> Result<PreviewUrl, DaytonaError> {
        let path = format!("/sandbox/{}/ports/{port}/preview-url", encode(id));
        let reply = self.rest.json(Method::GET, &path, None).await?;
        match reply.status {
            StatusCode::OK => Ok(reply.json("a preview URL")?),
            StatusCode::NOT_FOUND => Err(DaytonaError::Gone(id.to_owned())),
            _ => Err(refused("give a preview URL", &reply)),
        }
    }

    /// Polls the sandbox until it is `wanted` (`started`, `stopped`);
    /// answers it then. A state that is neither wanted nor on the way is an
    /// error naming it.
    pub async fn wait_for(&self, id: &str, wanted: &'static str) -> Result<Sandbox, DaytonaError> {
        let deadline = Deadline::after(STATE_TIMEOUT, STATE_POLL);
        loop {
            let sandbox = self
                .get(id)
                .await?
                .ok_or_else(|| DaytonaError::Gone(id.to_owned()))?;
            let state = sandbox.state();
            if state == wanted {
                return Ok(sandbox);
            }
            if !TRANSITIONS.contains(&state) {
                return Err(DaytonaError::BadState {
                    id: id.to_owned(),
                    state: state.to_owned(),
                    reason: sandbox.error_reason.clone(),
                });
            }
            if !deadline.pause().await {
                return Err(DaytonaError::Timeout {
                    id: id.to_owned(),
                    wanted,
                    state: state.to_owned(),
                    secs: STATE_TIMEOUT.as_secs(),
                });
            }
        }
    }
}

/// The error for an answer Daytona gave instead of doing what was asked.
/// The control plane answers `{statusCode, message, error}` (`message` may
/// be a list); the toolbox answers `{error}` or plain text.
pub fn refused(what: &'static str, reply: &Reply) -> DaytonaError {
    DaytonaError::Refused {
        what,
        status: reply.status.as_u16(),
        message: error_message(reply),
    }
}

/// The message of an error answer, from either service's shape.
pub fn error_message(reply: &Reply) -> String {
    serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|body| {
            let text = |v: &serde_json::Value| match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Array(items) => Some(
                    items
                        .iter()
                        .filter_map(|i| i.as_str())
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                _ => None,
            };
            body.get("message")
                .and_then(text)
                .or_else(|| body.get("error").and_then(text))
                .or_else(|| body.get("errors").and_then(text))
        })
        .unwrap_or_else(|| reply.text())
}

/// What a URL component keeps as it is: RFC 3986's unreserved characters
/// (Daytona's ids are UUIDs, whose dashes stay dashes).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A value as one URL component.
pub fn encode(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use serde_json::json;

    #[test]
    fn the_create_body_and_answers_use_the_specs_field_names() {
        let body = serde_json::to_value(NewSandbox {
            snapshot: Some("silo-base".into()),
            env: BTreeMap::new(),
            labels: BTreeMap::from([("silo.sandbox".into(), "sbx-1".into())]),
            public: false,
            network_block_all: false,
            network_allow_list: None,
            domain_allow_list: None,
            auto_stop_interval: 60,
            target: None,
        })
        .unwrap();
        assert_eq!(
            body,
            json!({
                "snapshot": "silo-base", "env": {}, "labels": { "silo.sandbox": "sbx-1" },
                "public": false, "networkBlockAll": false, "autoStopInterval": 60,
            })
        );
        let sandbox: Sandbox = serde_json::from_value(json!({
            "id": "s1", "organizationId": "o", "name": "s1", "user": "daytona", "env": {},
            "labels": { "a": "b" }, "public": false, "networkBlockAll": false,
            "target": "us", "cpu": 1, "gpu": 0, "memory": 1, "disk": 3,
            "state": "started", "toolboxProxyUrl": "https://proxy.app.daytona.io/toolbox",
        }))
        .unwrap();
        assert_eq!(sandbox.state(), "started");
        assert_eq!(
            sandbox.toolbox_proxy_url.as_deref(),
            Some("https://proxy.app.daytona.io/toolbox")
        );
    }

    #[test]
    fn the_label_filter_is_one_json_parameter() {
        let labels = BTreeMap::from([("silo.home".to_owned(), "h 1".to_owned())]);
        let filter = serde_json::to_string(&labels).unwrap();
        assert_eq!(filter, r#"{"silo.home":"h 1"}"#);
        assert_eq!(encode(&filter), "%7B%22silo.home%22%3A%22h%201%22%7D");
        assert_eq!(encode("ad36be6c-39b4"), "ad36be6c-39b4");
    }
}
