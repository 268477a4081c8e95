//! The S3 client's HTTP: `object_store`'s requests sent over silo's own
//! transport ([`crate::client::transport`]), so TLS, trusted roots and
//! connecting are set up in one place for agents, providers and the store.
//!
//! Each request opens a connection of its own; on loopback or a LAN that
//! costs less than a millisecond, and a blob's bytes dwarf it elsewhere.

use async_trait::async_trait;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};

use crate::client::{ClientError, Endpoint, transport};

/// Makes the [`HttpClient`] the S3 client sends through.
#[derive(Debug, Default)]
pub struct Connector {
    /// Trusted roots besides the system's (`AWS_CA_BUNDLE`), when given.
    pub ca_pem: Option<std::path::PathBuf>,
}

impl HttpConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Service {
            ca_pem: self.ca_pem.clone(),
        }))
    }
}

#[derive(Debug)]
struct Service {
    ca_pem: Option<std::path::PathBuf>,
}

#[async_trait]
impl HttpService for Service {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let (mut parts, body) = request.into_parts();
        let uri = parts.uri.clone();
        let host = uri
            .host()
            .ok_or_else(|| HttpError::new(HttpErrorKind::Request, invalid("a URL without a host")))?
            .to_owned();
        let endpoint = match uri.scheme_str() {
            Some("https") => Endpoint::Tls {
                port: uri.port_u16().unwrap_or(443),
                server_name: host.clone(),
                host,
                ca_pem: self.ca_pem.clone(),
                headers: Vec::new(),
                host_header: None,
            },
            _ => Endpoint::Tcp {
                port: uri.port_u16().unwrap_or(80),
                host,
            },
        };
        // HTTP/1.1 on a connection of our own: the path alone as the
        // target, the authority (which the request was signed for) as Host.
        if let Some(authority) = uri.authority() {
            let value = http::HeaderValue::from_str(authority.as_str())
                .map_err(|e| HttpError::new(HttpErrorKind::Request, e))?;
            parts.headers.entry(http::header::HOST).or_insert(value);
        }
        parts.uri = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .map_err(|e| HttpError::new(HttpErrorKind::Request, e))?;
        let stream = transport::open(&endpoint)
            .await
            .map_err(|e| connect_error(&uri, e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| HttpError::new(HttpErrorKind::Connect, e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let response = sender
            .send_request(http::Request::from_parts(parts, body))
            .await
            .map_err(|e| HttpError::new(kind_of(&e), e))?;
        let (parts, body) = response.into_parts();
        let body = body.map_err(|e| HttpError::new(kind_of(&e), e));
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned())
}

/// A failed connect, named by the server's address (the transport's own
/// words are an agent's); worth another try, which the client makes.
fn connect_error(uri: &http::Uri, error: ClientError) -> HttpError {
    let mut cause: &(dyn std::error::Error + 'static) = &error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let authority = uri.authority().map_or("the server", |a| a.as_str());
    HttpError::new(
        HttpErrorKind::Connect,
        std::io::Error::other(format!("cannot connect to {authority}: {cause}")),
    )
}

fn kind_of(error: &hyper::Error) -> HttpErrorKind {
    if error.is_timeout() {
        HttpErrorKind::Timeout
    } else if error.is_closed() || error.is_incomplete_message() {
        HttpErrorKind::Interrupted
    } else {
        HttpErrorKind::Request
    }
}
