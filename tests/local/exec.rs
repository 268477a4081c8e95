//! Exec through the real agent: streaming, exit codes, multiplexing, stdin,
//! timeouts and interrupts.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo::client::{ExecEvent, ExecOutput};
use silo_protocol::exec::{ExecSpec, ExecState};
use silo_tests::{TestAgent, sh, text};

#[tokio::test]
async fn exit_codes_and_separate_streams() {
    let agent = TestAgent::start().await;
    let out = agent
        .client()
        .run(sh("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(out.exit.code, Some(3));
    assert!(!out.exit.interrupted && !out.exit.timed_out);

    let out = agent.client().run(sh("kill -TERM $$")).await.unwrap();
    assert_eq!((out.exit.code, out.exit.signal), (None, Some(15)));
    assert_eq!(out.exit.shell_code(), 143);
}

#[tokio::test]
async fn runs_in_the_default_workdir_and_honours_cwd_and_env() {
    let agent = TestAgent::start().await;
    let out = agent.client().run(sh("pwd")).await.unwrap();
    assert_eq!(
        text(&out.stdout).trim(),
        agent.workdir().canonicalize().unwrap().to_str().unwrap()
    );

    let mut spec = sh("pwd; echo $GREETING; echo ${SILO_AGENT_KEY:-no-key}");
    spec.cwd = Some("/tmp".into());
    spec.env.insert("GREETING".into(), "hello".into());
    let out = agent.client().run(spec).await.unwrap();
    assert_eq!(text(&out.stdout), "/tmp\nhello\nno-key\n");
}

#[tokio::test]
async fn a_missing_program_is_a_clear_error_not_a_hang() {
    let agent = TestAgent::start().await;
    let spec = ExecSpec {
        argv: vec!["/no/such/program".into()],
        ..Default::default()
    };
    let err = agent.client().run(spec).await.unwrap_err();
    assert!(err.to_string().contains("/no/such/program"), "{err}");
    // The connection and agent are fine afterwards.
    assert_eq!(
        agent.client().run(sh("exit 0")).await.unwrap().exit.code,
        Some(0)
    );
}

#[tokio::test]
async fn output_streams_while_the_command_runs() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let started = Instant::now();
    let mut exec = conn
        .exec(sh("echo first; sleep 1; echo second"))
        .await
        .unwrap();
    let first = exec.next_event().await.unwrap();
    let first_at = started.elapsed();
    assert!(
        matches!(&first, ExecEvent::Output { offset: 0, data, .. } if data == b"first\n"),
        "{first:?}"
    );
    assert!(
        first_at < Duration::from_millis(700),
        "first line took {first_at:?}"
    );
    let rest = exec.collect().await.unwrap();
    assert_eq!(text(&rest.stdout), "second\n");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[tokio::test]
async fn many_execs_share_one_connection() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let runs = (0..32).map(|i| {
        let conn = conn.clone();
        async move {
            (
                i,
                conn.run(sh(&format!("sleep 0.0{}; echo {i}; exit {}", i % 3, i % 7)))
                    .await,
            )
        }
    });
    for (i, result) in futures_util::future::join_all(runs).await {
        let out: ExecOutput = result.unwrap();
        assert_eq!(text(&out.stdout), format!("{i}\n"));
        assert_eq!(out.exit.code, Some(i % 7));
    }
}

#[tokio::test]
async fn concurrent_execs_each_get_exactly_their_own_output() {
    // The agent's pumps all read through one buffer per thread: full reads
    // on many pipes at once must still land whole in the right exec.
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let runs = ["a", "b", "c", "d"].map(|letter| {
        let conn = conn.clone();
        async move {
            let upper = letter.to_uppercase();
            let script =
                format!("yes {letter} | head -c 262144 & yes {upper} | head -c 131072 >&2; wait");
            (letter, upper, conn.run(sh(&script)).await)
        }
    });
    for (letter, upper, result) in futures_util::future::join_all(runs).await {
        let out = result.unwrap();
        assert_eq!(text(&out.stdout), format!("{letter}\n").repeat(131_072));
        assert_eq!(text(&out.stderr), format!("{upper}\n").repeat(65_536));
        assert_eq!(out.exit.code, Some(0));
    }
}

#[tokio::test]
async fn stdin_is_closed_unless_asked_for() {
    let agent = TestAgent::start().await;
    // A program waiting on stdin must not hang when nobody attached stdin.
    let out = tokio::time::timeout(
        Duration::from_secs(5),
        agent.client().run(ExecSpec {
            argv: vec!["cat".into()],
            ..Default::default()
        }),
    )
    .await
    .expect("cat with closed stdin must end")
    .unwrap();
    assert_eq!(out.exit.code, Some(0));
    assert!(out.stdout.is_empty());

    let conn = agent.client().connect().await.unwrap();
    let exec = conn
        .exec(ExecSpec {
            argv: vec!["cat".into()],
            stdin: true,
            ..Default::default()
        })
        .await
        .unwrap();
    exec.write_stdin(b"hello ").await.unwrap();
    exec.write_stdin(&vec![b'x'; 200_000]).await.unwrap();
    exec.close_stdin().await.unwrap();
    let out = exec.collect().await.unwrap();
    assert_eq!(out.stdout.len(), 6 + 200_000);
    assert!(out.stdout.starts_with(b"hello x"));
}

#[tokio::test]
async fn timeout_interrupts_the_command() {
    let agent = TestAgent::start().await;
    let mut spec = sh("sleep 100");
    spec.timeout_ms = Some(300);
    let started = Instant::now();
    let out = agent.client().run(spec).await.unwrap();
    assert!(out.exit.timed_out, "{:?}", out.exit);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn interrupt_stops_sleep_promptly() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let exec = conn
        .exec(ExecSpec {
            argv: vec!["sleep".into(), "100".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let asked = Instant::now();
    assert_eq!(exec.interrupt(None).await.unwrap(), ExecState::Running);
    let out = exec.collect().await.unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "took {:?}",
        asked.elapsed()
    );
    assert!(out.exit.interrupted);
    assert_eq!(
        out.exit.signal,
        Some(2),
        "sleep dies of SIGINT: {:?}",
        out.exit
    );
}

#[tokio::test]
async fn interrupt_escalates_to_kill_after_the_grace() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    // An ignored SIGINT is inherited across exec, so the whole group ignores it.
    let mut exec = conn
        .exec(sh("trap '' INT; echo armed; sleep 100"))
        .await
        .unwrap();
    assert!(matches!(
        exec.next_event().await,
        Some(ExecEvent::Output { .. })
    ));
    let asked = Instant::now();
    exec.interrupt(Some(Duration::from_millis(800)))
        .await
        .unwrap();
    let out = exec.collect().await.unwrap();
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(750),
        "killed before the grace ended: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(out.exit.signal, Some(9));
    assert!(out.exit.interrupted);
}

#[tokio::test]
async fn interrupt_kills_descendants_that_escaped_with_setsid() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let mut exec = conn
        .exec(sh("setsid sleep 300 & echo $!; sleep 100"))
        .await
        .unwrap();
    let Some(ExecEvent::Output { data, .. }) = exec.next_event().await else {
        panic!("no pid printed")
    };
    let escaped: u32 = text(&data).trim().parse().unwrap();
    assert!(silo_tests::process_alive(escaped));
    exec.interrupt(Some(Duration::from_millis(200)))
        .await
        .unwrap();
    exec.collect().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while silo_tests::process_alive(escaped) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !silo_tests::process_alive(escaped),
        "the setsid grandchild {escaped} survived"
    );
}

#[tokio::test]
async fn interrupting_finished_or_unknown_execs_is_harmless() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let exec = conn.exec(sh("true")).await.unwrap();
    let id = exec.id();
    exec.collect().await.unwrap();
    assert_eq!(conn.interrupt(id, None).await.unwrap(), ExecState::Finished);
    assert_eq!(
        conn.interrupt(u64::MAX - 1, None).await.unwrap(),
        ExecState::Unknown
    );
    assert_eq!(
        conn.run(sh("echo still-fine")).await.unwrap().stdout,
        b"still-fine\n"
    );
}
