//! The E2B backend through the mock E2B (`tests/mocks`), with the real CLI
//! in separate processes: the agent uploaded and started through envd, and
//! reached through the TLS proxy, a sandbox's life (exec, interrupt,
//! sessions, push, pause with processes kept, resume from a new process,
//! the agent killed inside the VM, a VM killed behind silo's back, rm),
//! and the bad input a user meets (a wrong key, an unknown template, an
//! upload that fails half way through a create), each leaving no VM
//! behind.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_mocks::containers::{LABEL_SANDBOX, labelled};
use silo_mocks::{MockE2b, MockE2bConfig};
use silo_tests::Cli;
use silo_tests::docker::engine_with_base;
use silo_tests::json;

/// The CLI with the mock's environment (its clean-up included).
fn cli(mock: &MockE2b) -> Cli {
    crate::cli().with_env(mock.env())
}

/// The E2B id of a silo sandbox, from `silo ls --json`.
pub(crate) fn vm_of(e2b: &Cli, name: &str) -> String {
    let listed = json(&e2b.ok(&["ls", "--json"]));
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name || row["sandbox"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {listed}"))
        .clone();
    let backend_ref = if row["backend_ref"].is_object() {
        &row["backend_ref"]
    } else {
        &row["sandbox"]["backend_ref"]
    };
    backend_ref["sandbox_id"].as_str().unwrap().to_owned()
}

/// An image whose `/.silo` is a file, so nothing can be uploaded under it.
pub(crate) const NO_ROOM_IMAGE: &str = "silo-test-no-room:latest";

async fn mock() -> Option<(MockE2b, bollard::Docker)> {
    let engine = engine_with_base().await?;
    let mock = MockE2b::start(MockE2bConfig::default()).await.unwrap();
    Some((mock, engine))
}

/// Builds [`NO_ROOM_IMAGE`] from the base image.
pub(crate) async fn no_room_image(engine: &bollard::Docker) {
    let dockerfile = format!(
        "FROM {}\nRUN touch /.silo\n",
        silo_tests::docker::BASE_IMAGE
    );
    let mut context = silo::internals::image::Context::new();
    context
        .file("Dockerfile", 0o644, dockerfile.as_bytes())
        .unwrap();
    silo::internals::image::build(
        engine,
        context.finish().unwrap(),
        NO_ROOM_IMAGE,
        &mut |_| {},
    )
    .await
    .unwrap();
}

async fn vms(engine: &bollard::Docker, vm: &str) -> usize {
    labelled(engine, LABEL_SANDBOX, vm).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_lives_on_e2b_through_the_agent() {
    let Some((mock, engine)) = mock().await else {
        return;
    };
    let e2b = cli(&mock);

    let up = json(&e2b.ok(&[
        "up",
        "box",
        "--backend",
        "e2b",
        "--template",
        "base",
        "--json",
    ]));
    assert_eq!(up["tier"], 3, "{up}");
    let vm = vm_of(&e2b, "box");
    assert_eq!(vms(&engine, &vm).await, 1);

    // Commands go through the agent, which is not the VM's PID 1.
    let out = e2b.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "echo hello; cat /proc/1/cmdline | tr '\\0' ' '",
    ]);
    assert!(out.starts_with("hello\n"), "{out}");
    assert!(
        !out.contains("silo-agent"),
        "the agent must not be PID 1: {out}"
    );
    // The key file is gone once the agent has read it.
    let out = e2b.run(&["exec", "box", "--", "test", "-e", "/.silo/key"]);
    assert_eq!(out.status.code(), Some(1), "the key file is still there");

    // An interrupted runaway returns at once.
    let start = Instant::now();
    let out = e2b.run(&["exec", "box", "--timeout", "1", "--", "sleep", "100"]);
    assert!(!out.status.success());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    // A session keeps its cwd and variables across processes.
    e2b.ok(&[
        "exec",
        "--session",
        "dev",
        "box",
        "--",
        "cd /tmp && export GREETING=hi",
    ]);
    let out = e2b.ok(&[
        "exec",
        "--session",
        "dev",
        "box",
        "--",
        "echo $PWD $GREETING",
    ]);
    assert_eq!(out.trim(), "/tmp hi");

    // A push lands whole.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.txt"), "pushed\n").unwrap();
    e2b.ok(&[
        "push",
        dir.path().to_str().unwrap(),
        "--mount",
        "/workspace/managed/app",
        "box",
    ]);
    let out = e2b.ok(&["exec", "box", "--", "cat", "/workspace/managed/app/app.txt"]);
    assert_eq!(out, "pushed\n");

    // A pause keeps processes: one started before it runs on after resume.
    e2b.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "setsid sleep 1000 >/dev/null 2>&1 &",
    ]);
    let paused = e2b.ok(&["pause", "box"]);
    assert!(paused.contains("paused box"), "{paused}");
    let refused = e2b.fails(&["exec", "box", "--", "true"]);
    assert!(refused.contains("silo start box"), "{refused}");
    let up = json(&e2b.ok(&["up", "box", "--json"]));
    assert_eq!(up["tier"], 1, "{up}");
    let out = e2b.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "ps | grep -c '[s]leep 1000'",
    ]);
    assert_eq!(out.trim(), "1", "the process did not survive the pause");

    // The agent killed inside the VM: the sandbox reads as stopped, with
    // the command that starts it, and `up` starts the agent again.
    let _ = e2b.run(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "kill -9 $(pidof silo-agent)",
    ]);
    let dead = e2b.fails(&["exec", "box", "--", "true"]);
    assert!(dead.contains("silo start box"), "{dead}");
    let up = json(&e2b.ok(&["up", "box", "--json"]));
    assert_eq!(up["tier"], 1, "{up}");
    assert_eq!(e2b.ok(&["exec", "box", "--", "echo", "again"]), "again\n");

    // Gone behind silo's back: `up` makes a fresh VM under the same id.
    let (status, _) = api(&mock, "DELETE", &format!("/sandboxes/{vm}")).await;
    assert_eq!(status, 204);
    let gone = e2b.fails(&["exec", "box", "--", "true"]);
    assert!(
        gone.contains("no longer exists") && gone.contains("silo up box"),
        "{gone}"
    );
    let up = json(&e2b.ok(&["up", "box", "--json"]));
    assert_eq!(up["tier"], 3, "{up}");
    let again = vm_of(&e2b, "box");
    assert_ne!(again, vm);
    assert_eq!(e2b.ok(&["exec", "box", "--", "echo", "back"]), "back\n");

    e2b.ok(&["rm", "box"]);
    assert_eq!(vms(&engine, &again).await, 0, "rm left the VM");
    // The CLI's clean-up (`gc` included) talks to the mock: it goes first.
    drop(e2b);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_keys_and_templates_are_named_and_leave_no_vm() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    no_room_image(&engine).await;
    let mut config = MockE2bConfig::default();
    config
        .templates
        .insert("no-room".into(), NO_ROOM_IMAGE.into());
    let mock = MockE2b::start(config).await.unwrap();
    let wrong_key = mock.env().into_iter().map(|(k, v)| {
        (
            k,
            if k == "E2B_API_KEY" {
                "e2b_wrong".into()
            } else {
                v
            },
        )
    });
    let wrong = crate::cli().with_env(wrong_key);
    let err = wrong.fails(&["up", "box", "--backend", "e2b"]);
    assert!(err.contains("401") && err.contains("E2B_API_KEY"), "{err}");
    drop(wrong);

    let e2b = cli(&mock);
    let err = e2b.fails(&["up", "box", "--backend", "e2b", "--template", "nope"]);
    assert!(err.contains("404") && err.contains("template"), "{err}");

    let err = e2b.fails(&["up", "box", "--backend", "e2b", "--bind", "/tmp:/tmp"]);
    assert!(err.contains("bind"), "{err}");

    // The agent's upload fails half way through a create: envd's refusal
    // is named, and the VM that was made is killed.
    let err = e2b.fails(&["up", "box", "--backend", "e2b", "--template", "no-room"]);
    assert!(err.contains("envd") && err.contains("/.silo"), "{err}");

    let (status, listed) = api(&mock, "GET", "/v2/sandboxes").await;
    assert_eq!((status, listed.trim()), (200, "[]"), "VMs left behind");
    drop((engine, e2b));
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_template_that_carries_the_agent_runs_its_own() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    const BAKED: &str = "silo-test-baked:latest";
    let request = silo::internals::image::BakeRequest {
        base: silo_tests::docker::BASE_IMAGE,
        tag: BAKED,
        agent: silo_tests::agent_binary(),
        listen: silo::DEFAULT_LISTEN,
    };
    silo::internals::image::bake(
        &engine,
        &silo::internals::docker::DOCKER,
        &request,
        &mut |_| {},
    )
    .await
    .unwrap();
    let mut config = MockE2bConfig::default();
    config.templates.insert("baked".into(), BAKED.into());
    let mock = MockE2b::start(config).await.unwrap();
    let e2b = cli(&mock);

    // The first machine of the template shows it carries the agent; the
    // next one runs that agent instead of an uploaded one.
    let running = |name: &str| {
        e2b.ok(&[
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "tr '\\0' ' ' < /proc/$(pidof silo-agent)/cmdline",
        ])
    };
    e2b.ok(&["up", "first", "--backend", "e2b", "--template", "baked"]);
    let out = running("first");
    assert!(out.starts_with("/.silo/silo-agent"), "{out}");
    e2b.ok(&["rm", "first"]);
    e2b.ok(&["up", "box", "--backend", "e2b", "--template", "baked"]);
    let out = running("box");
    assert!(
        out.starts_with(silo::internals::image::BAKED_AGENT_PATH),
        "not the template's agent: {out}"
    );
    // Paused and resumed, it still answers.
    e2b.ok(&["stop", "box"]);
    e2b.ok(&["up", "box"]);
    assert_eq!(e2b.ok(&["exec", "box", "--", "echo", "ok"]), "ok\n");
    e2b.ok(&["rm", "box"]);
    drop(e2b);
    mock.shutdown().await.unwrap();
}

/// Calls the mock's control plane as another E2B client would; answers
/// the status and the body.
pub(crate) async fn api(mock: &MockE2b, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url: http::Uri = mock.api_url().parse().unwrap();
    let addr = format!("{}:{}", url.host().unwrap(), url.port_u16().unwrap());
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: api\r\nX-API-Key: {}\r\nConnection: close\r\n\r\n",
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
