//! E2B's control plane (`X-API-Key`): create, find by metadata, look at,
//! pause, connect (resume), snapshot (memory included) and kill sandboxes,
//! and delete a snapshot's template. Routes, fields,
//! statuses and the error body follow the generated client of the `e2b`
//! SDK named in `docs/providers.md`.
//!
//! Create and connect come in two generations: the current client's
//! `POST /v2/sandboxes` and `POST /v2/sandboxes/{id}/connect`, and the
//! older `POST /sandboxes` and `POST /sandboxes/{id}/connect`, which an
//! older or self-hosted E2B may be the only one to serve. silo asks v2
//! first and falls back to v1 when the route is not there; the generation
//! that answered is remembered ([`Generation`]) so later calls go straight
//! to it, and each sandbox keeps the one that made it.
//!
//! The client is the one every provider has ([`ProviderApi`]), speaking
//! E2B's [`E2bDialect`]; what is here is only E2B's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::config::NAME;
use super::error::E2bError;
use crate::backend::remote::api::{Dialect, Hints, Page, ProviderApi};
use crate::backend::remote::rest::{Call, Reply, RestError, encode};
use crate::spec::SandboxSpec;
use crate::spec::egress::ALL_TRAFFIC;

/// Most sandboxes asked for per page when listing.
const PAGE_LIMIT: u32 = 100;
/// How long a kill waits out `409` (the sandbox is between states: being
/// paused, resumed or snapshotted) before it reports the conflict.
const KILL_CONFLICT_BUDGET: Duration = Duration::from_secs(20);
/// Pause between kills that met `409`.
const KILL_CONFLICT_PAUSE: Duration = Duration::from_millis(250);
/// The header that makes a retried create answer the sandbox the first
/// try made rather than a second one.
const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// `NewSandboxV2`, the body of `POST /v2/sandboxes`; v1's `NewSandbox` is
/// the same plus `secure` (v2 always secures envd).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// Template id or alias.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until E2B ends (or pauses) it.
    pub timeout: u32,
    /// Pause instead of kill when the timeout passes.
    pub auto_pause: bool,
    /// Outbound internet access.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: bool,
    /// Egress rules (`SandboxNetworkConfig`: `allowOut`, `denyOut`), when
    /// the sandbox has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
    /// What silo finds it by again.
    pub metadata: BTreeMap<String, String>,
}

/// The egress rules of `spec`, enforced by E2B's firewall: without
/// network (`--network none`) every IPv4 destination denied, besides
/// `allow_internet_access: false`; else those of `--allow-out` and
/// `--deny-out` (E2B's `allowOut` wins over `denyOut`, and a host name may
/// only be allowed over `0.0.0.0/0` denied): an allow-list alone denies
/// every other IPv4 destination, a deny list denies its blocks but for
/// those allowed; `None` for neither.
pub fn egress_rules(spec: &SandboxSpec) -> Option<serde_json::Value> {
    if spec.offline() {
        return Some(json!({ "denyOut": [ALL_TRAFFIC] }));
    }
    let (allowed, denied) = (&spec.allow_out, &spec.deny_out);
    match (allowed.is_empty(), denied.is_empty()) {
        (true, true) => None,
        (false, true) => Some(json!({ "allowOut": allowed, "denyOut": [ALL_TRAFFIC] })),
        (true, false) => Some(json!({ "denyOut": denied })),
        (false, false) => Some(json!({ "allowOut": allowed, "denyOut": denied })),
    }
}

/// A generation of E2B's create and connect routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// `POST /sandboxes`, `POST /sandboxes/{id}/connect`.
    V1,
    /// `POST /v2/sandboxes`, `POST /v2/sandboxes/{id}/connect`.
    V2,
}

