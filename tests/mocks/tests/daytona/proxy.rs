//! The preview proxy: what the sandbox sees of a relayed request (the
//! host rewritten, the token consumed), an upgraded connection spliced
//! byte for byte, public sandboxes, and hosts that name no port.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{Access, Client};
use super::{mock, wait_for};

/// Answers any request with `101` and then echoes every byte.
const ECHO_UPGRADE: &str = "cr=$(printf '\\r')\n\
while IFS= read -r line; do [ -z \"${line%$cr}\" ] && break; done\n\
printf 'HTTP/1.1 101 Switching Protocols\\r\\nConnection: Upgrade\\r\\nUpgrade: echo\\r\\n\\r\\n'\n\
exec cat\n";

/// Answers any request with its own head as the body.
const ECHO_HEAD: &str = "cr=$(printf '\\r')\nhead=\n\
while IFS= read -r line; do line=${line%$cr}; [ -z \"$line\" ] && break; head=\"$head$line\n\"; done\n\
printf 'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n%s' ${#head} \"$head\"\n";

/// Serves `script` for every connection to port 49999, from a session.
async fn serve(client: &Client, sandbox: &Value, script: &str) {
    let uploaded = client
        .upload(sandbox, "/tmp/serve.sh", script.as_bytes())
        .await;
    assert_eq!(uploaded.status, StatusCode::OK);
    let key = client.key().to_owned();
    let session = client
        .toolbox(
            sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/session",
            Some(json!({"sessionId": "web"})),
        )
        .await;
    assert_eq!(session.status, StatusCode::CREATED);
    let started = client
        .toolbox(
            sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/session/web/exec",
            Some(json!({"command": "nc -ll -p 49999 -e /bin/sh /tmp/serve.sh", "runAsync": true})),
        )
        .await;
    assert_eq!(started.status, StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sandbox_sees_the_request_as_the_real_proxy_relays_it() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    serve(&client, &sandbox, ECHO_HEAD).await;
    let (url, token) = client.preview_url(id, 49999).await;
    wait_for("the echo server", Duration::from_secs(10), || async {
        client
            .preview(&url, "/seen?x=1", Access::Token(&token))
            .await
            .status
            == StatusCode::OK
    })
    .await;
    let seen = client
        .preview(&url, "/seen?x=1", Access::Token(&token))
        .await
        .text();
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines[0], "GET /seen?x=1 HTTP/1.1");
    let has = |name: &str| {
        lines
            .iter()
            .find(|l| l.to_ascii_lowercase().starts_with(name))
            .copied()
    };
    assert_eq!(has("host:"), Some("host: localhost:49999"), "{seen}");
    assert_eq!(
        has("x-forwarded-host:"),
        Some(format!("x-forwarded-host: 49999-{id}.{}", mock.proxy_domain()).as_str()),
        "{seen}"
    );
    assert_eq!(
        has("x-daytona-preview-token:"),
        None,
        "the token is consumed: {seen}"
    );
    // So is the API key, and a token given as a query parameter.
    let key = client.key().to_owned();
    let seen = client
        .preview(&url, "/k", Access::Bearer(&key))
        .await
        .text();
    assert!(
        !seen.to_ascii_lowercase().contains("authorization"),
        "{seen}"
    );
    let seen = client
        .preview(
            &url,
            &format!("/q?a=b&DAYTONA_SANDBOX_AUTH_KEY={token}"),
            Access::None,
        )
        .await
        .text();
    assert!(seen.starts_with("GET /q?a=b HTTP/1.1"), "{seen}");
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrades_are_spliced_byte_for_byte_and_public_sandboxes_need_no_token() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({"public": true})).await;
    let id = sandbox["id"].as_str().unwrap();
    serve(&client, &sandbox, ECHO_UPGRADE).await;
    let (url, _token) = client.preview_url(id, 49999).await;
    let host = url.trim_start_matches("https://").to_owned();
    let upgrade = || {
        Request::get("/exec")
            .header("host", &host)
            .header("connection", "Upgrade")
            .header("upgrade", "echo")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let response = loop {
        let reply = client.open(&host, upgrade()).await;
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

    // The toolbox port stays private on a public sandbox.
    let toolbox = client
        .preview(
            &format!("https://2280-{id}.{}", mock.proxy_domain()),
            "/process/session",
            Access::None,
        )
        .await;
    assert_eq!(toolbox.status, StatusCode::TEMPORARY_REDIRECT);
    let key = client.key().to_owned();
    let toolbox = client
        .preview(
            &format!("https://2280-{id}.{}", mock.proxy_domain()),
            "/process/session",
            Access::Bearer(&key),
        )
        .await;
    assert_eq!(toolbox.status, StatusCode::OK, "{}", toolbox.text());
    assert_eq!(toolbox.json()[0]["sessionId"], "web");
    // An unknown sandbox is a sign-in, as for any sandbox without access.
    let unknown = client
        .preview(
            &format!("https://49999-nothere.{}", mock.proxy_domain()),
            "/",
            Access::Bearer(&key),
        )
        .await;
    assert_eq!(unknown.status, StatusCode::TEMPORARY_REDIRECT);
    mock.shutdown().await.unwrap();
}
