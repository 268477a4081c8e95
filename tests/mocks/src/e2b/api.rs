//! The control plane (the API the `e2b` SDK's generated client carries;
//! e2b-dev/infra for statuses and messages): `X-API-Key` authentication,
//! then create (`POST /v2/sandboxes`, and the older `POST /sandboxes`,
//! [`super::create`]), list (v2 and the deprecated v1), detail, pause,
//! connect (`POST /v2/sandboxes/{id}/connect` and the older
//! `/sandboxes/{id}/connect`), timeout, kill, fork and snapshots
//! ([`super::fork`], [`super::snapshots`]) and network updates
//! ([`super::network`]). Every failure is an `Error` body
//! (`{code, message}`) with the real API's status and message.
//!
//! Not modelled (answered `404` saying so, like an unknown route): the
//! deprecated resume, refreshes, metrics, logs and the template (but for
//! deleting a snapshot template), volume and secret routes. Every routed
//! request is recorded in the mock's [`Journal`] (the test-only
//! [`JOURNAL_PATH`] answers it); the test-only [`ADMIN_PATH`] sets the
//! mock's [`Faults`]; while a rate limit is on, every route but
//! `GET /health` and those two answers `429`, and while failed creates
//! are on, the next creates answer `500`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use percent_encoding::percent_decode_str;
use serde::Serialize;

use super::Settings;
use super::create::{self, IDEMPOTENCY_HEADER, IdempotencyKeys, MAX_TIMEOUT_HOURS, Version};
use super::fork;
use super::list::{list_v1, list_v2, listed};
use super::model::{
    ApiError, ConnectSandbox, ForkRequest, Lifecycle, NetworkUpdate, NewSandbox, PauseRequest,
    SandboxDetail, SnapshotRequest, TimeoutRequest,
};
use super::network;
use super::snapshots;
use super::store::{Refusal, State, Store, short_id};
use super::templates::Templates;
use crate::faults::{ADMIN_PATH, Faults, Switches};
use crate::http::{Body, Handler, full, json_as, read_body, status, uri_query_pairs, with_body};
use crate::journal::{JOURNAL_PATH, Journal};

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
    /// The templates, snapshots among them.
    pub templates: Arc<Templates>,
    /// Key, domain and the routes served.
    pub settings: Arc<Settings>,
    /// The switches a test turns on.
    pub faults: Arc<Faults>,
    /// What clients asked.
    pub journal: Arc<Journal>,
    /// Idempotency keys of v2 creates.
    pub idempotency: IdempotencyKeys,
}

/// A route the mock serves, with its path parameters.
enum Route {
    Create(Version),
    ListV1,
    ListV2,
    Detail(String),
    Kill(String),
    Pause(String),
    Connect(String, Version),
    Timeout(String),
    Fork(String),
    Snapshot(String),
    Network(String),
    Snapshots,
    DeleteTemplate(String),
}

