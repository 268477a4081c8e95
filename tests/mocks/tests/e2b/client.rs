//! A plain client for the tests: the control plane over HTTP, sandbox
//! ports over TLS through the mock's proxy (trusting only its CA), and the
//! Connect envelopes of envd's streams. Written from the public API shapes
//! alone, as a backend would be.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use silo_mocks::MockE2b;
use silo_mocks::e2b::{ENV_API_KEY, ENV_API_URL, ENV_CA_PEM, ENV_DOMAIN, ENV_PROXY_ADDR};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

pub use super::common::Reply;
use super::common::{REQUEST_TIMEOUT, read, send, tls_connector};

pub struct Client {
    api: String,
    key: String,
    domain: String,
    proxy: SocketAddr,
    tls: TlsConnector,
}

impl Client {
    pub fn new(mock: &MockE2b) -> Self {
        Self::from_parts(
            mock.api_url(),
            mock.api_key(),
            mock.domain(),
            mock.proxy_addr(),
            mock.ca_pem_path(),
        )
    }

    /// A client from the `KEY=value` lines the binary prints.
    pub fn from_env(env: &HashMap<String, String>) -> Self {
        Self::from_parts(
            &env[ENV_API_URL],
            &env[ENV_API_KEY],
            &env[ENV_DOMAIN],
            env[ENV_PROXY_ADDR].parse().unwrap(),
            Path::new(&env[ENV_CA_PEM]),
        )
    }

    fn from_parts(
        api_url: &str,
        key: &str,
        domain: &str,
        proxy: SocketAddr,
        ca_pem: &Path,
    ) -> Self {
        Self {
            api: api_url.trim_start_matches("http://").to_owned(),
            key: key.to_owned(),
            domain: domain.to_owned(),
            proxy,
            tls: tls_connector(ca_pem),
        }
    }

    /// A control-plane call with the right key.
    pub async fn api(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let key = self.key.clone();
        self.api_as(Some(&key), method, path, body).await
    }

    /// A control-plane call with the right key and extra headers.
    pub async fn api_with(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let key = self.key.clone();
        self.api_full(Some(&key), method, path, body, headers).await
    }

    /// A control-plane call with `key` (or none).
    pub async fn api_as(
        &self,
        key: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Reply {
        self.api_full(key, method, path, body, &[]).await
    }

    async fn api_full(
        &self,
        key: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.api)
            .header("user-agent", "silo-mocks-tests");
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = match body {
            Some(value) => {
                request = request.header("content-type", "application/json");
                Bytes::from(value.to_string())
            }
            None => Bytes::new(),
        };
        let tcp = TcpStream::connect(&self.api).await.unwrap();
        let response = send(tcp, request.body(Full::new(body)).unwrap()).await;
        read(response).await
    }

    /// Creates a sandbox from `body` and returns the `Sandbox` answer.
    pub async fn create(&self, body: Value) -> Value {
        let reply = self.api(Method::POST, "/sandboxes", Some(body)).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
        reply.json()
    }

    /// Creates a sandbox from `body` and returns its id.
    pub async fn create_id(&self, body: Value) -> String {
        self.create(body).await["sandboxID"]
            .as_str()
            .expect("a sandbox id")
            .to_owned()
    }

    /// Writes `data` to `path` in a sandbox through envd (a raw body).
    pub async fn upload(&self, sandbox_id: &str, path: &str, data: impl Into<Bytes>) -> Reply {
        let host = self.host(49983, sandbox_id);
        let request = Request::post(format!("/files?path={path}"))
            .header("host", &host)
            .header("content-type", "application/octet-stream")
            .body(Full::new(data.into()))
            .unwrap();
        self.sandbox(&host, request).await
    }

    pub fn host(&self, port: u16, sandbox_id: &str) -> String {
        format!("{port}-{sandbox_id}.{}", self.domain)
    }

    /// A request to a sandbox port through the proxy; the answer unread.
    pub async fn open(
        &self,
        host: &str,
        request: Request<Full<Bytes>>,
    ) -> hyper::Response<Incoming> {
        let tcp = TcpStream::connect(self.proxy).await.unwrap();
        let name = ServerName::try_from(host.to_owned()).unwrap();
        let tls = self.tls.connect(name, tcp).await.unwrap();
        send(tls, request).await
    }

    /// A request to a sandbox port through the proxy, read whole.
    pub async fn sandbox(&self, host: &str, request: Request<Full<Bytes>>) -> Reply {
        read(self.open(host, request).await).await
    }

    /// `GET path` on a sandbox port.
    pub async fn get(&self, host: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = Request::get(path).header("host", host);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.sandbox(host, request.body(Full::new(Bytes::new())).unwrap())
            .await
    }

