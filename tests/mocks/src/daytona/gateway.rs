//! Daytona's proxy on top of the shared [`crate::proxy`]: one TLS listener
//! serving both the previews and the toolbox, routed by `Host` as the real
//! proxy routes them (daytonaio/daytona `apps/proxy`).
//!
//! A host whose first label is `{port}-{sandboxId}` is a preview: the
//! request goes to that container port, published on 127.0.0.1, with
//! `Host: localhost:{port}` and `X-Forwarded-Host` as the sandbox sees it
//! behind the real proxy, WebSocket upgrades spliced. Port 2280 is the
//! toolbox itself. Any other host (the toolbox host `proxy.{proxyDomain}`
//! among them) serves `/toolbox/{sandboxId}/{path}` to the toolbox and
//! answers `404` to everything else.
//!
//! Access: the API key as `Authorization: Bearer`, or the sandbox's
//! current preview token in `X-Daytona-Preview-Token` (or the
//! `DAYTONA_SANDBOX_AUTH_KEY` query parameter). The toolbox always needs
//! one (`401` otherwise); a preview needs one unless the sandbox is public
//! (ports 22222, 2280 and 33333 always do) and sends a client without one
//! to sign in (`307`). A sandbox that is not running answers as the runner
//! behind the proxy does (`400` "Is the Sandbox started?"); a port nothing
//! listens on answers `502` with no body. Every request that gets through
//! counts as activity for auto-stop, and so does every relayed exchange
//! while it is open, unless `X-Daytona-Skip-Last-Activity-Update: true`.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;
use http::header::{AUTHORIZATION, HOST, LOCATION};
use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Settings;
use super::reply::{GoError, go_error};
use super::store::{ActivityHold, Desired, Record, State, Store};
use super::toolbox;
use crate::faults::Faults;
use crate::http::{Body, Handler, full, header, hostname, request_host, status, with_body};
use crate::proxy::forward;
use crate::secret::{HEX, random_text, same_secret};

/// The header carrying a preview token.
pub const PREVIEW_TOKEN_HEADER: &str = "x-daytona-preview-token";
/// The query parameter carrying a preview token.
pub const PREVIEW_TOKEN_QUERY: &str = "DAYTONA_SANDBOX_AUTH_KEY";
/// The header that keeps a request from counting as activity.
pub const SKIP_ACTIVITY_HEADER: &str = "x-daytona-skip-last-activity-update";
/// The toolbox's port in every sandbox.
pub const TOOLBOX_PORT: u16 = 2280;
/// Ports that need a token even on a public sandbox (terminal, toolbox, recordings).
const ALWAYS_PRIVATE_PORTS: [u16; 3] = [22222, TOOLBOX_PORT, 33333];
/// What the runner says when the sandbox's container has no address.
const NOT_STARTED: &str =
    "failed to resolve container IP after 3 attempts: no IP address found. Is the Sandbox started?";
/// What the proxy says when no credential was given at all.
const NO_CREDENTIALS: &str = "missing authentication: provide a preview access token (via header, query parameter, or cookie) or use an API key or JWT";

/// The proxy's request handler.
pub struct Gateway {
    /// The sandboxes.
    pub store: Arc<Store>,
    /// Domain, key, ports.
    pub settings: Arc<Settings>,
    /// The fault switches (an older toolbox among them).
    pub faults: Arc<Faults>,
    /// Ends spliced connections and session pumps at shutdown.
    pub cancel: CancellationToken,
}

/// How a request proved it may reach a sandbox.
enum Credential {
    Public,
    Bearer,
    Token,
    QueryToken,
}

impl Handler for Gateway {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let host = request_host(&request);
        match preview_target(hostname(&host)) {
            Some((port, sandbox_id)) => self.preview(request, &host, port, &sandbox_id).await,
            None => self.toolbox_route(request).await,
        }
    }
}

impl Gateway {
    /// A request to the toolbox host (or any host that names no port).
    async fn toolbox_route(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let method = request.method().clone();
        let not_found = || go_error(GoError::NotFound, "not found", &path, &method);
        let Some((sandbox_id, rest)) = path
            .strip_prefix("/toolbox/")
            .and_then(|tail| tail.split_once('/'))
        else {
            return not_found();
        };
        let daemon_path = format!("/{rest}");
        let record = match self.authenticate(&request, sandbox_id) {
            Ok((record, _)) => record,
            Err(reason) => return go_error(GoError::Unauthorized, &reason, &path, &method),
        };
        let _hold = self.activity(&request, &record);
        let runner_path = format!("/sandboxes/{}/toolbox{daemon_path}", record.id);
        if let Some(refusal) = not_running(&record, &runner_path, &method) {
            return refusal;
        }
        let older = self.faults.no_bulk_upload();
        toolbox::handle(&record, &daemon_path, request, &self.cancel, older).await
    }

