//! E2B's control plane (`X-API-Key`): create, find by metadata, look at,
//! pause, connect (resume), set the timeout of, and kill sandboxes. Field
//! names, statuses and the error body follow E2B's public OpenAPI spec
//! (e2b-dev/infra, `spec/openapi.yml`).

use std::collections::BTreeMap;

use http::{Method, StatusCode};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::config::E2bConfig;
use super::error::E2bError;
use crate::backend::remote::rest::{Reply, Rest};

/// How long `silo doctor`'s check of the key may retry.
const CHECK_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);
/// Most sandboxes asked for per page when listing.
const PAGE_LIMIT: u32 = 100;
/// Most pages followed when listing (10,000 sandboxes).
const MAX_PAGES: usize = 100;

/// `POST /sandboxes`' body.
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
    /// Ask for an envd access token.
    pub secure: bool,
    /// Outbound internet access.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: bool,
    /// What silo finds it by again.
    pub metadata: BTreeMap<String, String>,
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

/// E2B's error body.
#[derive(Debug, Clone, Deserialize)]
struct ErrorBody {
    message: String,
}

/// The control plane, with this home's key.
#[derive(Debug, Clone)]
pub struct Api {
    rest: Rest,
}

impl Api {
    /// A client for the control plane `config` names.
    pub fn new(config: &E2bConfig) -> Result<Self, E2bError> {
        let key = config.api_key()?;
        let rest = Rest::new(
            "the E2B API",
            &config.api_url,
            config.ca_pem.clone(),
            vec![("X-API-Key".to_owned(), key.to_owned())],
        )?;
        Ok(Self { rest })
    }

    /// Makes a sandbox.
    pub async fn create(&self, new: &NewSandbox) -> Result<SandboxCreated, E2bError> {
        let body = serde_json::to_value(new).unwrap_or_default();
        let reply = self
            .rest
            .json(Method::POST, "/sandboxes", Some(&body))
            .await?;
        match reply.status {
            StatusCode::CREATED | StatusCode::OK => Ok(reply.json("the created sandbox")?),
            _ => Err(refused("create a sandbox", &reply)),
        }
    }

    /// The sandbox now: `None` when E2B does not know it (killed, timed out).
    pub async fn get(&self, id: &str) -> Result<Option<ListedSandbox>, E2bError> {
        let reply = self
            .rest
            .json(Method::GET, &format!("/sandboxes/{}", path_part(id)), None)
            .await?;
        match reply.status {
            StatusCode::OK => Ok(Some(reply.json("a sandbox's details")?)),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(refused("look at a sandbox", &reply)),
        }
    }

    /// Every running or paused sandbox whose metadata has all of `metadata`.
    pub async fn find(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<ListedSandbox>, E2bError> {
        // The filter is `k=v&k=v` with each part encoded, then the whole
        // encoded again as one query value.
        let filter = metadata
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut found = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query = format!(
                "/v2/sandboxes?metadata={}&state=running,paused&limit={PAGE_LIMIT}",
                encode(&filter)
            );
            if let Some(token) = &next {
                query.push_str(&format!("&nextToken={}", encode(token)));
            }
            let reply = self.rest.json(Method::GET, &query, None).await?;
            if reply.status != StatusCode::OK {
                return Err(refused("list sandboxes", &reply));
            }
            let page: Vec<ListedSandbox> = reply.json("the sandbox list")?;
            found.extend(page);
            next = reply
                .headers
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            if next.is_none() {
                return Ok(found);
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
    pub async fn check(&self) -> Result<(), E2bError> {
        let reply = self
            .rest
            .clone()
            .with_retry_budget(CHECK_BUDGET)
            .json(Method::GET, "/v2/sandboxes?limit=1", None)
            .await?;
        match reply.status {
            StatusCode::OK => Ok(()),
            _ => Err(refused("list sandboxes", &reply)),
        }
    }

    /// Pauses a running sandbox (memory and processes kept). Answers whether
    /// it was running; a sandbox already paused is not an error.
    pub async fn pause(&self, id: &str) -> Result<bool, E2bError> {
        let path = format!("/sandboxes/{}/pause", path_part(id));
        let reply = self.rest.json(Method::POST, &path, None).await?;
        match reply.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(true),
            StatusCode::CONFLICT => Ok(false),
            StatusCode::NOT_FOUND => Err(E2bError::Gone(id.to_owned())),
            _ => Err(refused("pause a sandbox", &reply)),
        }
    }

    /// Resumes a paused sandbox, or keeps a running one, for `timeout_secs`
    /// more; answers whether it was paused.
    pub async fn connect(
        &self,
        id: &str,
        timeout_secs: u32,
    ) -> Result<(SandboxCreated, bool), E2bError> {
        let path = format!("/sandboxes/{}/connect", path_part(id));
        let body = json!({ "timeout": timeout_secs });
        let reply = self.rest.json(Method::POST, &path, Some(&body)).await?;
        match reply.status {
            StatusCode::OK => Ok((reply.json("the connected sandbox")?, false)),
            StatusCode::CREATED => Ok((reply.json("the resumed sandbox")?, true)),
            StatusCode::NOT_FOUND => Err(E2bError::Gone(id.to_owned())),
            _ => Err(refused("resume a sandbox", &reply)),
        }
    }

    /// Kills a sandbox (a paused one's saved state goes too). One E2B no
    /// longer knows is not an error.
    pub async fn kill(&self, id: &str) -> Result<(), E2bError> {
        let path = format!("/sandboxes/{}", path_part(id));
        let reply = self.rest.json(Method::DELETE, &path, None).await?;
        match reply.status {
            StatusCode::NO_CONTENT | StatusCode::OK | StatusCode::NOT_FOUND => Ok(()),
            _ => Err(refused("kill a sandbox", &reply)),
        }
    }
}

/// The error for an answer E2B gave instead of doing what was asked.
pub fn refused(what: &'static str, reply: &Reply) -> E2bError {
    let message = serde_json::from_slice::<ErrorBody>(&reply.body)
        .map(|body| body.message)
        .unwrap_or_else(|_| reply.text());
    E2bError::Refused {
        what,
        status: reply.status.as_u16(),
        message,
    }
}

fn encode(text: &str) -> String {
    utf8_percent_encode(text, NON_ALPHANUMERIC).to_string()
}

/// An id as one path segment (E2B's ids are `[a-z0-9]`; anything else is
/// encoded rather than trusted).
fn path_part(id: &str) -> String {
    encode(id)
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
            secure: true,
            allow_internet_access: false,
            metadata: BTreeMap::from([("silo.sandbox".into(), "sbx-1".into())]),
        })
        .unwrap();
        assert_eq!(
            body,
            json!({
                "templateID": "base",
                "timeout": 60,
                "autoPause": true,
                "secure": true,
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

    #[test]
    fn the_metadata_filter_is_encoded_twice() {
        let filter = format!("{}={}", encode("silo.home"), encode("a b"));
        assert_eq!(filter, "silo%2Ehome=a%20b");
        assert_eq!(encode(&filter), "silo%252Ehome%3Da%2520b");
    }
}
