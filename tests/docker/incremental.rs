//! Incremental snapshots on the real engine, through the real CLI: each
//! snapshot after the first stores only what changed since the one before
//! (edits to files copied up earlier, deletions and moved directories
//! included), and rewinding to any of them gives back the tree the sandbox
//! had when it was taken. Each names its baseline by digest when the agent
//! kept that tree, and an agent restarted between two of them is sent the
//! paths instead.
//! A snapshot of a stopped sandbox starts it first.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use crate::sh;
use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, engine_with_base};
use silo_tests::json;

fn snapshot(cli: &Cli, name: &str) -> serde_json::Value {
    json(&cli.ok(&["snapshot", name, "--json"]))["snapshot"].clone()
}

fn layers(snapshot: &serde_json::Value) -> Vec<String> {
    let layers = snapshot["layers"].as_array().unwrap();
    layers
        .iter()
        .map(|l| l.as_str().unwrap().to_owned())
        .collect()
}

/// Every path under the sandbox's own directories, with each file's
/// content hash, and whether two files of the image are still there.
fn tree(cli: &Cli, name: &str) -> String {
    sh(
        cli,
        name,
        "for d in /work /moved /root; do [ -e $d ] && find $d; done | sort; \
         find /work /moved /root -type f 2>/dev/null | sort | xargs -r md5sum; \
         for f in /etc/group /bin/ls; do [ -e $f ] && echo has $f; done; true",
    )
}

#[tokio::test]
async fn each_snapshot_stores_what_changed_since_the_last_and_restores_its_own_tree() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "inc", "--image", BASE_IMAGE]);

    sh(
        &cli,
        "inc",
        "mkdir -p /work/sub && head -c 262144 /dev/urandom > /work/big && \
         echo a > /work/sub/a && rm /etc/group",
    );
    let first = snapshot(&cli, "inc");
    let first_tree = tree(&cli, "inc");
    assert!(first["layer_bytes"].as_u64().unwrap() > 262_144, "{first}");

    // An edit to a file copied up before the first snapshot moves no
    // directory's ctime; it must still be found.
    sh(
        &cli,
        "inc",
        "echo more >> /work/sub/a && rm /work/big && echo n > /root/n",
    );
    let second = snapshot(&cli, "inc");
    let second_tree = tree(&cli, "inc");
    assert_eq!(second["parent"], first["id"], "{second}");
    assert_eq!(layers(&second)[..layers(&first).len()], layers(&first)[..]);
    assert_eq!(layers(&second).len(), layers(&first).len() + 1);
    assert!(
        second["layer_bytes"].as_u64().unwrap() < 16 * 1024,
        "only what changed since the first: {second}"
    );

    // A path changed up to 20 ms before a snapshot's stamp counts as
    // changed in the next one too (the kernel's file clock is coarse), so
    // the last change is made longer ago than that for the unchanged
    // snapshot below to be unchanged whatever the machine's speed.
    sh(&cli, "inc", "mv /work /moved && rm /bin/ls && sleep 0.1");
    let third = snapshot(&cli, "inc");
    let third_tree = tree(&cli, "inc");
    assert_eq!(third["parent"], second["id"]);

    // Nothing changed: the same layers, no new one on the chain.
    let fourth = snapshot(&cli, "inc");
    assert_eq!(layers(&fourth), layers(&third));
    assert_eq!(fourth["parent"], third["id"]);

    // A snapshot returns once durable, and its process exits: no engine
    // image is made. A fork, which needs one, makes it from the store
    // (every layer above the base, none of which the engine had).
    let report = json(&cli.ok(&["snapshot", "inc", "--json"]));
    assert!(report.get("loaded_ms").is_none(), "{report}");
    assert_eq!(layers(&report["snapshot"]), layers(&third));
    let lazy = report["snapshot"]["id"].as_str().unwrap();
    let forked = json(&cli.ok(&["fork", lazy, "--name", "inc-lazy", "--json"]));
    assert!(
        forked["image"]["store"]["layers_sent"].as_u64().unwrap() >= 3,
        "{forked}"
    );
    assert_eq!(tree(&cli, "inc-lazy"), third_tree);
    cli.ok(&["rm", "inc-lazy"]);
    cli.ok(&["rewind", "inc", report["snapshot"]["id"].as_str().unwrap()]);
    assert_eq!(tree(&cli, "inc"), third_tree);

    for (snap, want) in [
        (&first, &first_tree),
        (&third, &third_tree),
        (&second, &second_tree),
    ] {
        cli.ok(&["rewind", "inc", snap["id"].as_str().unwrap()]);
        assert_eq!(&tree(&cli, "inc"), want, "rewound to {}", snap["id"]);
    }
    assert!(second_tree.contains("/root/n") && !second_tree.contains("/work/big"));
    assert!(third_tree.contains("/moved/sub/a") && !third_tree.contains("has /bin/ls"));

    // After a rewind, the chain goes on from the snapshot rewound to.
    sh(&cli, "inc", "echo after > /root/after");
    let fifth = snapshot(&cli, "inc");
    assert_eq!(fifth["parent"], second["id"]);
    sh(&cli, "inc", "rm /root/after");
    let sixth = snapshot(&cli, "inc");
    assert_eq!(sixth["parent"], fifth["id"]);
    cli.ok(&["rewind", "inc", sixth["id"].as_str().unwrap()]);
    assert_eq!(tree(&cli, "inc"), second_tree);

    // A fork of a snapshot deep in a chain has the same files.
    cli.ok(&["fork", third["id"].as_str().unwrap(), "--name", "inc-fork"]);
    assert_eq!(tree(&cli, "inc-fork"), third_tree);
}

