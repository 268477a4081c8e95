//! Rewind in place on the real engine, through the real CLI: the agent
//! brings its own file system back to any snapshot of a chain, and the
//! tree it gives equals, entry by entry, the tree a new machine made from
//! the same snapshot has; no process started before the rewind is left;
//! and an agent killed half way through placing the restoring layer leaves
//! a sandbox that `silo up` brings back to the snapshot's tree whole.
//! Along the way, each snapshot and rewind names its baseline by digest:
//! the tree the agent kept after its last snapshot or rewind is the tree
//! the controller measures against, and an agent that restarted is sent
//! the paths instead.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use silo_tests::Cli;
use silo_tests::docker::{
    BASE_IMAGE, container, container_id, container_log, engine_with_base, wait_stopped,
};
use silo_tests::json;

use crate::sh;

/// What `find` may not list: the kernel's file systems, silo's own
/// directory and the engine's bind-mounted files.
const NOT_THE_SANDBOX_S: &str = "\\( -path /proc -o -path /sys -o -path /dev -o -path /.silo \
     -o -path /etc/hosts -o -path /etc/hostname -o -path /etc/resolv.conf \
     -o -path /.dockerenv \\) -prune -o";

/// Every entry of the sandbox's file system: path → kind, mode, owner,
/// group, size, and a file's content hash or a link's target.
pub(crate) fn entries(cli: &Cli, name: &str) -> BTreeMap<String, String> {
    let find = |test: &str, action: &str| {
        sh(
            cli,
            name,
            &format!("find / {NOT_THE_SANDBOX_S} {test} -exec {action} {{}} +"),
        )
    };
    let mut out = BTreeMap::new();
    for line in find("", "stat -c '%n|%F|%a|%u|%g|%s'").lines() {
        let (path, what) = line.split_once('|').unwrap();
        // A directory's size is the file system's business.
        let what = match what.strip_prefix("directory|") {
            Some(rest) => format!("directory|{}", rest.rsplit_once('|').unwrap().0),
            None => what.to_owned(),
        };
        out.insert(path.to_owned(), what);
    }
    for line in find("-type f", "sha256sum").lines() {
        let (hash, path) = line.split_once("  ").unwrap();
        out.get_mut(path).unwrap().push_str(&format!("|{hash}"));
    }
    let links = sh(
        cli,
        name,
        &format!(
            "find / {NOT_THE_SANDBOX_S} -type l -exec sh -c \
             'for p; do echo \"$p|$(readlink \"$p\")\"; done' sh {{}} +"
        ),
    );
    for line in links.lines() {
        let (path, target) = line.split_once('|').unwrap();
        out.get_mut(path).unwrap().push_str(&format!("|{target}"));
    }
    out
}

/// Differences between two listings, for a readable failure.
pub(crate) fn differences(
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (path, what) in a {
        match b.get(path) {
            Some(other) if other == what => {}
            Some(other) => out.push(format!("{path}: {what} / {other}")),
            None => out.push(format!("{path}: only in the first ({what})")),
        }
    }
    for (path, what) in b {
        if !a.contains_key(path) {
            out.push(format!("{path}: only in the second ({what})"));
        }
    }
    out
}

pub(crate) fn snapshot(cli: &Cli, name: &str) -> String {
    snapshot_sent(cli, name).0
}

/// Takes a snapshot; its id, and how its baseline reached the agent.
pub(crate) fn snapshot_sent(cli: &Cli, name: &str) -> (String, String) {
    let report = json(&cli.ok(&["snapshot", name, "--json"]));
    let id = report["snapshot"]["id"].as_str().unwrap().to_owned();
    let sent = report["baseline_sent"].as_str().unwrap().to_owned();
    (id, sent)
}

pub(crate) fn rewind(cli: &Cli, name: &str, snapshot: &str) -> serde_json::Value {
    json(&cli.ok(&["rewind", name, snapshot, "--json"]))
}

