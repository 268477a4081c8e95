//! What keeps an agent usable over time: re-attach after a lost connection,
//! dropped clients, zombie reaping under an orphan storm, the supervised
//! workload, and clean shutdown.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo::client::ExecEvent;
use silo_protocol::exec::{ExecSpec, ExecState};
use silo_tests::{TestAgent, sh};

#[tokio::test]
async fn reattach_from_a_new_connection_replays_what_was_missed() {
    let agent = TestAgent::start().await;
    let expected: String = (1..=40).map(|i| format!("line{i}\n")).collect();
    let conn = agent.client().connect().await.unwrap();
    let mut exec = conn
        .exec(sh(
            "i=1; while [ $i -le 40 ]; do echo line$i; i=$((i+1)); sleep 0.01; done",
        ))
        .await
        .unwrap();
    let id = exec.id();
    let mut seen = Vec::new();
    while seen.len() < 30 {
        match exec.next_event().await.unwrap() {
            ExecEvent::Output { offset, data, .. } => {
                assert_eq!(
                    offset as usize,
                    seen.len(),
                    "sequence numbers are byte offsets"
                );
                seen.extend(data);
            }
            ExecEvent::Exit(_) => panic!("ended too soon"),
        }
    }
    // The client vanishes mid-stream.
    drop(exec);
    drop(conn);

    let conn = agent.client().connect().await.unwrap();
    let (exec, lost) = conn.attach(id, seen.len() as u64).await.unwrap();
    assert_eq!(lost, 0);
    let rest = exec.collect().await.unwrap();
    seen.extend(rest.stdout);
    assert_eq!(String::from_utf8(seen).unwrap(), expected);
    assert_eq!(rest.exit.code, Some(0));
}

#[tokio::test]
async fn reattach_says_how_many_bytes_the_ring_lost() {
    let agent = TestAgent::start_with(&["--ring-bytes", "4096"], &[]).await;
    let conn = agent.client().connect().await.unwrap();
    let exec = conn.exec(sh("head -c 50000 /dev/zero")).await.unwrap();
    let id = exec.id();
    let total = exec.collect().await.unwrap().exit.output_bytes;
    assert_eq!(total, 50_000);

    let (exec, lost) = conn.attach(id, 0).await.unwrap();
    let replayed = exec.collect().await.unwrap();
    assert!(lost > 0, "a 4 KiB ring cannot hold 50000 bytes");
    assert_eq!(
        lost + replayed.stdout.len() as u64,
        total,
        "lost + replayed covers everything"
    );
    assert!(
        replayed.stdout.len() <= 4096 + 64 * 1024,
        "ring bound respected"
    );
}

#[tokio::test]
async fn a_dropped_client_wedges_nothing() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let exec = conn
        .exec(ExecSpec {
            argv: vec!["sleep".into(), "100".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let id = exec.id();
    drop(exec);
    drop(conn);

    let started = Instant::now();
    let conn = agent.client().connect().await.unwrap();
    assert_eq!(conn.run(sh("echo next")).await.unwrap().stdout, b"next\n");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "next request took {:?}",
        started.elapsed()
    );
    let (state, exit, _) = conn.status(id).await.unwrap();
    assert_eq!(
        (state, exit),
        (ExecState::Running, None),
        "the detached exec keeps running"
    );
    conn.interrupt(id, Some(Duration::ZERO)).await.unwrap();
}

#[tokio::test]
async fn every_exec_whose_client_vanishes_at_once_is_interrupted() {
    // The agent's default applies to requests that name no timeout; an
    // explicit 0 keeps a command running as a background job.
    let agent = TestAgent::start_with(&["--detach-timeout-secs", "1"], &[]).await;
    let mut abandoned = Vec::new();
    for round in 0..40 {
        let conn = agent.client().connect().await.unwrap();
        let spec = ExecSpec {
            argv: vec!["sleep".into(), "100.4242".into()],
            // Half name their own timeout, half rely on the agent's.
            detach_timeout_ms: (round % 2 == 0).then_some(300),
            ..Default::default()
        };
        let exec = conn.exec(spec).await.unwrap();
        abandoned.push(exec.pid());
        // The client goes away right as the exec starts.
        drop(exec);
        drop(conn);
    }
    let conn = agent.client().connect().await.unwrap();
    let background = conn
        .exec(ExecSpec {
            argv: vec!["sleep".into(), "100.4545".into()],
            detach_timeout_ms: Some(0),
            ..Default::default()
        })
        .await
        .unwrap();
    let (kept, kept_pid) = (background.id(), background.pid());
    drop(background);
    drop(conn);

    let deadline = Instant::now() + Duration::from_secs(15);
    let alive = |pids: &[u32]| -> Vec<u32> {
        pids.iter()
            .copied()
            .filter(|pid| silo_tests::process_alive(*pid))
            .collect()
    };
    while !alive(&abandoned).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        alive(&abandoned),
        Vec::<u32>::new(),
        "abandoned execs still running"
    );
    assert!(
        silo_tests::process_alive(kept_pid),
        "a 0 timeout keeps it running"
    );
    let conn = agent.client().connect().await.unwrap();
    conn.interrupt(kept, Some(Duration::ZERO)).await.unwrap();
}

