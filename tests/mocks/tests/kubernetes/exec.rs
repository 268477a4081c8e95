//! Exec in a running pod: WebSocket channels (`v5.channel.k8s.io` as
//! kubectl and the Python client settle on it, `v4.channel.k8s.io`), with
//! output on stdout and stderr and the exit code in the error channel's
//! `Status`, stdin echoed back and ended with v5's close signal, a
//! terminal and its size; SPDY/3.1 over a plain upgrade, as kubectl falls
//! back to, spoken here with the mock's own framing and header
//! compression; kube-rs's exec client (the controller's); and the
//! refusals before the upgrade.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use silo_mocks::kubernetes::spdy::frame::{self, FLAG_FIN, Frame};
use silo_mocks::kubernetes::spdy::zlib::{Deflater, encode_pairs};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::client::Kube;
use super::common::send;
use super::{mock, pod, until_phase};

/// Longest wait for the next message of an exec.
const QUIET: Duration = Duration::from_secs(20);
/// A pod that stays up until it is deleted.
const IDLE: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
/// Prints on both streams and fails.
const FAILING: &str =
    "command=sh&command=-c&command=echo%20out%3B%20echo%20err%20%3E%262%3B%20exit%203";

/// What one exec over WebSocket channels delivered.
#[derive(Debug, Default)]
struct Delivered {
    chosen: Option<String>,
    first: Vec<u8>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    error: Vec<u8>,
    close: Option<CloseCode>,
}

impl Delivered {
    fn status(&self) -> Value {
        serde_json::from_slice(&self.error).unwrap()
    }
}

/// Runs an exec (`query` after `exec?`) offering `protocols`; `input` is
/// sent as stdin messages, then v5's close of stdin if `close_stdin`.
async fn exec(
    client: &Kube,
    query: &str,
    protocols: &str,
    input: &[&[u8]],
    close_stdin: bool,
) -> Delivered {
    let path = format!("/api/v1/namespaces/default/pods/shell/exec?{query}");
    let (mut socket, chosen) = client.websocket(&path, protocols).await;
    let mut delivered = Delivered {
        chosen,
        ..Default::default()
    };
    for data in input {
        socket
            .send(Message::binary([&[0u8][..], data].concat()))
            .await
            .unwrap();
    }
    if close_stdin {
        socket.send(Message::binary(vec![255, 0])).await.unwrap();
    }
    let mut seen = 0;
    loop {
        let next = tokio::time::timeout(QUIET, socket.next()).await;
        match next.expect("the exec went quiet") {
            Some(Ok(Message::Binary(bytes))) => {
                if seen == 0 {
                    delivered.first = bytes.to_vec();
                }
                seen += 1;
                let (channel, data) = bytes.split_first().unwrap();
                match channel {
                    1 => delivered.stdout.extend_from_slice(data),
                    2 => delivered.stderr.extend_from_slice(data),
                    3 => delivered.error.extend_from_slice(data),
                    other => panic!("unexpected channel {other}"),
                }
            }
            Some(Ok(Message::Close(frame))) => {
                delivered.close = frame.map(|f| f.code);
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return delivered,
        }
    }
}

/// A mock with a running pod `shell`.
async fn shell() -> Option<(silo_mocks::MockKubernetes, Kube)> {
    let (mock, client, _engine) = mock().await?;
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("shell", json!({}), IDLE, &[]),
        )
        .await;
    until_phase(&client, "default", "shell", "Running").await;
    Some((mock, client))
}

