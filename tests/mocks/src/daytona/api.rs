//! The control plane (daytonaio/daytona `apps/api`, spec
//! `libs/api-client-go/api/openapi.yaml`): every route under `/api`,
//! `Authorization: Bearer <key>` on each, `X-Daytona-Organization-ID`
//! accepted and ignored (an API key names its organization).
//!
//! Routes are matched before authentication, as the framework matches
//! them: an unknown route is `404` "Cannot {METHOD} {url}" with or without
//! a key, a known one without a valid key is `401` "Invalid credentials".
//! Served: create, list, get, delete, start (and resume), stop, pause,
//! network settings, preview URL, toolbox proxy URL, label replacement
//! and the auto-stop interval; any other route of the published spec
//! ([`super::routes`]) is `501` saying the mock does not model it. Every
//! request past the key check is recorded in the mock's [`Journal`] (the
//! test-only `/api/_mock/requests` answers it). Every failure is the exception filter's body
//! `{path, timestamp, statusCode, error, message}`. Paths outside `/api`
//! (the dashboard, in production) answer `404` here.
//!
//! The notification gateway's Socket.IO path (`/api/socket.io/`, where the
//! SDKs wait for state events) is not modelled: its handshake is refused
//! as engine.io refuses a request it does not allow (`403`
//! `{"code":4,"message":"Forbidden"}`), so an SDK notes the failure and
//! polls the sandbox instead, as it does whenever the socket is down. The
//! test-only `/api/_mock/faults` sets the mock's [`Faults`]; while a rate
//! limit is on, every other route answers `429` with `Retry-After`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::Value;

use super::Settings;
use super::create;
use super::list;
use super::model::{ApiError, ListSandboxesResponse, PortPreviewUrl, ToolboxProxyUrl, iso_millis};
use super::network;
use super::routes::is_published;
use super::store::{Refusal, Store};
use crate::faults::{ADMIN_PATH, Faults, Switches};
use crate::http::{Body, Handler, header, json_as, query_pairs, query_value, read_body};
use crate::journal::{JOURNAL_PATH, Journal};
use crate::secret::same_secret;

/// Where every route lives.
pub const API_PREFIX: &str = "/api";
/// Largest JSON body read.
const MAX_JSON_BYTES: usize = 1 << 20;
/// The notification gateway's Socket.IO path under the API prefix.
const SOCKET_IO_PATH: &str = "/socket.io";
/// The state a create answers, though the sandbox runs by then.
const CREATE_ANSWER_STATE: &str = "creating";
/// JSON answers, as the framework labels them.
const JSON_UTF8: &str = "application/json; charset=utf-8";

/// A route the mock serves, with its path parameters.
enum Route {
    List,
    Create,
    Get(String),
    Delete(String),
    Start(String),
    Stop(String),
    Pause(String),
    NetworkSettings(String),
    PreviewUrl(String, String),
    ToolboxProxyUrl(String),
    Labels(String),
    AutoStop(String, String),
}

/// The control plane's request handler.
pub struct Api {
    /// The sandboxes.
    pub store: Arc<Store>,
    /// Key, snapshots, regions.
    pub settings: Arc<Settings>,
    /// The switches a test turns on.
    pub faults: Arc<Faults>,
    /// What clients asked.
    pub journal: Arc<Journal>,
}

