//! envd: access tokens and file signatures of a secure sandbox, the
//! traffic token of a private one, and processes that time out, take
//! signals or cannot start.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{mock, wait_for};

/// A file signature computed the way the SDKs do, encoded for a query.
fn signature(path: &str, operation: &str, token: &str, expiration: Option<i64>) -> String {
    let mut text = format!("{path}:{operation}::{token}");
    if let Some(exp) = expiration {
        text.push_str(&format!(":{exp}"));
    }
    let signature = format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(text.as_bytes()))
    );
    form_urlencoded::byte_serialize(signature.as_bytes()).collect()
}

#[tokio::test]
async fn secure_and_private_sandboxes_check_their_tokens() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let created = client
        .create(json!({
            "templateID": "base",
            "timeout": 60,
            "secure": true,
            "network": {"allowPublicTraffic": false},
        }))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let token = created["envdAccessToken"]
        .as_str()
        .expect("an envd token")
        .to_owned();
    let traffic = created["trafficAccessToken"]
        .as_str()
        .expect("a traffic token")
        .to_owned();
    let envd = client.host(49983, &id);

    assert_eq!(
        client.get(&envd, "/health", &[]).await.status,
        StatusCode::NO_CONTENT
    );
    let refused = client
        .rpc(&id, "process.Process/List", json!({}), None)
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused.json(),
        json!({"code": 401, "message": "unauthorized access, please provide a valid access token or method signing if supported"})
    );
    let wrong = client
        .rpc(&id, "process.Process/List", json!({}), Some("nope"))
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let listed = client
        .rpc(&id, "process.Process/List", json!({}), Some(&token))
        .await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.json(), json!({}));

    let path = "/tmp/secret.txt";
    let write = |query: String, header: Option<&str>| {
        let mut request = Request::post(format!("/files?path={path}{query}"))
            .header("host", &envd)
            .header("content-type", "application/octet-stream");
        if let Some(value) = header {
            request = request.header("x-access-token", value);
        }
        client.sandbox(
            &envd,
            request
                .body(Full::new(Bytes::from_static(b"s3cret")))
                .unwrap(),
        )
    };
    let message =
        |reply: super::client::Reply| reply.json()["message"].as_str().unwrap().to_owned();
    assert_eq!(
        message(write(String::new(), None).await),
        "missing signature query parameter"
    );
    assert_eq!(
        message(write(String::new(), Some("nope")).await),
        "access token present in header but does not match"
    );
    let signed = write(
        format!("&signature={}", signature(path, "write", &token, None)),
        None,
    )
    .await;
    assert_eq!(signed.status, StatusCode::OK, "{}", signed.text());
    let wrong_op = format!(
        "/files?path={path}&signature={}",
        signature(path, "write", &token, None)
    );
    assert_eq!(
        message(client.get(&envd, &wrong_op, &[]).await),
        "invalid signature"
    );
    let expired = format!(
        "/files?path={path}&signature={}&signature_expiration=1",
        signature(path, "read", &token, Some(1))
    );
    assert_eq!(
        message(client.get(&envd, &expired, &[]).await),
        "signature is already expired"
    );
    let read = client
        .get(
            &envd,
            &format!("/files?path={path}"),
            &[("x-access-token", &token)],
        )
        .await;
    assert_eq!(read.body.as_ref(), b"s3cret");

    // The traffic token guards every port but envd's.
    let web = client.host(49999, &id);
    let missing = client.get(&web, "/", &[]).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN);
    assert_eq!(
        missing.json()["message"],
        "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
    );
    let invalid = client
        .get(&web, "/", &[("e2b-traffic-access-token", "nope")])
        .await;
    assert_eq!(invalid.status, StatusCode::FORBIDDEN);
    let passed = client
        .get(&web, "/", &[("e2b-traffic-access-token", &traffic)])
        .await;
    assert_eq!(
        passed.status,
        StatusCode::BAD_GATEWAY,
        "past the token, the port is closed"
    );

    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn processes_time_out_take_signals_or_fail_to_start() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({"templateID": "base", "timeout": 60}))
        .await;

    // Connect-Timeout-Ms is the process's lifetime.
    let started = std::time::Instant::now();
    let timed = client
        .start(
            &id,
            "echo up; exec sleep 30",
            &[("connect-timeout-ms", "700")],
        )
        .await
        .finish()
        .await;
    assert_eq!(timed.stdout, "up\n");
    assert_eq!(timed.end_stream["error"]["code"], "deadline_exceeded");
    assert!(started.elapsed() < Duration::from_secs(5));
    wait_for(
        "the timed-out process to go",
        Duration::from_secs(5),
        || async {
            let listed = client
                .rpc(&id, "process.Process/List", json!({}), None)
                .await
                .json();
            listed.get("processes").is_none()
        },
    )
    .await;

    // Silence is broken by keepalives at the client's interval.
    let quiet = client
        .start(
            &id,
            "sleep 1.5; echo done",
            &[("keepalive-ping-interval", "1")],
        )
        .await
        .finish()
        .await;
    assert_eq!(quiet.stdout, "done\n");
    assert_eq!(quiet.keepalives, 1);

    // SendSignal by tag ends the stream with envd's signalled end event.
    let message =
        json!({"process": {"cmd": "sleep", "args": ["30"]}, "tag": "sleeper", "stdin": false});
    let mut sleeper = client.start_message(&id, message, &[]).await;
    let pid = sleeper.pid().await;
    let listed = client
        .rpc(&id, "process.Process/List", json!({}), None)
        .await
        .json();
    assert_eq!(
        listed["processes"][0],
        json!({"config": {"cmd": "sleep", "args": ["30"]}, "pid": pid, "tag": "sleeper"})
    );
    let kill = json!({"process": {"tag": "sleeper"}, "signal": "SIGNAL_SIGKILL"});
    let killed = client
        .rpc(&id, "process.Process/SendSignal", kill, None)
        .await;
    assert_eq!(killed.status, StatusCode::OK);
    assert_eq!(killed.json(), json!({}));
    let run = sleeper.finish().await;
    assert_eq!(
        run.end,
        Some(json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}))
    );

    let unknown = json!({"process": {"pid": 999_999}, "signal": "SIGNAL_SIGTERM"});
    let unknown = client
        .rpc(&id, "process.Process/SendSignal", unknown, None)
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        unknown.json(),
        json!({"code": "not_found", "message": "process with pid 999999 not found"})
    );

    let failures = [
        (
            json!({"process": {"cmd": "/no/such/program"}}),
            "invalid_argument",
        ),
        (
            json!({"process": {"cmd": "true", "cwd": "/no/such/dir"}}),
            "invalid_argument",
        ),
        (
            json!({"process": {"cmd": "true"}, "pty": {"size": {"cols": 80, "rows": 24}}}),
            "unimplemented",
        ),
    ];
    for (message, code) in failures {
        let run = client
            .start_message(&id, message.clone(), &[])
            .await
            .finish()
            .await;
        assert_eq!(run.end_stream["error"]["code"], code, "{message}");
        assert!(run.end.is_none());
    }
    let nobody = format!("Basic {}", STANDARD.encode("nobody:"));
    let run = client
        .start_message(
            &id,
            json!({"process": {"cmd": "true"}}),
            &[("authorization", &nobody)],
        )
        .await
        .finish()
        .await;
    assert_eq!(
        run.end_stream["error"],
        json!({"code": "unauthenticated", "message": "invalid username: 'nobody'"})
    );

    // A user's home is where relative paths and processes start.
    let root = format!("Basic {}", STANDARD.encode("root:"));
    let run = client
        .start_message(
            &id,
            json!({"process": {"cmd": "pwd"}}),
            &[("authorization", &root)],
        )
        .await
        .finish()
        .await;
    assert_eq!(run.stdout, "/root\n");

    mock.shutdown().await.unwrap();
}
