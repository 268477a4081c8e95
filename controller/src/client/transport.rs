//! Byte streams to an agent and the one-shot HTTP requests made over them.
//!
//! An agent listens on a Unix socket (local and Docker sandboxes), on TCP, or
//! on TCP with TLS (remote VMs behind a provider's proxy). Everything above
//! this module sees one boxed stream type and does not care which. The
//! HTTP/1 exchange on a fresh connection ([`exchange`]) and reading an
//! answer whole ([`read_whole`]) live here once, for the agent's client and
//! the providers' REST client alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use silo_protocol::ErrorKind;
use silo_protocol::auth::{Key, sign};
use silo_protocol::http::{ErrorBody, HEADER_PROTOCOL};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use super::ClientError;

/// How long opening a connection may take before the agent counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where an agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket on this host.
    Unix(PathBuf),
    /// Plain TCP (only sensible on loopback or a private network).
    Tcp {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
    /// TCP with TLS, possibly through a provider's HTTPS proxy that routes
    /// on the `Host` header (TLS ends there; the signature still covers
    /// every request end to end).
    Tls {
        /// Host name or address to connect to.
        host: String,
        /// Port.
        port: u16,
        /// Name the server certificate must carry, and the `Host` header
        /// every request carries.
        server_name: String,
        /// PEM bundle of trusted roots; the system's roots when absent.
        ca_pem: Option<PathBuf>,
        /// Headers every request carries besides silo's own, such as a
        /// proxy's access token.
        headers: Vec<(String, String)>,
        /// The `Host` header when it is not `server_name` alone: a
        /// provider's URL that names its port (`host:8443`).
        host_header: Option<String>,
    },
    /// Plain HTTP through a provider's proxy that routes on the `Host`
    /// header (a self-hosted provider's `http://` preview URL).
    Http {
        /// Host name or address to connect to.
        host: String,
        /// Port.
        port: u16,
        /// The `Host` header every request carries (`host[:port]` of the
        /// provider's URL).
        host_header: String,
        /// Headers every request carries besides silo's own, such as a
        /// proxy's access token.
        headers: Vec<(String, String)>,
    },
}

impl Endpoint {
    /// The `Host` header of requests to it: a proxy routes on it; a direct
    /// agent ignores it.
    pub fn host_header(&self) -> &str {
        match self {
            Endpoint::Tls {
                server_name,
                host_header,
                ..
            } => host_header.as_deref().unwrap_or(server_name),
            Endpoint::Http { host_header, .. } => host_header,
            Endpoint::Unix(_) | Endpoint::Tcp { .. } => "agent",
        }
    }

    /// Headers every request to it carries besides silo's own.
    pub fn extra_headers(&self) -> &[(String, String)] {
        match self {
            Endpoint::Tls { headers, .. } | Endpoint::Http { headers, .. } => headers,
            Endpoint::Unix(_) | Endpoint::Tcp { .. } => &[],
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
            Endpoint::Tls { host, port, .. } => write!(f, "tls:{host}:{port}"),
            Endpoint::Http { host, port, .. } => write!(f, "http:{host}:{port}"),
        }
    }
}

/// A connected byte stream of any of the endpoint kinds.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// Opens a stream to the endpoint, within [`CONNECT_TIMEOUT`].
pub async fn open(endpoint: &Endpoint) -> Result<Box<dyn Stream>, ClientError> {
    let connect = async {
        let stream: Box<dyn Stream> = match endpoint {
            Endpoint::Unix(path) => Box::new(UnixStream::connect(path).await?),
            Endpoint::Tcp { host, port } | Endpoint::Http { host, port, .. } => {
                let tcp = TcpStream::connect((host.as_str(), *port)).await?;
                tcp.set_nodelay(true)?;
                Box::new(tcp)
            }
            Endpoint::Tls {
                host,
                port,
                server_name,
                ca_pem,
                ..
            } => {
                let connector = tls_connector(ca_pem.as_ref().map(PathBuf::as_path))?;
                let name = ServerName::try_from(server_name.clone()).map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("{server_name:?} is not a valid TLS server name"),
                    )
                })?;
                let tcp = TcpStream::connect((host.as_str(), *port)).await?;
                tcp.set_nodelay(true)?;
                Box::new(connector.connect(name, tcp).await?)
            }
        };
        Ok::<_, std::io::Error>(stream)
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(source)) => Err(ClientError::Connect {
            endpoint: endpoint.to_string(),
            source,
        }),
        Err(_) => Err(ClientError::Timeout {
            what: format!("connecting to {endpoint}"),
        }),
    }
}