    /// A request to `{port}-{sandboxId}.{domain}`.
    async fn preview(
        &self,
        mut request: Request<Incoming>,
        host: &str,
        port: u32,
        sandbox_id: &str,
    ) -> Response<Body> {
        let method = request.method().clone();
        let public = self.store.get(sandbox_id).filter(|r| r.public);
        let needs_credential = u16::try_from(port)
            .map_or(true, |p| ALWAYS_PRIVATE_PORTS.contains(&p))
            || public.is_none();
        let (record, credential) = match public {
            Some(record) if !needs_credential => (record, Credential::Public),
            _ => match self.authenticate(&request, sandbox_id) {
                Ok(found) => found,
                Err(_) => return self.sign_in(&request, host, sandbox_id),
            },
        };
        strip_credential(&mut request, &credential);
        let hold = self.activity(&request, &record);
        if port == u32::from(TOOLBOX_PORT) {
            let path = request.uri().path().to_owned();
            let runner_path = format!("/sandboxes/{}/toolbox{path}", record.id);
            if let Some(refusal) = not_running(&record, &runner_path, &method) {
                return refusal;
            }
            let older = self.faults.no_bulk_upload();
            return toolbox::handle(&record, &path, request, &self.cancel, older).await;
        }
        let runner_path = format!(
            "/sandboxes/{}/toolbox/proxy/{port}{}",
            record.id,
            request.uri().path()
        );
        if let Some(refusal) = not_running(&record, &runner_path, &method) {
            return refusal;
        }
        if record.unready_until.is_some_and(|t| Instant::now() < t) {
            return status(StatusCode::BAD_GATEWAY);
        }
        let Some(upstream) = u16::try_from(port)
            .ok()
            .and_then(|p| record.container.host_addr(p))
        else {
            return status(StatusCode::BAD_GATEWAY);
        };
        let headers = request.headers_mut();
        if let Ok(value) = HeaderValue::from_str(&format!("localhost:{port}")) {
            headers.insert(HOST, value);
        }
        if let Ok(value) = HeaderValue::from_str(host) {
            headers.insert("x-forwarded-host", value);
        }
        match forward(request, upstream, &self.cancel, hold).await {
            Ok(response) => response,
            Err(error) => {
                tracing::debug!(sandbox = %record.id, port, %error, "relaying failed");
                status(StatusCode::BAD_GATEWAY)
            }
        }
    }

    /// The sandbox and the credential that reaches it, or the proxy's
    /// reason for refusing (every failed method, joined by `,`).
    fn authenticate(
        &self,
        request: &Request<Incoming>,
        sandbox_id: &str,
    ) -> Result<(Record, Credential), String> {
        let record = self.store.get(sandbox_id);
        let token_valid = |token: &str| {
            record
                .as_ref()
                .is_some_and(|r| same_secret(token, &r.auth_token))
        };
        let mut failures = Vec::new();
        let bearer = header(request, AUTHORIZATION.as_str())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let Some(key) = bearer {
            match &record {
                Some(r) if same_secret(key, &self.settings.api_key) => {
                    return Ok((r.clone(), Credential::Bearer));
                }
                _ => failures.push("Bearer token is invalid"),
            }
        }
        if let Some(token) = header(request, PREVIEW_TOKEN_HEADER).filter(|t| !t.is_empty()) {
            match &record {
                Some(r) if token_valid(token) => return Ok((r.clone(), Credential::Token)),
                _ => failures.push("Auth key header is invalid"),
            }
        }
        let query = crate::http::query_pairs(request);
        if let Some(token) =
            crate::http::query_value(&query, PREVIEW_TOKEN_QUERY).filter(|t| !t.is_empty())
        {
            match &record {
                Some(r) if token_valid(token) => return Ok((r.clone(), Credential::QueryToken)),
                _ => failures.push("Auth key query parameter is invalid"),
            }
        }
        if failures.is_empty() {
            Err(NO_CREDENTIALS.to_owned())
        } else {
            Err(format!("authentication failed: {}", failures.join(",")))
        }
    }

