//! Snapshots, rewind, fork and restore on the real engine, through the real
//! CLI: what a rewound sandbox sees (changes undone, deletions kept as
//! deletions), that the store alone can bring a snapshot back after the
//! engine lost its images, that forks and chains keep their parents
//! intact, that `up` restores a machine removed behind silo's back, that
//! neither a `kill -9` mid-snapshot nor gc ever leaves a record naming a
//! missing blob, that a full disk fails a snapshot cleanly, and that pushes
//! and new commands wait while a snapshot reads.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sh;
use silo_tests::Cli;
use silo_tests::docker::{
    BASE_IMAGE, container, engine_with_base, remove_behind_silos_back, remove_image, unique_image,
    wait_stopped,
};
use silo_tests::json;

/// Takes a snapshot; returns its report.
fn snapshot(cli: &Cli, name: &str, message: &str) -> serde_json::Value {
    json(&cli.ok(&["snapshot", name, "-m", message, "--json"]))
}

/// `silo up NAME` on the base image; the sandbox's id.
fn up(cli: &Cli, name: &str) -> String {
    let up = json(&cli.ok(&["up", name, "--image", BASE_IMAGE, "--json"]));
    up["sandbox"]["id"].as_str().unwrap().to_owned()
}

/// The key and socket of a sandbox's agent, for requests made by hand.
fn agent_of(cli: &Cli, name: &str, id: &str) -> (silo_protocol::auth::Key, PathBuf) {
    let silo = cli.silo();
    let key = silo.sandbox_key(&silo.get(name).unwrap());
    let socket = cli
        .home
        .path()
        .join(format!("sandboxes/{id}/run/agent.sock"));
    (key, socket)
}

fn snapshot_id(report: &serde_json::Value) -> String {
    report["snapshot"]["id"].as_str().unwrap().to_owned()
}

fn blobs(home: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(home.join("store/blobs/sha256"))
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn temps(home: &Path) -> usize {
    std::fs::read_dir(home.join("store/tmp")).map_or(0, |dir| dir.count())
}

/// Every layer every recorded snapshot names is in the store.
fn assert_no_dangling_layers(cli: &Cli) {
    let snapshots = json(&cli.ok(&["snapshots", "--json"]));
    for snapshot in snapshots.as_array().unwrap() {
        for layer in snapshot["layers"].as_array().unwrap() {
            let path = cli
                .home
                .path()
                .join("store/blobs/sha256")
                .join(layer.as_str().unwrap());
            assert!(
                path.exists(),
                "{} names missing blob {path:?}",
                snapshot["id"]
            );
        }
    }
}

#[tokio::test]
async fn rewind_undoes_changes_and_keeps_deletions_deleted() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = up(&cli, "rw");
    sh(
        &cli,
        "rw",
        "mkdir -p /work && echo 'version 1' > /work/file && rm /etc/group /bin/ls && \
         mkdir /tmp/kept && echo t > /tmp/kept/x",
    );
    // A session's shell lives on between runs: the snapshot stops it and
    // continues it.
    cli.ok(&["exec", "rw", "--session", "live", "--", "cd", "/work"]);
    let first = snapshot(&cli, "rw", "version 1");
    assert!(first["processes_stopped"].as_u64().unwrap() >= 1, "{first}");
    assert_eq!(first["processes_unsettled"], 0, "{first}");
    assert_eq!(
        cli.ok(&["exec", "rw", "--session", "live", "--", "pwd"]),
        "/work\n",
        "the session's shell runs on after the snapshot"
    );
    assert!(first["durable_ms"].as_f64().unwrap() > 0.0);
    // Durable is where it returns: the engine image is left to a restore
    // that needs one.
    assert!(first.get("loaded_ms").is_none(), "{first}");
    assert!(first["deletions"].as_u64().unwrap() >= 2, "{first}");
    let snap = snapshot_id(&first);

    sh(
        &cli,
        "rw",
        "echo 'version 2' > /work/file && echo new > /work/new && echo back > /etc/group",
    );
    let before = container(&engine, &id).await.unwrap().id.unwrap();
    let rewound = json(&cli.ok(&["rewind", "rw", &snap, "--json"]));
    assert_eq!(rewound["sandbox"]["id"], id.as_str(), "same sandbox id");
    let after = container(&engine, &id).await.unwrap().id.unwrap();
    assert_eq!(before, after, "rewound in place: {rewound}");

    assert_eq!(sh(&cli, "rw", "cat /work/file"), "version 1\n");
    let gone = sh(
        &cli,
        "rw",
        "for f in /work/new /etc/group /bin/ls; do test -e $f && echo $f; done; true",
    );
    assert_eq!(
        gone, "",
        "files created after, or deleted before, the snapshot"
    );
    // Directories keep their modes (a sticky /tmp stays sticky).
    assert_eq!(
        sh(&cli, "rw", "stat -c %a /tmp; cat /tmp/kept/x"),
        "1777\nt\n"
    );
    // The agent's own mounts are not part of the snapshot, and still work.
    assert_eq!(sh(&cli, "rw", "echo alive"), "alive\n");

    let events = cli.ok(&["events", "rw", "--json"]);
    assert!(
        events.contains("\"snapshot\"") && events.contains("\"rewound\""),
        "{events}"
    );
}