fn tls_connector(ca_pem: Option<&std::path::Path>) -> std::io::Result<tokio_rustls::TlsConnector> {
    let roots = match ca_pem {
        Some(bundle) => bundle_roots(bundle)?,
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The trusted roots of a PEM bundle: every certificate in it.
fn bundle_roots(bundle: &std::path::Path) -> std::io::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(bundle).map_err(|e| {
        std::io::Error::other(format!("reading CA bundle {}: {e}", bundle.display()))
    })? {
        let cert = cert.map_err(|e| {
            std::io::Error::other(format!("parsing CA bundle {}: {e}", bundle.display()))
        })?;
        roots
            .add(cert)
            .map_err(|e| std::io::Error::other(format!("CA bundle {}: {e}", bundle.display())))?;
    }
    Ok(roots)
}

/// The system's trusted roots, found where the platform keeps them
/// (`SSL_CERT_FILE` and `SSL_CERT_DIR` override). Unreadable or unusable
/// ones are skipped; none at all is an error naming what went wrong.
fn system_roots() -> std::io::Result<rustls::RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _unusable) = roots.add_parsable_certificates(found.certs);
    if added > 0 {
        for error in &found.errors {
            tracing::debug!(%error, "skipped a system CA certificate");
        }
        return Ok(roots);
    }
    let why = found
        .errors
        .first()
        .map_or_else(|| "none found".to_owned(), ToString::to_string);
    Err(std::io::Error::other(format!(
        "no usable system CA certificates ({why}); name a CA bundle instead"
    )))
}

/// An HTTP answer from the agent.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: http::StatusCode,
    /// Whole body.
    pub body: Bytes,
}

impl Response {
    /// The agent's error body, or a stand-in built from the raw text.
    pub fn error_body(&self) -> ErrorBody {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| stand_in_error(String::from_utf8_lossy(&self.body).into_owned()))
    }
}

/// The error body of an answer that carries none of the agent's (a
/// proxy's error page, an empty body): its kind is unknown, spelt `http`,
/// so only the status tells what happened.
pub fn stand_in_error(message: String) -> ErrorBody {
    ErrorBody {
        kind: ErrorKind::Unknown("http".into()),
        message,
    }
}

/// Bytes handed to the connection at a time when streaming a body, so
/// progress is reported as the upload goes rather than once at its end.
pub const UPLOAD_CHUNK: usize = 256 * 1024;

/// Told how many more bytes of a streamed body went out.
pub type SentCallback = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// Sends one request on a fresh connection and reads the whole answer.
///
/// `key` signs the request; `None` sends it unsigned (only `/healthz` accepts that).
pub async fn request(
    endpoint: &Endpoint,
    key: Option<&Key>,
    version: u32,
    method: http::Method,
    path_and_query: &str,
    body: Bytes,
) -> Result<Response, ClientError> {
    let digest = key.map(|_| silo_protocol::auth::body_sha256(&body));
    send(
        endpoint,
        key.zip(digest.as_deref()),
        version,
        method,
        path_and_query,
        Full::new(body),
    )
    .await
}