impl Handler for Api {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let url = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| request.uri().path().to_owned());
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let rest = path.strip_prefix(API_PREFIX).unwrap_or_default();
        if rest.trim_end_matches('/') == SOCKET_IO_PATH {
            return json_as(
                StatusCode::FORBIDDEN,
                "application/json",
                &serde_json::json!({"code": 4, "message": "Forbidden"}),
            );
        }
        if rest == ADMIN_PATH || rest == JOURNAL_PATH {
            if !self.authenticated(&request) {
                let refusal = Refusal::new(StatusCode::UNAUTHORIZED, "Invalid credentials");
                return error(&url, &refusal);
            }
            if rest == JOURNAL_PATH {
                return ok(StatusCode::OK, &self.journal.all());
            }
            return self.admin(request, &url).await;
        }
        let route = route(&method, &path);
        let published = path
            .strip_prefix(API_PREFIX)
            .is_some_and(|rest| is_published(method.as_str(), rest));
        if route.is_none() && !published {
            let message = format!("Cannot {method} {url}");
            return error(&url, &Refusal::new(StatusCode::NOT_FOUND, message));
        }
        if !self.authenticated(&request) {
            let refusal = Refusal::new(StatusCode::UNAUTHORIZED, "Invalid credentials");
            return error(&url, &refusal);
        }
        let query = query_pairs(&request);
        let body = match read_body(request.into_body(), MAX_JSON_BYTES).await {
            Ok(body) => body,
            Err(e) => return error(&url, &Refusal::bad(e.to_string())),
        };
        self.journal.record(method.as_str(), &url, &body);
        if let Some(retry_after) = self.faults.take_rate_limit() {
            let refusal = Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "ThrottlerException: Too Many Requests",
            );
            let mut response = error(&url, &refusal);
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from(retry_after),
            );
            return response;
        }
        let Some(route) = route else {
            let message = format!("the mock does not model {method} {path}");
            return error(&url, &Refusal::new(StatusCode::NOT_IMPLEMENTED, message));
        };
        let answer = match route {
            Route::List => self.list(&query),
            Route::Create => match json_of(&body) {
                Ok(body) => self.create(&body).await,
                Err(refusal) => Err(refusal),
            },
            Route::Get(id) => self
                .store
                .find(&id)
                .map(|r| ok(StatusCode::OK, &r.to_sandbox(&self.settings)))
                .ok_or_else(|| Refusal::not_found(&id)),
            Route::Delete(id) => self.store.destroy(&id).map(|r| self.sandbox(&r)),
            Route::Start(id) => self.store.start(&id).await.map(|r| self.sandbox(&r)),
            Route::Stop(id) => {
                let force = query_value(&query, "force") == Some("true");
                self.store.stop(&id, force).map(|r| self.sandbox(&r))
            }
            Route::Pause(id) => self.store.pause(&id).map(|r| self.sandbox(&r)),
            Route::NetworkSettings(id) => json_of(&body)
                .and_then(|body| network::parse_update(&body))
                .and_then(|update| self.store.update_network(&id, &update))
                .map(|r| self.sandbox(&r)),
            Route::PreviewUrl(id, port) => self.preview_url(&id, &port),
            Route::ToolboxProxyUrl(id) => match self.store.find(&id) {
                Some(_) => Ok(ok(
                    StatusCode::OK,
                    &ToolboxProxyUrl {
                        url: self.settings.toolbox_url.clone(),
                    },
                )),
                None => Err(Refusal::not_found(&id)),
            },
            Route::Labels(id) => match json_of(&body) {
                Ok(body) => self.replace_labels(&id, &body),
                Err(refusal) => Err(refusal),
            },
            Route::AutoStop(id, minutes) => {
                let minutes = minutes.parse::<i64>().unwrap_or(-1);
                self.store
                    .set_auto_stop(&id, minutes)
                    .map(|r| ok(StatusCode::CREATED, &r.to_sandbox(&self.settings)))
            }
        };
        answer.unwrap_or_else(|refusal| error(&url, &refusal))
    }
}

impl Api {
    /// The test-only switches: `GET` answers them, `POST` changes them
    /// (`lapsePreviewTokens: true` lapses every preview token there and then).
    async fn admin(&self, request: Request<Incoming>, url: &str) -> Response<Body> {
        if request.method() == Method::POST {
            let body = match read_body(request.into_body(), MAX_JSON_BYTES).await {
                Ok(body) => json_of(&body),
                Err(e) => Err(Refusal::bad(e.to_string())),
            };
            let body = match body {
                Ok(body) => body,
                Err(refusal) => return error(url, &refusal),
            };
            let switches: Switches = match serde_json::from_value(body) {
                Ok(switches) => switches,
                Err(refused) => return error(url, &Refusal::bad(refused.to_string())),
            };
            if let Err(refused) = self.faults.apply(&switches) {
                return error(url, &Refusal::bad(refused.to_string()));
            }
            if switches.lapse_preview_tokens == Some(true) {
                if let Err(refusal) = self.store.lapse_preview_tokens() {
                    return error(url, &refusal);
                }
            }
        }
        ok(StatusCode::OK, &self.faults.switches())
    }

