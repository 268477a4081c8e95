//! What the current `daytona` SDK needs that the older spec did not have:
//! the fields its models require (`kvm` on a sandbox, `networkBlockAll` on
//! a list item), the bulk file routes and the listing, `user-home-dir`,
//! session output shaped by `X-Daytona-SDK-Version`, and the Socket.IO
//! path refused so the SDK polls.

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{Access, Client};
use super::{mock, wait_for};

const BOUNDARY: &str = "bulk-boundary-3f1c";

#[tokio::test]
async fn the_current_models_required_fields_are_there() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client
        .create(json!({"labels": {"suite": "current"}, "kvm": false}))
        .await;
    assert_eq!(sandbox["kvm"], false);
    let listed = client
        .api(
            Method::GET,
            "/sandbox?labels=%7B%22suite%22%3A%22current%22%7D",
            None,
        )
        .await
        .json();
    let item = &listed["items"][0];
    assert_eq!(item["networkBlockAll"], false, "{item}");
    assert!(item.get("networkAllowList").is_some());
    for refused in [
        json!({"ttlMinutes": 30}),
        json!({"autoPauseInterval": 5}),
        json!({"spot": true}),
    ] {
        let reply = client
            .api(Method::POST, "/sandbox", Some(refused.clone()))
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{refused}");
        assert!(
            reply.json()["message"]
                .as_str()
                .unwrap()
                .contains("does not model")
        );
    }
    // The notification gateway's handshake is refused as engine.io refuses it.
    let socket = client
        .api(Method::GET, "/socket.io/?EIO=4&transport=websocket", None)
        .await;
    assert_eq!(socket.status, StatusCode::FORBIDDEN);
    assert_eq!(socket.json(), json!({"code": 4, "message": "Forbidden"}));
    // A route only the current spec has is known (501), not unknown (404).
    let id = sandbox["id"].as_str().unwrap();
    let ttl = client
        .api(Method::POST, &format!("/sandbox/{id}/ttl/30"), None)
        .await;
    assert_eq!(ttl.status, StatusCode::NOT_IMPLEMENTED);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn files_move_in_bulk_and_list_with_their_paths() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({})).await;
    let home = toolbox(&client, &sandbox, Method::GET, "/user-home-dir", None, &[]).await;
    assert_eq!(home.json(), json!({"dir": "/home/daytona"}));

    let mut body = Vec::new();
    for (i, (path, data)) in [("notes/a.txt", "alpha"), ("/tmp/b.bin", "beta!")]
        .iter()
        .enumerate()
    {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"files[{i}].path\"\r\n\r\n{path}\r\n\
                 --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"files[{i}].file\"; filename=\"{path}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n{data}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    let key = client.key().to_owned();
    let uploaded = client
        .toolbox_body(
            &sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/files/bulk-upload",
            Some(&content_type),
            Bytes::from(body),
            &[],
        )
        .await;
    assert_eq!(uploaded.status, StatusCode::OK, "{}", uploaded.text());
    assert_eq!(
        uploaded.json(),
        json!({"files": [{"path": "notes/a.txt", "bytes": 5}, {"path": "/tmp/b.bin", "bytes": 5}]})
    );

    let paths = json!({"paths": ["notes/a.txt", "/tmp/b.bin", "/tmp/none"]});
    let downloaded = toolbox(
        &client,
        &sandbox,
        Method::POST,
        "/files/bulk-download",
        Some(paths),
        &[],
    )
    .await;
    assert_eq!(downloaded.status, StatusCode::OK);
    assert_eq!(
        downloaded.header("content-type"),
        Some("multipart/form-data; boundary=DAYTONA-FILE-BOUNDARY")
    );
    let text = downloaded.text();
    assert!(
        text.contains("name=\"file\"; filename=\"notes/a.txt\""),
        "{text}"
    );
    assert!(text.contains("\r\n\r\nalpha\r\n"), "{text}");
    assert!(text.contains("\r\n\r\nbeta!\r\n"), "{text}");
    assert!(
        text.contains("name=\"error\"; filename=\"/tmp/none\""),
        "{text}"
    );
    assert!(text.contains("\"code\":\"FILE_NOT_FOUND\""), "{text}");
    assert!(
        text.trim_end().ends_with("--DAYTONA-FILE-BOUNDARY--"),
        "{text}"
    );

    let listed = toolbox(
        &client,
        &sandbox,
        Method::GET,
        "/files?path=notes",
        None,
        &[],
    )
    .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text());
    let entry = &listed.json()[0];
    assert_eq!(entry["name"], "a.txt");
    assert_eq!(entry["path"], "/home/daytona/notes/a.txt");
    assert_eq!(entry["size"], 5);
    assert_eq!(entry["isDir"], false);
    assert_eq!(entry["mode"], "-rw-r--r--");
    assert_eq!(entry["permissions"], "0644");
    let missing = toolbox(
        &client,
        &sandbox,
        Method::GET,
        "/files?path=nowhere",
        None,
        &[],
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn session_output_takes_the_shape_the_sdk_version_asks_for() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({})).await;
    let made = toolbox(
        &client,
        &sandbox,
        Method::POST,
        "/process/session",
        Some(json!({"sessionId": "s"})),
        &[],
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED);
    let current = [("x-daytona-sdk-version", "0.226.1")];
    let command = json!({"command": "echo out; echo err >&2; sh -c 'exit 2'"});
    let split = toolbox(
        &client,
        &sandbox,
        Method::POST,
        "/process/session/s/exec",
        Some(command.clone()),
        &current,
    )
    .await
    .json();
    assert_eq!(split["exitCode"], 2);
    assert_eq!(split["stdout"], "out\n");
    assert_eq!(split["stderr"], "err\n");
    let raw = split["output"].as_str().unwrap();
    assert!(
        raw.contains("\u{1}\u{1}\u{1}out\n") && raw.contains("\u{2}\u{2}\u{2}err\n"),
        "{raw:?}"
    );

    let old = toolbox(
        &client,
        &sandbox,
        Method::POST,
        "/process/session/s/exec",
        Some(command),
        &[],
    )
    .await
    .json();
    assert_eq!(old["stdout"], Value::Null);
    let mut lines: Vec<&str> = old["output"].as_str().unwrap().lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["err", "out"]);

    let started = toolbox(
        &client,
        &sandbox,
        Method::POST,
        "/process/session/s/exec",
        Some(json!({"command": "echo async; echo oops >&2", "runAsync": true})),
        &current,
    )
    .await;
    assert_eq!(started.status, StatusCode::ACCEPTED);
    let cmd = started.json()["cmdId"].as_str().unwrap().to_owned();
    let logs_path = format!("/process/session/s/command/{cmd}/logs");
    wait_for(
        "the async command's logs",
        std::time::Duration::from_secs(10),
        || async {
            toolbox(&client, &sandbox, Method::GET, &logs_path, None, &current)
                .await
                .json()["stderr"]
                == "oops\n"
        },
    )
    .await;
    let logs = toolbox(&client, &sandbox, Method::GET, &logs_path, None, &current).await;
    assert_eq!(
        logs.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(logs.json()["stdout"], "async\n");
    let text = toolbox(&client, &sandbox, Method::GET, &logs_path, None, &[]).await;
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    let text = text.text();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["async", "oops"]);
    mock.shutdown().await.unwrap();
}

/// A toolbox call with the key and `headers`.
async fn toolbox(
    client: &Client,
    sandbox: &Value,
    method: Method,
    path: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> super::common::Reply {
    let key = client.key().to_owned();
    let (content_type, bytes) = match body {
        Some(value) => (Some("application/json"), Bytes::from(value.to_string())),
        None => (None, Bytes::new()),
    };
    client
        .toolbox_body(
            sandbox,
            Access::Bearer(&key),
            method,
            path,
            content_type,
            bytes,
            headers,
        )
        .await
}
