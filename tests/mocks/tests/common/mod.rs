//! What every mock's black-box tests share: an HTTP/1.1 client over plain
//! TCP or TLS trusting only a mock's test CA, answers read whole, and
//! polling until something holds. Written from public shapes alone, as a
//! backend would be.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_rustls::TlsConnector;

/// Longest any single test request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// An answer read whole.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A TLS client trusting only the CA in `ca_pem`.
pub fn tls_connector(ca_pem: &Path) -> TlsConnector {
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_pem).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// Sends one request on `io` (upgrades allowed); the answer unread.
pub async fn send<IO>(io: IO, request: Request<Full<Bytes>>) -> hyper::Response<Incoming>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(connection.with_upgrades());
    tokio::time::timeout(REQUEST_TIMEOUT, sender.send_request(request))
        .await
        .expect("no answer in time")
        .unwrap()
}

/// Reads an answer whole.
pub async fn read(response: hyper::Response<Incoming>) -> Reply {
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(REQUEST_TIMEOUT, body.collect())
        .await
        .expect("the body stalled")
        .unwrap()
        .to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Polls `check` until it holds; panics with `what` after `within`.
pub async fn wait_for<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
