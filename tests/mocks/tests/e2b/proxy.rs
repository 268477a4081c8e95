//! The proxy: an upgraded connection (silo's agent runs exec over a
//! WebSocket) is spliced byte for byte, and bad hosts get E2B's `400`s.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::mock;

/// Answers any request with `101` and then echoes every byte.
const ECHO_UPGRADE: &str = "cr=$(printf '\\r')\n\
while IFS= read -r line; do [ -z \"${line%$cr}\" ] && break; done\n\
printf 'HTTP/1.1 101 Switching Protocols\\r\\nConnection: Upgrade\\r\\nUpgrade: echo\\r\\n\\r\\n'\n\
exec cat\n";

#[tokio::test]
async fn upgrades_are_spliced_byte_for_byte() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({"templateID": "base", "timeout": 60}))
        .await;
    let uploaded = client.upload(&id, "/tmp/echo.sh", ECHO_UPGRADE).await;
    assert_eq!(uploaded.status, StatusCode::OK);
    let mut server = client
        .start(
            &id,
            "exec nc -ll -p 49999 -e /bin/sh /tmp/echo.sh",
            &[("connect-timeout-ms", "0")],
        )
        .await;
    server.pid().await;
    drop(server);

    let web = client.host(49999, &id);
    let upgrade = || {
        Request::get("/exec")
            .header("host", &web)
            .header("connection", "Upgrade")
            .header("upgrade", "echo")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let response = loop {
        let reply = client.open(&web, upgrade()).await;
        if reply.status() == StatusCode::SWITCHING_PROTOCOLS {
            break reply;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the echo server never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(response.headers()["upgrade"], "echo");
    let mut stream = TokioIo::new(hyper::upgrade::on(response).await.unwrap());
    let sent: Vec<u8> = (0..=255u8).cycle().take(64 * 1024).collect();
    let (mut reader, mut writer) = tokio::io::split(&mut stream);
    let write = async {
        writer.write_all(&sent).await.unwrap();
        writer.flush().await.unwrap();
    };
    let read = async {
        let mut echoed = vec![0u8; sent.len()];
        reader.read_exact(&mut echoed).await.unwrap();
        echoed
    };
    let ((), echoed) =
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(write, read) })
            .await
            .expect("the echo stalled");
    assert!(echoed == sent, "the spliced bytes differ");

    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn hosts_are_parsed_as_e2b_does() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let domain = mock.domain().to_owned();
    let cases = [
        (
            format!("notanumber-iabc.{domain}"),
            "Invalid sandbox port\n",
        ),
        (format!("49999-IABC.{domain}"), "Invalid sandbox ID\n"),
        (format!("49999.{domain}"), "Invalid host\n"),
    ];
    for (host, text) in cases {
        let request = Request::get("/")
            .header("host", &host)
            .body(Full::new(Bytes::new()))
            .unwrap();
        // The TLS name is any valid one; routing reads the Host header.
        let reply = client.sandbox(&format!("x.{domain}"), request).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{host}");
        assert_eq!(reply.text(), text, "{host}");
    }
    let unknown = client
        .get(&format!("49983-inothere.{domain}"), "/health", &[])
        .await;
    assert_eq!(unknown.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        unknown.json(),
        json!({"sandboxId": "inothere", "message": "The sandbox was not found", "code": 502})
    );
    // Routing headers count on a neutral host such as sandbox.{domain}.
    let shared = format!("sandbox.{domain}");
    let by_headers = client
        .get(
            &shared,
            "/health",
            &[
                ("e2b-sandbox-id", "inothere"),
                ("e2b-sandbox-port", "49983"),
            ],
        )
        .await;
    assert_eq!(by_headers.json()["sandboxId"], "inothere");
    let half = client
        .get(&shared, "/health", &[("e2b-sandbox-id", "inothere")])
        .await;
    assert_eq!(half.status, StatusCode::BAD_REQUEST);
    // api.{domain} is the control plane.
    let api = client
        .get(&format!("api.{domain}"), "/v2/sandboxes", &[])
        .await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);
    mock.shutdown().await.unwrap();
}
