//! The toolbox through the proxy: who may use it, `process/execute`,
//! sessions (state kept between commands, sync and async runs, deletion
//! ending what they started), files in and out, and the two error shapes
//! (typed `ErrorResponse`, bare aborts).

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{Access, Reply};
use super::{mock, wait_for, wait_state};

/// Checks a Go `ErrorResponse` and returns its message.
fn go_error(reply: &Reply, status: StatusCode, code: &str, path: &str, method: &str) -> String {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let body = reply.json();
    assert_eq!(body["statusCode"], status.as_u16(), "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["path"], path, "{body}");
    assert_eq!(body["method"], method, "{body}");
    assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));
    body["message"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_toolbox_needs_the_key_or_the_token_and_lives_only_on_the_proxy() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    let path = format!("/toolbox/{id}/process/execute");
    let command = || Some(json!({"command": "echo hi"}));

    let none = client
        .toolbox(
            &sandbox,
            Access::None,
            Method::POST,
            "/process/execute",
            command(),
        )
        .await;
    let message = go_error(
        &none,
        StatusCode::UNAUTHORIZED,
        "UNAUTHORIZED",
        &path,
        "POST",
    );
    assert_eq!(
        message,
        "unauthorized: missing authentication: provide a preview access token (via header, query parameter, or cookie) or use an API key or JWT"
    );
    let wrong = client
        .toolbox(
            &sandbox,
            Access::Bearer("dtn_wrong"),
            Method::POST,
            "/process/execute",
            command(),
        )
        .await;
    let message = go_error(
        &wrong,
        StatusCode::UNAUTHORIZED,
        "UNAUTHORIZED",
        &path,
        "POST",
    );
    assert_eq!(
        message,
        "unauthorized: authentication failed: Bearer token is invalid"
    );

    let key = client.key().to_owned();
    let by_key = client
        .toolbox(
            &sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/execute",
            command(),
        )
        .await;
    assert_eq!(by_key.status, StatusCode::OK, "{}", by_key.text());
    assert_eq!(by_key.json(), json!({"exitCode": 0, "result": "hi\n"}));
    let preview = client
        .api(
            Method::GET,
            &format!("/sandbox/{id}/ports/49999/preview-url"),
            None,
        )
        .await
        .json();
    let token = preview["token"].as_str().unwrap();
    let by_token = client
        .toolbox(
            &sandbox,
            Access::Token(token),
            Method::POST,
            "/process/execute",
            command(),
        )
        .await;
    assert_eq!(by_token.status, StatusCode::OK);

    // A control-plane path sent to the proxy is not found there.
    let host = mock.toolbox_host();
    let request = http::Request::get("/api/sandbox")
        .header("host", &host)
        .header("authorization", format!("Bearer {key}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let misrouted = client.sandbox(&host, request).await;
    let message = go_error(
        &misrouted,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        "/api/sandbox",
        "GET",
    );
    assert_eq!(message, "not found: not found");

    // A stopped sandbox's toolbox answers as the runner does.
    client
        .api(Method::POST, &format!("/sandbox/{id}/stop"), None)
        .await;
    wait_state(&client, id, "stopped").await;
    let stopped = client
        .toolbox(
            &sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/execute",
            command(),
        )
        .await;
    let runner_path = format!("/sandboxes/{id}/toolbox/process/execute");
    let message = go_error(
        &stopped,
        StatusCode::BAD_REQUEST,
        "BAD_REQUEST",
        &runner_path,
        "POST",
    );
    assert_eq!(
        message,
        "bad request: failed to resolve container IP after 3 attempts: no IP address found. Is the Sandbox started?"
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn execute_answers_output_exit_codes_and_timeouts() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client
        .create(json!({"env": {"FROM_CREATE": "create"}}))
        .await;
    let key = client.key().to_owned();
    let execute = |body: Value| {
        let (client, sandbox, key) = (&client, &sandbox, &key);
        async move {
            client
                .toolbox(
                    sandbox,
                    Access::Bearer(key),
                    Method::POST,
                    "/process/execute",
                    Some(body),
                )
                .await
        }
    };
    let ran = execute(json!({
        "command": "echo \"$FROM_CREATE $EXTRA $HOME $(pwd)\"; echo oops >&2; exit 3",
        "envs": {"EXTRA": "extra"},
        "cwd": "/tmp",
    }))
    .await;
    assert_eq!(
        ran.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    let ran = ran.json();
    assert_eq!(ran["exitCode"], 3);
    assert_eq!(ran["result"], "create extra /home/daytona /tmp\noops\n");
    let home = execute(json!({"command": "pwd"})).await.json();
    assert_eq!(home["result"], "/home/daytona\n");
    let no_dir = execute(json!({"command": "true", "cwd": "/nowhere"}))
        .await
        .json();
    assert_eq!(
        no_dir,
        json!({"exitCode": -1, "result": "chdir /nowhere: no such file or directory"})
    );
    let timed_out = execute(json!({"command": "sleep 30", "timeout": 1})).await;
    let message = go_error(
        &timed_out,
        StatusCode::REQUEST_TIMEOUT,
        "REQUEST_TIMEOUT",
        "/process/execute",
        "POST",
    );
    assert_eq!(message, "request timeout: command execution timeout");
    let blank = execute(json!({"command": "  "})).await;
    let message = go_error(
        &blank,
        StatusCode::BAD_REQUEST,
        "BAD_REQUEST",
        "/process/execute",
        "POST",
    );
    assert_eq!(
        message,
        "bad request: command cannot be empty or whitespace-only"
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_keep_state_run_in_the_background_and_end_with_their_processes() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({})).await;
    let key = client.key().to_owned();
    let call = |method: Method, path: String, body: Option<Value>| {
        let (client, sandbox, key) = (&client, &sandbox, &key);
        async move {
            client
                .toolbox(sandbox, Access::Bearer(key), method, &path, body)
                .await
        }
    };
    let created = call(
        Method::POST,
        "/process/session".into(),
        Some(json!({"sessionId": "s1"})),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    assert!(created.body.is_empty());
    let twice = call(
        Method::POST,
        "/process/session".into(),
        Some(json!({"sessionId": "s1"})),
    )
    .await;
    let message = go_error(
        &twice,
        StatusCode::CONFLICT,
        "CONFLICT",
        "/process/session",
        "POST",
    );
    assert_eq!(message, "conflict: session already exists");

    let exec = |command: &str, run_async: bool| {
        call(
            Method::POST,
            "/process/session/s1/exec".into(),
            Some(json!({"command": command, "runAsync": run_async})),
        )
    };
    let first = exec("cd /tmp && export KEPT=yes", false).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(first.json()["exitCode"], 0);
    let second = exec(
        "echo \"$KEPT $(pwd)\"; echo warn >&2; printf tail; false",
        false,
    )
    .await
    .json();
    // stdout and stderr lines come through their own readers, as in the
    // daemon: in order within a stream, interleaved as they arrive.
    let mut lines: Vec<&str> = second["output"].as_str().unwrap().lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["tail", "warn", "yes /tmp"]);
    assert_eq!(second["exitCode"], 1);
    assert_eq!(second["stdout"], Value::Null);
    assert_eq!(second["stderr"], Value::Null);
    let quoted = exec("echo 'it''s' \"a  b\" $((1+2))", false).await.json();
    assert_eq!(quoted["output"], "its a  b 3\n");

    // runAsync answers at once; the process outlives the exchange.
    let background = exec("echo started > /tmp/bg; sleep 300", true).await;
    assert_eq!(
        background.status,
        StatusCode::ACCEPTED,
        "{}",
        background.text()
    );
    let background = background.json();
    assert_eq!(background["output"], Value::Null);
    assert_eq!(background["exitCode"], Value::Null);
    let command_id = background["cmdId"].as_str().unwrap().to_owned();
    let execute = |command: &str| {
        call(
            Method::POST,
            "/process/execute".into(),
            Some(json!({"command": command})),
        )
    };
    wait_for(
        "the background command",
        Duration::from_secs(10),
        || async { execute("cat /tmp/bg").await.json()["result"] == "started\n" },
    )
    .await;
    let session = call(Method::GET, "/process/session/s1".into(), None)
        .await
        .json();
    assert_eq!(session["sessionId"], "s1");
    let commands = session["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 4);
    assert_eq!(commands[1]["exitCode"], 1);
    assert_eq!(
        commands[3],
        json!({"id": command_id, "command": "echo started > /tmp/bg; sleep 300"})
    );
    let one = call(
        Method::GET,
        format!("/process/session/s1/command/{command_id}"),
        None,
    )
    .await;
    assert!(one.json().get("exitCode").is_none());
    let logs = call(
        Method::GET,
        format!("/process/session/s1/command/{command_id}/logs"),
        None,
    )
    .await;
    assert_eq!(logs.status, StatusCode::OK);
    let listed = call(Method::GET, "/process/session".into(), None)
        .await
        .json();
    assert_eq!(listed.as_array().unwrap().len(), 1);

    // Deleting the session ends the shell and the background command.
    let sleeping = || async {
        execute("ps -o args | grep -c '^sleep 300' || true")
            .await
            .json()["result"]
            == "1\n"
    };
    assert!(sleeping().await);
    let deleted = call(Method::DELETE, "/process/session/s1".into(), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    wait_for(
        "the background command to end",
        Duration::from_secs(10),
        || async {
            execute("ps -o args | grep -c '^sleep 300' || true")
                .await
                .json()["result"]
                == "0\n"
        },
    )
    .await;
    let gone = call(Method::GET, "/process/session/s1".into(), None).await;
    let message = go_error(
        &gone,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        "/process/session/s1",
        "GET",
    );
    assert_eq!(message, "not found: session not found");
    // An exec in an unknown session is the daemon's untyped error.
    let lost = exec("true", false).await;
    assert_eq!(lost.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        lost.json(),
        json!({
            "statusCode": 500,
            "message": "failed to execute command: not found: session not found",
            "timestamp": "0001-01-01T00:00:00Z",
            "path": "",
        })
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_go_in_and_out_and_refusals_are_bare() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({})).await;
    let key = client.key().to_owned();
    let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let uploaded = client.upload(&sandbox, "notes/data.bin", &data).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{}", uploaded.text());
    assert!(uploaded.body.is_empty());
    let get = |path: &str| {
        let (client, sandbox, key) = (&client, &sandbox, &key);
        let path = path.to_owned();
        async move {
            client
                .toolbox(sandbox, Access::Bearer(key), Method::GET, &path, None)
                .await
        }
    };
    let downloaded = get("/files/download?path=/home/daytona/notes/data.bin").await;
    assert_eq!(downloaded.status, StatusCode::OK);
    assert_eq!(
        downloaded.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(
        downloaded.header("content-disposition"),
        Some("attachment; filename=\"data.bin\"; filename*=utf-8''data.bin")
    );
    assert!(downloaded.body == data, "the bytes came back changed");

    let post = |path: &str| {
        let (client, sandbox, key) = (&client, &sandbox, &key);
        let path = path.to_owned();
        async move {
            client
                .toolbox(sandbox, Access::Bearer(key), Method::POST, &path, None)
                .await
        }
    };
    let mode = post("/files/permissions?path=notes/data.bin&mode=755").await;
    assert_eq!(mode.status, StatusCode::OK);
    let listed = client
        .toolbox(
            &sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/execute",
            Some(json!({"command": "stat -c %a notes/data.bin"})),
        )
        .await;
    assert_eq!(listed.json()["result"], "755\n");

    for (reply, status) in [
        (
            get("/files/download?path=/nowhere").await,
            StatusCode::NOT_FOUND,
        ),
        (
            get("/files/download?path=/tmp").await,
            StatusCode::BAD_REQUEST,
        ),
        (get("/files/download").await, StatusCode::BAD_REQUEST),
        (
            post("/files/permissions?path=/nowhere&mode=755").await,
            StatusCode::NOT_FOUND,
        ),
        (
            post("/files/permissions?path=/tmp&mode=9z").await,
            StatusCode::BAD_REQUEST,
        ),
        (
            post("/files/upload?path=/tmp/x").await,
            StatusCode::BAD_REQUEST,
        ),
    ] {
        assert_eq!(reply.status, status, "{}", reply.text());
        assert!(
            reply.body.is_empty(),
            "bare aborts have no body: {}",
            reply.text()
        );
    }
    let unmodelled = get("/git/status?path=/tmp").await;
    assert_eq!(unmodelled.status, StatusCode::NOT_IMPLEMENTED);
    let unknown = get("/nothing").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.text(), "404 page not found");
    mock.shutdown().await.unwrap();
}
