//! The control plane (e2b-dev/infra `spec/openapi.yml`): `X-API-Key`
//! authentication, then create, list (v2 and the deprecated v1), detail,
//! pause, connect, timeout and kill. Every failure is an `Error` body
//! (`{code, message}`) with the real API's status and message.
//!
//! Not modelled (answered `404` like an unknown route): the deprecated
//! resume, refreshes, network updates, fork, snapshots, metrics, logs and
//! the template routes.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Serialize;

use super::Settings;
use super::list::{list_v1, list_v2, listed};
use super::model::{
    ApiError, ConnectSandbox, Lifecycle, NewSandbox, SandboxDetail, TimeoutRequest,
};
use super::store::{NewRecord, Refusal, State, Store};
use crate::http::{
    Body, Handler, full, header, json_as, query_pairs, read_body, status, with_body,
};

/// The header carrying the API key.
pub const API_KEY_HEADER: &str = "x-api-key";
/// What every API key starts with.
pub const API_KEY_PREFIX: &str = "e2b_";
/// Largest JSON body the control plane reads.
const MAX_JSON_BYTES: usize = 1 << 20;
/// A sandbox's lifetime when `timeout` is not given.
pub const DEFAULT_TIMEOUT_SECS: i64 = 15;
/// The longest lifetime a team may ask for (E2B's Pro tier).
pub const MAX_TIMEOUT_HOURS: i64 = 24;
/// JSON responses, as the API's framework labels them.
const JSON_UTF8: &str = "application/json; charset=utf-8";

/// The control plane's request handler.
pub struct Api {
    /// The sandboxes.
    pub store: Arc<Store>,
    /// Templates, key and domain.
    pub settings: Arc<Settings>,
}

impl Handler for Api {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let method = request.method().clone();
        let path = request.uri().path().trim_matches('/').to_owned();
        let segments: Vec<&str> = path.split('/').collect();
        if method == Method::GET && segments == ["health"] {
            return with_body(
                StatusCode::OK,
                "text/plain; charset=utf-8",
                full("Health check successful"),
            );
        }
        if let Err(refusal) = self.authenticate(&request) {
            return error(&refusal);
        }
        let outcome = match (&method, segments.as_slice()) {
            (&Method::POST, ["sandboxes"]) => self.create(request).await,
            (&Method::GET, ["sandboxes"]) => {
                let query = query_pairs(&request);
                list_v1(self.store.all(), &query).map(|items| ok(StatusCode::OK, &items))
            }
            (&Method::GET, ["v2", "sandboxes"]) => self.list(&request),
            (&Method::GET, ["sandboxes", id]) => self.detail(id),
            (&Method::DELETE, ["sandboxes", id]) => match short_id(id) {
                Ok(id) => self
                    .store
                    .kill(&id)
                    .await
                    .map(|()| status(StatusCode::NO_CONTENT)),
                Err(refusal) => Err(refusal),
            },
            (&Method::POST, ["sandboxes", id, "pause"]) => match short_id(id) {
                Ok(id) => self
                    .store
                    .pause(&id)
                    .await
                    .map(|()| status(StatusCode::NO_CONTENT)),
                Err(refusal) => Err(refusal),
            },
            (&Method::POST, ["sandboxes", id, "connect"]) => {
                let id = (*id).to_owned();
                self.connect(&id, request).await
            }
            (&Method::POST, ["sandboxes", id, "timeout"]) => {
                let id = (*id).to_owned();
                self.timeout(&id, request).await
            }
            _ => Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("the mock does not model {method} /{path}"),
            )),
        };
        outcome.unwrap_or_else(|refusal| error(&refusal))
    }
}

impl Api {
    /// The API's answer to a missing, malformed or unknown key.
    fn authenticate(&self, request: &Request<Incoming>) -> Result<(), Refusal> {
        let unauthorized = |message: &str| Refusal::new(StatusCode::UNAUTHORIZED, message);
        let key = header(request, API_KEY_HEADER).unwrap_or_default();
        if key.is_empty() {
            return Err(unauthorized("authorization header is missing"));
        }
        if !key.starts_with(API_KEY_PREFIX) {
            return Err(unauthorized("authorization header is malformed"));
        }
        if !crate::secret::same_secret(key, &self.settings.api_key) {
            return Err(unauthorized(
                "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.\nCannot get the team for the given API key",
            ));
        }
        Ok(())
    }