/// Sends a request to start `sleep SECS` on a fresh connection and drops the
/// connection without waiting for the reply, as a client killed at that
/// moment would.
async fn start_and_drop(agent: &TestAgent, secs: &str, detach_timeout_ms: Option<u64>) {
    let conn = agent.client().connect().await.unwrap();
    let spec = ExecSpec {
        argv: vec!["sleep".into(), secs.into()],
        detach_timeout_ms,
        ..Default::default()
    };
    // One poll queues the request; the writer still sends it before closing.
    let _ = tokio::time::timeout(Duration::ZERO, conn.exec(spec)).await;
    drop(conn);
}

#[tokio::test]
async fn every_exec_whose_client_drops_before_the_reply_is_interrupted() {
    const RUNS: usize = 100;
    let agent = TestAgent::start().await;
    let marker = "1001.5151";
    for _ in 0..RUNS {
        start_and_drop(&agent, marker, Some(2_000)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut peak = 0;
    let left = loop {
        let now = silo_tests::pids_running(&["sleep", marker]).len();
        peak = peak.max(now);
        if (now == 0 && peak > 0) || Instant::now() >= deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        peak >= RUNS / 2,
        "only {peak} of {RUNS} execs were seen running"
    );
    assert_eq!(left, 0, "{left} orphaned execs still run");
}

#[tokio::test]
async fn detach_timeout_kills_an_abandoned_exec() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let mut spec = ExecSpec {
        argv: vec!["sleep".into(), "100".into()],
        ..Default::default()
    };
    spec.detach_timeout_ms = Some(200);
    let exec = conn.exec(spec).await.unwrap();
    let (id, pid) = (exec.id(), exec.pid());
    drop(exec);
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(5);
    while silo_tests::process_alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !silo_tests::process_alive(pid),
        "abandoned exec still running"
    );
    let (state, _, _) = agent
        .client()
        .connect()
        .await
        .unwrap()
        .status(id)
        .await
        .unwrap();
    assert_eq!(state, ExecState::Finished);
}

#[tokio::test]
async fn orphan_storm_leaves_no_zombies_and_loses_no_exit_code() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    // Each subshell backgrounds a child and exits at once, orphaning it to the agent.
    let storm = conn.exec(sh(
        "i=0; while [ $i -lt 250 ]; do (sleep 0.05 &); i=$((i+1)); done; exit 42",
    ));
    let codes = (0..60).map(|i| {
        let conn = conn.clone();
        async move {
            (
                i,
                conn.run(sh(&format!("exit {}", i % 100)))
                    .await
                    .unwrap()
                    .exit
                    .code,
            )
        }
    });
    let (storm, results) = tokio::join!(
        async { storm.await.unwrap().collect().await.unwrap() },
        futures_util::future::join_all(codes)
    );
    assert_eq!(storm.exit.code, Some(42));
    for (i, code) in results {
        assert_eq!(code, Some(i % 100), "exit code of exec {i} lost");
    }
    // Give the last orphans time to exit and be reaped.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut zombies = silo_tests::zombie_children(agent.pid());
    while !zombies.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        zombies = silo_tests::zombie_children(agent.pid());
    }
    assert!(zombies.is_empty(), "zombies left: {zombies:?}");
}

