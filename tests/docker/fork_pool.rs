//! Forks onto warm pool members on the real engine, through the real CLI:
//! a fork from the pool is a started member of a pool of the snapshot's
//! spec rewound in place to the snapshot, with its own id and key, the
//! snapshot's files entry by entry and nothing else of what ran on the
//! machine before; `--count 3` makes three independent branches at once;
//! with no pool, an empty one or one of another spec, the fork makes a new
//! machine and says why.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecOptions};
use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, container_id, engine_with_base};
use silo_tests::json;

use crate::rewind::{differences, entries, snapshot};
use crate::sh;

/// A `sleep` nothing else in these sandboxes runs.
const LEFT_RUNNING: &str = "sleep 7432";

/// The members waiting in a pool, by id.
fn members(cli: &Cli, pool: &str) -> Vec<String> {
    let pools = json(&cli.ok(&["pool", "ls", "--json"]));
    let found = pools.as_array().unwrap().iter().find(|p| p["name"] == pool);
    found.map_or_else(Vec::new, |p| {
        p["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_str().unwrap().to_owned())
            .collect()
    })
}

/// Runs `script` in a container behind silo's back, as a process of the
/// engine's own, left running.
async fn behind_silo(engine: &bollard::Docker, container: &str, script: &str) {
    let options = CreateExecOptions {
        cmd: Some(vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()]),
        ..Default::default()
    };
    let created = engine.create_exec(container, options).await.unwrap();
    engine
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
}

/// Whether the sandbox runs [`LEFT_RUNNING`].
fn runs_left_over(cli: &Cli, name: &str) -> bool {
    let count = sh(
        cli,
        name,
        &format!("ps -o args | grep -c '^{LEFT_RUNNING}' ; true"),
    );
    count.trim() != "0"
}

