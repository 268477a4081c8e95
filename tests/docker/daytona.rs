//! The Daytona backend through the mock Daytona (`tests/mocks`), with the
//! real CLI in separate processes: the agent uploaded through the toolbox
//! (another host than the control plane) and started in a process session,
//! reached through the preview proxy with its token; a sandbox's life (exec,
//! interrupt, a session keeping cwd and env, push, cp, stop and start from
//! a new process with a new preview token, snapshot, the sandbox deleted
//! behind silo's back and restored from its snapshot, rm); forks Daytona ⇄
//! Docker ⇄ E2B; and the bad input a user meets (a wrong key, an unknown
//! snapshot, a bind mount, an upload that fails half way), each leaving no
//! sandbox behind.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_mocks::{MockDaytona, MockDaytonaConfig, MockE2b, MockE2bConfig};
use silo_tests::docker::engine_with_base;

use crate::e2b::{NO_ROOM_IMAGE, no_room_image};
use silo_tests::json;

/// The Daytona id of a silo sandbox, from `silo ls --json`.
pub(crate) fn daytona_id(cli: &silo_tests::Cli, name: &str) -> String {
    let listed = json(&cli.ok(&["ls", "--json"]));
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {listed}"))
        .clone();
    row["backend_ref"]["sandbox_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_lives_on_daytona_and_its_snapshots_move_everywhere() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let daytona = MockDaytona::start(MockDaytonaConfig::default())
        .await
        .unwrap();
    let e2b = MockE2b::start(MockE2bConfig::default()).await.unwrap();
    let mut env = daytona.env();
    env.extend(e2b.env());
    let cli = crate::cli().with_env(env);

    let up = json(&cli.ok(&[
        "up",
        "box",
        "--backend",
        "daytona",
        "--image",
        "base",
        "--json",
    ]));
    assert_eq!(up["tier"], 3, "{up}");
    let out = cli.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "echo hello; cat /proc/1/cmdline | tr '\\0' ' '; test -e /.silo/key || echo no-key",
    ]);
    assert!(out.starts_with("hello\n"), "{out}");
    assert!(
        !out.contains("silo-agent"),
        "the agent must not be PID 1: {out}"
    );
    assert!(out.contains("no-key"), "the key file is still there: {out}");

    // An interrupted runaway returns at once.
    let start = Instant::now();
    let out = cli.run(&["exec", "box", "--timeout", "1", "--", "sleep", "100"]);
    assert!(!out.status.success());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    // A session keeps its cwd and variables across processes.
    cli.ok(&[
        "exec",
        "--session",
        "dev",
        "box",
        "--",
        "cd /tmp && export GREETING=hi",
    ]);
    let out = cli.ok(&[
        "exec",
        "--session",
        "dev",
        "box",
        "--",
        "echo $PWD $GREETING",
    ]);
    assert_eq!(out.trim(), "/tmp hi");

    // Push and cp land whole.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.txt"), "pushed\n").unwrap();
    cli.ok(&[
        "push",
        dir.path().to_str().unwrap(),
        "--mount",
        "/workspace/managed/app",
        "box",
    ]);
    cli.ok(&[
        "cp",
        dir.path().join("app.txt").to_str().unwrap(),
        "box:/root/a",
    ]);
    assert_eq!(
        cli.ok(&[
            "exec",
            "box",
            "--",
            "cat",
            "/workspace/managed/app/app.txt",
            "/root/a"
        ]),
        "pushed\npushed\n"
    );

    // Stop ends processes and keeps files; `up` from a new process starts
    // it again (a new preview token) and the agent with it.
    cli.ok(&["stop", "box"]);
    let refused = cli.fails(&["exec", "box", "--", "true"]);
    assert!(refused.contains("silo start box"), "{refused}");
    let up = json(&cli.ok(&["up", "box", "--json"]));
    assert_eq!(up["tier"], 1, "{up}");
    assert_eq!(cli.ok(&["exec", "box", "--", "cat", "/root/a"]), "pushed\n");

    // A snapshot, then the sandbox deleted behind silo's back: `up`
    // restores it from the snapshot under the same id.
    cli.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "echo one > /root/b && rm /etc/group",
    ]);
    let snapshot = json(&cli.ok(&["snapshot", "box", "--json"]))["snapshot"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let id = daytona_id(&cli, "box");
    let (status, _) = api(&daytona, "DELETE", &format!("/sandbox/{id}")).await;
    assert_eq!(status, 200);
    let up = json(&cli.ok(&["up", "box", "--json"]));
    assert_eq!(up["tier"], 2, "{up}");
    let files = "cat /root/a /root/b; test -e /etc/group && echo group || echo no-group";
    let expected = "pushed\none\nno-group\n";
    assert_eq!(cli.ok(&["exec", "box", "--", "sh", "-c", files]), expected);

    // Daytona onto Docker, Docker onto E2B, E2B back onto Daytona.
    cli.ok(&["fork", &snapshot, "--name", "dock", "--backend", "docker"]);
    assert_eq!(cli.ok(&["exec", "dock", "--", "sh", "-c", files]), expected);
    let on_docker = json(&cli.ok(&["snapshot", "dock", "--json"]))["snapshot"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    cli.ok(&["fork", &on_docker, "--name", "vm", "--backend", "e2b"]);
    assert_eq!(cli.ok(&["exec", "vm", "--", "sh", "-c", files]), expected);
    let on_e2b = json(&cli.ok(&["snapshot", "vm", "--json"]))["snapshot"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    cli.ok(&[
        "fork",
        &on_e2b,
        "--name",
        "back",
        "--backend",
        "daytona",
        "--image",
        "base",
    ]);
    assert_eq!(cli.ok(&["exec", "back", "--", "sh", "-c", files]), expected);

    cli.ok(&["rm", "box", "dock", "vm", "back"]);
    assert_eq!(sandboxes(&daytona).await, 0, "rm left Daytona sandboxes");
    drop(cli);
    daytona.shutdown().await.unwrap();
    e2b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_keys_snapshots_and_mounts_are_named_and_leave_nothing() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    no_room_image(&engine).await;
    let mut config = MockDaytonaConfig::default();
    config
        .snapshots
        .insert("no-room".into(), NO_ROOM_IMAGE.into());
    let daytona = MockDaytona::start(config).await.unwrap();
    let wrong_key = daytona.env().into_iter().map(|(k, v)| {
        let v = if k == "DAYTONA_API_KEY" {
            "dtn_wrong".into()
        } else {
            v
        };
        (k, v)
    });
    let wrong = crate::cli().with_env(wrong_key);
    let err = wrong.fails(&["up", "box", "--backend", "daytona", "--image", "base"]);
    assert!(
        err.contains("401") && err.contains("DAYTONA_API_KEY"),
        "{err}"
    );
    drop(wrong);

    let cli = crate::cli().with_env(daytona.env());
    let err = cli.fails(&["up", "box", "--backend", "daytona", "--image", "nope"]);
    assert!(err.contains("nope"), "{err}");
    let err = cli.fails(&[
        "up",
        "box",
        "--backend",
        "daytona",
        "--image",
        "base",
        "--bind",
        "/tmp:/tmp",
    ]);
    assert!(err.contains("bind"), "{err}");

    // The agent's upload fails half way through a create: the toolbox's
    // refusal is named, and the sandbox that was made is deleted.
    let err = cli.fails(&["up", "box", "--backend", "daytona", "--image", "no-room"]);
    assert!(
        err.contains("toolbox") && err.contains("upload /.silo"),
        "{err}"
    );
    assert_eq!(
        sandboxes(&daytona).await,
        0,
        "a failed create left a sandbox"
    );
    drop(cli);
    daytona.shutdown().await.unwrap();
}

/// Calls the mock's control plane as another Daytona client would; answers
/// the status and the body.
async fn api(mock: &MockDaytona, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url: http::Uri = mock.api_url().parse().unwrap();
    let addr = format!("{}:{}", url.host().unwrap(), url.port_u16().unwrap());
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {}{path} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        url.path().trim_end_matches('/'),
        mock.api_key()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// How many sandboxes the mock lists that are not being deleted (a delete
/// is answered at once and finishes in the background, as Daytona's does).
async fn sandboxes(mock: &MockDaytona) -> usize {
    let (status, body) = api(mock, "GET", "/sandbox").await;
    assert_eq!(status, 200, "{body}");
    let listed = json(&body);
    listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| !matches!(item["state"].as_str(), Some("destroying" | "destroyed")))
        .count()
}
