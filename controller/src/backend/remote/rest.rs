//! [`Rest`]: the one JSON-over-HTTP(S) client of providers' REST APIs (a
//! control plane, an in-VM daemon reached through a proxy), and
//! [`RestError`], why a call to one did not do what was asked, a service's
//! refusal ([`RestError::Refused`]) among them.
//!
//! Each call opens a fresh connection through the agent client's transport
//! ([`transport::exchange`]: TLS, trusted roots and the HTTP/1 handshake are
//! set up there once), sends one request and reads the whole answer. Calls
//! that fail in a way worth another try (no connection, a timeout, 429, 502,
//! 503, 504) are retried with exponential backoff inside [`RETRY_BUDGET`]; a
//! provider's `Retry-After` is honoured. Nothing else is retried: 4xx answers
//! mean the request itself is wrong.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::Full;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::de::DeserializeOwned;

use crate::client::{ClientError, Endpoint, transport};
use crate::retry::{Backoff, jitter};

/// How long one call may keep retrying.
pub const RETRY_BUDGET: Duration = Duration::from_secs(30);
/// Longest a single request may take, answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Pauses between tries: doubled from 200 ms up to 5 s.
const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(200),
    max: Duration::from_secs(5),
};

/// Where a provider's API answers, and what every request to it carries.
#[derive(Debug, Clone)]
pub struct Rest {
    /// Who answers, for messages ("the E2B API", "envd of sandbox X").
    what: String,
    endpoint: Endpoint,
    /// Prepended to every path (an API URL may have one).
    base_path: String,
    headers: Vec<(String, String)>,
    retry_budget: Duration,
}

/// One request to a service: what [`Rest::send`] retries and
/// [`Rest::open_stream`] opens. Besides the client's own headers it carries
/// `headers`, and `body` as `content_type` when it has one.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    method: Method,
    path_and_query: &'a str,
    content_type: Option<&'a str>,
    headers: Vec<(&'a str, &'a str)>,
    body: Bytes,
}