#[tokio::test]
async fn every_snapshot_of_a_chain_comes_back_in_place_as_a_new_machine_would_have_it() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let up = json(&cli.ok(&["up", "inplace", "--image", BASE_IMAGE, "--json"]));
    let id = up["sandbox"]["id"].as_str().unwrap().to_owned();

    // A chain of three snapshots: files made, changed and deleted (the
    // base's too), a directory replaced by another, a symlink swapped for
    // a file and back, a mode and an owner changed.
    sh(
        &cli,
        "inplace",
        "mkdir -p /work/sub /work/keep && echo one > /work/file && echo a > /work/sub/a && \
         echo k > /work/keep/k && ln -s file /work/ln && rm /etc/group /bin/ls",
    );
    let first = snapshot(&cli, "inplace");
    sh(
        &cli,
        "inplace",
        "echo two > /work/file && rm -r /work/sub && mkdir /work/sub && echo b > /work/sub/b && \
         rm /work/ln && echo 'no longer a link' > /work/ln && chmod 700 /work/keep && \
         chown 12:34 /work/keep/k && rm /bin/cat",
    );
    let (second, sent) = snapshot_sent(&cli, "inplace");
    // The agent kept the first snapshot's tree, and it is the controller's.
    assert_eq!(sent, "digest");
    sh(
        &cli,
        "inplace",
        "rm -r /work/keep && ln -s /tmp /work/sub2 && chmod 4755 /work/file && \
         mkdir -p /root/deep/er && echo d > /root/deep/er/d",
    );
    let (third, sent) = snapshot_sent(&cli, "inplace");
    assert_eq!(sent, "digest");
    let container_before = container_id(&engine, &id).await;

    // Back and forth along the chain, with a step made before each rewind
    // and a process left running.
    let mut in_place = BTreeMap::new();
    for (step, target) in [&first, &third, &second, &first, &second]
        .iter()
        .enumerate()
    {
        sh(
            &cli,
            "inplace",
            &format!(
                "echo {step} > /work/step; rm -rf /work/sub; mkdir -p /usr/new/{step}; \
                 chmod 600 /etc/passwd; (sleep 1000 > /dev/null 2>&1 &); true"
            ),
        );
        let report = rewind(&cli, "inplace", target);
        assert!(report["image"]["in_place"].is_object(), "{report}");
        assert!(report["new_machine_because"].is_null(), "{report}");
        // The tree the agent kept after the last snapshot or rewind is the
        // controller's anchor, every time.
        assert_eq!(
            report["image"]["in_place"]["baseline_sent"], "digest",
            "{report}"
        );
        let left = sh(&cli, "inplace", "ps -o comm | grep -c '^sleep' ; true");
        assert_eq!(
            left.trim(),
            "0",
            "a process started before the rewind is gone"
        );
        in_place.insert((*target).clone(), entries(&cli, "inplace"));
    }
    assert_eq!(
        container_id(&engine, &id).await,
        container_before,
        "rewound on the same machine"
    );
    // A checkpoint after a rewind builds on the rewind's tree, by digest,
    // and comes back as it was taken.
    sh(&cli, "inplace", "echo after > /work/after && rm /work/file");
    let (after, sent) = snapshot_sent(&cli, "inplace");
    assert_eq!(sent, "digest");
    let taken = entries(&cli, "inplace");
    rewind(&cli, "inplace", &first);
    rewind(&cli, "inplace", &after);
    let differ = differences(&taken, &entries(&cli, "inplace"));
    assert!(differ.is_empty(), "not the checkpoint's tree: {differ:#?}");

    // The same snapshots on new machines: a stopped sandbox is rewound by
    // making its machine again.
    for target in [&first, &second, &third] {
        cli.ok(&["stop", "inplace"]);
        let report = rewind(&cli, "inplace", target);
        assert!(report["new_machine_because"].is_string(), "{report}");
        let made = entries(&cli, "inplace");
        if let Some(rewound) = in_place.get(target) {
            let differ = differences(rewound, &made);
            assert!(
                differ.is_empty(),
                "in place and new machine differ: {differ:#?}"
            );
        }
    }
    // Every snapshot of the chain was reached in place.
    assert_eq!(in_place.len(), 3);
    // And each fall back to a new machine is in the event log, with why.
    let fell_back = rewound_events(&cli, "inplace")
        .into_iter()
        .filter(|event| event["detail"]["new_machine_because"].is_string())
        .count();
    assert_eq!(fell_back, 3);
    assert!(in_place[&second]["/work/ln"].starts_with("regular file"));
    assert!(in_place[&first]["/work/ln"].starts_with("symbolic link"));
    assert!(in_place[&second]["/work/keep"].starts_with("directory|700"));
    assert!(!in_place[&first].contains_key("/bin/ls"));
}