impl Version {
    fn create_path(self) -> &'static str {
        match self {
            Self::V1 => "/sandboxes",
            Self::V2 => "/v2/sandboxes",
        }
    }

    fn create_route(self) -> &'static str {
        match self {
            Self::V1 => "POST /sandboxes",
            Self::V2 => "POST /v2/sandboxes",
        }
    }

    fn connect_route(self) -> &'static str {
        match self {
            Self::V1 => "POST /sandboxes/{id}/connect",
            Self::V2 => "POST /v2/sandboxes/{id}/connect",
        }
    }

    fn connect_path(self, id: &str) -> String {
        let prefix = match self {
            Self::V1 => "",
            Self::V2 => "/v2",
        };
        format!("{prefix}/sandboxes/{}/connect", encode(id))
    }

    /// Newest first: the order to try them in when none is known.
    fn in_order(known: Option<Self>) -> Vec<Self> {
        match known {
            Some(version) => vec![version],
            None => vec![Self::V2, Self::V1],
        }
    }
}

/// Which generation of the create and connect routes this E2B serves, once
/// learnt; shared by every [`Api`] of one backend.
#[derive(Debug, Default)]
struct Generation(AtomicU8);

impl Generation {
    fn get(&self) -> Option<Version> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(Version::V1),
            2 => Some(Version::V2),
            _ => None,
        }
    }

    fn learn(&self, version: Version) {
        let code = match version {
            Version::V1 => 1,
            Version::V2 => 2,
        };
        self.0.store(code, Ordering::Relaxed);
    }
}

/// A sandbox as create and connect answer it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCreated {
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Its template.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// envd's version.
    pub envd_version: String,
    /// The token envd wants in `X-Access-Token` (secure sandboxes).
    #[serde(default)]
    pub envd_access_token: Option<String>,
    /// The token the proxy wants for ports other than envd's (sandboxes
    /// without public traffic).
    #[serde(default)]
    pub traffic_access_token: Option<String>,
    /// Its domain, when not the client's.
    #[serde(default)]
    pub domain: Option<String>,
    /// Which generation of the routes made it (not E2B's field: silo's).
    #[serde(skip)]
    pub version: Option<Version>,
}

/// A sandbox as the list and detail endpoints show it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// `running` or `paused`.
    pub state: String,
    /// Its metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// E2B's control plane, with this home's key.
pub type Api = ProviderApi<E2bDialect>;

/// What E2B's control plane says its own way: the key in `X-API-Key`,
/// sandboxes found by metadata, pages followed by `x-next-token`; and which
/// generation of its create and connect routes it serves, once learnt
/// (shared by the clones of one backend's dialect).
#[derive(Debug, Clone, Default)]
pub struct E2bDialect {
    generation: Arc<Generation>,
}

impl Dialect for E2bDialect {
    const NAME: &'static str = NAME;
    const CHECK_ROUTE: &'static str = "/v2/sandboxes?limit=1";
    const HINTS: Hints = Hints {
        unauthorized: " (check E2B_API_KEY)",
        forbidden: " (the key's team may not use this)",
        not_found: " (check the template name: silo up --image TEMPLATE)",
        too_many: " (the team's sandbox or rate limit; remove sandboxes or wait)",
    };
    /// 10,000 sandboxes.
    const MAX_PAGES: usize = 100;
    type Error = E2bError;

    fn auth_header(key: &str) -> (String, String) {
        ("X-API-Key".to_owned(), key.to_owned())
    }

    /// Running and paused sandboxes by metadata: the filter is `k=v&k=v`
    /// with each part encoded, then the whole encoded again as one query
    /// value.
    fn page_route(metadata: &BTreeMap<String, String>, cursor: Option<&str>) -> String {
        let filter = metadata
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut route = format!(
            "/v2/sandboxes?metadata={}&state=running,paused&limit={PAGE_LIMIT}",
            encode(&filter)
        );
        if let Some(token) = cursor {
            route.push_str(&format!("&nextToken={}", encode(token)));
        }
        route
    }

