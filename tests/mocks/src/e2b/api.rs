//! The control plane (the API the `e2b` SDK's generated client carries;
//! e2b-dev/infra `spec/openapi.yml` for statuses and messages): `X-API-Key`
//! authentication, then create (`POST /v2/sandboxes`, and the older
//! `POST /sandboxes`, [`super::create`]), list (v2 and the deprecated v1),
//! detail, pause, connect (`POST /v2/sandboxes/{id}/connect` and the older
//! `/sandboxes/{id}/connect`), timeout and kill. Every failure is an
//! `Error` body (`{code, message}`) with the real API's status and message.
//!
//! Not modelled (answered `404` saying so, like an unknown route): the
//! deprecated resume, refreshes, network updates, fork, snapshots, metrics,
//! logs and the template, volume and secret routes. The test-only
//! [`ADMIN_PATH`] sets the mock's [`Faults`]; while a rate limit is on,
//! every route but `GET /health` and that one answers `429`.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Serialize;

use super::Settings;
use super::create::{self, IDEMPOTENCY_HEADER, IdempotencyKeys, MAX_TIMEOUT_HOURS, Version};
use super::list::{list_v1, list_v2, listed};
use super::model::{
    ApiError, ConnectSandbox, Lifecycle, NewSandbox, PauseRequest, SandboxDetail, TimeoutRequest,
};
use super::store::{Refusal, State, Store};
use crate::faults::{ADMIN_PATH, Faults, Switches};
use crate::http::{
    Body, Handler, full, header, json_as, query_pairs, read_body, status, with_body,
};

/// The header carrying the API key.
pub const API_KEY_HEADER: &str = "x-api-key";
/// What every API key starts with.
pub const API_KEY_PREFIX: &str = "e2b_";
/// Largest JSON body the control plane reads.
const MAX_JSON_BYTES: usize = 1 << 20;
/// How long a v2 connect keeps the sandbox alive when `timeout` is not given.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: i64 = 300;
/// JSON responses, as the API's framework labels them.
const JSON_UTF8: &str = "application/json; charset=utf-8";

/// The control plane's request handler.
pub struct Api {
    /// The sandboxes.
    pub store: Arc<Store>,
    /// Templates, key and domain.
    pub settings: Arc<Settings>,
    /// The switches a test turns on.
    pub faults: Arc<Faults>,
    /// Idempotency keys of v2 creates.
    pub idempotency: IdempotencyKeys,
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
        if request.uri().path() == ADMIN_PATH {
            return self.admin(request).await;
        }
        if let Some(retry_after) = self.faults.take_rate_limit() {
            let mut response = error(&Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "Rate limit exceeded, please try again later.",
            ));
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after));
            return response;
        }
        let routes = self.settings.routes;
        let outcome = match (&method, segments.as_slice()) {
            (&Method::POST, ["sandboxes"]) if routes.v1 => self.create(request, Version::V1).await,
            (&Method::POST, ["v2", "sandboxes"]) if routes.v2 => {
                self.create(request, Version::V2).await
            }
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
            (&Method::POST, ["sandboxes", id, "pause"]) => {
                let id = (*id).to_owned();
                self.pause(&id, request).await
            }
            (&Method::POST, ["sandboxes", id, "connect"]) if routes.v1 => {
                let id = (*id).to_owned();
                self.connect(&id, request, Version::V1).await
            }
            (&Method::POST, ["v2", "sandboxes", id, "connect"]) if routes.v2 => {
                let id = (*id).to_owned();
                self.connect(&id, request, Version::V2).await
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

    async fn create(
        &self,
        request: Request<Incoming>,
        version: Version,
    ) -> Result<Response<Body>, Refusal> {
        let key = match version {
            Version::V2 => header(&request, IDEMPOTENCY_HEADER).map(str::to_owned),
            Version::V1 => None,
        };
        let new: NewSandbox = parse_body(request).await?;
        if let Some(record) = key
            .as_deref()
            .and_then(|k| self.idempotency.get(k))
            .and_then(|id| self.store.get(&id))
        {
            return Ok(ok(StatusCode::CREATED, &self.store.sandbox_json(&record)));
        }
        let new = create::parse(new, version, &self.settings)?;
        let record = self.store.create(new).await?;
        if let Some(key) = key {
            self.idempotency.remember(&key, &record.id);
        }
        Ok(ok(StatusCode::CREATED, &self.store.sandbox_json(&record)))
    }

    /// The test-only switches: `GET` answers them, `POST` changes them.
    async fn admin(&self, request: Request<Incoming>) -> Response<Body> {
        if request.method() == Method::POST {
            let switches: Switches = match parse_body(request).await {
                Ok(switches) => switches,
                Err(refusal) => return error(&refusal),
            };
            if let Err(refused) = self.faults.apply(&switches) {
                return error(&Refusal::new(StatusCode::BAD_REQUEST, refused.to_string()));
            }
        }
        ok(StatusCode::OK, &self.faults.switches())
    }

    async fn pause(&self, id: &str, request: Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let id = short_id(id)?;
        let body: PauseRequest = parse_optional_body(request).await?;
        if body.memory == Some(false) {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "the mock does not model memory=false (a filesystem-only pause)",
            ));
        }
        self.store
            .pause(&id)
            .await
            .map(|()| status(StatusCode::NO_CONTENT))
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
        version: Version,
    ) -> Result<Response<Body>, Refusal> {
        let body: ConnectSandbox = match version {
            Version::V1 => parse_body(request).await?,
            Version::V2 => parse_optional_body(request).await?,
        };
        let timeout = match (version, body.timeout) {
            (_, Some(timeout)) => timeout,
            (Version::V2, None) => DEFAULT_CONNECT_TIMEOUT_SECS,
            (Version::V1, None) => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "Error when parsing request: property \"timeout\" is missing",
                ));
            }
        };
        if timeout < 0 {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "Error when parsing request: timeout must be at least 0",
            ));
        }
        if timeout > MAX_TIMEOUT_HOURS * 3600 {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("Timeout cannot be greater than {MAX_TIMEOUT_HOURS} hours"),
            ));
        }
        if body.memory == Some(false) {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "the mock does not model memory=false (a resume from disk only)",
            ));
        }
        let id = short_id(id)?;
        let timeout = Duration::from_secs(timeout.unsigned_abs());
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

/// A body that may be left out (or empty): its default then.
async fn parse_optional_body<T: serde::de::DeserializeOwned + Default>(
    request: Request<Incoming>,
) -> Result<T, Refusal> {
    let body = read_body(request.into_body(), MAX_JSON_BYTES)
        .await
        .map_err(|e| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("Error when parsing request: {e}"),
            )
        })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body).map_err(|e| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("Error when parsing request: {e}"),
        )
    })
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
