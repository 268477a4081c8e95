//! The agent's half of an in-place rewind, as a host process started with
//! `--machine-agent` (it may end only what it started): ending every
//! process it started, the change list, the hold and its refusals, the
//! restoring layer placed under it, and the workload started again. And
//! the refusals of an agent that may end nothing.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::sys::signal::Signal;
use silo::client::ClientError;
use silo_protocol::rewind::Change;
use silo_protocol::snapshot::SnapshotRequest;
use silo_tests::{TestAgent, pids_running, sh, signal};

/// How far before a moment a file's ctime may read, on a coarse clock.
const MARGIN_NS: i64 = 50_000_000;

fn now_ns() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_nanos()).unwrap()
}

/// A layer: `(path, Some(data))` a file, `(path, None)` a whiteout.
fn layer(entries: &[(&str, Option<&str>)]) -> Bytes {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_mtime(1_600_000_000);
        header.set_uid(u64::from(nix::unistd::getuid().as_raw()));
        header.set_gid(u64::from(nix::unistd::getgid().as_raw()));
        let (name, data) = match data {
            Some(data) => ((*path).to_owned(), data.as_bytes()),
            None => {
                let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
                let marker = format!("{parent}/.wh.{name}");
                (marker.trim_start_matches('/').to_owned(), &b""[..])
            }
        };
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, name, data).unwrap();
    }
    Bytes::from(builder.into_inner().unwrap())
}

/// `sleep` durations no other run of these tests uses, so a process is
/// known by its command line.
fn sleeps() -> [String; 4] {
    let base = 100_000 + u64::from(std::process::id()) * 4;
    [0, 1, 2, 3].map(|i| (base + i).to_string())
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn a_rewind_ends_every_process_lists_what_changed_and_starts_the_workload_again() {
    let root = tempfile::tempdir().unwrap();
    let runs = root.path().parent().unwrap().join(format!(
        "silo-rewind-runs-{}",
        root.path().file_name().unwrap().to_string_lossy()
    ));
    let [workload_sleep, command_sleep, daemon_sleep, _] = sleeps();
    let workload = format!(
        "echo run >> {}; exec sleep {workload_sleep}",
        runs.display()
    );
    std::fs::write(root.path().join("keep"), "old").unwrap();
    std::fs::write(root.path().join("gone"), "was here").unwrap();
    let agent = TestAgent::start_with(
        &[
            "--machine-agent",
            "--apply-root",
            root.path().to_str().unwrap(),
        ],
        &["sh", "-c", &workload],
    )
    .await;
    let client = agent.client();
    let lines = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    wait_for("the workload never ran", || lines() == 1);

    // A command still running, and a daemon that left its session.
    let conn = client.connect().await.unwrap();
    let _running = conn
        .exec(sh(&format!("exec sleep {command_sleep}")))
        .await
        .unwrap();
    let daemon = format!("setsid sleep {daemon_sleep} > /dev/null 2>&1 < /dev/null &");
    conn.run(sh(&daemon)).await.unwrap();
    wait_for("the commands never started", || {
        !pids_running(&["sleep", &command_sleep]).is_empty()
            && !pids_running(&["sleep", &daemon_sleep]).is_empty()
    });
    let since = now_ns() - MARGIN_NS;
    std::fs::write(root.path().join("keep"), "new").unwrap();
    std::fs::write(root.path().join("made"), "since").unwrap();
    std::fs::remove_file(root.path().join("gone")).unwrap();

    let request = SnapshotRequest {
        changed_since_ns: since,
        prune_unchanged_dirs: false,
        descend_since_ns: None,
        exclude: Vec::new(),
        baseline: vec!["keep".into(), "gone".into()],
        baseline_raw: Vec::new(),
        baseline_digest: None,
        walk_hint: None,
        rewind_to: None,
        block_sums: false,
    };
    let begun = client.begin_rewind(&request).await.unwrap();
    for sleeper in [&workload_sleep, &command_sleep, &daemon_sleep] {
        assert!(
            pids_running(&["sleep", sleeper]).is_empty(),
            "sleep {sleeper} outlived the rewind's start"
        );
    }
    assert!(begun.ended >= 1, "the daemon was ended by the sweep");
    let mut changes: Vec<(Change, String)> = begun
        .changes()
        .into_iter()
        .map(|(kind, path)| (kind, String::from_utf8(path.to_vec()).unwrap()))
        .collect();
    changes.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        changes,
        [
            // The root's own entry: names were made and removed in it.
            (Change::Dir, String::new()),
            (Change::Gone, "gone".to_owned()),
            (Change::File, "keep".to_owned()),
            (Change::File, "made".to_owned()),
        ]
    );

    // Held: nothing runs, another rewind is refused, a wrong token finds
    // nothing, and the workload is not started again meanwhile.
    let busy = client.begin_rewind(&request).await.unwrap_err();
    assert!(
        matches!(busy, ClientError::Rejected { status: 409, .. }),
        "{busy}"
    );
    let unknown = client.finish_rewind("0000", layer(&[])).await.unwrap_err();
    assert!(
        matches!(&unknown, ClientError::Rejected { status: 404, message } if message.contains("0000")),
        "{unknown}"
    );
    assert!(pids_running(&["sleep", &workload_sleep]).is_empty());

    let restoring = layer(&[
        ("made", None),
        ("keep", Some("old")),
        ("gone", Some("was here")),
    ]);
    let applied = client.finish_rewind(&begun.token, restoring).await.unwrap();
    assert!(applied.applied_at_ns.unwrap() >= since);
    assert_eq!(
        std::fs::read_to_string(root.path().join("keep")).unwrap(),
        "old"
    );
    assert_eq!(
        std::fs::read_to_string(root.path().join("gone")).unwrap(),
        "was here"
    );
    assert!(!root.path().join("made").exists());
    wait_for("the workload was not started again", || lines() == 2);
    // The hold is gone with its layer: commands run again, and its token
    // is no use twice.
    let out = conn.run(sh("echo again")).await.unwrap();
    assert_eq!(out.stdout, b"again\n");
    let used = client
        .finish_rewind(&begun.token, layer(&[]))
        .await
        .unwrap_err();
    assert!(
        matches!(used, ClientError::Rejected { status: 404, .. }),
        "{used}"
    );
    let _ = std::fs::remove_file(&runs);
    end(&workload_sleep);
}

#[tokio::test]
async fn an_agent_that_may_end_nothing_refuses_and_ends_nothing() {
    let agent = TestAgent::start().await;
    let client = agent.client();
    let conn = client.connect().await.unwrap();
    let [.., sleep] = sleeps();
    let _running = conn.exec(sh(&format!("exec sleep {sleep}"))).await.unwrap();
    wait_for("the command never started", || {
        !pids_running(&["sleep", &sleep]).is_empty()
    });
    let request = SnapshotRequest {
        changed_since_ns: now_ns(),
        prune_unchanged_dirs: false,
        descend_since_ns: None,
        exclude: Vec::new(),
        baseline: Vec::new(),
        baseline_raw: Vec::new(),
        baseline_digest: None,
        walk_hint: None,
        rewind_to: None,
        block_sums: false,
    };
    let err = client.begin_rewind(&request).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Rejected { status: 501, message } if message.contains("--machine-agent")),
        "{err}"
    );
    assert!(!pids_running(&["sleep", &sleep]).is_empty());
    end(&sleep);
}

/// Kills this test's `sleep SECONDS`, which would outlive its agent.
fn end(seconds: &str) {
    for pid in pids_running(&["sleep", seconds]) {
        signal(pid, Signal::SIGKILL);
    }
}