#[tokio::test]
async fn an_agent_killed_half_way_through_a_rewind_leaves_a_sandbox_up_makes_whole() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let up = json(&cli.ok(&["up", "cut", "--image", BASE_IMAGE, "--json"]));
    let id = up["sandbox"]["id"].as_str().unwrap().to_owned();
    const FILES: usize = 3000;
    sh(
        &cli,
        "cut",
        &format!(
            "mkdir /data && cd /data && i=0; while [ $i -lt {FILES} ]; do \
             echo $i > f$(printf %05d $i); i=$((i+1)); done"
        ),
    );
    let full = snapshot(&cli, "cut");
    let want = entries(&cli, "cut");
    sh(&cli, "cut", "rm -r /data && echo gone > /etc/motd");

    // The rewind's layer puts 3,000 files back; the agent is stopped once
    // its journal is written and a few of them are in place, and killed.
    let mut rewinding = cli.command(&["rewind", "cut", &full]).spawn().unwrap();
    let pid = container(&engine, &id)
        .await
        .and_then(|c| c.state)
        .and_then(|s| s.pid)
        .unwrap();
    let root = Path::new("/proc").join(pid.to_string()).join("root");
    let journaled = || {
        std::fs::read_dir(root.join(".silo/layers"))
            .map(|dir| dir.flatten().any(|e| e.path().join("journal").exists()))
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(journaled() && root.join("data/f00100").exists()) {
        assert!(Instant::now() < deadline, "the rewind never began placing");
        std::thread::yield_now();
    }
    silo_tests::signal(u32::try_from(pid).unwrap(), Signal::SIGSTOP);
    let placed = std::fs::read_dir(root.join("data")).unwrap().count();
    assert!(
        (1..FILES).contains(&placed),
        "the agent was stopped half way ({placed} of {FILES} files placed)"
    );
    rewinding.kill().unwrap();
    rewinding.wait().unwrap();
    silo_tests::signal(u32::try_from(pid).unwrap(), Signal::SIGKILL);
    wait_stopped(&engine, &id, Duration::from_secs(30)).await;

    // Its next boot finishes the layer before serving anything, and `up`
    // records the rewind the killed client never did.
    let up = cli.ok(&["up", "cut"]);
    assert!(
        up.contains(&format!("its files are snapshot {full}'s")),
        "{up}"
    );
    let differ = differences(&want, &entries(&cli, "cut"));
    assert!(differ.is_empty(), "not the snapshot's tree: {differ:#?}");
    let log = container_log(&engine, &id).await;
    assert!(
        log.contains("finished placing a layer an earlier agent had begun"),
        "{log}"
    );
    // And it rewinds in place again from there; the new agent keeps no
    // tree, so the controller sends the anchor's paths after its digest.
    sh(&cli, "cut", "rm /data/f00007");
    let report = rewind(&cli, "cut", &full);
    assert!(report["image"]["in_place"].is_object(), "{report}");
    assert_eq!(
        report["image"]["in_place"]["baseline_sent"], "digest_then_paths",
        "{report}"
    );
    assert_eq!(sh(&cli, "cut", "cat /data/f00007"), "7\n");
}

/// `silo rewind` as a process that dies at the fault point `point`.
fn rewind_dying_at(cli: &Cli, name: &str, snapshot: &str, point: &str) {
    let out = cli
        .command(&["rewind", name, snapshot])
        .env("SILO_TEST_DIE_AT", point)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(86), "{out:?}");
}

