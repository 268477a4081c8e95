//! A fleet on this machine: two hosts, `a` (its sandboxes on the Docker
//! engine) and `b` (on the Podman engine), two homes sharing one state on
//! the real PostgreSQL and one snapshot store on the real S3 server that
//! `scripts/fleet.sh up` starts (both required when `CI=true`; the script
//! prints `SILO_TEST_POSTGRES_URL`, `SILO_TEST_S3_URL` and the `AWS_*`
//! variables). Each test has a schema and a bucket prefix of its own.
//!
//! What is checked: a snapshot taken on `a` forks on `b` with `b`'s cache
//! empty, entry by entry the same tree; names are the fleet's; `b` is
//! refused `a`'s container by name of host; two hosts claiming from one
//! pool never get one member twice; gc on `b` while `a` snapshots onto
//! blobs the bucket already holds deletes nothing a recorded snapshot
//! needs; PostgreSQL restarted under `silo up` and `silo snapshot`, and the
//! S3 server stopped under a snapshot.
//!
//! The tests run one at a time: one of them restarts the server they all
//! use.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use silo::fleet::{HOST_ENV, STATE_URL_ENV, STORE_URL_ENV};
use silo::internals::ScratchSchema;
use silo_tests::docker::{BASE_IMAGE, in_ci};
use silo_tests::exact::listing::{self, Compare};
use silo_tests::{Cli, json};

/// One fleet test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Two hosts of one fleet, on a schema and a prefix of their own.
struct Fleet {
    a: Cli,
    b: Cli,
    /// `s3://bucket/prefix` of this test's blobs.
    store: String,
    // Dropped after both hosts' clean-up.
    _schema: ScratchSchema,
    _serial: MutexGuard<'static, ()>,
}

/// The fleet, or `None` (the reason printed) without the services; under
/// CI their absence fails the test.
fn fleet() -> Option<Fleet> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(postgres), Some(bucket)) = (var("SILO_TEST_POSTGRES_URL"), var("SILO_TEST_S3_URL"))
    else {
        assert!(
            !in_ci(),
            "CI=true but SILO_TEST_POSTGRES_URL or SILO_TEST_S3_URL is not set: \
             `scripts/fleet.sh up` starts PostgreSQL and the S3 server and prints them"
        );
        eprintln!("skipping: no fleet services (scripts/fleet.sh up); CI=true makes this fail");
        return None;
    };
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let schema = ScratchSchema::create(&postgres).expect("a schema for the fleet's state");
    let store = format!("{}/{}", bucket.trim_end_matches('/'), schema.name());
    let host = |name: &str| {
        Cli::new(crate::SILO).with_home_state().with_env([
            (STATE_URL_ENV, schema.url.clone()),
            (STORE_URL_ENV, store.clone()),
            (HOST_ENV, name.to_owned()),
        ])
    };
    Some(Fleet {
        a: host("a"),
        b: host("b"),
        store,
        _schema: schema,
        _serial: serial,
    })
}

/// [`fleet`] for a test that stops one of the services: not in the suite's
/// run on the shared services (`SILO_TEST_STATE_URL`), where every test
/// uses them; it runs in the suite's first pass.
fn fleet_alone() -> Option<Fleet> {
    if std::env::var(silo_tests::TEST_STATE_URL_ENV).is_ok_and(|v| !v.is_empty()) {
        return None;
    }
    fleet()
}

