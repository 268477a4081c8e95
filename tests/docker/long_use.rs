//! What accumulates over long use stays bounded, on the machine's real
//! Docker storage driver: output memory under a small memory limit, the
//! debris of cancelled pushes and killed copies, and workload children that
//! drop every marker.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, container_id, engine_with_base};
use silo_tests::json;

use crate::sh;

/// What the agent may grow above idle under `--memory 64m`: the running
/// budget, the finished budget and the newest finished ring (4 MiB each
/// under that limit, see docs/limits.md), and 8 MiB for connections,
/// buffers and the allocator.
const RSS_BOUND_KIB: u64 = (4 + 4 + 4 + 8) * 1024;

/// A field of PID 1's `/proc/1/status`, in KiB.
fn agent_status_kib(cli: &Cli, name: &str, field: &str) -> u64 {
    let status = sh(cli, name, "cat /proc/1/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// Pids of the sandbox's processes whose command line is exactly `argv`.
fn pids_of(cli: &Cli, name: &str, argv: &str) -> Vec<String> {
    let script = format!(
        "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); \
         [ \"$c\" = '{argv} ' ] && echo ${{p#/proc/}}; done; true"
    );
    sh(cli, name, &script)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test]
async fn fifty_chatty_commands_under_64m_leave_the_agent_alive_within_its_bound() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "lu-mem", "--image", BASE_IMAGE, "--memory", "64m"]);
    let idle = agent_status_kib(&cli, "lu-mem", "VmRSS");
    let started = sh(&cli, "lu-mem", "cut -d' ' -f22 /proc/1/stat");
    for i in 0..50 {
        let out = cli.run(&[
            "exec",
            "lu-mem",
            "--",
            "dd",
            "if=/dev/zero",
            "bs=1048576",
            "count=5",
        ]);
        assert!(out.status.success(), "command {i}: {out:?}");
        assert_eq!(out.stdout.len(), 5 << 20, "command {i} got all its output");
    }
    let peak = agent_status_kib(&cli, "lu-mem", "VmHWM");
    let now = agent_status_kib(&cli, "lu-mem", "VmRSS");
    assert_eq!(
        sh(&cli, "lu-mem", "cut -d' ' -f22 /proc/1/stat"),
        started,
        "the same agent is PID 1: it was never killed"
    );
    assert!(
        peak <= idle + RSS_BOUND_KIB,
        "agent peaked at {peak} KiB from {idle} KiB idle (bound +{RSS_BOUND_KIB} KiB)"
    );
    assert!(now <= idle + RSS_BOUND_KIB, "agent at {now} KiB");
}