#[tokio::test]
async fn forks_take_warm_sandboxes_and_say_when_they_cannot() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "src", "--image", BASE_IMAGE]);
    sh(
        &cli,
        "src",
        "mkdir -p /work/sub && echo one > /work/file && echo a > /work/sub/a && \
         ln -s file /work/ln && chmod 700 /work/sub && rm /etc/group",
    );
    let snap = snapshot(&cli, "src");
    let want = entries(&cli, "src");

    // No pool: a new machine, and why.
    let lone = json(&cli.ok(&["fork", &snap, "--name", "lone", "--json"]));
    assert!(lone["pool"].is_null(), "{lone}");
    let why = lone["new_machine_because"].as_str().unwrap();
    assert!(why.contains("no pool"), "{lone}");
    assert!(differences(&want, &entries(&cli, "lone")).is_empty());

    // A pool of the snapshot's spec, one member with leftovers planted
    // behind silo's back: a file and a running process.
    cli.ok(&[
        "pool", "create", "warm", "--size", "3", "--image", BASE_IMAGE,
    ]);
    let waiting = members(&cli, "warm");
    assert_eq!(waiting.len(), 3);
    for id in &waiting {
        let container = container_id(&engine, id).await;
        behind_silo(
            &engine,
            &container,
            &format!("echo leftover > /root/leftover; {LEFT_RUNNING}"),
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let container = container_id(&engine, &waiting[0]).await;
    while !{
        let top = engine
            .top_processes(&container, None::<bollard::query_parameters::TopOptions>)
            .await;
        top.ok().and_then(|top| top.processes).is_some_and(|rows| {
            rows.iter()
                .flatten()
                .any(|cell| cell.contains(LEFT_RUNNING))
        })
    } {
        assert!(Instant::now() < deadline, "the planted process never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let one = json(&cli.ok(&["fork", &snap, "--name", "one", "--json"]));
    assert_eq!(one["pool"], "warm", "{one}");
    assert!(one["image"]["in_place"].is_object(), "{one}");
    assert!(one["new_machine_because"].is_null(), "{one}");
    let one_id = one["sandbox"]["id"].as_str().unwrap();
    assert!(waiting.iter().any(|id| id == one_id), "{one}");
    assert_eq!(one["sandbox"]["origin_snapshot"], snap.as_str(), "{one}");
    let differ = differences(&want, &entries(&cli, "one"));
    assert!(differ.is_empty(), "not the snapshot's tree: {differ:#?}");
    assert!(!runs_left_over(&cli, "one"), "a process of before is gone");
    let silo = cli.silo();
    let key = |name: &str| silo.sandbox_key(&silo.get(name).unwrap());
    assert!(key("one") != key("src") && key("one") != key("lone"));
    // It is a sandbox like another: snapshots and rewinds build on the fork.
    sh(&cli, "one", "echo two > /work/two");
    let on_one = snapshot(&cli, "one");
    sh(&cli, "one", "rm /work/two");
    let back = json(&cli.ok(&["rewind", "one", &on_one, "--json"]));
    assert!(back["image"]["in_place"].is_object(), "{back}");
    assert_eq!(sh(&cli, "one", "cat /work/two"), "two\n");

    // Three branches at once, each its own sandbox.
    let many = json(&cli.ok(&["fork", &snap, "--name", "br", "--count", "3", "--json"]));
    let many = many.as_array().unwrap();
    assert_eq!(many.len(), 3, "{many:?}");
    let names: Vec<&str> = many
        .iter()
        .map(|report| report["sandbox"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["br-1", "br-2", "br-3"]);
    assert!(
        many.iter().any(|report| report["pool"] == "warm"),
        "{many:?}"
    );
    let keys: Vec<_> = names.iter().map(|name| key(name)).collect();
    for (i, a) in keys.iter().enumerate() {
        assert!(
            keys[i + 1..].iter().all(|b| a != b) && *a != key("src") && *a != key("one"),
            "each branch has its own key"
        );
    }
    for name in &names {
        let differ = differences(&want, &entries(&cli, name));
        assert!(differ.is_empty(), "{name}: {differ:#?}");
        assert!(!runs_left_over(&cli, name), "{name}");
        sh(&cli, name, &format!("echo {name} > /work/mine"));
    }
    for name in &names {
        assert_eq!(sh(&cli, name, "cat /work/mine"), format!("{name}\n"));
    }

    // Bad counts are refused before anything is made.
    let target = silo::ForkTarget::default();
    for count in [0, silo::MAX_FORKS + 1] {
        let refused = silo.fork_many(&snap, "none", count, &target).await;
        let error = refused.err().unwrap().to_string();
        assert!(error.contains("1 to 64"), "{error}");
    }
    let err = cli.fails(&["fork", &snap, "--name", "none", "--count", "65"]);
    assert!(err.contains("--count"), "{err}");
    assert!(silo.get("none-1").is_err());

    // A pool of another spec, or an empty one, is not taken from.
    cli.ok(&["pool", "rm", "warm"]);
    let other = silo::SandboxSpec {
        image: Some(BASE_IMAGE.into()),
        env: [("OTHER".to_owned(), "1".to_owned())].into(),
        ..silo::SandboxSpec::new(silo::BackendKind::Docker)
    };
    silo.create_pool("other", other, 1).unwrap();
    silo.fill_pool("other").await.unwrap();
    let same = silo.snapshot_info(&snap).unwrap().spec;
    silo.create_pool("idle", same, 1).unwrap();
    let refused = json(&cli.ok(&["fork", &snap, "--name", "late", "--json"]));
    assert!(refused["pool"].is_null(), "{refused}");
    let why = refused["new_machine_because"].as_str().unwrap();
    assert!(
        why.contains("no pool of the snapshot's spec has a sandbox ready"),
        "{why}"
    );
    assert_eq!(
        members(&cli, "other").len(),
        1,
        "the other pool is left alone"
    );
    assert!(differences(&want, &entries(&cli, "late")).is_empty());

    drop(silo);
    cli.ok(&["pool", "rm", "other"]);
    cli.ok(&["pool", "rm", "idle"]);
    cli.ok(&["rm", "src", "lone", "one", "br-1", "br-2", "br-3", "late"]);
}

#[tokio::test]
async fn a_snapshot_too_heavy_for_a_fresh_member_goes_onto_a_new_machine_and_says_why() {
    if engine_with_base().await.is_none() {
        return;
    }
    let cli = crate::cli();
    cli.ok(&["up", "heavy", "--image", BASE_IMAGE]);
    // About 12 MB above the base: a claim would apply all of it.
    sh(
        &cli,
        "heavy",
        "mkdir /w && i=0; while [ $i -lt 12 ]; do head -c 1000000 /dev/urandom > /w/f$i; i=$((i+1)); done",
    );
    let snap = snapshot(&cli, "heavy");
    cli.ok(&[
        "pool", "create", "plain", "--size", "1", "--image", BASE_IMAGE,
    ]);
    cli.ok(&["pool", "fill", "plain"]);
    let fork = json(&cli.ok(&["fork", &snap, "--name", "heavy-fork", "--json"]));
    assert!(fork["pool"].is_null(), "{fork}");
    let why = fork["new_machine_because"].as_str().unwrap();
    assert!(
        why.contains("pool plain") && why.contains("a new machine is expected sooner"),
        "{why}"
    );
    assert_eq!(
        members(&cli, "plain").len(),
        1,
        "the member stays in its pool"
    );
    let sum = "cat /w/f* | md5sum";
    assert_eq!(
        cli.ok(&["exec", "heavy-fork", "--", "sh", "-c", sum]),
        cli.ok(&["exec", "heavy", "--", "sh", "-c", sum])
    );
    cli.ok(&["pool", "rm", "plain"]);
    cli.ok(&["rm", "heavy", "heavy-fork"]);
}

#[tokio::test]
async fn a_pool_on_a_snapshot_hands_out_forks_that_stand_on_it_and_checks_them() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "root", "--image", BASE_IMAGE]);
    sh(
        &cli,
        "root",
        "mkdir -p /work/repo && for i in $(seq 200); do echo $i > /work/repo/f$i; done && \
         rm /etc/group",
    );
    let snap = snapshot(&cli, "root");
    let want = entries(&cli, "root");
    sh(&cli, "root", "echo later > /work/later");
    let later = snapshot(&cli, "root");

    let err = cli.fails(&[
        "pool",
        "create",
        "mixed",
        "--size",
        "1",
        "--snapshot",
        &snap,
        "--image",
        BASE_IMAGE,
    ]);
    assert!(err.contains("spec flags"), "{err}");
    cli.ok(&["pool", "create", "on", "--size", "3", "--snapshot", &snap]);
    let pools = json(&cli.ok(&["pool", "ls", "--json"]));
    assert_eq!(pools[0]["snapshot"], snap.as_str(), "{pools}");
    let waiting = members(&cli, "on");
    assert_eq!(waiting.len(), 3);
    // One member changed while it waited, behind silo's back.
    let container = container_id(&engine, &waiting[0]).await;
    behind_silo(
        &engine,
        &container,
        "rm /work/repo/f7; echo stray > /work/stray",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A fork of another snapshot never takes one.
    let other = json(&cli.ok(&["fork", &later, "--name", "other", "--json"]));
    assert!(other["pool"].is_null(), "{other}");

    // Forks of the snapshot claim members, each the snapshot's tree exactly
    // (the changed one restored), each its own sandbox.
    let many = json(&cli.ok(&["fork", &snap, "--name", "leaf", "--count", "3", "--json"]));
    let many = many.as_array().unwrap();
    for report in many {
        assert_eq!(report["pool"], "on", "{report}");
        assert!(report["new_machine_because"].is_null(), "{report}");
        assert_eq!(
            report["sandbox"]["origin_snapshot"],
            snap.as_str(),
            "{report}"
        );
        let name = report["sandbox"]["name"].as_str().unwrap();
        let differ = differences(&want, &entries(&cli, name));
        assert!(
            differ.is_empty(),
            "{name} is not the snapshot's tree: {differ:#?}"
        );
    }
    // The untouched members changed nothing since their fill: the fill's
    // rewind settled, so no path it placed counts as changed by its time.
    let untouched = many
        .iter()
        .filter(|r| r["image"]["in_place"]["changed"] == 0)
        .count();
    assert_eq!(untouched, 2, "{many:#?}");
    // Every member was claimed (the refill the forks started behind them
    // may have made new ones by now).
    let left = members(&cli, "on");
    assert!(waiting.iter().all(|m| !left.contains(m)), "{left:?}");
    // No pool on the snapshot any more: a new machine, and why. (The
    // refill under way is waited for by the removal.)
    cli.ok(&["pool", "rm", "on"]);
    let fourth = json(&cli.ok(&["fork", &snap, "--name", "leaf-4", "--json"]));
    assert!(fourth["pool"].is_null(), "{fourth}");
    assert!(fourth["new_machine_because"].is_string(), "{fourth}");
}
