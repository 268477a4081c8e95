//! Open-or-create on the real Docker engine, driven through the real `silo`
//! CLI: every `silo` call is a brand-new process that finds what an earlier
//! one made. Tier 1 running and stopped, tier 3 fresh, idle TTL expiry and
//! gc, spec drift and `--recreate`, and a container removed behind silo's back.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::Duration;

use silo_tests::Cli;
use silo_tests::docker::{
    BASE_IMAGE, container_id, containers_of, engine_with_base, is_running,
    remove_behind_silos_back, wait_stopped,
};
use silo_tests::json;

/// Longest an idle-timeout test waits for its container to stop by itself.
const TTL_WAIT: Duration = Duration::from_secs(20);

/// Runs `silo up NAME --json ARGS...`; returns (sandbox id, action, notes).
fn up(cli: &Cli, name: &str, args: &[&str]) -> (String, String, Vec<String>) {
    let mut argv = vec!["up", name, "--json"];
    argv.extend_from_slice(args);
    let out = json(&cli.ok(&argv));
    let notes = out["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    (
        out["sandbox"]["id"].as_str().unwrap().to_owned(),
        out["action"].as_str().unwrap().to_owned(),
        notes,
    )
}

fn event_kinds(cli: &Cli, name: &str) -> Vec<String> {
    json(&cli.ok(&["events", name, "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn tier_1_attaches_to_a_running_sandbox_and_starts_a_stopped_one() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let (id, action, _) = up(&cli, "t1", &["--image", BASE_IMAGE]);
    assert_eq!(action, "created", "tier 3: nothing existed");
    let container = container_id(&engine, &id).await;
    cli.ok(&["exec", "t1", "--", "sh", "-c", "echo kept > /marker"]);

    // Running: a new process attaches to the same container.
    let (again, action, _) = up(&cli, "t1", &["--image", BASE_IMAGE]);
    assert_eq!((again.as_str(), action.as_str()), (id.as_str(), "attached"));
    assert_eq!(container_id(&engine, &id).await, container);

    // Stopped: a new process starts the same container; its files are there.
    cli.ok(&["stop", "t1"]);
    assert!(!is_running(&engine, &id).await);
    let (again, action, _) = up(&cli, "t1", &[]);
    assert_eq!((again.as_str(), action.as_str()), (id.as_str(), "started"));
    assert_eq!(container_id(&engine, &id).await, container);
    assert_eq!(cli.ok(&["exec", "t1", "--", "cat", "/marker"]), "kept\n");

    assert_eq!(
        event_kinds(&cli, "t1"),
        [
            "created", "started", "resumed", "stopped", "started", "resumed"
        ]
    );
    // Containers are never removed when a silo process exits: only rm does.
    cli.ok(&["rm", "t1"]);
    assert!(containers_of(&engine, &id).await.is_empty());
}

#[tokio::test]
async fn up_without_a_spec_opens_but_never_creates() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let out = cli.run(&["up", "nothing-here"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--image"), "{stderr}");
}

#[tokio::test]
async fn a_changed_spec_is_refused_with_its_differences_unless_recreate() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let (id, _, _) = up(&cli, "drift", &["--image", BASE_IMAGE, "--env", "A=1"]);
    let container = container_id(&engine, &id).await;
    cli.ok(&["exec", "drift", "--", "touch", "/old"]);

    let out = cli.run(&[
        "up", "drift", "--image", BASE_IMAGE, "--env", "A=2", "--memory", "64m",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(r#"env.A: "1" -> "2""#), "{stderr}");
    assert!(
        stderr.contains("memory_bytes: unset -> 67108864"),
        "{stderr}"
    );
    assert!(stderr.contains("--recreate"), "{stderr}");
    assert_eq!(
        container_id(&engine, &id).await,
        container,
        "nothing touched"
    );

    let (again, action, notes) = up(
        &cli,
        "drift",
        &["--image", BASE_IMAGE, "--env", "A=2", "--recreate"],
    );
    assert_eq!(
        (again.as_str(), action.as_str()),
        (id.as_str(), "recreated")
    );
    assert!(notes[0].contains("spec changed"), "{notes:?}");
    assert_ne!(container_id(&engine, &id).await, container);
    assert_eq!(containers_of(&engine, &id).await.len(), 1);
    let out = cli.ok(&[
        "exec",
        "drift",
        "--",
        "sh",
        "-c",
        "echo $A; ls /old 2>&1; true",
    ]);
    assert!(out.starts_with("2\n"), "{out}");
    assert!(out.contains("No such file"), "a fresh machine: {out}");
    assert!(event_kinds(&cli, "drift").contains(&"recreated".to_owned()));
}

#[tokio::test]
async fn a_container_removed_behind_silos_back_is_reported_and_replaced() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let (id, _, _) = up(&cli, "gone", &["--image", BASE_IMAGE]);
    remove_behind_silos_back(&engine, &id).await;

    let listed = json(&cli.ok(&["ls", "--json"]));
    assert_eq!(listed[0]["status"], "missing");
    let out = cli.run(&["exec", "gone", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("removed outside silo"), "{stderr}");

    let (again, action, notes) = up(&cli, "gone", &[]);
    assert_eq!(
        (again.as_str(), action.as_str()),
        (id.as_str(), "recreated")
    );
    assert!(notes[0].contains("removed outside silo"), "{notes:?}");
    assert_eq!(cli.ok(&["exec", "gone", "--", "echo", "back"]), "back\n");
}

#[tokio::test]
async fn an_expired_idle_ttl_counts_as_gone_and_gc_collects_it() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let (id, _, _) = up(&cli, "ttl", &["--image", BASE_IMAGE, "--idle-timeout", "1"]);
    let first = container_id(&engine, &id).await;
    cli.ok(&["exec", "ttl", "--", "touch", "/marker"]);
    // The agent exits after a second without requests; the container stops by itself.
    wait_stopped(&engine, &id, TTL_WAIT).await;

    let (again, action, notes) = up(&cli, "ttl", &[]);
    assert_eq!(
        (again.as_str(), action.as_str()),
        (id.as_str(), "recreated")
    );
    assert!(notes[0].contains("idle TTL expired"), "{notes:?}");
    assert_ne!(container_id(&engine, &id).await, first);
    let out = cli.run(&["exec", "ttl", "--", "ls", "/marker"]);
    assert_ne!(out.status.code(), Some(0), "a fresh machine has no marker");

    // A stop by silo is not an expiry: `up` starts the same container again.
    // (A TTL long enough that the stop surely comes first.)
    let (other, _, _) = up(
        &cli,
        "ttl-stop",
        &["--image", BASE_IMAGE, "--idle-timeout", "30"],
    );
    let kept = container_id(&engine, &other).await;
    cli.ok(&["stop", "ttl-stop"]);
    let (_, action, _) = up(&cli, "ttl-stop", &[]);
    assert_eq!(action, "started");
    assert_eq!(container_id(&engine, &other).await, kept);

    // gc leaves fresh expiries alone unless told, then removes the sandbox.
    wait_stopped(&engine, &id, TTL_WAIT).await;
    assert!(cli.ok(&["gc"]).contains("nothing to collect"));
    let dry = cli.ok(&["gc", "--older-than", "0", "--dry-run"]);
    assert!(dry.contains("would remove ttl"), "{dry}");
    assert_eq!(containers_of(&engine, &id).await.len(), 1);
    let done = cli.ok(&["gc", "--older-than", "0"]);
    assert!(done.contains("removed ttl"), "{done}");
    assert!(containers_of(&engine, &id).await.is_empty());
    assert_eq!(
        event_kinds(&cli, &id).last().map(String::as_str),
        Some("removed")
    );
}