/// `silo ARGS`, started with its output piped, not waited for.
fn spawn(cli: &Cli, args: &[&str]) -> Child {
    cli.command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `scripts/fleet.sh COMMAND` (stopping or starting one of the services).
fn fleet_sh(command: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fleet.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(command)
        .output()
        .expect("running scripts/fleet.sh");
    assert!(
        out.status.success(),
        "fleet.sh {command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sandbox `name`'s row in `silo ls --json`.
fn row(cli: &Cli, name: &str) -> serde_json::Value {
    json(&cli.ok(&["ls", "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed"))
        .clone()
}

/// The snapshot id `silo snapshot NAME --json` took.
fn snapshot(cli: &Cli, name: &str) -> String {
    let taken = json(&cli.ok(&["snapshot", name, "--json"]));
    taken["snapshot"]["id"].as_str().unwrap().to_owned()
}

/// The tree of a sandbox's container, read from this host through its
/// init's `/proc/PID/root`.
async fn tree_of(engine: &bollard::Docker, cli: &Cli, name: &str) -> listing::Listing {
    let id = row(cli, name)["id"].as_str().unwrap().to_owned();
    let container = silo_tests::docker::container(engine, &id)
        .await
        .unwrap_or_else(|| panic!("no container for {name}"));
    let pid = container.state.and_then(|s| s.pid).unwrap();
    listing::of_pid(u32::try_from(pid).unwrap()).unwrap()
}

/// Deletes every snapshot `cli` lists.
fn remove_snapshots(cli: &Cli) {
    let ids = cli.listed(&["snapshots", "--json"], "id");
    if !ids.is_empty() {
        let mut args = vec!["snapshot", "rm"];
        args.extend(ids.iter().map(String::as_str));
        cli.ok(&args);
    }
}

/// Blobs in the store under a home.
fn cached(cli: &Cli) -> usize {
    std::fs::read_dir(cli.home.path().join("store/blobs/sha256"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_snapshot_taken_on_one_host_forks_on_another_exactly() {
    let Some(docker) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let Some(podman) = silo_tests::podman::engine().await else {
        return;
    };
    let Some(fleet) = fleet() else {
        return;
    };
    let (a, b) = (&fleet.a, &fleet.b);
    a.ok(&["up", "box", "--image", BASE_IMAGE]);
    crate::sh(
        a,
        "box",
        "mkdir -p /work/src/deep /work/empty && cd /work && \
         for i in $(seq 40); do echo line $i > src/f$i; done && \
         head -c 300000 /dev/urandom > src/blob && chmod 0600 src/f1 && \
         chmod 0755 src/f2 && ln -s f3 src/link && ln src/f4 src/hard && \
         echo deep > src/deep/leaf && rm /bin/vi",
    );
    let snap = snapshot(a, "box");
    let on_a = tree_of(&docker, a, "box").await;

    assert_eq!(cached(b), 0, "b starts with an empty cache");
    b.ok(&["fork", &snap, "--name", "leaf", "--backend", "podman"]);
    let on_b = tree_of(&podman, b, "leaf").await;
    let across = Compare {
        across_engines: true,
        ..Compare::default()
    };
    let differences = listing::diff(&on_a, &on_b, across);
    assert!(
        differences.is_empty(),
        "the fork on b differs from the snapshot on a:\n{}",
        differences.join("\n")
    );
    assert!(
        cached(b) > 0,
        "b fetched the snapshot's blobs into its cache"
    );
    assert_eq!(row(b, "leaf")["host"], "b");
    assert_eq!(row(b, "box")["host"], "a");

    // A name is the fleet's.
    let err = b.fails(&["up", "box", "--image", BASE_IMAGE, "--backend", "podman"]);
    assert!(err.contains("runs on host \"a\""), "{err}");
    let err = b.fails(&[
        "create",
        "--name",
        "box",
        "--image",
        BASE_IMAGE,
        "--backend",
        "podman",
    ]);
    assert!(err.contains("already exists"), "{err}");

    // a's container is a's: b is told where it is, and touches nothing.
    for args in [
        &["exec", "box", "--", "true"][..],
        &["stop", "box"][..],
        &["rm", "box"][..],
        &["snapshot", "box"][..],
    ] {
        let err = b.fails(args);
        assert!(err.contains("runs on host \"a\""), "silo {args:?}: {err}");
    }
    assert_eq!(crate::sh(a, "box", "cat /work/src/deep/leaf"), "deep\n");
    let listed = b.ok(&["ls"]);
    assert!(listed.contains("elsewhere"), "{listed}");
    let hosts = json(&b.ok(&["hosts", "--json"]));
    let names: Vec<&str> = hosts
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
}

// The mock serves on this test's runtime while the test waits on CLIs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hosts_claiming_from_one_pool_never_share_a_member() {
    let Some(_engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let mock = silo_mocks::MockE2b::start(silo_mocks::MockE2bConfig::default())
        .await
        .unwrap();
    let Some(fleet) = fleet() else {
        return;
    };
    let a = fleet.a.with_env(mock.env());
    let b = fleet.b.with_env(mock.env());
    a.ok(&[
        "pool",
        "create",
        "warm",
        "--size",
        "4",
        "--backend",
        "e2b",
        "--template",
        "base",
    ]);
    let claims: Vec<(String, Child)> = (0..6)
        .map(|i| {
            let (cli, host) = if i % 2 == 0 { (&a, "a") } else { (&b, "b") };
            let name = format!("job-{host}-{i}");
            let child = spawn(cli, &["up", &name, "--pool", "warm", "--json"]);
            (name, child)
        })
        .collect();
    let mut ids = Vec::new();
    let mut claimed = 0;
    for (name, child) in claims {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let up = json(&String::from_utf8_lossy(&out.stdout));
        if up["action"] == "claimed" {
            claimed += 1;
        }
        ids.push(up["sandbox"]["id"].as_str().unwrap().to_owned());
    }
    assert!(claimed >= 1, "nothing was claimed from the pool");
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "a member went to two claims: {ids:?}"
    );
    // Each VM behind them is its own too.
    let vms: Vec<String> = (0..6)
        .map(|i| {
            let host = if i % 2 == 0 { "a" } else { "b" };
            crate::e2b::vm_of(&a, &format!("job-{host}-{i}"))
        })
        .collect();
    let mut distinct = vms.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        vms.len(),
        "one VM behind two sandboxes: {vms:?}"
    );
    for i in 0..6 {
        let host = if i % 2 == 0 { "a" } else { "b" };
        let events = json(&a.ok(&["events", &format!("job-{host}-{i}"), "--json"]));
        let claims = events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "claimed")
            .count();
        assert!(claims <= 1, "job-{host}-{i} was claimed {claims} times");
    }
    a.ok(&["pool", "rm", "warm"]);
}

#[tokio::test]
async fn gc_on_one_host_keeps_what_a_snapshot_on_another_reuses() {
    let Some(_docker) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let Some(_podman) = silo_tests::podman::engine().await else {
        return;
    };
    let Some(fleet) = fleet() else {
        return;
    };
    let (a, b) = (&fleet.a, &fleet.b);
    a.ok(&["up", "box", "--image", BASE_IMAGE]);
    let mut kept = Vec::new();
    let mut collected = 0;
    for round in 0..6 {
        // The last snapshot gone, its base image's blobs are named by
        // nothing, yet still in the bucket: the next snapshot finds them
        // there and sends nothing, while gc on b judges them.
        remove_snapshots(a);
        crate::sh(a, "box", &format!("echo {round} > /root/round"));
        let snapshotting = spawn(a, &["snapshot", "box", "--json"]);
        let gc = b.ok(&["gc", "--older-than", "0s"]);
        if gc.contains("from the shared store") {
            collected += 1;
        }
        let out = snapshotting.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let taken = json(&String::from_utf8_lossy(&out.stdout));
        kept = vec![taken["snapshot"]["id"].as_str().unwrap().to_owned()];
    }
    assert!(
        collected > 0,
        "gc on b never removed anything from the bucket"
    );
    // What the last snapshot names is all there: b restores it from the
    // bucket alone, with its cache emptied.
    let _ = std::fs::remove_dir_all(b.home.path().join("store"));
    b.ok(&["fork", &kept[0], "--name", "check", "--backend", "podman"]);
    assert_eq!(crate::sh(b, "check", "cat /root/round"), "5\n");
}

#[tokio::test]
async fn postgres_restarted_under_up_and_snapshot_leaves_whole_records() {
    let Some(_docker) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let Some(fleet) = fleet_alone() else {
        return;
    };
    let a = &fleet.a;
    let restart_under = |args: &[&str]| {
        let child = spawn(a, args);
        std::thread::sleep(Duration::from_millis(100));
        fleet_sh("pg-stop");
        std::thread::sleep(Duration::from_millis(500));
        fleet_sh("pg-start");
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "silo {args:?} across a restart: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    restart_under(&["up", "box", "--image", BASE_IMAGE]);
    let listed = json(&a.ok(&["ls", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert!(
        listed[0]["backend_ref"]
            .as_object()
            .is_some_and(|r| !r.is_empty()),
        "the sandbox's machine is recorded: {listed}"
    );
    assert_eq!(crate::sh(a, "box", "echo up"), "up\n");

    crate::sh(a, "box", "echo kept > /root/kept");
    restart_under(&["snapshot", "box", "-m", "across"]);
    let snaps = json(&a.ok(&["snapshots", "--json"]));
    assert_eq!(snaps.as_array().unwrap().len(), 1, "{snaps}");
    crate::sh(a, "box", "rm /root/kept");
    let id = snaps[0]["id"].as_str().unwrap();
    a.ok(&["rewind", "box", id]);
    assert_eq!(crate::sh(a, "box", "cat /root/kept"), "kept\n");
}

#[tokio::test]
async fn a_snapshot_waits_for_the_store_and_fails_cleanly_without_it() {
    let Some(_docker) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let Some(fleet) = fleet_alone() else {
        return;
    };
    let a = fleet.a.with_env([("SILO_STORE_WAIT_SECS", "3".to_owned())]);
    a.ok(&["up", "box", "--image", BASE_IMAGE]);
    crate::sh(&a, "box", "echo one > /root/one");

    // Down longer than the wait: a clear error, and nothing recorded.
    fleet_sh("s3-stop");
    let start = Instant::now();
    let err = a.fails(&["snapshot", "box", "-m", "while down"]);
    fleet_sh("s3-start");
    assert!(err.contains("did not take the blobs"), "{err}");
    assert!(
        err.contains(&fleet.store),
        "the error names the store: {err}"
    );
    assert!(start.elapsed() < Duration::from_secs(60));
    let snaps = json(&a.ok(&["snapshots", "--json"]));
    assert_eq!(snaps, serde_json::json!([]), "nothing was marked durable");

    // Down for less than the wait: the snapshot completes once it is back.
    let patient = a.with_env([("SILO_STORE_WAIT_SECS", "60".to_owned())]);
    fleet_sh("s3-stop");
    let child = spawn(&patient, &["snapshot", "box", "-m", "back", "--json"]);
    std::thread::sleep(Duration::from_secs(2));
    fleet_sh("s3-start");
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snaps = json(&patient.ok(&["snapshots", "--json"]));
    assert_eq!(snaps.as_array().unwrap().len(), 1, "{snaps}");
    assert_eq!(snaps[0]["message"], "back");
}