    /// Whether the request carries the key as `Authorization: Bearer`.
    fn authenticated(&self, request: &Request<Incoming>) -> bool {
        header(request, http::header::AUTHORIZATION.as_str())
            .and_then(|value| {
                let (scheme, token) = value.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .is_some_and(|token| same_secret(token, &self.settings.api_key))
    }

    async fn create(&self, body: &Value) -> Result<Response<Body>, Refusal> {
        let new = create::parse(body, &self.settings)?;
        let record = self.store.create(new).await?;
        let mut answer = record.to_sandbox(&self.settings);
        // The controller waits for `started` but answers the object it had
        // before the wait (a sandbox not from the warm pool): `creating`.
        answer.state = CREATE_ANSWER_STATE;
        Ok(ok(StatusCode::OK, &answer))
    }

    fn list(&self, query: &[(String, String)]) -> Result<Response<Body>, Refusal> {
        let parsed = list::parse(query)?;
        let r = &self.settings.resources;
        let (records, next_cursor) =
            list::page(self.store.all(), &parsed, (r.cpu, r.memory, r.disk));
        let page = ListSandboxesResponse {
            items: records
                .iter()
                .map(|r| r.to_list_item(&self.settings))
                .collect(),
            next_cursor,
        };
        Ok(ok(StatusCode::OK, &page))
    }

    fn preview_url(&self, id: &str, port: &str) -> Result<Response<Body>, Refusal> {
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| Refusal::bad("Invalid port"))?;
        let record = self.store.find(id).ok_or_else(|| Refusal::not_found(id))?;
        Ok(ok(
            StatusCode::OK,
            &PortPreviewUrl {
                url: self.settings.preview_url(port, &record.id),
                sandbox_id: record.id,
                token: record.auth_token,
            },
        ))
    }

    fn replace_labels(&self, id: &str, body: &Value) -> Result<Response<Body>, Refusal> {
        let Some(labels) = body.get("labels").and_then(Value::as_object) else {
            return Err(Refusal::bad("labels must be an object"));
        };
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string()),
                )
            })
            .collect();
        self.store
            .replace_labels(id, labels)
            .map(|r| self.sandbox(&r))
    }

    fn sandbox(&self, record: &super::store::Record) -> Response<Body> {
        ok(StatusCode::OK, &record.to_sandbox(&self.settings))
    }
}

/// The route a method and path name, if the mock serves it.
fn route(method: &Method, path: &str) -> Option<Route> {
    let rest = path.strip_prefix(API_PREFIX)?;
    let rest = rest.strip_prefix('/')?.trim_end_matches('/');
    let segments: Vec<&str> = rest.split('/').collect();
    let owned = |s: &&str| (*s).to_owned();
    Some(match (method, segments.as_slice()) {
        (&Method::GET, ["sandbox"]) => Route::List,
        (&Method::POST, ["sandbox"]) => Route::Create,
        // Literal routes the framework matches before `{sandboxIdOrName}`.
        (&Method::GET, ["sandbox", "paginated" | "for-runner"]) => return None,
        (&Method::GET, ["sandbox", id]) => Route::Get(owned(id)),
        (&Method::DELETE, ["sandbox", id]) => Route::Delete(owned(id)),
        (&Method::POST, ["sandbox", id, "start"]) => Route::Start(owned(id)),
        (&Method::POST, ["sandbox", id, "stop"]) => Route::Stop(owned(id)),
        (&Method::POST, ["sandbox", id, "pause"]) => Route::Pause(owned(id)),
        (&Method::POST, ["sandbox", id, "network-settings"]) => Route::NetworkSettings(owned(id)),
        (&Method::GET, ["sandbox", id, "ports", port, "preview-url"]) => {
            Route::PreviewUrl(owned(id), owned(port))
        }
        (&Method::GET, ["sandbox", id, "toolbox-proxy-url"]) => Route::ToolboxProxyUrl(owned(id)),
        (&Method::PUT, ["sandbox", id, "labels"]) => Route::Labels(owned(id)),
        (&Method::POST, ["sandbox", id, "autostop", minutes]) => {
            Route::AutoStop(owned(id), owned(minutes))
        }
        _ => return None,
    })
}

/// A body as JSON; an empty body reads as `null`.
fn json_of(body: &[u8]) -> Result<Value, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| Refusal::bad(e.to_string()))
}

fn ok<T: Serialize>(code: StatusCode, value: &T) -> Response<Body> {
    json_as(code, JSON_UTF8, value)
}

/// The exception filter's body for `refusal` on the request for `url`.
fn error(url: &str, refusal: &Refusal) -> Response<Body> {
    let body = ApiError {
        path: url.to_owned(),
        timestamp: iso_millis(SystemTime::now()),
        status_code: refusal.status.as_u16(),
        error: refusal
            .status
            .canonical_reason()
            .unwrap_or_default()
            .to_owned(),
        message: refusal.message.clone(),
    };
    json_as(refusal.status, JSON_UTF8, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_live_under_the_api_prefix() {
        assert!(matches!(
            route(&Method::GET, "/api/sandbox"),
            Some(Route::List)
        ));
        assert!(matches!(
            route(&Method::GET, "/api/sandbox/"),
            Some(Route::List)
        ));
        assert!(matches!(
            route(&Method::GET, "/api/sandbox/x/ports/3000/preview-url"),
            Some(Route::PreviewUrl(id, port)) if id == "x" && port == "3000"
        ));
        assert!(route(&Method::GET, "/sandbox").is_none());
        assert!(route(&Method::POST, "/api/x/process/execute").is_none());
        assert!(route(&Method::POST, "/api/toolbox/x/process/execute").is_none());
        assert!(route(&Method::PATCH, "/api/sandbox").is_none());
    }
}