    /// A list of sandboxes; the next page's token in `x-next-token`.
    fn read_page(reply: &Reply) -> Result<Page, RestError> {
        let listed: Vec<ListedSandbox> = reply.json("the sandbox list")?;
        Ok(Page {
            machines: listed
                .into_iter()
                .map(|sandbox| (sandbox.sandbox_id, sandbox.metadata))
                .collect(),
            next: reply
                .headers
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        })
    }
}

impl Api {
    /// Makes a sandbox: `POST /v2/sandboxes`, or `POST /sandboxes` where
    /// only that is served. One `Idempotency-Key` covers every retry, so
    /// a create whose answer was lost does not make a second sandbox.
    pub async fn create(&self, new: &NewSandbox) -> Result<SandboxCreated, E2bError> {
        let key = idempotency_key()?;
        let generation = &self.dialect().generation;
        let mut missed = Vec::new();
        for version in Version::in_order(generation.get()) {
            let mut body = serde_json::to_value(new).unwrap_or_default();
            if version == Version::V1 {
                // v1 secures envd only when asked; silo always asks.
                body["secure"] = json!(true);
            }
            let body = serde_json::to_vec(&body).unwrap_or_default();
            let call = Call::new(Method::POST, version.create_path())
                .body("application/json", body.into())
                .header(IDEMPOTENCY_HEADER, &key);
            let reply = self.rest().send(&call).await?;
            if route_missing(&reply, "template") {
                missed.push((version.create_route(), reply.message()));
                continue;
            }
            return match reply.status {
                StatusCode::CREATED | StatusCode::OK => {
                    generation.learn(version);
                    let mut created: SandboxCreated = reply.json("the created sandbox")?;
                    created.version = Some(version);
                    Ok(created)
                }
                _ => Err(self.refused("create a sandbox", &reply).into()),
            };
        }
        Err(no_route("create a sandbox", missed))
    }