#[tokio::test]
async fn a_crashing_workload_is_restarted_with_backoff() {
    let marker = tempfile::NamedTempFile::new().unwrap();
    let path = marker.path().to_str().unwrap().to_owned();
    let agent = TestAgent::start_with(
        &["--restart", "on-failure"],
        &["sh", "-c", &format!("echo run >> {path}; exit 1")],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runs = std::fs::read_to_string(&path).unwrap().lines().count();
    // Backoff doubling from a small start gives a handful of runs in 2 s; none would give thousands.
    assert!((3..=15).contains(&runs), "{runs} runs in 2 s");
    // The agent itself is unaffected.
    assert_eq!(
        agent.client().run(sh("echo alive")).await.unwrap().stdout,
        b"alive\n"
    );
}

#[tokio::test]
async fn a_restarted_workload_leaves_nothing_of_its_last_run() {
    let runs = tempfile::NamedTempFile::new().unwrap();
    let path = runs.path().to_str().unwrap().to_owned();
    // Each run starts a background child and one that escapes into its own
    // session (as a server's worker or daemon would), then waits.
    let script = format!(
        "sleep 1000.1717 & a=$!; setsid sleep 1000.1818 & b=$!; echo \"$$ $a $b\" >> {path}; wait"
    );
    let _agent = TestAgent::start_with(&["--restart", "on-failure"], &["sh", "-c", &script]).await;
    let lines = |min: usize| {
        let path = path.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<Vec<u32>> = text
                    .lines()
                    .map(|l| l.split_whitespace().map(|p| p.parse().unwrap()).collect())
                    .collect();
                if lines.len() >= min || Instant::now() > deadline {
                    return lines;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let first = lines(1).await[0].clone();
    let leader = i32::try_from(first[0]).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(leader),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let runs_now = lines(2).await;
    assert!(runs_now.len() >= 2, "the workload was not restarted");
    let deadline = Instant::now() + Duration::from_secs(5);
    while first[1..].iter().any(|p| silo_tests::process_alive(*p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for pid in &first[1..] {
        assert!(
            !silo_tests::process_alive(*pid),
            "process {pid} of the last run still runs"
        );
    }
    // The new run's own children are alive.
    assert!(
        runs_now[1][1..]
            .iter()
            .all(|p| silo_tests::process_alive(*p))
    );
}

#[tokio::test]
async fn sigterm_shuts_down_with_the_workload_status() {
    let agent = TestAgent::start_with(
        &["--restart", "never"],
        &[
            "sh",
            "-c",
            "trap 'exit 7' TERM; while true; do sleep 0.05; done",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let status = agent.terminate();
    assert_eq!(
        status.code(),
        Some(7),
        "agent exits with the workload's status"
    );
    assert!(started.elapsed() < Duration::from_secs(6));
}

/// Per-stream offsets through the library, with a ring too small for the
/// output: each stream comes back as a suffix of what it printed, from
/// where the caller stood when the ring still holds it, the rest counted
/// as lost, and the execution ends standing at each stream's end.
#[tokio::test]
async fn an_attach_by_stream_offsets_gives_each_stream_its_rest_or_counts_it_lost() {
    use silo::{CommandEvent, Commands};
    use silo_protocol::exec::{Channel, StreamOffsets};

    let agent = TestAgent::start_with(&["--ring-bytes", "4096"], &[]).await;
    let commands = Commands::new(agent.client());
    // More than the ring on both streams, then a short tail whose order the
    // pauses fix, so the last bytes of each stream are surely held.
    let script = "head -c 6000 /dev/zero; head -c 3000 /dev/zero >&2; \
                  for i in 1 2 3 4 5; do echo out$i; sleep 0.01; echo err$i >&2; sleep 0.01; done";
    let first = commands.spawn(sh(script)).await.unwrap();
    let id = first.id();
    let whole = first.collect().await.unwrap();
    let (out, err) = (whole.stdout, whole.stderr);
    assert_eq!(whole.lost_bytes, 0, "the first follower keeps up");

    let cases = [
        // Long gone from a 4 KiB ring: what is held comes, the rest is lost.
        (10, 5),
        // Inside what the ring holds: exactly the last bytes of each.
        (out.len() - 20, err.len() - 30),
        // One stream whole, the other from the start of the ring.
        (out.len(), 0),
    ];
    for (have_out, have_err) in cases {
        let have = StreamOffsets {
            stdout: have_out as u64,
            stderr: have_err as u64,
        };
        let mut execution = commands.attach_streams(id, have).await.unwrap();
        let (mut got_out, mut got_err, mut lost) = (Vec::new(), Vec::new(), 0);
        while let Some(event) = execution.next().await.unwrap() {
            match event {
                CommandEvent::Output {
                    channel: Channel::Stderr,
                    data,
                    ..
                } => got_err.extend(data),
                CommandEvent::Output { data, .. } => got_out.extend(data),
                CommandEvent::Lost { bytes, .. } => lost += bytes,
                CommandEvent::Exit(_) => {}
            }
        }
        assert!(
            out.ends_with(&got_out) && err.ends_with(&got_err),
            "suffixes"
        );
        let missing =
            |total: usize, have: usize, got: usize| total.saturating_sub(have).saturating_sub(got);
        assert_eq!(
            lost as usize,
            missing(out.len(), have_out, got_out.len())
                + missing(err.len(), have_err, got_err.len()),
            "with {have:?}: every wanted byte came or was counted lost"
        );
        let end = execution.streams().unwrap();
        assert_eq!(
            (end.stdout, end.stderr),
            (out.len() as u64, err.len() as u64)
        );
        if have_out == out.len() - 20 {
            assert_eq!((got_out.len(), got_err.len(), lost), (20, 30, 0));
        }
        if have_out == out.len() {
            assert!(got_out.is_empty(), "nothing of a stream already whole");
        }
    }
}