#[tokio::test]
async fn exec_over_websocket_channels() {
    let Some((mock, client)) = shell().await else {
        return;
    };

    // v5, as kubectl asks: output on both streams, the exit code in the status.
    let query = format!("{FAILING}&container=app&stdout=true&stderr=true");
    let failed = exec(&client, &query, "v5.channel.k8s.io", &[], false).await;
    assert_eq!(failed.chosen.as_deref(), Some("v5.channel.k8s.io"));
    assert_eq!(
        failed.first,
        [1],
        "an empty stdout message opens the streams"
    );
    assert_eq!(failed.stdout, b"out\n");
    assert_eq!(failed.stderr, b"err\n");
    assert_eq!(failed.close, Some(CloseCode::Normal));
    let status = failed.status();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "ExitCode", "message": "3"}])
    );
    assert_eq!(
        status["message"],
        "command terminated with non-zero exit code: command terminated with exit code 3"
    );
    assert!(status.get("kind").is_none(), "{status}");

    // v4 (the kubelet's words); a success is the bare status.
    let failed = exec(&client, &query, "v4.channel.k8s.io", &[], false).await;
    assert_eq!(failed.chosen.as_deref(), Some("v4.channel.k8s.io"));
    assert_eq!(
        failed.status()["message"],
        "command terminated with non-zero exit code: error executing command [sh -c echo out; echo err >&2; exit 3], exit code 3"
    );
    let fine = exec(
        &client,
        "command=true&stdout=true",
        "v4.channel.k8s.io",
        &[],
        false,
    )
    .await;
    assert_eq!(
        fine.error,
        br#"{"metadata":{},"status":"Success"}"#,
        "{}",
        String::from_utf8_lossy(&fine.error)
    );

    // Stdin relayed and ended by v5's close signal; stderr not attached.
    let echoed = exec(
        &client,
        "command=cat&stdin=true&stdout=true",
        "v5.channel.k8s.io, v4.channel.k8s.io",
        &[b"hello ", b"pod\n"],
        true,
    )
    .await;
    assert_eq!(echoed.stdout, b"hello pod\n");
    assert_eq!(echoed.status()["status"], "Success");

    // A terminal: one stream, CR LF line ends, the size the client sent
    // (an engine older than API 1.42 applies it only once the process runs).
    let path = "/api/v1/namespaces/default/pods/shell/exec?command=sh&command=-c&command=sleep%201%3B%20stty%20size&stdin=true&stdout=true&tty=true";
    let (mut socket, _) = client.websocket(path, "v5.channel.k8s.io").await;
    let mut size = vec![4u8];
    size.extend_from_slice(br#"{"Width":100,"Height":30}"#);
    socket.send(Message::binary(size)).await.unwrap();
    let mut printed = Vec::new();
    let mut status = Vec::new();
    while let Ok(Some(Ok(message))) = tokio::time::timeout(QUIET, socket.next()).await {
        if let Message::Binary(bytes) = message {
            match bytes[0] {
                1 => printed.extend_from_slice(&bytes[1..]),
                3 => status.extend_from_slice(&bytes[1..]),
                other => panic!("unexpected channel {other}"),
            }
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&printed),
        "30 100\r\n",
        "{}",
        String::from_utf8_lossy(&status)
    );

    // A program that is not there: the runtime's error, as an internal one.
    let missing = exec(
        &client,
        "command=no-such-program&stdout=true",
        "v4.channel.k8s.io",
        &[],
        false,
    )
    .await;
    let status = missing.status();
    assert_eq!(status["reason"], "InternalError");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with("Internal error occurred: error executing command in container:")
            && message.contains(r#"exec: "no-such-program": executable file not found in $PATH"#),
        "{message}"
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn exec_refusals() {
    let Some((mock, client)) = shell().await else {
        return;
    };
    let status = |reply: &super::client::Reply, code: StatusCode| {
        assert_eq!(reply.status, code, "{}", reply.text());
        reply.json()
    };
    let missing = client
        .get("/api/v1/namespaces/default/pods/nope/exec?command=true&stdout=true")
        .await;
    let missing = status(&missing, StatusCode::NOT_FOUND);
    assert_eq!(missing["reason"], "NotFound");
    assert_eq!(missing["message"], "pods \"nope\" not found");

    let plain = client
        .get("/api/v1/namespaces/default/pods/shell/exec?command=true&stdout=true")
        .await;
    assert_eq!(
        status(&plain, StatusCode::BAD_REQUEST)["message"],
        "Upgrade request required"
    );
    let other = client
        .get("/api/v1/namespaces/default/pods/shell/exec?command=true&stdout=true&container=db")
        .await;
    assert_eq!(
        status(&other, StatusCode::BAD_REQUEST)["message"],
        "container db is not valid for pod shell"
    );
    let no_stream = client
        .get("/api/v1/namespaces/default/pods/shell/exec?command=true")
        .await;
    assert_eq!(
        status(&no_stream, StatusCode::BAD_REQUEST)["message"],
        "you must specify at least 1 of stdin, stdout, stderr"
    );
    let no_command = client
        .get("/api/v1/namespaces/default/pods/shell/exec?stdout=true")
        .await;
    status(&no_command, StatusCode::BAD_REQUEST);

    // A pod whose container has ended has nothing to exec in.
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("done", json!({}), "true", &[]),
        )
        .await;
    until_phase(&client, "default", "done", "Succeeded").await;
    let ended = client
        .get("/api/v1/namespaces/default/pods/done/exec?command=true&stdout=true")
        .await;
    assert_eq!(
        status(&ended, StatusCode::BAD_REQUEST)["message"],
        "unable to upgrade connection: container not found (\"app\")"
    );
    let discovery = client.get("/api/v1").await.json();
    let exec = discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods/exec")
        .cloned()
        .expect("pods/exec is listed");
    assert_eq!(exec["kind"], "PodExecOptions");
    assert_eq!(exec["verbs"], json!(["create", "get"]));
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn exec_over_spdy() {
    let Some((mock, client)) = shell().await else {
        return;
    };
    let script = "cat; echo err >&2; exit 3";
    let path = format!(
        "/api/v1/namespaces/default/pods/shell/exec?command=sh&command=-c&command={}&stdin=true&stdout=true&stderr=true",
        script
            .replace(' ', "%20")
            .replace(';', "%3B")
            .replace('&', "%26")
            .replace('>', "%3E")
    );
    let request = Request::post(path)
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {}", mock.token()))
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .header("x-stream-protocol-version", "v5.channel.k8s.io")
        .header("x-stream-protocol-version", "v4.channel.k8s.io")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = send(client.connect().await, request).await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        response.headers()["x-stream-protocol-version"],
        "v5.channel.k8s.io"
    );
    let upgraded = hyper::upgrade::on(response).await.unwrap();
    let (mut reading, mut writing) = tokio::io::split(TokioIo::new(upgraded));

    // kubectl's order: error, stdin, stdout, stderr.
    let mut deflater = Deflater::default();
    let mut syn = |stream: u32, kind: &str| {
        let mut payload = stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&[0; 6]);
        payload.extend(deflater.block(&encode_pairs(&[("streamtype", kind)])));
        frame::control(frame::SYN_STREAM, 0, &payload)
    };
    for (stream, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
        writing.write_all(&syn(stream, kind)).await.unwrap();
    }
    writing
        .write_all(&frame::data(3, 0, b"over spdy\n"))
        .await
        .unwrap();
    writing
        .write_all(&frame::data(3, FLAG_FIN, b""))
        .await
        .unwrap();

    let mut replies = Vec::new();
    let mut received: [Vec<u8>; 8] = Default::default();
    let mut finished = Vec::new();
    let mut gone_away = false;
    while !gone_away {
        let next = tokio::time::timeout(QUIET, frame::read(&mut reading)).await;
        match next.unwrap().unwrap().expect("the session ended early") {
            Frame::Control {
                kind: frame::SYN_REPLY,
                payload,
                ..
            } => replies.push(frame::stream_id(&payload).unwrap()),
            Frame::Control {
                kind: frame::GOAWAY,
                ..
            } => gone_away = true,
            Frame::Data {
                stream,
                flags,
                payload,
            } => {
                received[stream as usize].extend_from_slice(&payload);
                if flags & FLAG_FIN != 0 {
                    finished.push(stream);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(replies, [1, 3, 5, 7]);
    assert_eq!(received[5], b"over spdy\n");
    assert_eq!(received[7], b"err\n");
    assert_eq!(finished, [5, 7, 1, 3], "stdout, stderr, error, stdin");
    let status: Value = serde_json::from_slice(&received[1]).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "3");
    assert_eq!(
        status["message"],
        "command terminated with non-zero exit code: error executing command [sh -c cat; echo err >&2; exit 3], exit code 3"
    );
    drop(writing);
    drop(reading);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn exec_with_kube_rs() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, AttachParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use tokio::io::AsyncReadExt;

    let Some((mock, _client)) = shell().await else {
        return;
    };
    let kubeconfig = Kubeconfig::read_from(mock.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    let params = AttachParams::default().stdin(true).stderr(false);
    let mut attached = pods
        .exec("shell", ["sh", "-c", "cat; exit 4"], &params)
        .await
        .unwrap();
    let mut stdin = attached.stdin().unwrap();
    stdin.write_all(b"through kube-rs\n").await.unwrap();
    // Shutting stdin down is v5's close signal, which ends `cat`.
    stdin.shutdown().await.unwrap();
    let mut stdout = attached.stdout().unwrap();
    let mut printed = String::new();
    tokio::time::timeout(QUIET, stdout.read_to_string(&mut printed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(printed, "through kube-rs\n");
    let status = tokio::time::timeout(QUIET, attached.take_status().unwrap())
        .await
        .unwrap()
        .expect("a status");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    let causes = status.details.and_then(|d| d.causes).unwrap_or_default();
    assert_eq!(causes[0].message.as_deref(), Some("4"));
    attached.join().await.unwrap();
    mock.shutdown().await.unwrap();
}