    /// The sandbox now: `None` when E2B does not know it (killed, timed out).
    pub async fn get(&self, id: &str) -> Result<Option<ListedSandbox>, E2bError> {
        let reply = self
            .rest()
            .json(Method::GET, &format!("/sandboxes/{}", encode(id)), None)
            .await?;
        match reply.status {
            StatusCode::OK => Ok(Some(reply.json("a sandbox's details")?)),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.refused("look at a sandbox", &reply).into()),
        }
    }

    /// Pauses a running sandbox (memory and processes kept). Answers whether
    /// it was running; a sandbox already paused is not an error.
    pub async fn pause(&self, id: &str) -> Result<bool, E2bError> {
        let path = format!("/sandboxes/{}/pause", encode(id));
        let reply = self.rest().json(Method::POST, &path, None).await?;
        match reply.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(true),
            StatusCode::CONFLICT => Ok(false),
            StatusCode::NOT_FOUND => Err(E2bError::Gone(id.to_owned())),
            _ => Err(self.refused("pause a sandbox", &reply).into()),
        }
    }

    /// Resumes a paused sandbox, or keeps a running one, for `timeout_secs`
    /// more; answers whether it was paused. `made_by` is the generation
    /// that created it, when known: a sandbox is connected through the
    /// routes of the E2B that made it.
    pub async fn connect(
        &self,
        id: &str,
        timeout_secs: u32,
        made_by: Option<Version>,
    ) -> Result<(SandboxCreated, bool), E2bError> {
        let body = json!({ "timeout": timeout_secs });
        let generation = &self.dialect().generation;
        let mut missed = Vec::new();
        for version in Version::in_order(made_by.or(generation.get())) {
            let path = version.connect_path(id);
            let reply = self.rest().json(Method::POST, &path, Some(&body)).await?;
            if route_missing(&reply, "sandbox") {
                missed.push((version.connect_route(), reply.message()));
                continue;
            }
            let resumed = match reply.status {
                StatusCode::OK => false,
                StatusCode::CREATED => true,
                StatusCode::NOT_FOUND => return Err(E2bError::Gone(id.to_owned())),
                _ => return Err(self.refused("resume a sandbox", &reply).into()),
            };
            generation.learn(version);
            let mut connected: SandboxCreated = reply.json("the connected sandbox")?;
            connected.version = Some(version);
            return Ok((connected, resumed));
        }
        Err(no_route("resume a sandbox", missed))
    }

    /// Snapshots a running sandbox, memory and processes included, as a
    /// snapshot template named `name` (`POST /sandboxes/{id}/snapshots`,
    /// `SandboxSnapshotRequest`); answers the snapshot's id, which a
    /// create takes as its `templateID`.
    pub async fn snapshot(&self, id: &str, name: &str) -> Result<String, E2bError> {
        #[derive(Deserialize)]
        struct SnapshotInfo {
            #[serde(rename = "snapshotID")]
            snapshot_id: String,
        }
        let path = format!("/sandboxes/{}/snapshots", encode(id));
        let body = json!({ "name": name, "memory": true });
        let reply = self.rest().json(Method::POST, &path, Some(&body)).await?;
        match reply.status {
            StatusCode::CREATED | StatusCode::OK => {
                let info: SnapshotInfo = reply.json("the snapshot")?;
                Ok(info.snapshot_id)
            }
            // A paused sandbox is not among the running ones E2B snapshots.
            StatusCode::NOT_FOUND => Err(E2bError::NotRunning(id.to_owned())),
            _ => Err(self.refused("snapshot a sandbox", &reply).into()),
        }
    }

    /// Replaces a sandbox's egress rules whole (`PUT
    /// /sandboxes/{id}/network`, `SandboxNetworkUpdateConfig`: what `rules`
    /// leaves out is cleared).
    pub async fn update_network(
        &self,
        id: &str,
        rules: &serde_json::Value,
    ) -> Result<(), E2bError> {
        let path = format!("/sandboxes/{}/network", encode(id));
        let reply = self.rest().json(Method::PUT, &path, Some(rules)).await?;
        match reply.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(()),
            StatusCode::NOT_FOUND => Err(E2bError::Gone(id.to_owned())),
            _ => Err(self
                .refused("change a sandbox's network rules", &reply)
                .into()),
        }
    }

    /// Deletes a snapshot's template (`DELETE /templates/{id}`); one E2B
    /// no longer knows is not an error.
    pub async fn delete_template(&self, snapshot_id: &str) -> Result<(), E2bError> {
        let path = format!("/templates/{}", encode(snapshot_id));
        let reply = self.rest().json(Method::DELETE, &path, None).await?;
        match reply.status {
            StatusCode::NO_CONTENT | StatusCode::OK | StatusCode::NOT_FOUND => Ok(()),
            _ => Err(self.refused("delete a snapshot's template", &reply).into()),
        }
    }

    /// Kills a sandbox (a paused one's saved state goes too). One E2B no
    /// longer knows is not an error; one between states (`409`: being
    /// paused, resumed or snapshotted) is killed once it settles.
    pub async fn kill(&self, id: &str) -> Result<(), E2bError> {
        let path = format!("/sandboxes/{}", encode(id));
        let deadline = tokio::time::Instant::now() + KILL_CONFLICT_BUDGET;
        loop {
            let reply = self.rest().json(Method::DELETE, &path, None).await?;
            match reply.status {
                StatusCode::NO_CONTENT | StatusCode::OK | StatusCode::NOT_FOUND => return Ok(()),
                StatusCode::CONFLICT if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(KILL_CONFLICT_PAUSE).await;
                }
                _ => return Err(self.refused("kill a sandbox", &reply).into()),
            }
        }
    }
}

/// A fresh key for one create and its retries.
fn idempotency_key() -> Result<String, E2bError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|_| E2bError::NoRandomness)?;
    Ok(hex::encode(bytes))
}

/// Whether a `404` says the route is not served rather than that the thing
/// asked for (`noun`: the template, the sandbox) is unknown: E2B's own 404s
/// on these routes name what they did not find.
fn route_missing(reply: &Reply, noun: &str) -> bool {
    reply.status == StatusCode::NOT_FOUND && {
        let message = reply.message().to_lowercase();
        !message.contains(noun) || message.contains("/sandboxes")
    }
}