/// The `rewound` events of sandbox `name`.
fn rewound_events(cli: &Cli, name: &str) -> Vec<serde_json::Value> {
    let events = json(&cli.ok(&["events", name, "--json"]));
    events
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["kind"] == "rewound")
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_rewind_whose_client_died_after_its_layer_went_in_is_recorded_by_the_next_process() {
    if engine_with_base().await.is_none() {
        return;
    }
    let cli = crate::cli();
    cli.ok(&["up", "late", "--image", BASE_IMAGE]);
    sh(&cli, "late", "mkdir /w && echo one > /w/f");
    let first = snapshot(&cli, "late");
    let want = entries(&cli, "late");
    sh(&cli, "late", "echo two > /w/f && echo more > /w/g");

    // The client dies once the agent has placed the layer: the tree is
    // the snapshot's, and nothing of it is recorded.
    rewind_dying_at(&cli, "late", &first, "rewind-placed");
    assert!(differences(&want, &entries(&cli, "late")).is_empty());
    assert!(rewound_events(&cli, "late").is_empty());

    // The next process to open it records the rewind, at the moment the
    // agent placed the layer: the next snapshot builds on that snapshot
    // and holds only what changed since.
    let up = cli.ok(&["up", "late"]);
    assert!(
        up.contains(&format!("its files are snapshot {first}'s")),
        "{up}"
    );
    let events = rewound_events(&cli, "late");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["detail"]["snapshot"], first.as_str());
    assert!(events[0]["detail"]["recorded_later"].is_string());
    sh(&cli, "late", "echo three > /w/h");
    let next = json(&cli.ok(&["snapshot", "late", "--json"]));
    assert_eq!(next["snapshot"]["parent"], first.as_str(), "{next}");
    cli.ok(&["rm", "late"]);
}

#[tokio::test]
async fn a_rewind_whose_client_died_before_its_layer_went_out_changes_nothing_and_says_so() {
    if engine_with_base().await.is_none() {
        return;
    }
    let cli = crate::cli();
    cli.ok(&["up", "early", "--image", BASE_IMAGE]);
    sh(&cli, "early", "mkdir /w && echo one > /w/f");
    let first = snapshot(&cli, "early");
    sh(&cli, "early", "echo two > /w/f");

    rewind_dying_at(&cli, "early", &first, "rewind-sending");
    // The next process finds the rewind under way and the agent without
    // its layer: nothing is recorded, and `up` says the files are as they
    // were. (The agent lets the sandbox go when its hold expires.)
    let up = cli.ok(&["up", "early"]);
    assert!(up.contains("the files are as they were"), "{up}");
    assert!(rewound_events(&cli, "early").is_empty());
    cli.ok(&["rm", "early"]);
}

#[tokio::test]
async fn a_big_file_changed_in_the_middle_goes_back_by_the_blocks_that_changed() {
    if engine_with_base().await.is_none() {
        return;
    }
    let cli = crate::cli();
    cli.ok(&["up", "blocks", "--image", BASE_IMAGE]);
    // 3 MiB of random bytes, and a 2 MiB sparse file with 4 bytes of data
    // in the middle (holes at both ends).
    sh(
        &cli,
        "blocks",
        "mkdir /w && head -c 3145728 /dev/urandom > /w/big && truncate -s 2097152 /w/sparse && \
         printf data | dd of=/w/sparse bs=1 seek=1048576 conv=notrunc 2>/dev/null",
    );
    let snap = snapshot(&cli, "blocks");
    let look = "sha256sum /w/big /w/sparse; stat -c '%n %s %b %a %Y' /w/big /w/sparse";
    let before = sh(&cli, "blocks", look);
    for round in 0..2 {
        // 4 KiB changed in the middle and 1 MiB appended; the sparse
        // file written where it had a hole.
        sh(
            &cli,
            "blocks",
            "head -c 4096 /dev/urandom | dd of=/w/big bs=4096 seek=300 conv=notrunc 2>/dev/null && \
             head -c 1048576 /dev/urandom >> /w/big && \
             printf XXXX | dd of=/w/sparse bs=1 seek=1500000 conv=notrunc 2>/dev/null",
        );
        let report = rewind(&cli, "blocks", &snap);
        let stats = &report["image"]["in_place"];
        assert_eq!(stats["patched"], 2, "round {round}: {report}");
        // One 16 KiB block of each file.
        assert_eq!(stats["bytes"], 2 * 16384, "round {round}: {report}");
        assert!(
            stats["layer_bytes"].as_u64().unwrap() < 40 * 1024,
            "round {round}: {report}"
        );
        assert_eq!(sh(&cli, "blocks", look), before, "round {round}");
    }
    cli.ok(&["rm", "blocks"]);
}
