//! The agent's front door: signatures, replay, clock skew, per-sandbox keys,
//! protocol version, and the shape of the binary itself.
//!
//! Requests here are written by hand on a raw socket so that forged ones are
//! really forged, not produced by the client that is supposed to get them right.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{SystemTime, UNIX_EPOCH};

use silo::client::ClientError;
use silo_protocol::PROTOCOL_VERSION;
use silo_protocol::auth::{EMPTY_BODY_SHA256, Key, SignedHeaders, sign, sign_at};
use silo_protocol::http::{HEADER_PROTOCOL, PATH_EXEC};
use silo_tests::TestAgent;

/// Sends a WebSocket upgrade with the given signing headers; returns status and body.
fn upgrade(agent: &TestAgent, signed: Option<&SignedHeaders>, protocol: &str) -> (u16, String) {
    let mut stream = UnixStream::connect(agent.socket()).unwrap();
    let mut request = format!(
        "GET {PATH_EXEC} HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{HEADER_PROTOCOL}: {protocol}\r\n"
    );
    for (name, value) in signed.map(|s| s.pairs().to_vec()).unwrap_or_default() {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Read the head and whatever body arrives; a 101 leaves the socket open, so stop at the head.
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&answer);
        if text.starts_with("HTTP/1.1 101") && text.contains("\r\n\r\n") {
            break;
        }
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
            });
            if length.is_some_and(|len| body.len() >= len) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn version() -> String {
    PROTOCOL_VERSION.to_string()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn a_properly_signed_upgrade_is_accepted() {
    let agent = TestAgent::start().await;
    let signed = sign(&agent.key, "GET", PATH_EXEC, EMPTY_BODY_SHA256).unwrap();
    assert_eq!(upgrade(&agent, Some(&signed), &version()).0, 101);
}

#[tokio::test]
async fn unsigned_forged_and_wrong_key_requests_are_refused() {
    let agent = TestAgent::start().await;
    let (status, body) = upgrade(&agent, None, &version());
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("missing header"), "{body}");

    let mut forged = sign(&agent.key, "GET", PATH_EXEC, EMPTY_BODY_SHA256).unwrap();
    forged.signature = "00".repeat(32);
    let (status, body) = upgrade(&agent, Some(&forged), &version());
    assert_eq!(status, 401);
    assert!(body.contains("signature"), "{body}");
    assert!(
        !body.contains(&agent.key.to_hex()),
        "the reason must not leak the key"
    );

    let other = sign(
        &Key::generate().unwrap(),
        "GET",
        PATH_EXEC,
        EMPTY_BODY_SHA256,
    )
    .unwrap();
    assert_eq!(upgrade(&agent, Some(&other), &version()).0, 401);

    // Signed for another path: the signature binds the path.
    let elsewhere = sign(&agent.key, "GET", "/v1/other", EMPTY_BODY_SHA256).unwrap();
    assert_eq!(upgrade(&agent, Some(&elsewhere), &version()).0, 401);

    // The client surfaces the refusal as such.
    let err = agent
        .client_with_key(Key::generate().unwrap())
        .connect()
        .await
        .err()
        .unwrap();
    assert!(matches!(err, ClientError::Unauthorized(_)), "{err}");
}

#[tokio::test]
async fn replayed_and_expired_requests_are_refused() {
    let agent = TestAgent::start().await;
    let signed = sign(&agent.key, "GET", PATH_EXEC, EMPTY_BODY_SHA256).unwrap();
    assert_eq!(upgrade(&agent, Some(&signed), &version()).0, 101);
    let (status, body) = upgrade(&agent, Some(&signed), &version());
    assert_eq!(status, 401);
    assert!(body.contains("replay"), "{body}");

    let stale = sign_at(
        &agent.key,
        "GET",
        PATH_EXEC,
        EMPTY_BODY_SHA256,
        now() - 3600,
        "0123456789abcdef0123456789abcdef",
    );
    // A skewed clock is its own kind, naming how far apart the clocks are.
    let (status, body) = upgrade(&agent, Some(&stale), &version());
    assert_eq!(status, 401);
    assert!(
        body.contains("clock_skew") && body.contains("s behind the agent's clock"),
        "{body}"
    );
    let future = sign_at(
        &agent.key,
        "GET",
        PATH_EXEC,
        EMPTY_BODY_SHA256,
        now() + 3600,
        "1123456789abcdef0123456789abcdef",
    );
    let (status, body) = upgrade(&agent, Some(&future), &version());
    assert_eq!(status, 401);
    assert!(body.contains("ahead of the agent's clock"), "{body}");
}

#[tokio::test]
async fn a_mismatched_protocol_version_is_refused_clearly() {
    let agent = TestAgent::start().await;
    let signed = sign(&agent.key, "GET", PATH_EXEC, EMPTY_BODY_SHA256).unwrap();
    let (status, body) = upgrade(&agent, Some(&signed), "999");
    assert_eq!(status, 400);
    assert!(
        body.contains("version_mismatch") && body.contains("999"),
        "{body}"
    );
}

#[tokio::test]
async fn healthz_needs_no_key_and_reports_versions() {
    let agent = TestAgent::start().await;
    let health = agent
        .client_with_key(Key::generate().unwrap())
        .healthz()
        .await
        .unwrap();
    assert_eq!(health.protocol_version, PROTOCOL_VERSION);
    assert_eq!(
        health.protocol_min,
        Some(silo_protocol::MIN_PROTOCOL_VERSION)
    );
    assert_eq!(health.pid, agent.pid());
    assert!(!health.agent_version.is_empty() && !health.boot_id.is_empty());
}

#[test]
fn the_agent_is_a_static_binary() {
    let bytes = std::fs::read(silo_tests::agent_binary()).unwrap();
    assert!(
        silo::internals::is_static_executable(&bytes),
        "the agent asks for a dynamic loader"
    );
    let host_shell = std::fs::read("/bin/sh").unwrap();
    assert!(
        !silo::internals::is_static_executable(&host_shell),
        "the check can fail"
    );
    // Generous bound; the real size target is reported by silo-bench.
    assert!(
        bytes.len() < 12 * 1024 * 1024,
        "agent is {} bytes",
        bytes.len()
    );
}
