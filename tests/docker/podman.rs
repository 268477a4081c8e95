//! The Podman backend on the real Podman engine (its Docker-compatible API
//! socket, required when `CI=true`), through the real CLI: a sandbox's
//! journey (up, exec, interrupt, a session, push, cp, stop and start,
//! snapshot, rewind in place, a restore onto a new container), then a fork onto Docker and one back onto Podman, each
//! engine holding only its own containers, a runtime Podman would drop
//! refused, and nothing left on either after `rm`.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, container};
use silo_tests::json;

use crate::sh;

/// The sandbox id of `name`, from `silo up`'s report (`up` of a running
/// sandbox answers at once).
fn id_of(cli: &Cli, name: &str) -> String {
    let up = json(&cli.ok(&["up", name, "--json"]));
    up["sandbox"]["id"].as_str().unwrap().to_owned()
}

/// The id of a new snapshot of `name`.
fn snapshot(cli: &Cli, name: &str) -> String {
    let report = json(&cli.ok(&["snapshot", name, "--json"]));
    report["snapshot"]["id"].as_str().unwrap().to_owned()
}

/// The files the journey writes, read back.
const FILES: &str = "cat /root/a /workspace/managed/app/app.txt; \
                     test -e /etc/group && echo group || echo no-group";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_lives_on_podman_and_forks_to_docker_and_back() {
    let Some(podman) = silo_tests::podman::engine_with_base().await else {
        return;
    };
    let Some(docker) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let started = Instant::now();

    let up = json(&cli.ok(&[
        "up",
        "pod",
        "--backend",
        "podman",
        "--image",
        BASE_IMAGE,
        "--json",
    ]));
    assert_eq!(up["tier"], 3, "{up}");
    assert_eq!(up["sandbox"]["spec"]["backend"], "podman", "{up}");
    let id = up["sandbox"]["id"].as_str().unwrap().to_owned();
    assert!(
        container(&podman, &id).await.is_some(),
        "no container on Podman"
    );
    assert!(
        container(&docker, &id).await.is_none(),
        "a Podman sandbox's container is on Docker"
    );

    // Commands go through the agent, PID 1 of the container, which runs
    // with the limits Podman is given explicitly.
    let out = sh(
        &cli,
        "pod",
        "echo hello; cat /proc/1/cmdline | tr '\\0' ' '; echo; ulimit -n",
    );
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("hello"), "{out}");
    assert!(lines.next().unwrap().contains("silo-agent"), "{out}");
    assert_eq!(lines.next(), Some("1024"), "{out}");

    // An interrupted runaway returns at once.
    let start = Instant::now();
    let out = cli.run(&["exec", "pod", "--timeout", "1", "--", "sleep", "100"]);
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
        "pod",
        "--",
        "cd /tmp && export GREETING=hi",
    ]);
    let out = cli.ok(&[
        "exec",
        "--session",
        "dev",
        "pod",
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
        "pod",
    ]);
    std::fs::write(dir.path().join("a"), "copied\n").unwrap();
    cli.ok(&["cp", dir.path().join("a").to_str().unwrap(), "pod:/root/a"]);
    let back = dir.path().join("back");
    cli.ok(&["cp", "pod:/root/a", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "copied\n");

    // Stop keeps the container and its files; `up` starts it again.
    cli.ok(&["stop", "pod"]);
    let up = json(&cli.ok(&["up", "pod", "--json"]));
    assert_eq!(up["tier"], 1, "{up}");
    assert_eq!(sh(&cli, "pod", "cat /root/a"), "copied\n");

    // A snapshot, then changes, then a rewind puts the files back.
    sh(&cli, "pod", "rm /etc/group");
    let expected = "copied\npushed\nno-group\n";
    assert_eq!(sh(&cli, "pod", FILES), expected);
    let first = snapshot(&cli, "pod");
    sh(&cli, "pod", "echo broken > /root/a && touch /etc/group");
    let before = container(&podman, &id).await.unwrap().id;
    let rewound = json(&cli.ok(&["rewind", "pod", &first, "--json"]));
    assert!(rewound["new_machine_because"].is_null(), "{rewound}");
    assert_eq!(
        container(&podman, &id).await.unwrap().id,
        before,
        "rewound in place"
    );
    assert_eq!(sh(&cli, "pod", FILES), expected);

    // A new machine from the snapshot, as `up` makes when the container is
    // gone: the snapshot's image loaded into Podman from the store.
    silo_tests::docker::remove_behind_silos_back(&podman, &id).await;
    let up = json(&cli.ok(&["up", "pod", "--json"]));
    assert_eq!(up["tier"], 2, "{up}");
    assert_eq!(sh(&cli, "pod", FILES), expected);

    // Podman onto Docker: the snapshot's image loaded from the store into
    // Docker's engine, the container there and not on Podman.
    cli.ok(&["fork", &first, "--name", "dock", "--backend", "docker"]);
    assert_eq!(sh(&cli, "dock", FILES), expected);
    let dock = id_of(&cli, "dock");
    assert!(container(&docker, &dock).await.is_some());
    assert!(container(&podman, &dock).await.is_none());

    // And back onto Podman, with a change made on Docker.
    sh(&cli, "dock", "echo docker > /root/a");
    let on_docker = snapshot(&cli, "dock");
    cli.ok(&["fork", &on_docker, "--name", "back", "--backend", "podman"]);
    assert_eq!(
        sh(&cli, "back", FILES),
        "docker\npushed\nno-group\n",
        "the fork back lost Docker's change"
    );
    let back = id_of(&cli, "back");
    assert!(container(&podman, &back).await.is_some());

    // Podman's API would drop a runtime (gVisor would silently be runc):
    // refused by name, before anything is made.
    let refused = cli.fails(&[
        "up",
        "gvisor",
        "--backend",
        "podman",
        "--image",
        BASE_IMAGE,
        "--runtime",
        "runsc",
    ]);
    assert!(
        refused.contains("ignores a container's runtime"),
        "{refused}"
    );
    assert!(!cli.ok(&["ls"]).contains("gvisor"));

    cli.ok(&["rm", "pod", "dock", "back"]);
    for sandbox in [&id, &dock, &back] {
        assert!(
            container(&podman, sandbox).await.is_none(),
            "rm left {sandbox} on Podman"
        );
        assert!(
            container(&docker, sandbox).await.is_none(),
            "rm left {sandbox} on Docker"
        );
    }
    cli.ok(&["gc"]);
    eprintln!("podman journey: {:?}", started.elapsed());
}