/// The error for an E2B that served none of the generations tried.
fn no_route(what: &'static str, missed: Vec<(&'static str, String)>) -> E2bError {
    E2bError::NoRoute {
        what,
        tried: missed
            .into_iter()
            .map(|(route, message)| format!("{route}: {message}"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn the_create_body_uses_the_specs_field_names() {
        let body = serde_json::to_value(NewSandbox {
            template_id: "base".into(),
            timeout: 60,
            auto_pause: true,
            allow_internet_access: false,
            network: None,
            metadata: BTreeMap::from([("silo.sandbox".into(), "sbx-1".into())]),
        })
        .unwrap();
        assert_eq!(
            body,
            json!({
                "templateID": "base",
                "timeout": 60,
                "autoPause": true,
                "allow_internet_access": false,
                "metadata": { "silo.sandbox": "sbx-1" },
            })
        );
        let created: SandboxCreated = serde_json::from_value(json!({
            "templateID": "base", "sandboxID": "iabc", "clientID": "6532622b",
            "envdVersion": "0.6.13", "envdAccessToken": "tok", "trafficAccessToken": null,
            "domain": null,
        }))
        .unwrap();
        assert_eq!(created.sandbox_id, "iabc");
        assert_eq!(created.envd_access_token.as_deref(), Some("tok"));
        assert_eq!(created.traffic_access_token, None);
    }

    fn reply(status: u16, body: &str) -> Reply {
        Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: http::HeaderMap::new(),
            body: body.to_owned().into(),
        }
    }

    #[test]
    fn a_missing_route_is_told_from_an_unknown_template_or_sandbox() {
        let unknown_route = reply(404, "404 page not found");
        assert!(route_missing(&unknown_route, "template"));
        let unmodelled = reply(
            404,
            r#"{"code":404,"message":"no POST /v2/sandboxes here"}"#,
        );
        assert!(route_missing(&unmodelled, "template"));
        let template = reply(404, r#"{"code":404,"message":"template 'x' not found"}"#);
        assert!(!route_missing(&template, "template"));
        let sandbox = reply(
            404,
            r#"{"code":404,"message":"Sandbox \"i1\" doesn't exist"}"#,
        );
        assert!(!route_missing(&sandbox, "sandbox"));
        assert!(!route_missing(&reply(400, "{}"), "template"));
    }

    #[test]
    fn refusals_carry_the_providers_error_code_and_a_hint() {
        let config = super::super::E2bConfig::from_lookup(|name| {
            (name == super::super::config::ENV_API_KEY).then(|| "e2b_x".to_owned())
        })
        .unwrap();
        let api = Api::new(&config).unwrap();
        let conflict = reply(
            409,
            r#"{"code":409,"message":"busy","error_code":"sandbox_busy"}"#,
        );
        let error = api.refused("kill a sandbox", &conflict).to_string();
        assert_eq!(
            error,
            "E2B refused to kill a sandbox (409): busy [sandbox_busy]"
        );
        let error = api.refused("list sandboxes", &reply(401, "{}")).to_string();
        assert!(error.ends_with(" (check E2B_API_KEY)"), "{error}");
        let error = no_route(
            "create a sandbox",
            vec![
                ("POST /v2/sandboxes", "a".into()),
                ("POST /sandboxes", "b".into()),
            ],
        )
        .to_string();
        assert!(
            error.contains("POST /v2/sandboxes: a; POST /sandboxes: b"),
            "{error}"
        );
    }

    #[test]
    fn the_metadata_filter_is_encoded_twice() {
        let metadata = BTreeMap::from([("silo.home".to_owned(), "a b".to_owned())]);
        assert_eq!(
            E2bDialect::page_route(&metadata, Some("t/1")),
            "/v2/sandboxes?metadata=silo.home%3Da%2520b&state=running,paused&limit=100\
             &nextToken=t%2F1"
        );
    }
}
