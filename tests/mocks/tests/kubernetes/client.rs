//! A plain client for the tests: the API over HTTPS trusting only the
//! mock's CA (with 127.0.0.1 as the server name, so the certificate's IP
//! address is what is checked), the bearer token, watch streams read line
//! by line, and WebSocket upgrades. Written from the API's public shapes.

use std::net::SocketAddr;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use silo_mocks::MockKubernetes;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

pub use super::common::Reply;
use super::common::{REQUEST_TIMEOUT, read, send, tls_connector};

pub struct Kube {
    addr: SocketAddr,
    token: String,
    tls: TlsConnector,
}

impl Kube {
    pub fn new(mock: &MockKubernetes) -> Self {
        Self::from_parts(mock.api_url(), mock.token(), mock.ca_pem_path())
    }

    pub fn from_parts(api_url: &str, token: &str, ca_pem: &Path) -> Self {
        Self {
            addr: api_url.trim_start_matches("https://").parse().unwrap(),
            token: token.to_owned(),
            tls: tls_connector(ca_pem),
        }
    }

    pub async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        self.tls.connect(name, tcp).await.unwrap()
    }

    fn request(&self, method: Method, path: &str, body: Option<&Value>) -> http::request::Builder {
        let builder = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("authorization", format!("Bearer {}", self.token));
        if body.is_some() {
            builder.header("content-type", "application/json")
        } else {
            builder
        }
    }

    /// A call with the token; `headers` added.
    pub async fn call_with(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut builder = self.request(method, path, body.as_ref());
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let request = builder.body(Full::new(bytes)).unwrap();
        read(send(self.connect().await, request).await).await
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        self.call_with(method, path, body, &[]).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, None).await
    }

    /// Creates an object; asserts `201`.
    pub async fn create(&self, path: &str, body: Value) -> Value {
        let reply = self.call(Method::POST, path, Some(body)).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
        reply.json()
    }

    /// A call without any credential, or with `authorization` as given.
    pub async fn unauthenticated(&self, path: &str, authorization: Option<&str>) -> Reply {
        let mut builder = Request::get(path).header("host", self.addr.to_string());
        if let Some(value) = authorization {
            builder = builder.header("authorization", value);
        }
        let request = builder.body(Full::new(Bytes::new())).unwrap();
        read(send(self.connect().await, request).await).await
    }

    /// Starts a watch; its events come from [`Watch::next`].
    pub async fn watch(&self, path: &str) -> Watch {
        let request = self
            .request(Method::GET, path, None)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = send(self.connect().await, request).await;
        assert_eq!(response.status(), StatusCode::OK);
        Watch {
            body: response.into_body(),
            buffer: BytesMut::new(),
        }
    }

    /// Upgrades `path` to a WebSocket offering `protocols`.
    pub async fn websocket(
        &self,
        path: &str,
        protocols: &str,
    ) -> (WebSocketStream<TlsStream<TcpStream>>, Option<String>) {
        let mut request = format!("wss://{}{path}", self.addr)
            .into_client_request()
            .unwrap();
        let headers = request.headers_mut();
        headers.insert(
            "authorization",
            format!("Bearer {}", self.token).parse().unwrap(),
        );
        headers.insert("sec-websocket-protocol", protocols.parse().unwrap());
        let (socket, response) = tokio::time::timeout(
            REQUEST_TIMEOUT,
            tokio_tungstenite::client_async(request, self.connect().await),
        )
        .await
        .expect("no upgrade in time")
        .unwrap();
        let chosen = response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap().to_owned());
        (socket, chosen)
    }
}

/// A watch's event stream.
pub struct Watch {
    body: Incoming,
    buffer: BytesMut,
}

impl Watch {
    /// The next event, or `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line = self.buffer.split_to(end + 1);
                return Some(serde_json::from_slice(&line[..end]).unwrap());
            }
            let frame = tokio::time::timeout(super::PHASE_TIMEOUT, self.body.frame())
                .await
                .expect("the watch went quiet")?
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }

    /// Events until one satisfies `done`; all of them, that one last.
    pub async fn until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        while let Some(event) = self.next().await {
            let stop = done(&event);
            seen.push(event);
            if stop {
                return seen;
            }
        }
        panic!("the watch ended before the awaited event: {seen:#?}");
    }
}