    /// A unary Connect call on envd.
    pub async fn rpc(
        &self,
        sandbox_id: &str,
        method: &str,
        message: Value,
        token: Option<&str>,
    ) -> Reply {
        let host = self.host(49983, sandbox_id);
        let mut request = Request::post(format!("/{method}"))
            .header("host", &host)
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1");
        if let Some(token) = token {
            request = request.header("x-access-token", token);
        }
        let request = request
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        self.sandbox(&host, request).await
    }

    /// `process.Process/Start` for `sh -c script`; the open event stream.
    pub async fn start(&self, sandbox_id: &str, script: &str, headers: &[(&str, &str)]) -> Events {
        let message = json!({
            "process": {"cmd": "/bin/sh", "args": ["-c", script], "envs": {"GREETING": "hello"}},
            "stdin": false,
        });
        self.start_message(sandbox_id, message, headers).await
    }

    pub async fn start_message(
        &self,
        sandbox_id: &str,
        message: Value,
        headers: &[(&str, &str)],
    ) -> Events {
        let host = self.host(49983, sandbox_id);
        let payload = message.to_string();
        let mut body = vec![0u8];
        body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        body.extend_from_slice(payload.as_bytes());
        let mut request = Request::post("/process.Process/Start")
            .header("host", &host)
            .header("content-type", "application/connect+json")
            .header("connect-protocol-version", "1");
        if !headers
            .iter()
            .any(|(name, _)| *name == "keepalive-ping-interval")
        {
            request = request.header("keepalive-ping-interval", "50");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .open(&host, request.body(Full::new(Bytes::from(body))).unwrap())
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers().get("content-type").unwrap(),
            "application/connect+json"
        );
        Events {
            body: response.into_body(),
            buffer: BytesMut::new(),
        }
    }
}

/// The envelopes of a Connect stream.
pub struct Events {
    body: Incoming,
    buffer: BytesMut,
}

/// One envelope: its flags and its JSON.
pub struct Envelope {
    pub flags: u8,
    pub message: Value,
}

/// What a whole `Start` stream said.
#[derive(Default, Debug)]
pub struct Run {
    pub pid: u64,
    pub stdout: String,
    pub stderr: String,
    pub end: Option<Value>,
    pub end_stream: Value,
    pub keepalives: usize,
}

impl Events {
    pub async fn next(&mut self) -> Option<Envelope> {
        loop {
            if self.buffer.len() >= 5 {
                let len = u32::from_be_bytes(self.buffer[1..5].try_into().unwrap()) as usize;
                if self.buffer.len() >= 5 + len {
                    let flags = self.buffer[0];
                    self.buffer.advance(5);
                    let payload = self.buffer.split_to(len);
                    return Some(Envelope {
                        flags,
                        message: serde_json::from_slice(&payload).unwrap(),
                    });
                }
            }
            let frame = tokio::time::timeout(REQUEST_TIMEOUT, self.body.frame())
                .await
                .expect("the stream stalled")?
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }

    /// Reads on until the stream breaks off (`true`: the connection was
    /// cut) or ends cleanly (`false`).
    pub async fn broken(mut self) -> bool {
        loop {
            match tokio::time::timeout(REQUEST_TIMEOUT, self.body.frame()).await {
                Err(_) => panic!("the stream neither broke nor ended"),
                Ok(None) => return false,
                Ok(Some(Err(_))) => return true,
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// The `start` event's pid (the first message).
    pub async fn pid(&mut self) -> u64 {
        let first = self.next().await.expect("a start event");
        first.message["event"]["start"]["pid"]
            .as_u64()
            .expect("a pid")
    }

    /// Reads the stream to its end-stream envelope.
    pub async fn finish(mut self) -> Run {
        let mut run = Run::default();
        while let Some(envelope) = self.next().await {
            if envelope.flags & 0x02 != 0 {
                run.end_stream = envelope.message;
                return run;
            }
            let event = &envelope.message["event"];
            if let Some(pid) = event["start"]["pid"].as_u64() {
                run.pid = pid;
            }
            for (stream, text) in [("stdout", &mut run.stdout), ("stderr", &mut run.stderr)] {
                if let Some(data) = event["data"][stream].as_str() {
                    use base64::Engine as _;
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .unwrap();
                    text.push_str(&String::from_utf8_lossy(&bytes));
                }
            }
            if event.get("keepalive").is_some() {
                run.keepalives += 1;
            }
            if event.get("end").is_some() {
                run.end = Some(event["end"].clone());
            }
        }
        panic!("the stream ended without an end-stream envelope: {run:?}");
    }
}
