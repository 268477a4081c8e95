//! `silo image bake` against the real engine: the base image baked with the
//! agent, then used as a sandbox image, and run on its own with the baked
//! entrypoint (as a remote provider would run it).

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
};
use silo::client::{AgentClient, Endpoint};
use silo_protocol::auth::Key;
use silo_tests::docker::{BASE_IMAGE, engine_with_base};

/// The tag the bake test builds (removed at the end).
const BAKED: &str = "silo-baked:test";
/// How long the standalone baked agent has to answer.
const READY: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_baked_base_image_runs_as_a_sandbox_and_on_its_own() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let built = cli.ok(&["image", "bake", BASE_IMAGE, "-t", BAKED]);
    assert!(
        built.starts_with(&format!("built {BAKED} (sha256:")),
        "{built}"
    );
    let config = engine.inspect_image(BAKED).await.unwrap().config.unwrap();
    assert_eq!(
        config.entrypoint.unwrap(),
        [
            "/usr/local/bin/silo-agent",
            "--listen",
            "unix:/.silo/run/agent.sock",
            "--"
        ]
    );
    assert_eq!(
        config.cmd.unwrap(),
        ["/bin/sh"],
        "the base's command is the workload"
    );

    // As a sandbox image: silo mounts its own agent over it, as for any image.
    cli.ok(&["up", "baked", "--image", BAKED]);
    let out = cli.ok(&[
        "exec",
        "baked",
        "--",
        "sh",
        "-c",
        "test -x /usr/local/bin/silo-agent && echo baked",
    ]);
    assert_eq!(out, "baked\n");

    // On its own: the baked entrypoint serves with a key from the environment.
    let run = tempfile::tempdir().unwrap();
    std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let key = Key::generate().unwrap();
    let name = format!("silo-test-baked-{}", std::process::id());
    let body = ContainerCreateBody {
        image: Some(BAKED.into()),
        env: Some(vec![format!("SILO_AGENT_KEY={}", key.to_hex())]),
        host_config: Some(HostConfig {
            mounts: Some(vec![Mount {
                typ: Some(MountType::BIND),
                source: Some(run.path().to_string_lossy().into_owned()),
                target: Some("/.silo/run".into()),
                ..Default::default()
            }]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::new().name(&name).build();
    engine.create_container(Some(options), body).await.unwrap();
    engine.start_container(&name, None).await.unwrap();
    let client = AgentClient::new(Endpoint::Unix(run.path().join("agent.sock")), key);
    let ready = client.wait_ready(READY).await;
    let ran = match &ready {
        Ok(_) => Some(
            client
                .run(silo_tests::sh(
                    "echo standalone; cat /proc/1/cmdline | tr '\\0' ' '",
                ))
                .await,
        ),
        Err(_) => None,
    };
    let remove = RemoveContainerOptionsBuilder::new().force(true).build();
    engine.remove_container(&name, Some(remove)).await.unwrap();
    let health = ready.unwrap();
    assert_eq!(health.pid, 1);
    let out = ran.unwrap().unwrap();
    let stdout = silo_tests::text(&out.stdout);
    assert!(
        stdout.starts_with("standalone\n/usr/local/bin/silo-agent --listen"),
        "{stdout}"
    );

    cli.ok(&["rm", "baked"]);
    let remove = RemoveImageOptionsBuilder::new().force(true).build();
    engine
        .remove_image(BAKED, Some(remove), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn bake_refuses_what_cannot_go_into_a_dockerfile() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let out = cli.run(&[
        "image",
        "bake",
        BASE_IMAGE,
        "-t",
        "x:y",
        "--listen",
        "unix:/a b",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad listen address"), "{stderr}");
}