impl<'a> Call<'a> {
    /// `method` on `path_and_query` (under the client's base path), with no
    /// body.
    pub fn new(method: Method, path_and_query: &'a str) -> Self {
        Self {
            method,
            path_and_query,
            content_type: None,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// The same call, carrying `body` as `content_type`.
    pub fn body(mut self, content_type: &'a str, body: Bytes) -> Self {
        self.content_type = Some(content_type);
        self.body = body;
        self
    }

    /// The same call, carrying header `name` too.
    pub fn header(mut self, name: &'a str, value: &'a str) -> Self {
        self.headers.push((name, value));
        self
    }
}

/// A whole answer.
#[derive(Debug)]
pub struct Reply {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self, what: &str) -> Result<T, RestError> {
        serde_json::from_slice(&self.body).map_err(|source| RestError::Decode {
            what: what.to_owned(),
            source,
        })
    }

    /// The body as text, for error messages (cut at a sane length).
    pub fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        match text.char_indices().nth(500) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text.to_owned(),
        }
    }

    /// The message of an error answer, in any of the shapes providers'
    /// services answer: `{message}` (a string, or a list joined), `{error}`
    /// or `{errors}`, with E2B's machine-readable `error_code` after it when
    /// given; the text of any other body.
    pub fn message(&self) -> String {
        let Ok(body) = serde_json::from_slice::<serde_json::Value>(&self.body) else {
            return self.text();
        };
        let text = |value: &serde_json::Value| match value {
            serde_json::Value::String(text) => Some(text.clone()),
            serde_json::Value::Array(items) => Some(
                items
                    .iter()
                    .filter_map(|item| item.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            _ => None,
        };
        let message = ["message", "error", "errors"]
            .iter()
            .find_map(|field| body.get(field).and_then(text));
        match (
            message,
            body.get("error_code").and_then(|code| code.as_str()),
        ) {
            (Some(message), Some(code)) => format!("{message} [{code}]"),
            (Some(message), None) => message,
            (None, _) => self.text(),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    /// The URL is not one this client can use.
    #[error("{url:?} is not a usable URL: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// No answer within the retry budget.
    #[error("{what} did not answer: {reason}")]
    Unreachable {
        /// Who was asked.
        what: String,
        /// The last failure.
        reason: String,
    },
    /// The provider kept answering "try later" until the budget ran out.
    #[error("{what} answered {status} until silo gave up: {body}")]
    GaveUp {
        /// Who was asked.
        what: String,
        /// The last status.
        status: StatusCode,
        /// The last body.
        body: String,
    },
    /// An answer's body was not what the provider's API documents.
    #[error("cannot read {what}")]
    Decode {
        /// What was being read.
        what: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The service answered with an error instead of doing what was asked.
    #[error(
        "{who} refused to {what} ({status}): {}{hint}",
        if message.is_empty() { "it gave no reason" } else { message.as_str() }
    )]
    Refused {
        /// Who answered: the provider ("E2B"), or a service of one of its
        /// sandboxes ("the toolbox of Daytona sandbox …").
        who: String,
        /// What was asked.
        what: String,
        /// Its HTTP status.
        status: u16,
        /// The service's message.
        message: String,
        /// What to do about it, when the status says (empty otherwise).
        hint: &'static str,
    },
}

impl Rest {
    /// A client for the API at `url` (`http://host[:port][/path]` or
    /// `https://…`), trusting `ca_pem` besides nothing else when given (the
    /// system's roots otherwise), sending `headers` with every request.
    pub fn new(
        what: impl Into<String>,
        url: &str,
        ca_pem: Option<std::path::PathBuf>,
        headers: Vec<(String, String)>,
    ) -> Result<Self, RestError> {
        let bad = |reason: &str| RestError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = url.parse().map_err(|_| bad("it does not parse"))?;
        let host = uri.host().ok_or_else(|| bad("it has no host"))?.to_owned();
        let endpoint = match uri.scheme_str() {
            Some("https") => Endpoint::Tls {
                port: uri.port_u16().unwrap_or(443),
                server_name: host.clone(),
                host,
                ca_pem,
                headers: Vec::new(),
                host_header: None,
            },
            Some("http") => Endpoint::Tcp {
                port: uri.port_u16().unwrap_or(80),
                host,
            },
            _ => return Err(bad("it is neither http nor https")),
        };
        Ok(Self {
            what: what.into(),
            endpoint,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            headers,
            retry_budget: RETRY_BUDGET,
        })
    }

    /// A client for an API reached at `endpoint` (a proxy route, say).
    pub fn at(what: impl Into<String>, endpoint: Endpoint, headers: Vec<(String, String)>) -> Self {
        Self {
            what: what.into(),
            endpoint,
            base_path: String::new(),
            headers,
            retry_budget: RETRY_BUDGET,
        }
    }

    /// The same client, connecting to `proxy` (a test proxy on loopback)
    /// instead of its HTTPS host's own address; the name still goes in SNI
    /// and `Host`. Plain HTTP and `None` leave it as it is.
    pub fn via(mut self, proxy: Option<&(String, u16)>) -> Self {
        if let (Some((to, to_port)), Endpoint::Tls { host, port, .. }) = (proxy, &mut self.endpoint)
        {
            host.clone_from(to);
            *port = *to_port;
        }
        self
    }

    /// The same client, retrying for `budget` at most (a quick check).
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// Who answers, for messages.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// The error for an answer this service gave instead of doing `what`.
    pub fn refused(&self, what: impl Into<String>, reply: &Reply) -> RestError {
        RestError::Refused {
            who: self.what.clone(),
            what: what.into(),
            status: reply.status.as_u16(),
            message: reply.message(),
            hint: "",
        }
    }

    /// Sends a JSON body (or none) and reads the answer, retrying what is
    /// worth retrying. Any status comes back as a [`Reply`]; only failing
    /// to get one is an error.
    pub async fn json(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Reply, RestError> {
        let mut call = Call::new(method, path_and_query);
        if let Some(value) = body {
            let body = serde_json::to_vec(value).unwrap_or_default();
            call = call.body("application/json", body.into());
        }
        self.send(&call).await
    }

    /// Sends `call`, retrying what is worth retrying. Any status comes back
    /// as a [`Reply`]; only failing to get one is an error.
    pub async fn send(&self, call: &Call<'_>) -> Result<Reply, RestError> {
        let deadline = Instant::now() + self.retry_budget;
        let mut tries = 0u32;
        loop {
            let attempt = tokio::time::timeout(REQUEST_TIMEOUT, self.once(call))
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::Timeout {
                        what: format!("{} {}", self.what, call.path_and_query),
                    })
                });
            let pause = match attempt {
                Ok(reply) if !retryable(reply.status) => return Ok(reply),
                Ok(reply) => {
                    if Instant::now() >= deadline {
                        return Err(RestError::GaveUp {
                            what: self.what.clone(),
                            status: reply.status,
                            body: reply.text(),
                        });
                    }
                    // The provider's Retry-After is the least it asks for:
                    // waited in full, never shortened by jitter.
                    retry_after(&reply.headers).unwrap_or_else(|| jitter(BACKOFF.pause(tries)))
                }
                Err(error) => {
                    if Instant::now() >= deadline {
                        return Err(RestError::Unreachable {
                            what: self.what.clone(),
                            reason: unreachable_reason(&error),
                        });
                    }
                    jitter(BACKOFF.pause(tries))
                }
            };
            let pause = pause.min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
            tries = tries.saturating_add(1);
        }
    }

    /// Opens `call` and answers as soon as its status arrives, for
    /// streamed answers; not retried.
    pub async fn open_stream(
        &self,
        call: &Call<'_>,
    ) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
        let mut builder = http::Request::builder()
            .method(call.method.clone())
            .uri(format!("{}{}", self.base_path, call.path_and_query))
            .header(http::header::HOST, self.host_header());
        for (name, value) in self.endpoint.extra_headers() {
            builder = builder.header(name.as_str(), value.as_str());
        }
        for (name, value) in &self.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        for (name, value) in &call.headers {
            builder = builder.header(*name, *value);
        }
        if let Some(content_type) = call.content_type {
            builder = builder.header(http::header::CONTENT_TYPE, content_type);
        }
        let request = builder
            .body(Full::new(call.body.clone()))
            .map_err(|e| ClientError::Protocol(format!("building a request: {e}")))?;
        transport::exchange(&self.endpoint, request).await
    }

    async fn once(&self, call: &Call<'_>) -> Result<Reply, ClientError> {
        let response = self.open_stream(call).await?;
        let (head, body) = transport::read_whole(response).await?;
        Ok(Reply {
            status: head.status,
            headers: head.headers,
            body,
        })
    }

    fn host_header(&self) -> String {
        match &self.endpoint {
            Endpoint::Tcp { host, port } => format!("{host}:{port}"),
            Endpoint::Tls {
                server_name, port, ..
            } if *port != 443 => format!("{server_name}:{port}"),
            other => other.host_header().to_owned(),
        }
    }
}