/// A body to stream in [`UPLOAD_CHUNK`]s with a known length, each chunk
/// reported to `sent` as it goes out. Its SHA-256 is the caller's to know
/// (a bundle sent to many agents is hashed once).
pub fn chunked(
    body: Bytes,
    sent: Option<SentCallback>,
) -> impl hyper::body::Body<Data = Bytes, Error = std::convert::Infallible> + Send + 'static {
    let len = body.len();
    let chunks = (0..len).step_by(UPLOAD_CHUNK).map(move |start| {
        let chunk = body.slice(start..len.min(start + UPLOAD_CHUNK));
        if let Some(sent) = &sent {
            sent(chunk.len() as u64);
        }
        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk))
    });
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
    SizedBody {
        inner: body,
        len: len as u64,
    }
}

/// A streamed body that tells hyper its length, so the request carries a
/// `Content-Length` the agent can check before reading anything.
struct SizedBody<B> {
    inner: B,
    len: u64,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for SizedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.len)
    }
}

/// Sends `body` on a fresh connection, signed with `key` over `sha256` when
/// given and announcing protocol `version`, and reads the whole answer.
pub async fn send<B>(
    endpoint: &Endpoint,
    signing: Option<(&Key, &str)>,
    version: u32,
    method: http::Method,
    path_and_query: &str,
    body: B,
) -> Result<Response, ClientError>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let response =
        send_for_stream(endpoint, signing, version, method, path_and_query, body).await?;
    let (head, body) = read_whole(response).await?;
    Ok(Response {
        status: head.status,
        body,
    })
}

/// An answer's body read to its end.
pub async fn whole(body: Incoming) -> Result<Bytes, ClientError> {
    Ok(body.collect().await.map_err(ClientError::http)?.to_bytes())
}

/// An answer read to its end: its head (status, headers) and its whole body.
pub async fn read_whole(
    response: http::Response<Incoming>,
) -> Result<(http::response::Parts, Bytes), ClientError> {
    let (head, body) = response.into_parts();
    Ok((head, whole(body).await?))
}

/// Sends `body` on a fresh connection, signed with `key` over `sha256` when
/// given and announcing protocol `version`, and answers as soon as the
/// status arrives; the connection lives until the answer's body has been
/// read or dropped.
pub async fn send_for_stream<B>(
    endpoint: &Endpoint,
    signing: Option<(&Key, &str)>,
    version: u32,
    method: http::Method,
    path_and_query: &str,
    body: B,
) -> Result<http::Response<Incoming>, ClientError>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = http::Request::builder()
        .method(method.as_str())
        .uri(path_and_query)
        .header(http::header::HOST, endpoint.host_header())
        .header(HEADER_PROTOCOL, version.to_string());
    for (name, value) in endpoint.extra_headers() {
        builder = builder.header(name.as_str(), value.as_str());
    }
    if let Some((key, digest)) = signing {
        for (name, value) in sign(key, method.as_str(), path_and_query, digest)?.pairs() {
            builder = builder.header(name, value);
        }
    }
    let request = builder
        .body(body)
        .map_err(|e| ClientError::Protocol(format!("building request: {e}")))?;
    exchange(endpoint, request).await
}

/// Sends `request` on a fresh HTTP/1 connection to `endpoint` and answers
/// as soon as the status arrives; the connection lives until the answer's
/// body has been read or dropped. Every client of the controller (an
/// agent's, a provider's REST API) opens its connections here, so TLS, the
/// handshake and the connection's lifetime are set up in one place.
pub async fn exchange<B>(
    endpoint: &Endpoint,
    request: http::Request<B>,
) -> Result<http::Response<Incoming>, ClientError>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = open(endpoint).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ClientError::http)?;
    // The connection future drives the socket; it ends when the request is done.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(ClientError::http)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_bundle_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.pem");
        let err = tls_connector(Some(&missing)).err().unwrap();
        assert!(err.to_string().contains("none.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(bundle_roots(&empty).unwrap().is_empty());
    }
}