/// The process limit of the sandbox that fills it.
const PIDS_LIMIT: &str = "40";
/// Far above an agent answering at once, far below a hang.
const ANSWER_BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_workload_at_its_process_limit_leaves_the_agent_answering() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&[
        "up",
        "lu-pids",
        "--image",
        BASE_IMAGE,
        "--pids-limit",
        PIDS_LIMIT,
    ]);
    let started = sh(&cli, "lu-pids", "cut -d' ' -f22 /proc/1/stat");
    // What the agent starts is the OOM killer's choice before the agent.
    let scores = sh(
        &cli,
        "lu-pids",
        "cat /proc/1/oom_score_adj /proc/self/oom_score_adj",
    );
    let scores: Vec<i32> = scores.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(scores[1], (scores[0] + 500).min(1000), "{scores:?}");

    // Fill every pid: orphaned sleeps, until the agent itself cannot start
    // a program. A shell that got the last pid and could not fork its sleep
    // leaves that pid to a plain `sleep`.
    let mut holders = Vec::new();
    let mut full = None;
    for _ in 0..200 {
        let out = cli.run(&[
            "exec",
            "lu-pids",
            "--",
            "sh",
            "-c",
            "sleep 1000 >/dev/null 2>&1 &",
        ]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if err.contains("process limit") {
            full = Some(err);
            break;
        }
        if !out.status.success() {
            let holder = cli
                .command(&["exec", "lu-pids", "--", "sleep", "1000"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            holders.push(holder);
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let full = full.expect("the sandbox reached its process limit");
    assert!(full.contains("cannot start \"sh\""), "{full}");

    // At the limit, a command is answered at once with why it cannot run,
    // and snapshots and file reads go on.
    for attempt in 0..5 {
        let began = Instant::now();
        let out = cli.run(&["exec", "lu-pids", "--", "true"]);
        let took = began.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(took < ANSWER_BOUND, "attempt {attempt} took {took:?}");
        assert!(
            !out.status.success() && err.contains("process limit"),
            "{err}"
        );
    }
    let snap = json(&cli.ok(&["snapshot", "lu-pids", "--json"]));
    let snapshot = snap["snapshot"]["id"].as_str().unwrap().to_owned();
    assert!(!cli.ok(&["cat", "lu-pids", "/etc/hostname"]).is_empty());

    // A rewind ends the workload's processes, and commands run again.
    cli.ok(&["rewind", "lu-pids", &snapshot]);
    for holder in &mut holders {
        let _ = holder.kill();
        let _ = holder.wait();
    }
    assert_eq!(sh(&cli, "lu-pids", "echo back"), "back\n");
    assert_eq!(
        sh(&cli, "lu-pids", "cut -d' ' -f22 /proc/1/stat"),
        started,
        "the same agent is PID 1 throughout"
    );
}

#[tokio::test]
async fn a_workload_child_that_leaves_session_and_environment_is_gone_after_a_restart() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&[
        "up",
        "lu-wl",
        "--image",
        BASE_IMAGE,
        "--restart",
        "always",
        "--",
        "sh",
        "-c",
        "env -i setsid sleep 1002 & exec sleep 1001",
    ]);
    let mut strays = Vec::new();
    wait_for("first run", Duration::from_secs(30), || {
        strays = pids_of(&cli, "lu-wl", "sleep 1002");
        !strays.is_empty() && !pids_of(&cli, "lu-wl", "sleep 1001").is_empty()
    });
    for restart in 0..3 {
        let leader = pids_of(&cli, "lu-wl", "sleep 1001");
        assert_eq!(leader.len(), 1, "restart {restart}: {leader:?}");
        let old_strays = pids_of(&cli, "lu-wl", "sleep 1002");
        sh(&cli, "lu-wl", &format!("kill {}", leader[0]));
        wait_for("the next run", Duration::from_secs(30), || {
            let now = pids_of(&cli, "lu-wl", "sleep 1001");
            now.len() == 1 && now != leader
        });
        wait_for("the old run's stray gone", Duration::from_secs(15), || {
            let now = pids_of(&cli, "lu-wl", "sleep 1002");
            old_strays.iter().all(|pid| !now.contains(pid))
        });
    }
    wait_for(
        "one stray, the current run's",
        Duration::from_secs(15),
        || pids_of(&cli, "lu-wl", "sleep 1002").len() == 1,
    );
}

#[tokio::test]
async fn a_copy_cut_by_the_agents_death_can_be_retried_at_once_and_leaves_no_temp_file() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = json(&cli.ok(&["up", "lu-cp", "--image", BASE_IMAGE, "--json"]))["sandbox"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let host = tempfile::tempdir().unwrap();
    let big = host.path().join("big.bin");
    std::fs::write(&big, silo_tests::push::incompressible(7, 256 << 20)).unwrap();
    let big_text = big.display().to_string();
    let tree = host.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("a.txt"), b"a").unwrap();
    let tree_text = tree.display().to_string();

    // The agent dies (SIGKILL to PID 1 kills the container) while the file
    // is half written.
    let mut copy = cli
        .command(&["cp", &big_text, "lu-cp:/root/big.bin"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("a temporary file", Duration::from_secs(60), || {
        sh(&cli, "lu-cp", "ls -a /root").contains(".silo-tmp")
    });
    let container = container_id(&engine, &id).await;
    engine
        .kill_container(
            &container,
            Some(
                bollard::query_parameters::KillContainerOptionsBuilder::new()
                    .signal("KILL")
                    .build(),
            ),
        )
        .await
        .unwrap();
    let _ = copy.wait();

    // Retried at once, both copies work; the half-written file is swept.
    cli.ok(&["start", "lu-cp"]);
    cli.ok(&["cp", &big_text, "lu-cp:/root/big.bin"]);
    cli.ok(&["cp", &tree_text, "lu-cp:/root/tree"]);
    cli.ok(&["cp", &tree_text, "lu-cp:/root/tree"]);
    assert_eq!(
        sh(&cli, "lu-cp", "wc -c < /root/big.bin").trim(),
        "268435456"
    );
    wait_for("no temporary file left", Duration::from_secs(20), || {
        let listing = sh(&cli, "lu-cp", "ls -a /root /root/tree");
        !listing.contains(".silo-tmp") && !listing.contains(".silo-staging")
    });
}

/// Files enough that extracting them takes a few seconds on the container
/// root.
fn many_files(dir: &Path, count: usize) {
    for i in 0..count {
        let sub = dir.join(format!("d{}", i % 50));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
}

#[tokio::test]
async fn a_push_cancelled_while_a_process_reads_the_tree_leaves_no_debris() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    const MOUNT: &str = "/workspace/managed/app";
    let cli = crate::cli();
    cli.ok(&["up", "lu-push", "--image", BASE_IMAGE]);
    let first = tempfile::tempdir().unwrap();
    std::fs::write(first.path().join("live.txt"), b"live").unwrap();
    let first_text = first.path().display().to_string();
    cli.ok(&["push", &first_text, "--mount", MOUNT, "lu-push"]);
    let live = sh(&cli, "lu-push", "readlink /workspace/managed/app");

    // A reader walking the whole tree, version store included, all along.
    let mut reader = cli
        .command(&[
            "exec",
            "lu-push",
            "--",
            "sh",
            "-c",
            "while :; do find /workspace/managed -type f -exec cat {} + >/dev/null 2>&1; done",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let big = tempfile::tempdir().unwrap();
    many_files(big.path(), 60_000);
    let big_text = big.path().display().to_string();
    let mut push = cli
        .command(&["push", &big_text, "--mount", MOUNT, "lu-push"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the push extracting", Duration::from_secs(120), || {
        sh(&cli, "lu-push", "ls -a /workspace/managed/.versions/app").contains(".partial-")
    });
    std::thread::sleep(Duration::from_secs(2));
    push.kill().unwrap();
    let _ = push.wait();

    wait_for("the staging tree removed", Duration::from_secs(60), || {
        let left = sh(&cli, "lu-push", "ls -a /workspace/managed/.versions/app");
        !left.contains(".partial-") && !left.contains(".link-")
    });
    reader.kill().unwrap();
    let _ = reader.wait();
    assert_eq!(sh(&cli, "lu-push", "readlink /workspace/managed/app"), live);
    assert_eq!(
        sh(&cli, "lu-push", "cat /workspace/managed/app/live.txt"),
        "live"
    );
    let journal = sh(
        &cli,
        "lu-push",
        "ls -A /.silo/cleanup/* 2>/dev/null | grep -v '^\\.lock$' | grep -v ':$' | grep -v '^$'; true",
    );
    assert_eq!(journal.trim(), "", "nothing left to retry");
}
