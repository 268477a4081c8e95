//! E2B's sandbox proxy rules on top of the shared [`crate::proxy`]: which
//! sandbox and port a request is for, who may use it, and the refusals, as
//! e2b-dev/infra's client and orchestrator proxies answer them.
//!
//! The target comes from the `Host` header `{port}-{sandboxID}.{domain}`
//! (left-most label split on `-`), or from `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` when the host is `localhost`, an IP address or
//! `sandbox.{domain}`. Port 49983 is envd, served by the mock itself;
//! other ports are relayed to the container's published port. A sandbox
//! that is not running (paused included: auto-resume is not modelled) is
//! "not found" (502). `api.{domain}` is the control plane, so a client may
//! reach everything through the one TLS address.
//!
//! Error bodies are always the JSON variant (the real proxy sends HTML to
//! browsers). With the mock's faults on, a pause cuts every open
//! connection to the sandbox (answers in flight break off, spliced
//! upgrades close) and a resumed sandbox's ports answer `502` for a while.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::api::Api;
use super::envd;
use super::store::Store;
use super::{ENVD_PORT, Settings};
use crate::containers::files::clean_path;
use crate::http::{
    Body, Handler, cut_when, full, header, hostname, json_as, request_host, with_body,
};
use crate::proxy::forward;
use crate::secret::same_secret;

/// The header of a private sandbox's traffic token.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";
/// envd routes only the orchestrator may call (`x-internal` in envd.yaml).
const INTERNAL_PATHS: [&str; 7] = [
    "/collapse",
    "/freeze",
    "/fsfreeze",
    "/fsthaw",
    "/init",
    "/unfreeze",
    "/upgrade",
];

/// The proxy's request handler.
pub struct Gateway {
    /// The sandboxes.
    pub store: Arc<Store>,
    /// The control plane, for `api.{domain}`.
    pub api: Arc<Api>,
    /// Domain and ports.
    pub settings: Arc<Settings>,
    /// Ends spliced connections and process pumps at shutdown.
    pub cancel: CancellationToken,
}

impl Handler for Gateway {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let host = request_host(&request);
        let hostname = hostname(&host);
        if hostname == format!("api.{}", self.settings.domain) {
            return self.api.handle(request).await;
        }
        let (sandbox_id, port) = match target(&request, &host) {
            Ok(target) => target,
            Err(message) => return plain_error(message),
        };
        let Some(record) = self.store.get(&sandbox_id).filter(|r| r.state.runs()) else {
            return proxy_error(json!({
                "sandboxId": sandbox_id,
                "message": "The sandbox was not found",
                "code": 502,
            }));
        };
        let port_closed = || {
            proxy_error(json!({
                "sandboxId": sandbox_id,
                "message": "The sandbox is running but port is not open",
                "port": port,
                "code": 502,
            }))
        };
        if record.unready_until.is_some_and(|t| Instant::now() < t) {
            return port_closed();
        }
        if port == u64::from(ENVD_PORT) {
            let path = request.uri().path();
            if INTERNAL_PATHS.contains(&clean_path(path).as_str()) {
                return proxy_error(json!({
                    "message": "This endpoint is reserved for the E2B control plane and is not reachable through the sandbox URL",
                    "path": path,
                    "code": 404,
                }));
            }
            let (parts, body) = envd::handle(&record, request, &self.cancel)
                .await
                .into_parts();
            return Response::from_parts(parts, cut_when(body, record.links.clone()));
        }
        if let Some(token) = &record.traffic_token {
            let refusal = match header(&request, TRAFFIC_TOKEN_HEADER) {
                None | Some("") => Some(format!(
                    "Sandbox is secured with traffic access token. Token header '{TRAFFIC_TOKEN_HEADER}' is missing"
                )),
                Some(given) if !same_secret(given, token) => Some(format!(
                    "Sandbox is secured with traffic access token. Provided token in header '{TRAFFIC_TOKEN_HEADER}' is invalid"
                )),
                Some(_) => None,
            };
            if let Some(message) = refusal {
                return proxy_error(json!({
                    "sandboxId": sandbox_id,
                    "message": message,
                    "code": 403,
                }));
            }
        }
        let Some(upstream) = u16::try_from(port)
            .ok()
            .and_then(|p| record.container.host_addr(p))
        else {
            return port_closed();
        };
        match forward(request, upstream, &record.links, ()).await {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                Response::from_parts(parts, cut_when(body, record.links.clone()))
            }
            Err(error) => {
                tracing::debug!(sandbox = %sandbox_id, port, %error, "relaying failed");
                port_closed()
            }
        }
    }
}

/// The sandbox id and port a request is for, or the text of the proxy's `400`.
fn target(request: &Request<Incoming>, host: &str) -> Result<(String, u64), &'static str> {
    let id_header = header(request, "e2b-sandbox-id").filter(|v| !v.is_empty());
    let port_header = header(request, "e2b-sandbox-port").filter(|v| !v.is_empty());
    let routed_by_headers = id_header.is_some() || port_header.is_some();
    let (id, port) = if routed_by_headers && headers_allowed(host) {
        let (Some(id), Some(port)) = (id_header, port_header) else {
            return Err("missing header");
        };
        (id.to_owned(), port.to_owned())
    } else {
        let Some((label, _)) = host.split_once('.') else {
            return Err("Invalid host");
        };
        let mut parts = label.split('-');
        let (Some(port), Some(id)) = (parts.next(), parts.next()) else {
            return Err("Invalid host");
        };
        (id.to_owned(), port.to_owned())
    };
    let port: u64 = port.parse().map_err(|_| "Invalid sandbox port")?;
    let valid_id = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid_id {
        return Err("Invalid sandbox ID");
    }
    Ok((id, port))
}

/// Routing headers count only for `localhost`, an IP, or `sandbox.{domain}`.
fn headers_allowed(host: &str) -> bool {
    let name = hostname(host);
    name == "localhost"
        || name.parse::<IpAddr>().is_ok()
        || name.strip_prefix("sandbox.").is_some_and(|d| !d.is_empty())
}

/// The proxy's JSON refusal; `code` in the body is the status.
fn proxy_error(body: serde_json::Value) -> Response<Body> {
    let status = body["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    json_as(status, "application/json; charset=utf-8", &body)
}

/// Go's `http.Error`: the text and a newline.
fn plain_error(message: &str) -> Response<Body> {
    let mut response = with_body(
        StatusCode::BAD_REQUEST,
        "text/plain; charset=utf-8",
        full(format!("{message}\n")),
    );
    response.headers_mut().insert(
        "x-content-type-options",
        http::HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_headers_need_a_neutral_host() {
        assert!(headers_allowed("127.0.0.1:4443"));
        assert!(headers_allowed("localhost"));
        assert!(headers_allowed("sandbox.e2b.test"));
        assert!(!headers_allowed("sandbox."));
        assert!(!headers_allowed("49983-iabc.e2b.test"));
    }
}