/// The route `method` and `segments` name among those served.
fn route(method: &Method, segments: &[&str], settings: &Settings) -> Option<Route> {
    let routes = settings.routes;
    let id = |s: &&str| (*s).to_owned();
    Some(match (method, segments) {
        (&Method::POST, ["sandboxes"]) if routes.v1 => Route::Create(Version::V1),
        (&Method::POST, ["v2", "sandboxes"]) if routes.v2 => Route::Create(Version::V2),
        (&Method::GET, ["sandboxes"]) => Route::ListV1,
        (&Method::GET, ["v2", "sandboxes"]) => Route::ListV2,
        (&Method::GET, ["sandboxes", i]) => Route::Detail(id(i)),
        (&Method::DELETE, ["sandboxes", i]) => Route::Kill(id(i)),
        (&Method::POST, ["sandboxes", i, "pause"]) => Route::Pause(id(i)),
        (&Method::POST, ["sandboxes", i, "connect"]) if routes.v1 => {
            Route::Connect(id(i), Version::V1)
        }
        (&Method::POST, ["v2", "sandboxes", i, "connect"]) if routes.v2 => {
            Route::Connect(id(i), Version::V2)
        }
        (&Method::POST, ["sandboxes", i, "timeout"]) => Route::Timeout(id(i)),
        (&Method::POST, ["sandboxes", i, "fork"]) => Route::Fork(id(i)),
        (&Method::POST, ["sandboxes", i, "snapshots"]) => Route::Snapshot(id(i)),
        (&Method::PUT, ["sandboxes", i, "network"]) => Route::Network(id(i)),
        (&Method::GET, ["snapshots"]) => Route::Snapshots,
        (&Method::DELETE, ["templates", reference]) => Route::DeleteTemplate(
            percent_decode_str(reference)
                .decode_utf8_lossy()
                .into_owned(),
        ),
        _ => return None,
    })
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
        if request.uri().path() == JOURNAL_PATH {
            return ok(StatusCode::OK, &self.journal.all());
        }
        let (parts, body) = request.into_parts();
        let body = match read_body(body, MAX_JSON_BYTES).await {
            Ok(body) => body,
            Err(e) => return error(&parse_error(&e)),
        };
        let asked = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
        self.journal.record(method.as_str(), &asked, &body);
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
        let Some(route) = route(&method, &segments, &self.settings) else {
            return error(&Refusal::new(
                StatusCode::NOT_FOUND,
                format!("the mock does not model {method} /{path}"),
            ));
        };
        self.dispatch(route, &parts, &body)
            .await
            .unwrap_or_else(|refusal| error(&refusal))
    }
}

impl Api {
    async fn dispatch(
        &self,
        route: Route,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        match route {
            Route::Create(version) => self.create(parts, body, version).await,
            Route::ListV1 => {
                let query = uri_query_pairs(&parts.uri);
                list_v1(self.store.all(), &query).map(|items| ok(StatusCode::OK, &items))
            }
            Route::ListV2 => self.list(parts),
            Route::Detail(id) => self.detail(&id),
            Route::Kill(id) => {
                self.store.kill(&short_id(&id)?).await?;
                Ok(status(StatusCode::NO_CONTENT))
            }
            Route::Pause(id) => self.pause(&id, body).await,
            Route::Connect(id, version) => self.connect(&id, body, version).await,
            Route::Timeout(id) => self.timeout(&id, body),
            Route::Fork(id) => {
                let id = short_id(&id)?;
                let request: ForkRequest = parse_optional_body(body)?;
                let results = fork::fork(&self.store, &id, request, MAX_TIMEOUT_HOURS).await?;
                Ok(ok(StatusCode::CREATED, &results))
            }
            Route::Snapshot(id) => {
                let id = short_id(&id)?;
                let request: SnapshotRequest = parse_body(body)?;
                let info = fork::snapshot(&self.store, &self.templates, &id, request).await?;
                Ok(ok(StatusCode::CREATED, &info))
            }
            Route::Network(id) => self.update_network(&id, body),
            Route::Snapshots => {
                let query = uri_query_pairs(&parts.uri);
                let page = snapshots::list(&self.templates, &query)?;
                let mut response = ok(StatusCode::OK, &page.items);
                if let Some(token) = page.next_token.and_then(|t| HeaderValue::from_str(&t).ok()) {
                    response.headers_mut().insert("x-next-token", token);
                }
                Ok(response)
            }
            Route::DeleteTemplate(reference) => {
                snapshots::delete(&self.store, &self.templates, &reference).await?;
                Ok(status(StatusCode::NO_CONTENT))
            }
        }
    }

