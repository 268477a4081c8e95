//! Leases on the real engine with real `silo` processes: lifecycle
//! operations on one sandbox from several processes are serialized, a
//! process waits for a held lease and says for whom, and a lease whose owner
//! died is taken over at once.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use silo_tests::docker::{BASE_IMAGE, containers_of, engine_with_base};
use silo_tests::json;

/// Longest any single `silo` process in these tests may take.
const PROCESS_LIMIT: Duration = Duration::from_secs(60);
/// How long a waiting process is watched to be sure it really waits.
const WAITS_AT_LEAST: Duration = Duration::from_millis(800);

fn wait_with_limit(child: std::process::Child) -> std::process::Output {
    let started = Instant::now();
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if started.elapsed() > PROCESS_LIMIT {
            silo_tests::signal(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("silo process {pid} ran longer than {PROCESS_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().unwrap()
}

#[tokio::test]
async fn concurrent_ups_of_one_name_make_one_sandbox() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let spawn = || {
        cli.command(&["up", "shared", "--image", BASE_IMAGE, "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (first, second) = (spawn(), spawn());
    let outputs = [wait_with_limit(first), wait_with_limit(second)];
    let mut actions = Vec::new();
    let mut ids = Vec::new();
    for out in &outputs {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let outcome = json(&String::from_utf8_lossy(&out.stdout));
        actions.push(outcome["action"].as_str().unwrap().to_owned());
        ids.push(outcome["sandbox"]["id"].as_str().unwrap().to_owned());
    }
    actions.sort();
    assert_eq!(actions, ["attached", "created"]);
    assert_eq!(ids[0], ids[1]);
    assert_eq!(containers_of(&engine, &ids[0]).await.len(), 1);
    let events = json(&cli.ok(&["events", "shared", "--json"]));
    let created = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "created")
        .count();
    assert_eq!(created, 1);
}

#[tokio::test]
async fn a_held_lease_makes_others_wait_and_names_its_holder() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "held", "--image", BASE_IMAGE]);
    let silo = cli.silo();
    let lease = silo.lease("held", "test").await.unwrap();

    let stop = cli
        .command(&["stop", "held"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = stop.id();
    std::thread::sleep(WAITS_AT_LEAST);
    assert!(
        silo_tests::process_alive(pid),
        "`silo stop` finished while another process held the lease"
    );
    drop(lease);
    let out = wait_with_limit(stop);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("waiting for silo process {}", std::process::id())),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped held"));
}

#[tokio::test]
async fn a_lease_left_by_a_killed_process_is_taken_over() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let silo = cli.silo();
    // A real `silo up` killed mid-create, once its container exists: it
    // holds the lease then (create and boot run under it).
    let mut doomed = cli
        .command(&["up", "orphaned", "--image", BASE_IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PROCESS_LIMIT;
    let id = loop {
        if let Ok(sandbox) = silo.get("orphaned") {
            if !containers_of(&engine, &sandbox.id).await.is_empty() {
                break sandbox.id;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the first `silo up` never made its container"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    doomed.kill().unwrap();
    doomed.wait().unwrap();

    let started = Instant::now();
    let out = cli.ok(&["up", "orphaned", "--image", BASE_IMAGE, "--json"]);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the dead owner's lease was waited on"
    );
    let outcome = json(&out);
    assert_eq!(outcome["sandbox"]["id"], id.as_str(), "the same sandbox");
    assert_eq!(
        cli.ok(&["exec", "orphaned", "--", "echo", "alive"]),
        "alive\n"
    );
    assert_eq!(containers_of(&engine, &id).await.len(), 1);
}
