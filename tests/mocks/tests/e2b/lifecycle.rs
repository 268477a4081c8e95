//! A sandbox's whole life through the public shapes: create, find by
//! metadata, upload, run a process and read its stream, a background
//! process that outlives its stream, a server on 49999 through the TLS
//! proxy, pause, resume, timeout, kill.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};

use super::{containers_of, mock, wait_for};

const SCRIPT: &str = "echo \"$GREETING from $FROM_CREATE in $(pwd)\"\necho oops >&2\nexit 3\n";

#[tokio::test]
async fn a_sandbox_lives_runs_serves_pauses_resumes_and_times_out() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({
            "templateID": "base",
            "timeout": 60,
            "metadata": {"suite": "lifecycle"},
            "envVars": {"FROM_CREATE": "create"},
        }))
        .await;
    assert_eq!(containers_of(&engine, &id).await.len(), 1);

    let listed = client
        .api(
            Method::GET,
            "/v2/sandboxes?metadata=suite%253Dlifecycle",
            None,
        )
        .await;
    assert_eq!(listed.json()[0]["sandboxID"], id.as_str());

    // Upload as the SDKs do: multipart, field `file`, the path as filename.
    let envd = client.host(49983, &id);
    let boundary = "mockboundary42";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"scripts/hello.sh\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n{SCRIPT}\r\n--{boundary}--\r\n"
    );
    let upload = Request::post("/files")
        .header("host", &envd)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let uploaded = client.sandbox(&envd, upload).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{}", uploaded.text());
    assert_eq!(
        uploaded.json(),
        json!([{"path": "/home/user/scripts/hello.sh", "name": "hello.sh", "type": "file"}])
    );
    let downloaded = client
        .get(
            &envd,
            "/files?path=%2Fhome%2Fuser%2Fscripts%2Fhello.sh",
            &[],
        )
        .await;
    assert_eq!(downloaded.status, StatusCode::OK);
    assert_eq!(downloaded.body.as_ref(), SCRIPT.as_bytes());
    let missing = client.get(&envd, "/files?path=nothing.txt", &[]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(
        missing.json(),
        json!({"code": 404, "message": "path '/home/user/nothing.txt' does not exist"})
    );

    let run = client
        .start(&id, "sh scripts/hello.sh", &[])
        .await
        .finish()
        .await;
    assert!(run.pid > 1, "whatever a client starts is not PID 1");
    assert_eq!(run.stdout, "hello from create in /home/user\n");
    assert_eq!(run.stderr, "oops\n");
    assert_eq!(
        run.end,
        Some(
            json!({"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"})
        )
    );
    assert_eq!(run.end_stream, json!({}));
    let ok = client.start(&id, "true", &[]).await.finish().await;
    assert_eq!(
        ok.end,
        Some(json!({"exited": true, "status": "exit status 0"}))
    );

    // A process keeps running after its client drops the stream.
    let mut ticker = client
        .start(
            &id,
            "while :; do echo tick >> /tmp/ticks; sleep 0.1; done",
            &[],
        )
        .await;
    let ticker_pid = ticker.pid().await;
    drop(ticker);
    let count_ticks = || async {
        let run = client
            .start(&id, "wc -l < /tmp/ticks", &[])
            .await
            .finish()
            .await;
        run.stdout.trim().parse::<u64>().unwrap_or(0)
    };
    let before = count_ticks().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        count_ticks().await > before,
        "the dropped stream's process stopped"
    );
    let listed = client
        .rpc(&id, "process.Process/List", json!({}), None)
        .await;
    let pids: Vec<u64> = listed.json()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(pids.contains(&ticker_pid), "{pids:?}");

    // Port 49999: closed, then a server inside answers through the proxy.
    let web = client.host(49999, &id);
    let closed = client.get(&web, "/index.html", &[]).await;
    assert_eq!(closed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        closed.json(),
        json!({"sandboxId": id, "message": "The sandbox is running but port is not open", "port": 49999, "code": 502})
    );
    let server =
        "mkdir -p /www && echo hello-web > /www/index.html && exec httpd -f -p 49999 -h /www";
    let mut httpd = client
        .start(&id, server, &[("connect-timeout-ms", "0")])
        .await;
    httpd.pid().await;
    drop(httpd);
    wait_for(
        "the web server answering",
        Duration::from_secs(5),
        || async {
            let reply = client.get(&web, "/index.html", &[]).await;
            reply.status == StatusCode::OK && reply.body.as_ref() == b"hello-web\n"
        },
    )
    .await;

    // Paused: the proxy says "not found", as E2B does without auto-resume.
    let pause = client
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(pause.status, StatusCode::NO_CONTENT);
    let again = client
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let gone = client.get(&web, "/index.html", &[]).await;
    assert_eq!(gone.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        gone.json(),
        json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502})
    );
    assert_eq!(
        client.get(&envd, "/health", &[]).await.status,
        StatusCode::BAD_GATEWAY
    );
    let detail = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json();
    assert_eq!(detail["state"], "paused");
    assert_eq!(
        detail["lifecycle"],
        json!({"autoResume": false, "onTimeout": "kill"})
    );
    let paused = client
        .api(Method::GET, "/v2/sandboxes?state=paused", None)
        .await
        .json();
    assert_eq!(paused[0]["sandboxID"], id.as_str());

    // Connect resumes it (201), processes and all; a second connect is 200.
    let resumed = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::CREATED);
    assert_eq!(resumed.json()["sandboxID"], id.as_str());
    let reply = client.get(&web, "/index.html", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let resumed_ticks = count_ticks().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        count_ticks().await > resumed_ticks,
        "the background process did not resume"
    );
    let end_before: Value = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json()["endAt"]
        .clone();
    let running = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 5})),
        )
        .await;
    assert_eq!(running.status, StatusCode::OK);
    let end_after = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json()["endAt"]
        .clone();
    assert_eq!(end_before, end_after, "connect never shortens the timeout");

    // The timeout kills it: the record and the container go.
    let timeout = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 1})),
        )
        .await;
    assert_eq!(timeout.status, StatusCode::NO_CONTENT);
    wait_for(
        "the timed-out sandbox to go",
        Duration::from_secs(5),
        || async {
            client
                .api(Method::GET, &format!("/sandboxes/{id}"), None)
                .await
                .status
                == StatusCode::NOT_FOUND
                && containers_of(&engine, &id).await.is_empty()
        },
    )
    .await;
    let delete = client
        .api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!(delete.status, StatusCode::NOT_FOUND);

    assert_eq!(mock.shutdown().await.unwrap(), 0);
}

#[tokio::test]
async fn auto_pause_pauses_on_timeout_and_kill_removes_a_paused_sandbox() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({"templateID": "base", "timeout": 1, "autoPause": true}))
        .await;
    let detail = |id: String| {
        let client = &client;
        async move {
            client
                .api(Method::GET, &format!("/sandboxes/{id}"), None)
                .await
                .json()
        }
    };
    assert_eq!(detail(id.clone()).await["lifecycle"]["onTimeout"], "pause");
    wait_for("the auto-pause", Duration::from_secs(5), || async {
        let pause = client
            .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
            .await;
        pause.text().ends_with("is already paused\"}")
            && detail(id.clone()).await["state"] == "paused"
    })
    .await;
    let timeout = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 30})),
        )
        .await;
    assert_eq!(
        timeout.status,
        StatusCode::NOT_FOUND,
        "a paused sandbox has no timeout to set"
    );
    let resumed = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 30})),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::CREATED);
    let pause = client
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(pause.status, StatusCode::NO_CONTENT);
    let kill = client
        .api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!(kill.status, StatusCode::NO_CONTENT);
    assert!(containers_of(&engine, &id).await.is_empty());
    assert_eq!(mock.shutdown().await.unwrap(), 0);
}
