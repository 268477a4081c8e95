//! The HTTP plumbing every mock server shares: one body type, small
//! response builders, bounded body reads, query parsing, and the accept loop
//! that serves a [`Handler`] over plain TCP or TLS until it is cancelled.
//!
//! Connections are HTTP/1.1 with upgrades enabled, so a handler can hand an
//! upgraded connection on (the proxy splices WebSockets this way).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Any error a response body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response the mocks send (buffered, streamed or relayed).
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Most connections one server keeps open at once; the next waits.
pub const MAX_CONNECTIONS: usize = 512;
/// Longest a client may take to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (e.g. out of descriptors) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Answers one request; implemented by each mock's servers.
pub trait Handler: Send + Sync + 'static {
    /// The response to `request`. Failures are responses too.
    fn handle(&self, request: Request<Incoming>) -> impl Future<Output = Response<Body>> + Send;
}

/// A body that ended because the client or the server went away.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body was longer than the caller allows.
    #[error("request body is larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Reading the body failed.
    #[error("reading the request body failed")]
    Read(#[source] BoxError),
}

/// A complete body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

/// A relayed body (a request or response that passes through unchanged).
pub fn relay(body: Incoming) -> Body {
    body.map_err(|e| Box::new(e) as BoxError).boxed_unsync()
}

/// A body that breaks off with an error when `cut` fires, as a connection
/// that drops mid-answer does (hyper then closes the connection).
pub fn cut_when(body: Body, cut: tokio_util::sync::CancellationToken) -> Body {
    let frames = futures_util::stream::unfold((body, Some(cut)), |(mut body, cut)| async move {
        let cut = cut?;
        tokio::select! {
            frame = body.frame() => frame.map(|f| (f, (body, Some(cut)))),
            () = cut.cancelled() => {
                let error: BoxError = "the connection was cut".into();
                Some((Err(error), (body, None)))
            }
        }
    });
    http_body_util::StreamBody::new(frames).boxed_unsync()
}

/// A response with a status and no body.
pub fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(empty());
    *response.status_mut() = code;
    response
}

/// A response with a body and its content type.
pub fn with_body(code: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON response; `content_type` lets a caller add a charset as its
/// real counterpart does.
pub fn json_as<T: serde::Serialize>(
    code: StatusCode,
    content_type: &'static str,
    value: &T,
) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => with_body(code, content_type, full(bytes)),
        Err(error) => with_body(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            full(format!("encoding the response failed: {error}")),
        ),
    }
}

/// A JSON response as `application/json`.
pub fn json<T: serde::Serialize>(code: StatusCode, value: &T) -> Response<Body> {
    json_as(code, "application/json", value)
}

/// The whole body, refused past `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, BodyError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(BodyError::TooLarge { limit })
        }
        Err(error) => Err(BodyError::Read(error)),
    }
}

/// The decoded `key=value` pairs of a request's query, in order.
pub fn query_pairs<B>(request: &Request<B>) -> Vec<(String, String)> {
    uri_query_pairs(request.uri())
}

/// The decoded `key=value` pairs of a URI's query, in order.
pub fn uri_query_pairs(uri: &http::Uri) -> Vec<(String, String)> {
    uri.query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The first value of `key` in a query.
pub fn query_value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A request header as text, if present and printable.
pub fn header<'a, B>(request: &'a Request<B>, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The host a request is for: its `Host` header, or the authority of an
/// absolute request target.
pub fn request_host<B>(request: &Request<B>) -> String {
    header(request, http::header::HOST.as_str())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default()
}

/// The host without its port (and without brackets around an IPv6 address).
pub fn hostname(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Serves `handler` on `listener` (over TLS when `tls` is given) until
/// `cancel` fires; open connections end then too.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: Arc<H>,
    cancel: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            () = cancel.cancelled() => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let tcp = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    // Small frames (exec output, a control message) must not
                    // wait on delayed ACKs, as they do not behind a real proxy.
                    let _ = tcp.set_nodelay(true);
                    tcp
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let handler = handler.clone();
        let cancel = cancel.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    match handshake.await {
                        Ok(Ok(stream)) => serve_connection(stream, handler, cancel).await,
                        Ok(Err(error)) => tracing::debug!(%error, "tls handshake failed"),
                        Err(_) => tracing::debug!("tls handshake timed out"),
                    }
                }
                None => serve_connection(tcp, handler, cancel).await,
            }
        });
    }
}

/// One connection, request after request, until it closes or `cancel` fires.
async fn serve_connection<IO, H>(io: IO, handler: Arc<H>, cancel: CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let service = service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler.handle(request).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
        () = cancel.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_drop_the_port() {
        assert_eq!(hostname("49999-iabc.e2b.test:8443"), "49999-iabc.e2b.test");
        assert_eq!(hostname("127.0.0.1:443"), "127.0.0.1");
        assert_eq!(hostname("[::1]:443"), "::1");
        assert_eq!(hostname("e2b.test"), "e2b.test");
    }
}