#[tokio::test]
async fn a_snapshot_comes_back_from_the_store_after_the_engine_loses_every_image() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let marker = format!("unique-{}", std::process::id());
    let tag = format!("silo-test-unique:{}", std::process::id());
    unique_image(&engine, &tag, &marker).await;
    cli.ok(&["up", "solo", "--image", &tag]);
    sh(&cli, "solo", "echo kept > /root/note");
    let report = snapshot(&cli, "solo", "before the loss");
    assert!(
        report["base_stored"]["bytes"].as_u64().unwrap() > 500_000,
        "the first snapshot stores its base image: {report}"
    );
    let snap = snapshot_id(&report);

    // The engine loses everything: the sandbox and the base. The snapshot
    // never had an engine image: `silo snapshot` returned once durable and
    // its process exited.
    cli.ok(&["rm", "solo"]);
    assert!(!remove_image(&engine, &format!("silo-snapshot:{snap}")).await);
    assert!(remove_image(&engine, &tag).await);
    assert!(engine.inspect_image(&tag).await.is_err());

    let fork = json(&cli.ok(&["fork", &snap, "--name", "reborn", "--json"]));
    assert_eq!(fork["image"]["store"]["layers_sent"], 2, "{fork}");
    assert_eq!(
        sh(&cli, "reborn", "cat /root/note /etc/unique"),
        format!("kept\n{marker}\n")
    );
}

