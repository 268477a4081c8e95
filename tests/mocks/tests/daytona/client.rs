//! A plain client for the tests: the control plane over HTTP, previews and
//! the toolbox over TLS through the mock's proxy (trusting only its CA).
//! The toolbox's address comes from each sandbox's `toolboxProxyUrl`, as a
//! backend learns it. Written from the public API shapes alone.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::{Value, json};
use silo_mocks::MockDaytona;
use silo_mocks::daytona::{ENV_API_KEY, ENV_API_URL, ENV_CA_PEM, ENV_PROXY_ADDR};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

pub use super::common::Reply;
use super::common::{read, send, tls_connector};

/// The multipart boundary of uploads.
const BOUNDARY: &str = "silo-mock-test-boundary";

/// How a toolbox or preview request proves access.
#[derive(Clone, Copy)]
pub enum Access<'a> {
    None,
    Bearer(&'a str),
    Token(&'a str),
}

pub struct Client {
    /// `host:port` of the control plane.
    api: String,
    /// `/api`.
    prefix: String,
    key: String,
    proxy: SocketAddr,
    tls: TlsConnector,
}

impl Client {
    pub fn new(mock: &MockDaytona) -> Self {
        Self::from_parts(
            mock.api_url(),
            mock.api_key(),
            mock.proxy_addr(),
            mock.ca_pem_path(),
        )
    }

    /// A client from the `KEY=value` lines the binary prints.
    pub fn from_env(env: &HashMap<String, String>) -> Self {
        Self::from_parts(
            &env[ENV_API_URL],
            &env[ENV_API_KEY],
            env[ENV_PROXY_ADDR].parse().unwrap(),
            Path::new(&env[ENV_CA_PEM]),
        )
    }

    fn from_parts(api_url: &str, key: &str, proxy: SocketAddr, ca_pem: &Path) -> Self {
        let uri: Uri = api_url.parse().unwrap();
        Self {
            api: uri.authority().unwrap().to_string(),
            prefix: uri.path().trim_end_matches('/').to_owned(),
            key: key.to_owned(),
            proxy,
            tls: tls_connector(ca_pem),
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A control-plane call (`path` under the API URL) with the key.
    pub async fn api(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let key = format!("Bearer {}", self.key);
        self.api_raw(method, &format!("{}{path}", self.prefix), Some(&key), body)
            .await
    }

    /// A control-plane call to any `path` with any `Authorization` (or none).
    pub async fn api_raw(
        &self,
        method: Method,
        path: &str,
        authorization: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.api)
            .header("x-daytona-organization-id", "whatever-the-key-says");
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let body = match body {
            Some(value) => {
                request = request.header("content-type", "application/json");
                Bytes::from(value.to_string())
            }
            None => Bytes::new(),
        };
        let tcp = TcpStream::connect(&self.api).await.unwrap();
        read(send(tcp, request.body(Full::new(body)).unwrap()).await).await
    }

    /// Creates a sandbox from `body`; its `Sandbox` JSON.
    pub async fn create(&self, body: Value) -> Value {
        let reply = self.api(Method::POST, "/sandbox", Some(body)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply.json()
    }

    /// The preview URL and token of a sandbox's `port`.
    pub async fn preview_url(&self, id: &str, port: u16) -> (String, String) {
        let reply = self
            .api(
                Method::GET,
                &format!("/sandbox/{id}/ports/{port}/preview-url"),
                None,
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let body = reply.json();
        (
            body["url"].as_str().unwrap().to_owned(),
            body["token"].as_str().unwrap().to_owned(),
        )
    }

    /// A sandbox's `Sandbox` JSON, or the refusal.
    pub async fn get(&self, id: &str) -> Reply {
        self.api(Method::GET, &format!("/sandbox/{id}"), None).await
    }

    /// A toolbox call: `{toolboxProxyUrl}/{id}{path}` of `sandbox` (its JSON).
    pub async fn toolbox(
        &self,
        sandbox: &Value,
        access: Access<'_>,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Reply {
        let (content_type, body) = match body {
            Some(value) => (Some("application/json"), Bytes::from(value.to_string())),
            None => (None, Bytes::new()),
        };
        self.toolbox_body(sandbox, access, method, path, content_type, body, &[])
            .await
    }

    /// `POST /process/execute` of `command` with the key; the answer.
    pub async fn execute(&self, sandbox: &Value, command: &str) -> Reply {
        let key = self.key.clone();
        self.toolbox(
            sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/execute",
            Some(json!({"command": command})),
        )
        .await
    }

    /// Uploads `data` to `path` through the toolbox (multipart field `file`).
    pub async fn upload(&self, sandbox: &Value, path: &str, data: &[u8]) -> Reply {
        let mut body = format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"upload\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
        let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
        let key = self.key.clone();
        self.toolbox_body(
            sandbox,
            Access::Bearer(&key),
            Method::POST,
            &format!("/files/upload?path={path}"),
            Some(&content_type),
            Bytes::from(body),
            &[],
        )
        .await
    }

    /// A toolbox call with any body and extra headers.
    #[allow(clippy::too_many_arguments, reason = "a test helper's knobs")]
    pub async fn toolbox_body(
        &self,
        sandbox: &Value,
        access: Access<'_>,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Reply {
        let base: Uri = sandbox["toolboxProxyUrl"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let host = base.host().unwrap().to_owned();
        let id = sandbox["id"].as_str().unwrap();
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}/{id}{path}", base.path()))
            .header("host", &host);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request = with_access(request, access);
        self.sandbox(&host, request.body(Full::new(body)).unwrap())
            .await
    }

    /// `GET path` on a preview URL (`https://{port}-{id}.{domain}`).
    pub async fn preview(&self, url: &str, path: &str, access: Access<'_>) -> Reply {
        let host = url.parse::<Uri>().unwrap().host().unwrap().to_owned();
        let request = with_access(Request::get(path).header("host", &host), access);
        self.sandbox(&host, request.body(Full::new(Bytes::new())).unwrap())
            .await
    }

    /// A request to `host` through the proxy; the answer unread.
    pub async fn open(
        &self,
        host: &str,
        request: Request<Full<Bytes>>,
    ) -> hyper::Response<Incoming> {
        let tcp = TcpStream::connect(self.proxy).await.unwrap();
        let name = ServerName::try_from(silo_mocks::http::hostname(host).to_owned()).unwrap();
        let tls = self.tls.connect(name, tcp).await.unwrap();
        send(tls, request).await
    }

    /// A request to `host` through the proxy, read whole.
    pub async fn sandbox(&self, host: &str, request: Request<Full<Bytes>>) -> Reply {
        read(self.open(host, request).await).await
    }
}

fn with_access(request: http::request::Builder, access: Access<'_>) -> http::request::Builder {
    match access {
        Access::None => request,
        Access::Bearer(key) => request.header("authorization", format!("Bearer {key}")),
        Access::Token(token) => request.header("x-daytona-preview-token", token),
    }
}