    async fn create(&self, request: Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let new: NewSandbox = parse_body(request).await?;
        let bad = |message: &str| Refusal::new(StatusCode::BAD_REQUEST, message);
        let (identifier, tag) = match new.template_id.split_once(':') {
            Some((identifier, tag)) => (identifier, Some(tag)),
            None => (new.template_id.as_str(), None),
        };
        if identifier.is_empty() {
            return Err(bad("Invalid template reference: invalid identifier: empty"));
        }
        let Some(image) = self.settings.templates.get(identifier) else {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("template '{identifier}' not found"),
            ));
        };
        if let Some(tag) = tag.filter(|t| *t != "default") {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("tag '{tag}' does not exist for template '{identifier}'"),
            ));
        }
        let timeout = match new.timeout {
            None => DEFAULT_TIMEOUT_SECS,
            Some(t) if t <= 0 => return Err(bad("Timeout must be greater than 0")),
            Some(t) if t > MAX_TIMEOUT_HOURS * 3600 => {
                return Err(bad(&format!(
                    "Timeout cannot be greater than {MAX_TIMEOUT_HOURS} hours"
                )));
            }
            Some(t) => t,
        };
        let auto_pause = new.auto_pause.unwrap_or(false);
        let auto_resume = new.auto_resume.is_some_and(|r| r.enabled);
        let memory_pause = new.auto_pause_memory.unwrap_or(true);
        if !memory_pause && !auto_pause {
            return Err(bad(
                "autoPauseMemory=false only applies when autoPause is true.",
            ));
        }
        if !memory_pause && auto_resume {
            return Err(bad(
                "autoPauseMemory=false (filesystem-only auto-pause) cannot be combined with autoResume: a filesystem-only snapshot cannot be auto-resumed by traffic and must be resumed explicitly.",
            ));
        }
        let secure = new.secure.unwrap_or(false);
        let mut private = false;
        if let Some(network) = &new.network {
            if network.get("egressProxy").is_some_and(|p| !p.is_null()) {
                return Err(Refusal::new(
                    StatusCode::FORBIDDEN,
                    "Egress proxy (network.egressProxy) is not enabled for this team.",
                ));
            }
            private = network.get("allowPublicTraffic").and_then(|v| v.as_bool()) == Some(false);
            if private && !secure {
                return Err(bad(
                    "You cannot create a sandbox without public access unless you enable secure envd access via 'secure' flag.",
                ));
            }
        }
        if new.volume_mounts.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(bad("Volume mounts are not enabled."));
        }
        let record = self
            .store
            .create(NewRecord {
                template_id: identifier.to_owned(),
                image: image.clone(),
                timeout: Duration::from_secs(timeout.unsigned_abs()),
                metadata: new.metadata.unwrap_or_default(),
                env_vars: new.env_vars.unwrap_or_default(),
                secure,
                private,
                auto_pause,
                auto_resume,
                allow_internet_access: new.allow_internet_access,
                network: new.network,
            })
            .await?;
        Ok(ok(StatusCode::CREATED, &self.store.sandbox_json(&record)))
    }

    fn list(&self, request: &Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let query = query_pairs(request);
        let page = list_v2(self.store.all(), &query, |t| {
            self.settings.templates.contains_key(t)
        })?;
        let mut response = ok(StatusCode::OK, &page.items);
        let headers = response.headers_mut();
        if let Some(token) = page.next_token.and_then(|t| HeaderValue::from_str(&t).ok()) {
            headers.insert("x-next-token", token);
        }
        if let Some(total) = page.total_running {
            headers.insert("x-total-running", HeaderValue::from(total));
        }
        Ok(response)
    }

    fn detail(&self, id: &str) -> Result<Response<Body>, Refusal> {
        let id = short_id(id)?;
        let record = self
            .store
            .get(&id)
            .filter(|r| r.state != State::Killing)
            .ok_or_else(|| Refusal::not_found(&id))?;
        let detail = SandboxDetail {
            listed: listed(&record),
            envd_access_token: record.envd_token.clone(),
            allow_internet_access: record.allow_internet_access,
            domain: Some(self.settings.domain.clone()),
            network: record.network.clone(),
            lifecycle: Lifecycle {
                auto_resume: record.auto_resume,
                on_timeout: if record.auto_pause { "pause" } else { "kill" }.to_owned(),
            },
        };
        Ok(ok(StatusCode::OK, &detail))
    }

    async fn connect(
        &self,
        id: &str,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Refusal> {
        let body: ConnectSandbox = parse_body(request).await?;
        if body.timeout < 0 {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "Error when parsing request: timeout must be at least 0",
            ));
        }
        if body.timeout > MAX_TIMEOUT_HOURS * 3600 {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("Timeout cannot be greater than {MAX_TIMEOUT_HOURS} hours"),
            ));
        }
        let id = short_id(id)?;
        let timeout = Duration::from_secs(body.timeout.unsigned_abs());
        let (code, record) = self.store.connect(&id, timeout).await?;
        Ok(ok(code, &self.store.sandbox_json(&record)))
    }

    async fn timeout(
        &self,
        id: &str,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Refusal> {
        let id = short_id(id)?;
        let body: TimeoutRequest = parse_body(request).await?;
        let seconds = body.timeout.clamp(0, MAX_TIMEOUT_HOURS * 3600);
        self.store
            .set_timeout(&id, Duration::from_secs(seconds.unsigned_abs()))?;
        Ok(status(StatusCode::NO_CONTENT))
    }
}

/// The API's `utils.ShortID`: `{id}` or `{id}-{clientID}`, `[a-z0-9]+`.
fn short_id(composite: &str) -> Result<String, Refusal> {
    let invalid = || Refusal::new(StatusCode::BAD_REQUEST, "Invalid sandbox ID");
    let parts: Vec<&str> = composite.split('-').collect();
    if parts.len() > 2 {
        return Err(invalid());
    }
    let id = parts[0];
    let valid = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid {
        return Err(invalid());
    }
    Ok(id.to_owned())
}

async fn parse_body<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, Refusal> {
    let parse_error = |message: String| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("Error when parsing request: {message}"),
        )
    };
    let body = read_body(request.into_body(), MAX_JSON_BYTES)
        .await
        .map_err(|e| parse_error(e.to_string()))?;
    serde_json::from_slice(&body).map_err(|e| parse_error(e.to_string()))
}

fn ok<T: Serialize>(code: StatusCode, value: &T) -> Response<Body> {
    json_as(code, JSON_UTF8, value)
}

fn error(refusal: &Refusal) -> Response<Body> {
    let body = ApiError {
        code: refusal.status.as_u16(),
        message: refusal.message.clone(),
    };
    json_as(refusal.status, JSON_UTF8, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_ids_strip_the_client_id() {
        assert_eq!(short_id("iabc123"), Ok("iabc123".to_owned()));
        assert_eq!(short_id("iabc123-6532622b"), Ok("iabc123".to_owned()));
        assert!(short_id("a-b-c").is_err());
        assert!(short_id("iABC").is_err());
        assert!(short_id("").is_err());
    }
}