#[tokio::test]
async fn a_long_chain_is_squashed_and_every_snapshot_still_restores_its_tree() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "long", "--image", BASE_IMAGE]);
    let base_layers = {
        let first = json(&cli.ok(&["snapshot", "long", "--json"]));
        layers(&first["snapshot"]).len() - 1
    };
    let mut kept = Vec::new();
    let mut compacted = None;
    for step in 2..=50 {
        // Files come and go, and one is rewritten each step.
        sh(
            &cli,
            "long",
            &format!(
                "mkdir -p /work && echo {step} > /work/step-{step} && echo {step} > /work/latest \
                 && rm -f /work/step-{}",
                step - 2
            ),
        );
        let report = json(&cli.ok(&["snapshot", "long", "--json"]));
        let snapshot = report["snapshot"].clone();
        if !report["compacted"].is_null() {
            assert!(compacted.is_none(), "one squash in 50 steps: {report}");
            assert_eq!(report["compacted"]["layers"], 48, "{report}");
            assert_eq!(layers(&snapshot).len(), base_layers + 1, "{report}");
            compacted = Some(step);
        } else if let Some(at) = compacted {
            assert_eq!(layers(&snapshot).len(), base_layers + 1 + step - at);
        }
        if [3, 47, 48, 49, 50].contains(&step) {
            kept.push((snapshot, tree(&cli, "long")));
        }
    }
    assert_eq!(
        compacted,
        Some(48),
        "the 48th layer above the base squashes"
    );
    for (snapshot, want) in kept.iter().rev() {
        cli.ok(&["rewind", "long", snapshot["id"].as_str().unwrap()]);
        assert_eq!(&tree(&cli, "long"), want, "rewound to {}", snapshot["id"]);
    }
}

