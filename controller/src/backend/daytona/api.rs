//! Daytona's control plane (`Authorization: Bearer`): create, look at, find
//! by labels, start, stop and delete sandboxes, and the preview URL of a
//! port. Field names, statuses and query shapes follow the last published
//! spec of Daytona's public repository (`libs/api-client-go/api/
//! openapi.yaml`; the repository stopped receiving updates in June 2026).
//!
//! The client is the one every provider has ([`ProviderApi`]), speaking
//! Daytona's [`DaytonaDialect`]; what is here is only Daytona's.
//! Per-sandbox work (files, processes) is not here: it goes to the sandbox's
//! toolbox, another host ([`super::toolbox`]).

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::config::NAME;
use super::error::DaytonaError;
use crate::backend::remote::api::{Dialect, Hints, Page, ProviderApi};
use crate::backend::remote::rest::{Reply, RestError, encode};
use crate::retry::Deadline;

/// Most sandboxes asked for per page when listing (the spec's maximum).
const PAGE_LIMIT: u32 = 200;
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

/// Whether a sandbox the API still shows is gone: a deleted sandbox may
/// linger in it as `destroyed`.
fn destroyed(sandbox: &Sandbox) -> bool {
    matches!(sandbox.state(), "destroyed" | "destroying")
}

/// Daytona's control plane, with this home's key.
pub type Api = ProviderApi<DaytonaDialect>;

/// What Daytona's control plane says its own way: the key as a bearer
/// token, sandboxes found by labels, pages followed by a cursor.
#[derive(Debug, Clone, Copy, Default)]
pub struct DaytonaDialect;

impl Dialect for DaytonaDialect {
    const NAME: &'static str = NAME;
    const CHECK_ROUTE: &'static str = "/sandbox?limit=1";
    const HINTS: Hints = Hints {
        unauthorized: " (check DAYTONA_API_KEY)",
        forbidden: " (the key's organization may not do this)",
        not_found: " (check the snapshot name: silo up --image SNAPSHOT)",
        too_many: " (the organization's quota or rate limit; remove sandboxes or wait)",
    };
    /// 40,000 sandboxes.
    const MAX_PAGES: usize = 200;
    type Error = DaytonaError;

    fn auth_header(key: &str) -> (String, String) {
        ("Authorization".to_owned(), format!("Bearer {key}"))
    }

    /// Sandboxes by labels: one JSON object as one query parameter.
    fn page_route(labels: &BTreeMap<String, String>, cursor: Option<&str>) -> String {
        let filter = serde_json::to_string(labels).unwrap_or_default();
        let mut route = format!("/sandbox?labels={}&limit={PAGE_LIMIT}", encode(&filter));
        if let Some(cursor) = cursor {
            route.push_str(&format!("&cursor={}", encode(cursor)));
        }
        route
    }

    /// `ListSandboxesResponse`: the sandboxes not destroyed, and the next
    /// page's cursor.
    fn read_page(reply: &Reply) -> Result<Page, RestError> {
        let page: SandboxPage = reply.json("the sandbox list")?;
        Ok(Page {
            machines: page
                .items
                .into_iter()
                .filter(|sandbox| !destroyed(sandbox))
                .map(|sandbox| (sandbox.id, sandbox.labels))
                .collect(),
            next: page.next_cursor,
        })
    }
}

impl Api {
    /// Makes a sandbox (Daytona answers at once, before it has started).
    pub async fn create(&self, new: &NewSandbox) -> Result<Sandbox, DaytonaError> {
        let body = serde_json::to_value(new).unwrap_or_default();
        let reply = self
            .rest()
            .json(Method::POST, "/sandbox", Some(&body))
            .await?;
        match reply.status {
            StatusCode::OK | StatusCode::CREATED => Ok(reply.json("the created sandbox")?),
            _ => Err(self.refused("create a sandbox", &reply).into()),
        }
    }

    /// The sandbox now: `None` when Daytona does not know it.
    pub async fn get(&self, id: &str) -> Result<Option<Sandbox>, DaytonaError> {
        let reply = self
            .rest()
            .json(Method::GET, &format!("/sandbox/{}", encode(id)), None)
            .await?;
        match reply.status {
            StatusCode::OK => {
                let sandbox: Sandbox = reply.json("a sandbox")?;
                Ok(Some(sandbox).filter(|sandbox| !destroyed(sandbox)))
            }
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.refused("look at a sandbox", &reply).into()),
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
        let reply = self.rest().json(Method::POST, &path, None).await?;
        match reply.status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            StatusCode::NOT_FOUND => Err(DaytonaError::Gone(id.to_owned())),
            _ => Err(self.refused(what, &reply).into()),
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
        let reply = self.rest().json(Method::POST, &path, Some(&body)).await?;
        match reply.status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            StatusCode::NOT_FOUND => Err(DaytonaError::Gone(id.to_owned())),
            _ => Err(self
                .refused("change a sandbox's network rules", &reply)
                .into()),
        }
    }

    /// Deletes a sandbox; one Daytona no longer knows is not an error.
    pub async fn delete(&self, id: &str) -> Result<(), DaytonaError> {
        let path = format!("/sandbox/{}", encode(id));
        let reply = self.rest().json(Method::DELETE, &path, None).await?;
        match reply.status {
            StatusCode::OK | StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => Ok(()),
            _ => Err(self.refused("delete a sandbox", &reply).into()),
        }
    }

    /// The preview URL of `port` and its token (new after every start).
    pub async fn preview_url(&self, id: &str, port: u16) -> Result<PreviewUrl, DaytonaError> {
        let path = format!("/sandbox/{}/ports/{port}/preview-url", encode(id));
        let reply = self.rest().json(Method::GET, &path, None).await?;
        match reply.status {
            StatusCode::OK => Ok(reply.json("a preview URL")?),
            StatusCode::NOT_FOUND => Err(DaytonaError::Gone(id.to_owned())),
            _ => Err(self.refused("give a preview URL", &reply).into()),
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
        assert_eq!(
            DaytonaDialect::page_route(&labels, Some("c 2")),
            "/sandbox?labels=%7B%22silo.home%22%3A%22h%201%22%7D&limit=200&cursor=c%202"
        );
    }
}