/// What went wrong with a connection, without calling the peer an agent.
fn unreachable_reason(error: &ClientError) -> String {
    match error {
        ClientError::Connect { endpoint, source } => format!("{endpoint}: {source}"),
        other => silo_protocol::http::error_chain(other),
    }
}

/// Answers worth another try: the provider is busy or its proxy could not
/// reach the backend for a moment.
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

/// What a URL component keeps as it is: RFC 3986's unreserved characters
/// (ids that are UUIDs keep their dashes).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A value (an id, a path, a filter) as one URL path segment or query value.
pub fn encode(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

/// A `Retry-After` in seconds (the form providers use), capped.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(BACKOFF.max))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn urls_become_endpoints_with_their_path() {
        let rest = Rest::new("api", "https://api.e2b.app/v1/", None, vec![]).unwrap();
        assert!(matches!(
            &rest.endpoint,
            Endpoint::Tls { host, port: 443, server_name, .. } if host == "api.e2b.app" && server_name == "api.e2b.app"
        ));
        assert_eq!(rest.base_path, "/v1");
        let rest = Rest::new("api", "http://127.0.0.1:3000", None, vec![]).unwrap();
        assert!(matches!(&rest.endpoint, Endpoint::Tcp { port: 3000, .. }));
        assert_eq!(rest.host_header(), "127.0.0.1:3000");
        let err = Rest::new("api", "ftp://x", None, vec![]).unwrap_err();
        assert!(err.to_string().contains("neither http nor https"), "{err}");
    }

    #[test]
    fn only_busy_answers_are_retried_and_retry_after_is_capped() {
        assert!(retryable(StatusCode::TOO_MANY_REQUESTS));
        assert!(retryable(StatusCode::BAD_GATEWAY));
        assert!(!retryable(StatusCode::UNAUTHORIZED));
        assert!(!retryable(StatusCode::NOT_FOUND));
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(http::header::RETRY_AFTER, "3600".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(BACKOFF.max));
    }

    fn reply(status: u16, body: &str) -> Reply {
        Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: body.to_owned().into(),
        }
    }

    #[test]
    fn every_providers_error_shape_gives_its_message() {
        let e2b = reply(
            409,
            r#"{"code":409,"message":"busy","error_code":"sandbox_busy"}"#,
        );
        assert_eq!(e2b.message(), "busy [sandbox_busy]");
        let daytona = reply(
            400,
            r#"{"statusCode":400,"message":["a","b"],"error":"Bad"}"#,
        );
        assert_eq!(daytona.message(), "a; b");
        assert_eq!(
            reply(400, r#"{"error":"no such file"}"#).message(),
            "no such file"
        );
        assert_eq!(
            reply(404, "404 page not found\n").message(),
            "404 page not found"
        );
        assert_eq!(reply(500, r#"["x"]"#).message(), r#"["x"]"#);
        let rest = Rest::new("the toolbox of sandbox s", "http://h", None, vec![]).unwrap();
        let refused = rest.refused("run a command", &reply(500, "")).to_string();
        assert_eq!(
            refused,
            "the toolbox of sandbox s refused to run a command (500): it gave no reason"
        );
    }

    #[test]
    fn a_component_keeps_only_unreserved_characters() {
        assert_eq!(encode("ad36be6c-39b4"), "ad36be6c-39b4");
        assert_eq!(encode("silo.home=a b&c"), "silo.home%3Da%20b%26c");
        assert_eq!(encode("/.silo/key"), "%2F.silo%2Fkey");
    }
}