#[tokio::test]
async fn forks_and_chains_leave_their_sources_alone() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "src", "--image", BASE_IMAGE]);
    sh(&cli, "src", "echo one > /root/a");
    let one = snapshot_id(&snapshot(&cli, "src", "one"));

    cli.ok(&["fork", &one, "--name", "copy"]);
    sh(
        &cli,
        "copy",
        "echo changed > /root/a && echo extra > /root/b",
    );
    assert_eq!(sh(&cli, "src", "cat /root/a; ls /root"), "one\na\n");

    // A chain: rewind, change, snapshot again; both levels come back.
    cli.ok(&["rewind", "src", &one]);
    sh(&cli, "src", "echo two > /root/b && rm /root/a");
    let two_report = snapshot(&cli, "src", "two");
    assert_eq!(two_report["snapshot"]["parent"], one.as_str());
    assert_eq!(
        two_report["snapshot"]["layers"].as_array().unwrap().len(),
        3
    );
    let two = snapshot_id(&two_report);
    sh(&cli, "src", "echo three > /root/c");

    cli.ok(&["rewind", "src", &two]);
    assert_eq!(sh(&cli, "src", "ls /root; cat /root/b"), "b\ntwo\n");
    cli.ok(&["rewind", "src", &one]);
    assert_eq!(sh(&cli, "src", "ls /root"), "a\n");
    assert_eq!(sh(&cli, "copy", "cat /root/a /root/b"), "changed\nextra\n");

    let listed = json(&cli.ok(&["snapshots", "src", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 2);

    // Bad requests name what is wrong and change nothing.
    let out = cli.run(&["rewind", "src", "snap-000000000000"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown snapshot"));
    let other = snapshot_id(&snapshot(&cli, "copy", "copy's"));
    let out = cli.run(&["rewind", "src", &other]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("silo fork"),
        "{stderr}"
    );
    // A fork may go back to where it forked from. The snapshot its
    // machine was made from stays (`src` was rewound to it in place, on
    // the machine it had).
    cli.ok(&["rewind", "copy", &one]);
    assert_eq!(sh(&cli, "copy", "cat /root/a; ls /root"), "one\na\n");
    let out = cli.run(&["snapshot", "rm", &one]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("copy"),
        "in use: {stderr}"
    );
    assert_eq!(sh(&cli, "src", "ls /root"), "a\n");
}

#[tokio::test]
async fn up_restores_a_removed_container_from_its_latest_snapshot() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = up(&cli, "phoenix");
    sh(&cli, "phoenix", "echo old > /root/marker");
    snapshot(&cli, "phoenix", "old");
    sh(&cli, "phoenix", "echo latest > /root/marker");
    snapshot(&cli, "phoenix", "latest");

    remove_behind_silos_back(&engine, &id).await;
    let again = json(&cli.ok(&["up", "phoenix", "--image", BASE_IMAGE, "--json"]));
    assert_eq!(again["tier"], 2, "{again}");
    assert_eq!(again["action"], "restored");
    assert_eq!(again["sandbox"]["id"], id.as_str());
    assert_eq!(sh(&cli, "phoenix", "cat /root/marker"), "latest\n");

    // An expired sandbox with snapshots: gc takes its container, not the
    // sandbox, and `up` brings it back from its latest snapshot.
    let ttl = json(&cli.ok(&[
        "up",
        "sleepy",
        "--image",
        BASE_IMAGE,
        "--idle-timeout",
        "1",
        "--json",
    ]));
    let ttl_id = ttl["sandbox"]["id"].as_str().unwrap().to_owned();
    sh(&cli, "sleepy", "echo dreamt > /root/marker");
    snapshot(&cli, "sleepy", "before sleep");
    wait_stopped(&engine, &ttl_id, Duration::from_secs(20)).await;
    let gc = json(&cli.ok(&["gc", "--older-than", "0", "--json"]));
    let collected = gc["removed"].as_array().unwrap();
    assert_eq!(collected.len(), 1, "{gc}");
    assert_eq!(collected[0]["machine_only"], true);
    assert!(
        container(&engine, &ttl_id).await.is_none(),
        "its container is gone"
    );
    let woken = json(&cli.ok(&["up", "sleepy", "--json"]));
    assert_eq!(
        (woken["tier"].as_u64(), woken["sandbox"]["id"].as_str()),
        (Some(2), Some(ttl_id.as_str()))
    );
    assert_eq!(sh(&cli, "sleepy", "cat /root/marker"), "dreamt\n");

    // Without snapshots, a removed container is made fresh (tier 3).
    let bare = json(&cli.ok(&["up", "bare", "--image", BASE_IMAGE, "--json"]));
    let bare_id = bare["sandbox"]["id"].as_str().unwrap().to_owned();
    remove_behind_silos_back(&engine, &bare_id).await;
    let fresh = json(&cli.ok(&["up", "bare", "--image", BASE_IMAGE, "--json"]));
    assert_eq!(fresh["tier"], 3, "{fresh}");
}

#[tokio::test]
async fn a_killed_snapshot_leaves_no_record_and_gc_keeps_only_what_is_named() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "victim", "--image", BASE_IMAGE]);
    // Big enough that the layer is still streaming when silo is killed.
    sh(
        &cli,
        "victim",
        "dd if=/dev/urandom of=/root/big bs=1M count=96 2>/dev/null",
    );
    let mut child = cli
        .command(&["snapshot", "victim"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let home = cli.home.path().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Killed while the layer is being written: base stored, layer half in.
    while !(home.join("store/blobs/sha256").exists() && temps(&home) > 0) {
        assert!(
            Instant::now() < deadline,
            "the snapshot never started writing"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the snapshot ended first"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let listed = json(&cli.ok(&["snapshots", "--json"]));
    assert_eq!(
        listed.as_array().unwrap().len(),
        0,
        "no snapshot was recorded"
    );
    // The sandbox was not left frozen.
    let started = Instant::now();
    assert_eq!(sh(&cli, "victim", "echo thawed"), "thawed\n");
    assert!(started.elapsed() < Duration::from_secs(10));

    let gc = json(&cli.ok(&["gc", "--json"]));
    assert!(gc["store"]["temps_removed"].as_u64().unwrap() >= 1, "{gc}");
    // The snapshot was killed before the image went into the store: the
    // listing of the image the sandbox started from is all a row names.
    assert_eq!(blobs(&home).len(), 1, "only the image's listing is named");

    // Two snapshots; removing one keeps every blob the other names.
    sh(&cli, "victim", "rm /root/big; echo small > /root/small");
    let first = snapshot_id(&snapshot(&cli, "victim", "first"));
    sh(&cli, "victim", "echo more > /root/more");
    let second = snapshot(&cli, "victim", "second");
    cli.ok(&["snapshot", "rm", &first]);
    cli.ok(&["gc"]);
    assert_no_dangling_layers(&cli);
    assert_eq!(temps(&home), 0);
    let second = snapshot_id(&second);
    cli.ok(&["rewind", "victim", &second]);
    assert_eq!(
        sh(&cli, "victim", "cat /root/small /root/more"),
        "small\nmore\n"
    );
}

#[tokio::test]
async fn a_snapshot_waits_for_a_push_under_way_and_captures_it_whole() {
    use silo_protocol::bundle::{Bundle, BundleLimits, FileSet};
    use silo_tests::push::{incompressible, start_partial_push};
    use std::io::Read;

    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = up(&cli, "busy");
    // The base is stored first, so the next snapshot only waits on the push.
    snapshot(&cli, "busy", "base");

    let mut files = FileSet::new();
    for i in 0..64u64 {
        files
            .insert_bytes(&format!("f{i}"), incompressible(i + 1, 32 * 1024), false)
            .unwrap();
    }
    let bundle = Bundle::build(&files, &BundleLimits::default()).unwrap();
    let (key, socket) = agent_of(&cli, "busy", &id);
    let mount = "/workspace/managed/app";
    let half = bundle.bytes.len() / 2;
    // Declared, as silo's client does, so the agent extracts as it reads.
    let declared = silo_protocol::push::Declared {
        entries: Some(64),
        unpacked: Some(bundle.unpacked_bytes),
    };
    let mut push = start_partial_push(&socket, &key, (mount, declared), &bundle.bytes, half);
    // The extract is under way once files show up in its staging directory.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sh(
        &cli,
        "busy",
        "ls /workspace/managed/.versions/app/.partial-*/ 2>/dev/null | wc -l",
    )
    .trim()
        == "0"
    {
        assert!(
            Instant::now() < deadline,
            "the push never started extracting"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut taking = cli
        .command(&["snapshot", "busy", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        taking.try_wait().unwrap().is_none(),
        "the snapshot did not wait for the push under way"
    );
    std::io::Write::write_all(&mut push, &bundle.bytes[half..]).unwrap();
    let mut answer = [0u8; 12];
    push.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "the push went through");
    let taken = taking.wait_with_output().unwrap();
    assert!(
        taken.status.success(),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );
    let snap = snapshot_id(&json(&String::from_utf8_lossy(&taken.stdout)));

    cli.ok(&["rewind", "busy", &snap]);
    assert_eq!(
        sh(&cli, "busy", "ls /workspace/managed/app | wc -l").trim(),
        "64"
    );
}

#[tokio::test]
async fn a_command_started_while_a_snapshot_reads_waits_for_the_thaw() {
    use silo_protocol::snapshot::SnapshotRequest;
    use silo_tests::push::start_signed_post;
    use std::io::Read;

    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = up(&cli, "held");
    // More than every buffer between the agent and a client that does not
    // read holds, so the layer stalls mid-walk with the sandbox stopped.
    sh(&cli, "held", "head -c 33554432 /dev/urandom > /root/big");
    let (key, socket) = agent_of(&cli, "held", &id);
    let request = serde_json::to_vec(&SnapshotRequest {
        changed_since_ns: 0,
        prune_unchanged_dirs: false,
        descend_since_ns: None,
        exclude: Vec::new(),
        baseline: Vec::new(),
        baseline_raw: Vec::new(),
        baseline_digest: None,
        walk_hint: None,
        rewind_to: None,
        block_sums: false,
    })
    .unwrap();
    let mut reading = start_signed_post(
        &socket,
        &key,
        silo_protocol::http::PATH_SNAPSHOT,
        &request,
        request.len(),
    );
    let mut answer = [0u8; 12];
    reading.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "the layer started");

    let mut late = cli
        .command(&["exec", "held", "--", "sh", "-c", "echo late > /root/late"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        late.try_wait().unwrap().is_none(),
        "a command ran while the snapshot was reading"
    );
    // A client that leaves mid-layer ends the snapshot: the sandbox goes on
    // and the command waiting at the gate starts.
    drop(reading);
    let ran = late.wait_with_output().unwrap();
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(sh(&cli, "held", "cat /root/late"), "late\n");
}

#[tokio::test]
async fn a_full_store_fails_the_snapshot_and_keeps_everything_else() {
    use silo_tests::disk::SmallDisk;

    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let Some(disk) = SmallDisk::mount(32 << 20) else {
        return;
    };
    // Dropped before the disk, so its cleanup still finds its home.
    let cli = Cli::in_home(crate::SILO, tempfile::tempdir_in(disk.path()).unwrap());
    cli.ok(&["up", "full", "--image", BASE_IMAGE]);
    let base = snapshot_id(&snapshot(&cli, "full", "base"));
    sh(&cli, "full", "echo kept > /root/kept");
    // Larger than the whole disk, and random, so it fills the store mid-layer.
    sh(&cli, "full", "head -c 50331648 /dev/urandom > /root/big");

    let out = cli.run(&["snapshot", "full", "-m", "too big"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a snapshot larger than the disk was taken"
    );
    assert!(
        stderr.contains("blob store") && stderr.contains("No space left on device"),
        "the error does not say the store is full: {stderr}"
    );
    let listed = json(&cli.ok(&["snapshots", "--json"]));
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [base.as_str()], "only the base snapshot is recorded");
    assert_eq!(temps(cli.home.path()), 0, "the partial blob is gone");
    assert_no_dangling_layers(&cli);
    assert_eq!(
        sh(&cli, "full", "cat /root/kept"),
        "kept\n",
        "the sandbox runs on"
    );

    // With room again, the next snapshot is whole.
    sh(&cli, "full", "rm /root/big");
    let after = snapshot_id(&snapshot(&cli, "full", "after"));
    sh(&cli, "full", "echo changed > /root/kept");
    cli.ok(&["rewind", "full", &after]);
    assert_eq!(sh(&cli, "full", "cat /root/kept"), "kept\n");
    assert_eq!(sh(&cli, "full", "test -e /root/big || echo gone"), "gone\n");
}

#[tokio::test]
async fn silo_diff_names_every_path_that_differs_from_a_snapshot_and_how() {
    if engine_with_base().await.is_none() {
        return;
    }
    let cli = crate::cli();
    up(&cli, "diffed");
    sh(
        &cli,
        "diffed",
        "mkdir /w && echo a > /w/f && echo b > /w/g && ln -s f /w/l && echo same > /w/same",
    );
    let taken = snapshot_id(&snapshot(&cli, "diffed", "before"));
    sh(
        &cli,
        "diffed",
        "echo A > /w/f && rm /w/g && echo new > /w/h && chmod 600 /w/same && ln -sf g /w/l \
         && rm /bin/ls",
    );
    let report = json(&cli.ok(&["diff", "diffed", "--json"]));
    assert_eq!(report["snapshot"], taken.as_str(), "{report}");
    let found: Vec<(String, String, Vec<String>)> = report["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| {
            let what = path["what"]
                .as_array()
                .map(|what| {
                    what.iter()
                        .map(|w| w.as_str().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default();
            (
                path["path"].as_str().unwrap().to_owned(),
                path["change"].as_str().unwrap().to_owned(),
                what,
            )
        })
        .collect();
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        found,
        [
            ("/bin/ls".to_owned(), "removed".to_owned(), Vec::new()),
            (
                "/w/f".to_owned(),
                "changed".to_owned(),
                strings(&["content", "mtime"])
            ),
            ("/w/g".to_owned(), "removed".to_owned(), Vec::new()),
            ("/w/h".to_owned(), "added".to_owned(), Vec::new()),
            (
                "/w/l".to_owned(),
                "changed".to_owned(),
                strings(&["target", "mtime"])
            ),
            (
                "/w/same".to_owned(),
                "changed".to_owned(),
                strings(&["mode"])
            ),
        ],
        "{report}"
    );
    // A second diff compares with the snapshot taken, not the first
    // diff's capture, and finds the same paths; the human form lists them.
    let text = cli.ok(&["diff", "diffed"]);
    assert!(
        text.contains(&format!("against snapshot {taken}")),
        "{text}"
    );
    assert!(
        text.contains("~ /w/f (content, mtime)") && text.contains("+ /w/h"),
        "{text}"
    );
    cli.ok(&["rm", "diffed"]);
}