    /// Counts the request as activity, and holds the sandbox active while
    /// the returned hold lives.
    fn activity(&self, request: &Request<Incoming>, record: &Record) -> Option<ActivityHold> {
        (header(request, SKIP_ACTIVITY_HEADER) != Some("true")).then(|| record.activity.hold())
    }

    /// The proxy's answer to a preview request without a valid credential:
    /// `307` to sign in (an authorization URL under the mock's domain).
    fn sign_in(&self, request: &Request<Incoming>, host: &str, sandbox_id: &str) -> Response<Body> {
        let base_host = host.split_once('.').map(|(_, base)| base).unwrap_or(host);
        let state = random_text(32, HEX).unwrap_or_default();
        let return_to = format!(
            "https://{host}{}",
            request
                .uri()
                .path_and_query()
                .map(PathAndQuery::as_str)
                .unwrap_or("/")
        );
        let state = URL_SAFE.encode(
            json!({"state": state, "returnTo": return_to, "sandboxId": sandbox_id}).to_string(),
        );
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", "daytona")
            .append_pair("redirect_uri", &format!("https://{base_host}/callback"))
            .append_pair("response_type", "code")
            .append_pair("scope", "openid profile")
            .append_pair("state", &state)
            .finish();
        let location = format!(
            "https://auth.{}/authorize?{query}",
            self.settings.proxy_domain
        );
        let mut response = if matches!(*request.method(), Method::GET | Method::HEAD) {
            with_body(
                StatusCode::TEMPORARY_REDIRECT,
                "text/html; charset=utf-8",
                full(format!(
                    "<a href=\"{}\">Temporary Redirect</a>.\n\n",
                    html_escape(&location)
                )),
            )
        } else {
            status(StatusCode::TEMPORARY_REDIRECT)
        };
        if let Ok(value) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(LOCATION, value);
        }
        response
    }
}

/// The runner's answer when the sandbox cannot be reached, if it cannot.
fn not_running(record: &Record, runner_path: &str, method: &Method) -> Option<Response<Body>> {
    if record.desired == Desired::Destroyed {
        let reason = format!(
            "sandbox container not found: No such container: {}",
            record.id
        );
        return Some(go_error(GoError::NotFound, &reason, runner_path, method));
    }
    (record.state != State::Started)
        .then(|| go_error(GoError::BadRequest, NOT_STARTED, runner_path, method))
}

/// Removes the credential the proxy consumed, as it does before relaying.
fn strip_credential(request: &mut Request<Incoming>, credential: &Credential) {
    request.headers_mut().remove(PREVIEW_TOKEN_HEADER);
    match credential {
        Credential::Bearer => {
            request.headers_mut().remove(AUTHORIZATION);
        }
        Credential::QueryToken => {
            let kept: Vec<(String, String)> = crate::http::query_pairs(request)
                .into_iter()
                .filter(|(k, _)| k != PREVIEW_TOKEN_QUERY)
                .collect();
            let mut path = request.uri().path().to_owned();
            if !kept.is_empty() {
                let query = form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(kept)
                    .finish();
                path = format!("{path}?{query}");
            }
            if let Ok(uri) = path.parse::<Uri>() {
                *request.uri_mut() = uri;
            }
        }
        Credential::Public | Credential::Token => {}
    }
}

/// `{port}-{sandboxId}.{rest}` → (port, sandbox id), as the proxy's
/// `parseHost` reads a host (the first label cut at its first `-`).
fn preview_target(host: &str) -> Option<(u32, String)> {
    let (first, rest) = host.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    let (port, sandbox_id) = first.split_once('-')?;
    let port = port.parse().ok()?;
    Some((port, sandbox_id.to_owned()))
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preview_hosts_cut_the_first_label_at_its_first_hyphen() {
        assert_eq!(
            preview_target("49999-0b1e-4f.daytona.test"),
            Some((49999, "0b1e-4f".to_owned()))
        );
        assert_eq!(preview_target("proxy.daytona.test"), None);
        assert_eq!(preview_target("web-abc.daytona.test"), None);
        assert_eq!(preview_target("49999-abc"), None);
        assert_eq!(preview_target("127.0.0.1"), None);
    }
}