    /// The API's answer to a missing, malformed or unknown key.
    fn authenticate(&self, request: &Request<Incoming>) -> Result<(), Refusal> {
        let unauthorized = |message: &str| Refusal::new(StatusCode::UNAUTHORIZED, message);
        let key = crate::http::header(request, API_KEY_HEADER).unwrap_or_default();
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
        parts: &Parts,
        body: &Bytes,
        version: Version,
    ) -> Result<Response<Body>, Refusal> {
        let key = match version {
            Version::V2 => parts
                .headers
                .get(IDEMPOTENCY_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            Version::V1 => None,
        };
        let new: NewSandbox = parse_body(body)?;
        if self.faults.take_failed_create() {
            return Err(Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Failed to place sandbox",
            ));
        }
        if let Some(record) = key
            .as_deref()
            .and_then(|k| self.idempotency.get(k))
            .and_then(|id| self.store.get(&id))
        {
            return Ok(ok(StatusCode::CREATED, &self.store.sandbox_json(&record)));
        }
        let new = create::parse(new, version, &self.templates)?;
        let record = self.store.create(new).await?;
        if let Some(key) = key {
            self.idempotency.remember(&key, &record.id);
        }
        Ok(ok(StatusCode::CREATED, &self.store.sandbox_json(&record)))
    }

    /// The test-only switches: `GET` answers them, `POST` changes them.
    async fn admin(&self, request: Request<Incoming>) -> Response<Body> {
        if request.method() == Method::POST {
            let body = match read_body(request.into_body(), MAX_JSON_BYTES).await {
                Ok(body) => body,
                Err(e) => return error(&parse_error(&e)),
            };
            let switches: Switches = match parse_body(&body) {
                Ok(switches) => switches,
                Err(refusal) => return error(&refusal),
            };
            if let Err(refused) = self.faults.apply(&switches) {
                return error(&Refusal::new(StatusCode::BAD_REQUEST, refused.to_string()));
            }
        }
        ok(StatusCode::OK, &self.faults.switches())
    }

    async fn pause(&self, id: &str, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = short_id(id)?;
        let body: PauseRequest = parse_optional_body(body)?;
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

    fn list(&self, parts: &Parts) -> Result<Response<Body>, Refusal> {
        let query = uri_query_pairs(&parts.uri);
        let page = list_v2(self.store.all(), &query, |t| self.templates.exists(t))?;
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
        body: &Bytes,
        version: Version,
    ) -> Result<Response<Body>, Refusal> {
        let body: ConnectSandbox = match version {
            Version::V1 => parse_body(body)?,
            Version::V2 => parse_optional_body(body)?,
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

    fn timeout(&self, id: &str, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = short_id(id)?;
        let body: TimeoutRequest = parse_body(body)?;
        let seconds = body.timeout.clamp(0, MAX_TIMEOUT_HOURS * 3600);
        self.store
            .set_timeout(&id, Duration::from_secs(seconds.unsigned_abs()))?;
        Ok(status(StatusCode::NO_CONTENT))
    }

    /// `PUT /sandboxes/{id}/network`: the rules checked, then the sandbox
    /// looked up, then its transform rules refused, then the update.
    fn update_network(&self, id: &str, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = short_id(id)?;
        let update: NetworkUpdate = parse_body(body)?;
        network::check_update(&update)?;
        if let Err(refusal) = network::refuse_rules(&update) {
            // The API looks the sandbox up first: rules depend on its envd.
            self.store
                .get(&id)
                .filter(|r| r.state.runs())
                .ok_or_else(|| Refusal::not_found(&id))?;
            return Err(refusal);
        }
        self.store.update_network(&id, &update)?;
        Ok(status(StatusCode::NO_CONTENT))
    }
}

/// The API's answer to a body it cannot read.
fn parse_error(error: &dyn std::fmt::Display) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        format!("Error when parsing request: {error}"),
    )
}

fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Refusal> {
    serde_json::from_slice(body).map_err(|e| parse_error(&e))
}

/// A body that may be left out (or empty): its default then.
fn parse_optional_body<T: serde::de::DeserializeOwned + Default>(
    body: &Bytes,
) -> Result<T, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_body(body)
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
