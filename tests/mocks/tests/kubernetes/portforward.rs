//! Port-forward to a running pod: WebSocket channels (`v4.channel.k8s.io`,
//! the subprotocol kube-rs and the Python client settle on), with the
//! initial port frames, data both ways and a refused port on the error
//! channel; and SPDY/3.1 over a plain upgrade, as kubectl falls back to,
//! spoken here with the mock's own framing and header compression.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::json;
use silo_mocks::kubernetes::spdy::frame::{self, FLAG_FIN, Frame};
use silo_mocks::kubernetes::spdy::zlib::{Deflater, Inflater, decode_pairs, encode_pairs};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

use super::common::send;
use super::{mock, pod, until_phase};

/// An echo server on 8080 (busybox `nc -ll`: one `cat` per connection).
const ECHO: &str = "nc -ll -p 8080 -e cat";

/// Waits until the pod at `ip` echoes on 8080 (the engine's proxy accepts
/// on the published port before anything listens inside).
async fn until_echoing(ip: &str) {
    super::wait_for("the echo server", super::PHASE_TIMEOUT, || async {
        let Ok(mut tcp) = tokio::net::TcpStream::connect((ip, 8080)).await else {
            return false;
        };
        let mut byte = [0u8; 1];
        tcp.write_all(b"x").await.is_ok()
            && tokio::time::timeout(
                std::time::Duration::from_secs(2),
                tokio::io::AsyncReadExt::read(&mut tcp, &mut byte),
            )
            .await
            .is_ok_and(|read| read.is_ok_and(|n| n == 1))
    })
    .await;
}

#[tokio::test]
async fn port_forward_over_websocket_channels() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("echo", json!({}), ECHO, &[8080]),
        )
        .await;
    let running = until_phase(&client, "default", "echo", "Running").await;
    until_echoing(running["status"]["podIP"].as_str().unwrap()).await;

    let path = "/api/v1/namespaces/default/pods/echo/portforward?ports=8080,9";
    let (mut socket, chosen) = client
        .websocket(path, "v5.channel.k8s.io, v4.channel.k8s.io")
        .await;
    assert_eq!(chosen.as_deref(), Some("v4.channel.k8s.io"));
    let mut initial = Vec::new();
    while initial.len() < 4 {
        match socket.next().await.unwrap().unwrap() {
            Message::Binary(bytes) => initial.push(bytes.to_vec()),
            other => panic!("unexpected {other:?}"),
        }
    }
    let [lo, hi] = 8080u16.to_le_bytes();
    assert!(initial.contains(&vec![0, lo, hi]));
    assert!(initial.contains(&vec![1, lo, hi]));
    assert!(initial.contains(&vec![2, 9, 0]));
    assert!(initial.contains(&vec![3, 9, 0]));

    // Nothing listens on 9 (nor is it published): its error channel says so.
    let mut echoed = Vec::new();
    let mut refused = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    socket
        .send(Message::binary(b"\x00ping".to_vec()))
        .await
        .unwrap();
    while echoed != b"ping" || refused.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "echo {echoed:?}, error {refused:?}"
        );
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), socket.next()).await;
        match next.unwrap() {
            Some(Ok(Message::Binary(bytes))) => match bytes[0] {
                0 => echoed.extend_from_slice(&bytes[1..]),
                3 => refused.push_str(&String::from_utf8_lossy(&bytes[1..])),
                other => panic!("unexpected channel {other}"),
            },
            Some(Ok(Message::Close(_))) | None => panic!("closed early"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        refused.starts_with("error forwarding port 9 to pod echo_default"),
        "{refused}"
    );
    socket.close(None).await.ok();

    // A pod that is not running cannot be forwarded to; an unknown one is 404.
    let missing = client
        .get("/api/v1/namespaces/default/pods/nope/portforward?ports=1")
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let plain = client
        .get("/api/v1/namespaces/default/pods/echo/portforward?ports=8080")
        .await;
    assert_eq!(plain.status, StatusCode::BAD_REQUEST);
    assert_eq!(plain.json()["message"], "Upgrade request required");
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn port_forward_over_spdy() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("echo", json!({}), ECHO, &[8080]),
        )
        .await;
    let running = until_phase(&client, "default", "echo", "Running").await;
    until_echoing(running["status"]["podIP"].as_str().unwrap()).await;

    let request = Request::post("/api/v1/namespaces/default/pods/echo/portforward")
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {}", mock.token()))
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .header("x-stream-protocol-version", "portforward.k8s.io")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = send(client.connect().await, request).await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        response.headers()["x-stream-protocol-version"],
        "portforward.k8s.io"
    );
    let upgraded = hyper::upgrade::on(response).await.unwrap();
    let (mut reading, mut writing) = tokio::io::split(TokioIo::new(upgraded));

    let mut deflater = Deflater::default();
    let mut inflater = Inflater::default();
    let mut syn = |stream: u32, kind: &str| {
        let mut payload = stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&[0; 6]);
        let pairs = encode_pairs(&[("streamtype", kind), ("port", "8080"), ("requestid", "0")]);
        payload.extend(deflater.block(&pairs));
        frame::control(frame::SYN_STREAM, 0, &payload)
    };
    writing.write_all(&syn(1, "error")).await.unwrap();
    writing.write_all(&syn(3, "data")).await.unwrap();
    writing
        .write_all(&frame::data(3, 0, b"over spdy"))
        .await
        .unwrap();
    writing
        .write_all(&frame::data(3, FLAG_FIN, b""))
        .await
        .unwrap();

    let mut replies = Vec::new();
    let mut echoed = Vec::new();
    let mut finished = Vec::new();
    while finished.len() < 2 {
        let next = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            frame::read(&mut reading),
        )
        .await;
        match next.unwrap().unwrap().expect("the session ended early") {
            Frame::Control {
                kind: frame::SYN_REPLY,
                payload,
                ..
            } => {
                replies.push(frame::stream_id(&payload).unwrap());
                assert!(
                    decode_pairs(&inflater.block(&payload[4..]).unwrap())
                        .unwrap()
                        .is_empty()
                );
            }
            Frame::Data {
                stream,
                flags,
                payload,
            } => {
                if stream == 3 {
                    echoed.extend_from_slice(&payload);
                } else {
                    assert!(payload.is_empty(), "{}", String::from_utf8_lossy(&payload));
                }
                if flags & FLAG_FIN != 0 {
                    finished.push(stream);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(replies, [1, 3]);
    assert_eq!(echoed, b"over spdy");
    assert_eq!(finished, [3, 1]);
    mock.shutdown().await.unwrap();
}