/// One process checkpointing again and again (as a harness on the library
/// does) measures each step against the tree it remembers from the last:
/// each snapshot holds its own step only, a deletion is recorded once, and
/// rewinding in place to any of them gives back its files.
#[tokio::test]
async fn checkpoints_in_one_process_each_hold_their_own_step_only() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let silo = silo::Silo::open(Some(home.path().join("home"))).unwrap();
    let name = "remembers";
    silo.create(silo::CreateRequest {
        name: Some(name.to_owned()),
        spec: silo::SandboxSpec {
            image: Some(BASE_IMAGE.to_owned()),
            ..silo::SandboxSpec::new(silo::BackendKind::Docker)
        },
    })
    .await
    .unwrap();
    let snapshots = silo.snapshots_of(name).unwrap();
    let run = |script: &'static str| {
        let silo = silo.clone();
        async move {
            let client = silo.client(&silo.get(name).unwrap()).unwrap();
            let out = client.run(silo_tests::sh(script)).await.unwrap();
            assert_eq!(out.exit.code, Some(0), "{script}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    run("mkdir /project && echo a > /project/a && echo keep > /project/keep").await;
    let first = snapshots.take(None).await.unwrap();
    run("rm /project/a && echo b > /project/b").await;
    let second = snapshots.take(None).await.unwrap();
    assert_eq!(
        second.deletions, 1,
        "the deletion of /project/a: {second:?}"
    );
    run("echo c > /project/c").await;
    let third = snapshots.take(None).await.unwrap();
    assert_eq!(
        third.deletions, 0,
        "/project/a was deleted before the last snapshot: {third:?}"
    );
    run("echo d > /project/d && rm /project/b").await;
    let fourth = snapshots.take(None).await.unwrap();
    assert_eq!(
        fourth.deletions, 1,
        "the deletion of /project/b: {fourth:?}"
    );

    for (snapshot, listing) in [
        (&third, "b c keep"),
        (&first, "a keep"),
        (&fourth, "c d keep"),
        (&second, "b keep"),
    ] {
        snapshots.rewind(&snapshot.snapshot.id).await.unwrap();
        let found = run("ls /project | tr '\\n' ' '").await;
        assert_eq!(found.trim_end(), listing, "after a rewind to {snapshot:?}");
    }
    silo.remove(name).await.unwrap();
}

#[tokio::test]
async fn checkpoints_name_their_baseline_by_digest_and_a_restarted_agent_gets_the_paths() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "named", "--image", BASE_IMAGE]);
    let mut taken = Vec::new();
    for step in 0..5 {
        if step == 3 {
            // A new agent: the container stops and starts again, its files
            // and the controller's checkpoint kept.
            cli.ok(&["stop", "named"]);
            cli.ok(&["up", "named"]);
        }
        // Each step removes what the one before made (and, once, a file of
        // the image): a checkpoint measured against the wrong tree would
        // miss the deletion, and the file would come back with it.
        sh(
            &cli,
            "named",
            &format!(
                "mkdir -p /work && echo {step} > /work/step && rm -f /work/made* && \
                 echo {step} > /work/made{step} && rm -f /etc/group"
            ),
        );
        let report = json(&cli.ok(&["snapshot", "named", "--json"]));
        let id = report["snapshot"]["id"].as_str().unwrap().to_owned();
        taken.push((id, report["baseline_sent"].as_str().unwrap().to_owned()));
    }
    let sent: Vec<&str> = taken.iter().map(|(_, sent)| sent.as_str()).collect();
    assert_eq!(
        sent,
        [
            // No tree kept yet, then each checkpoint's, then none again
            // after the restart.
            "digest_then_paths",
            "digest",
            "digest",
            "digest_then_paths",
            "digest",
        ]
    );
    for (step, (id, _)) in taken.iter().enumerate().rev() {
        json(&cli.ok(&["rewind", "named", id, "--json"]));
        assert_eq!(
            sh(
                &cli,
                "named",
                "ls /work; cat /work/step; [ -e /etc/group ] && echo has /etc/group; true"
            ),
            format!("made{step}\nstep\n{step}\n"),
            "checkpoint {step} comes back as it was taken"
        );
    }
}

/// A new process's snapshot of a running sandbox asks its agent rather than
/// the backend, and keeps the engine's API version in the home; a stopped
/// sandbox's agent does not answer, so the snapshot asks the backend,
/// starts it and captures what it had. A remembered version of another
/// engine socket is not used.
#[tokio::test]
async fn a_snapshot_starts_a_stopped_sandbox_and_remembers_the_engine() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "stopped", "--image", BASE_IMAGE]);
    sh(&cli, "stopped", "echo kept > /root/kept");
    snapshot(&cli, "stopped");
    let remembered = cli.home.path().join("engine-api-docker");
    let text = std::fs::read_to_string(&remembered).unwrap();
    assert!(
        text.lines().nth(1).is_some_and(|v| v.contains('.')),
        "{text}"
    );

    // A stale entry (another socket) is replaced, not trusted.
    std::fs::write(&remembered, "/nowhere 0 0 0.0\n9.99\n").unwrap();
    cli.ok(&["stop", "stopped"]);
    let taken = snapshot(&cli, "stopped");
    assert_eq!(sh(&cli, "stopped", "cat /root/kept"), "kept\n", "{taken}");
    let text = std::fs::read_to_string(&remembered).unwrap();
    assert!(!text.contains("9.99"), "{text}");
}
