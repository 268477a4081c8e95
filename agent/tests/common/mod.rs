//! The agent under test: started from the built binary on a temporary Unix
//! socket with a fresh key, killed and cleaned up on drop.
#![allow(dead_code, reason = "each test crate uses its own part")]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use silo_protocol::PROTOCOL_VERSION;
use silo_protocol::auth::{Key, body_sha256, sign};
use silo_protocol::http::HEADER_PROTOCOL;
use tokio::net::UnixStream;

/// Longest wait for the agent to come up or go down.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Agent {
    pub child: Child,
    pub dir: PathBuf,
    pub key: Key,
}

impl Agent {
    pub fn start(name: &str, extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("silo-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = Key::generate().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_silo-agent"))
            .arg("--listen")
            .arg(format!("unix:{}", dir.join("agent.sock").display()))
            .arg("--workdir")
            .arg(&dir)
            .args(extra)
            .env("SILO_AGENT_KEY", key.to_hex())
            .env(
                "SILO_AGENT_LOG",
                std::env::var("SILO_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let agent = Self { child, dir, key };
        let deadline = Instant::now() + WAIT;
        while std::os::unix::net::UnixStream::connect(agent.socket()).is_err() {
            assert!(Instant::now() < deadline, "agent never listened");
            std::thread::sleep(Duration::from_millis(5));
        }
        agent
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "agent did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Agent {
    /// Sends one request, signed over `body` unless `signed` is false.
    pub async fn call(
        &self,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        signed: bool,
    ) -> (u16, Bytes) {
        let sha = signed.then(|| body_sha256(body));
        self.send(method, path_and_query, body, sha.as_deref())
            .await
    }

    /// Sends `body` in a request signed for the body hash `sha`, if any.
    pub async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        sha: Option<&str>,
    ) -> (u16, Bytes) {
        let (status, _, bytes) = self.exchange(method, path_and_query, body, sha).await;
        (status, bytes)
    }

    /// [`Agent::send`], with the answer's headers.
    pub async fn exchange(
        &self,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        sha: Option<&str>,
    ) -> (u16, http::HeaderMap, Bytes) {
        let stream = UnixStream::connect(self.socket()).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header("host", "agent")
            .header(HEADER_PROTOCOL, PROTOCOL_VERSION.to_string());
        if let Some(sha) = sha {
            let headers = sign(&self.key, method, path_and_query, sha).unwrap();
            for (name, value) in headers.pairs() {
                req = req.header(name, value);
            }
        }
        let req = req.body(Full::new(Bytes::copy_from_slice(body))).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (
            status,
            headers,
            resp.into_body().collect().await.unwrap().to_bytes(),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
