//! Shell sessions through the real agent: state that persists between runs,
//! clean streams and exit codes, one run at a time, interrupt that keeps the
//! shell, restore of a dead shell, and re-attach. The CLI tests at the end
//! run each command as a new `silo` process.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo::client::{ClientError, ExecConnection, ExecEvent, ExecOutput, SessionOptions};
use silo_protocol::exec::{ErrorKind, ExecSpec};
use silo_tests::{TestAgent, pids_running, text};

/// A run of `script` in session `id`.
fn in_session(id: &str, script: &str) -> ExecSpec {
    ExecSpec {
        argv: vec![script.into()],
        session: Some(id.into()),
        ..Default::default()
    }
}

async fn run(conn: &ExecConnection, id: &str, script: &str) -> ExecOutput {
    conn.run(in_session(id, script)).await.unwrap()
}

/// Waits for a process whose command line holds `needle` to come and go.
async fn wait_for_process(command: &str, present: bool) {
    // The exact argument vector: a shell whose script merely mentions the
    // command (`sh -c "trap '' INT; sleep …"`) must not count, or the wait
    // ends before that shell has even set its trap.
    let argv: Vec<&str> = command.split(' ').collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids_running(&argv).is_empty() == present {
        assert!(
            Instant::now() < deadline,
            "{command} never {}",
            if present { "started" } else { "went away" }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn cwd_environment_and_variables_persist_with_clean_streams() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let first = run(
        &conn,
        "s",
        "cd /tmp; export FOO=bar; x=5; f() { echo \"f:$1\"; }",
    )
    .await;
    assert_eq!(first.exit.code, Some(0));
    assert!(
        first.stdout.is_empty() && first.stderr.is_empty(),
        "{first:?}"
    );

    // A new connection, as another client would make.
    let conn = agent.client().connect().await.unwrap();
    let out = run(
        &conn,
        "s",
        "pwd; echo \"$FOO $x\"; f 1; echo oops >&2; return 3",
    )
    .await;
    assert_eq!(text(&out.stdout), "/tmp\nbar 5\nf:1\n");
    assert_eq!(
        text(&out.stderr),
        "oops\n",
        "nothing but the run's own stderr"
    );
    assert_eq!(out.exit.code, Some(3));
    assert!(!out.exit.restored && !out.exit.interrupted);

    // Another session is another shell.
    let other = run(&conn, "t", "echo \"[${FOO:-unset}]\"").await;
    assert_eq!(text(&other.stdout), "[unset]\n");
}

#[tokio::test]
async fn heredocs_multiline_scripts_and_quotes_work() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let script = "name='it'\"'\"'s'\ncat <<EOF\nhello $name!\n  'single' \"double\" \\$HOME\nEOF\ncat <<'RAW'\n$name `untouched`\nRAW\nfor i in 1 2; do\n  echo \"line $i\"\ndone\n";
    let out = run(&conn, "h", script).await;
    assert_eq!(
        text(&out.stdout),
        "hello it's!\n  'single' \"double\" $HOME\n$name `untouched`\nline 1\nline 2\n"
    );
    assert_eq!(out.exit.code, Some(0));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    // Several words are a command and its arguments, each passed as it is.
    let spec = ExecSpec {
        argv: vec![
            "echo".into(),
            "a".into(),
            "&&".into(),
            "echo".into(),
            "b".into(),
        ],
        session: Some("h".into()),
        ..Default::default()
    };
    assert_eq!(text(&conn.run(spec).await.unwrap().stdout), "a && echo b\n");
}

#[tokio::test]
async fn stdin_reads_eof_unless_attached() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), run(&conn, "in", "cat; echo rc=$?"))
        .await
        .expect("cat must see EOF at once");
    assert_eq!(text(&out.stdout), "rc=0\n");

    let mut spec = in_session("in", "tr a-z A-Z");
    spec.stdin = true;
    let exec = conn.exec(spec).await.unwrap();
    exec.write_stdin(b"piped ").await.unwrap();
    exec.write_stdin(b"in\n").await.unwrap();
    exec.close_stdin().await.unwrap();
    assert_eq!(text(&exec.collect().await.unwrap().stdout), "PIPED IN\n");
}

#[tokio::test]
async fn interrupting_sleep_is_prompt_and_keeps_the_shell_and_its_cwd() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let shell_pid = text(&run(&conn, "i", "cd /tmp; echo $$").await.stdout);
    let exec = conn
        .exec(in_session("i", "sleep 100.2323; echo never"))
        .await
        .unwrap();
    wait_for_process("sleep 100.2323", true).await;
    let sent = Instant::now();
    exec.interrupt(None).await.unwrap();
    let out = exec.collect().await.unwrap();
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(1), "interrupt took {took:?}");
    assert_eq!(out.exit.shell_code(), 130, "{:?}", out.exit);
    assert!(out.exit.interrupted && !out.exit.restored);
    assert!(out.stdout.is_empty(), "the rest of the script did not run");
    wait_for_process("sleep 100.2323", false).await;

    let after = run(&conn, "i", "pwd; echo $$").await;
    assert_eq!(
        text(&after.stdout),
        format!("/tmp\n{shell_pid}"),
        "same shell, same cwd"
    );
}

#[tokio::test]
async fn a_command_ignoring_sigint_is_killed_at_the_grace_and_the_session_survives() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let shell_pid = text(
        &run(&conn, "g", "cd /tmp; export KEEP=1; echo $$")
            .await
            .stdout,
    );
    let exec = conn
        .exec(in_session("g", "sh -c \"trap '' INT; sleep 100.4343\""))
        .await
        .unwrap();
    wait_for_process("sleep 100.4343", true).await;
    let grace = Duration::from_millis(400);
    let sent = Instant::now();
    exec.interrupt(Some(grace)).await.unwrap();
    let out = exec.collect().await.unwrap();
    let took = sent.elapsed();
    assert!(took >= grace, "killed before the grace: {took:?}");
    assert!(took < grace + Duration::from_secs(2), "took {took:?}");
    assert!(out.exit.interrupted && !out.exit.restored, "{:?}", out.exit);
    wait_for_process("sleep 100.4343", false).await;

    let after = run(&conn, "g", "pwd; echo $KEEP; echo $$").await;
    assert_eq!(text(&after.stdout), format!("/tmp\n1\n{shell_pid}"));
}

#[tokio::test]
async fn a_shell_that_will_not_stop_is_restarted_with_its_cwd_and_environment() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    run(&conn, "w", "cd /tmp; export KEEP=kept; unexported=gone").await;
    // The shell itself ignores SIGINT and never comes back to its prompt.
    let exec = conn
        .exec(in_session("w", "trap '' INT; while :; do :; done"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    exec.interrupt(Some(Duration::from_millis(200)))
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), exec.collect())
        .await
        .expect("the stuck shell is killed")
        .unwrap();
    assert!(out.exit.restored && out.exit.interrupted, "{:?}", out.exit);
    assert_eq!(out.exit.signal, Some(9));

    let after = run(&conn, "w", "pwd; echo \"$KEEP [${unexported:-}]\"; trap").await;
    assert_eq!(
        text(&after.stdout),
        "/tmp\nkept []\n",
        "cwd and exports survive, plain variables and traps do not"
    );
    assert!(!after.exit.restored, "the restart was reported once");
}

#[tokio::test]
async fn a_killed_shell_is_restored_on_the_next_run() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let pid: u32 = text(
        &run(&conn, "k", "cd /tmp; export FOO=bar; echo $$")
            .await
            .stdout,
    )
    .trim()
    .parse()
    .unwrap();
    silo_tests::signal(pid, nix::sys::signal::Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while silo_tests::process_alive(pid) {
        assert!(Instant::now() < deadline, "the shell did not die");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = run(&conn, "k", "pwd; echo $FOO; echo $$").await;
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines[..2], ["/tmp", "bar"]);
    assert_ne!(lines[2], pid.to_string(), "a new shell");
    assert!(out.exit.restored, "{:?}", out.exit);

    // `exit` ends the shell too: the run gets its code, the next run a new shell.
    let out = run(&conn, "k", "exit 7").await;
    assert_eq!(out.exit.code, Some(7));
    assert!(out.exit.restored);
    assert_eq!(text(&run(&conn, "k", "pwd").await.stdout), "/tmp\n");
}

#[tokio::test]
async fn commands_run_one_at_a_time_and_idle_interrupts_are_no_ops() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    assert_eq!(
        conn.interrupt_session("q", None).await.ok(),
        None,
        "unknown session"
    );
    run(&conn, "q", "true").await;
    assert_eq!(
        conn.interrupt_session("q", None).await.unwrap(),
        None,
        "idle: nothing to do"
    );

    let first = conn
        .exec(in_session("q", "sleep 0.5; echo first"))
        .await
        .unwrap();
    let mut refuse = in_session("q", "echo never");
    refuse.no_wait = true;
    match conn.exec(refuse).await {
        Err(ClientError::Agent { kind, .. }) => assert_eq!(kind, ErrorKind::Busy),
        other => panic!("expected busy, got {:?}", other.map(|h| h.id())),
    }
    let second = conn.exec(in_session("q", "echo second")).await.unwrap();
    let info = conn.list_sessions().await.unwrap();
    assert_eq!(info[0].running, Some(first.id()));
    assert_eq!(info[0].queued, 1);
    let first = first.collect().await.unwrap();
    let second = second.collect().await.unwrap();
    assert_eq!(text(&first.stdout), "first\n");
    assert_eq!(text(&second.stdout), "second\n");
    assert!(first.exit.duration_ms >= 500);
}

#[tokio::test]
async fn a_session_run_can_be_reattached_from_another_connection() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let mut exec = conn
        .exec(in_session(
            "r",
            "for i in 1 2 3; do echo $i; sleep 0.2; done",
        ))
        .await
        .unwrap();
    let id = exec.id();
    assert!(matches!(
        exec.next_event().await,
        Some(ExecEvent::Output { .. })
    ));
    drop(exec);
    drop(conn);
    let conn = agent.client().connect().await.unwrap();
    let (exec, lost) = conn.attach(id, 0).await.unwrap();
    assert_eq!(lost, 0);
    let out = exec.collect().await.unwrap();
    assert_eq!(text(&out.stdout), "1\n2\n3\n");
}

#[tokio::test]
async fn sessions_are_opened_listed_and_closed() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let options = SessionOptions {
        cwd: Some("/tmp".into()),
        env: [("GREETING".to_owned(), "hi".to_owned())].into(),
        ..Default::default()
    };
    let (info, created) = conn.open_session("o", options.clone()).await.unwrap();
    assert!(created && info.pid.is_some());
    assert_eq!(info.cwd, "/tmp");
    let (_, created) = conn.open_session("o", options).await.unwrap();
    assert!(!created);
    assert_eq!(
        text(&run(&conn, "o", "pwd; echo $GREETING").await.stdout),
        "/tmp\nhi\n"
    );
    assert!(
        conn.open_session("bad id", SessionOptions::default())
            .await
            .is_err()
    );

    let long = conn.exec(in_session("o", "sleep 100.5656")).await.unwrap();
    wait_for_process("sleep 100.5656", true).await;
    assert_eq!(conn.list_sessions().await.unwrap().len(), 1);
    assert!(conn.close_session("o").await.unwrap());
    let out = tokio::time::timeout(Duration::from_secs(10), long.collect())
        .await
        .expect("closing ends the running command")
        .unwrap();
    assert!(out.exit.interrupted, "{:?}", out.exit);
    wait_for_process("sleep 100.5656", false).await;
    assert!(!conn.close_session("o").await.unwrap());
    assert!(conn.list_sessions().await.unwrap().is_empty());
}

/// A POSIX shell the sessions must work with: dash, or busybox ash (what
/// minimal images ship). Missing is a skip outside CI and a failure in it.
fn posix_shell(name: &str, program: &str) -> Option<std::path::PathBuf> {
    let Ok(path) = which(program) else {
        assert!(
            !silo_tests::docker::in_ci(),
            "{program} is not installed (CI installs it)"
        );
        eprintln!("skipped: {program} is not installed");
        return None;
    };
    if name == "ash" {
        // busybox picks its applet from argv[0]: a link named `sh` runs ash.
        let dir = tempfile::tempdir().unwrap().keep();
        let link = dir.join("sh");
        std::os::unix::fs::symlink(path, &link).unwrap();
        return Some(link);
    }
    Some(path)
}

fn which(program: &str) -> Result<std::path::PathBuf, ()> {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .map_err(|_| ())?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() && !path.is_empty() {
        Ok(path.into())
    } else {
        Err(())
    }
}

#[tokio::test]
async fn posix_sh_sessions_survive_an_interrupt_with_everything_kept() {
    for (name, program) in [("dash", "dash"), ("ash", "busybox")] {
        let Some(shell) = posix_shell(name, program) else {
            continue;
        };
        let agent = TestAgent::start().await;
        let conn = agent.client().connect().await.unwrap();
        let options = SessionOptions {
            shell: Some(shell.display().to_string()),
            ..Default::default()
        };
        let (info, _) = conn.open_session("d", options).await.unwrap();
        assert_eq!(info.shell, shell.display().to_string());
        run(
            &conn,
            "d",
            "cd /tmp; export FOO=bar; LOCAL=kept; greet() { echo hi $1; }",
        )
        .await;
        let out = run(&conn, "d", "pwd; echo $FOO; echo err >&2; false").await;
        assert_eq!(text(&out.stdout), "/tmp\nbar\n", "{name}");
        assert_eq!(text(&out.stderr), "err\n", "{name}");
        assert_eq!(out.exit.code, Some(1), "{name}");
        let exec = conn.exec(in_session("d", "sleep 100.7878")).await.unwrap();
        wait_for_process("sleep 100.7878", true).await;
        let asked = Instant::now();
        exec.interrupt(None).await.unwrap();
        let out = exec.collect().await.unwrap();
        assert_eq!(out.exit.shell_code(), 130, "{name}: {:?}", out.exit);
        assert!(!out.exit.restored, "{name}: the shell itself survived");
        // The default grace is 2 s; a shell that came back is far quicker.
        assert!(
            asked.elapsed() < Duration::from_millis(1500),
            "{name}: {:?}",
            asked.elapsed()
        );
        let out = run(&conn, "d", "pwd; echo $FOO $LOCAL; greet there").await;
        assert_eq!(text(&out.stdout), "/tmp\nbar kept\nhi there\n", "{name}");
        assert_eq!(conn.list_sessions().await.unwrap()[0].restarts, 0, "{name}");
    }
}

#[test]
fn cli_sessions_persist_across_silo_processes() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    let exec = |script: &str| cli.run(&["exec", "--session", "work", "box", "--", script]);
    let out = exec("cd /tmp && export FOO=bar");
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    // Each call is a brand-new silo process.
    assert_eq!(
        cli.ok(&["exec", "--session", "work", "box", "--", "pwd"]),
        "/tmp\n"
    );
    assert_eq!(
        cli.ok(&["exec", "--session", "work", "box", "--", "echo $FOO"]),
        "bar\n"
    );
    // Several words are a command and its arguments, as without a session.
    let argv = ["sh", "-c", "echo \"[$FOO]\""];
    let plain = cli.ok(&[&["exec", "box", "--"][..], &argv].concat());
    let in_session = cli.ok(&[&["exec", "--session", "work", "box", "--"][..], &argv].concat());
    assert_eq!(
        in_session, "[bar]\n",
        "the session's exported FOO is inherited"
    );
    assert_eq!(plain, "[]\n");
    assert_eq!(
        cli.ok(&["exec", "--session", "work", "box", "--", "echo", "$FOO"]),
        "$FOO\n",
        "an argument is passed as it is, not expanded by the session's shell"
    );
    let out = exec("echo to-err >&2; return 4");
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(text(&out.stderr), "to-err\n");

    let listed = cli.ok(&["session", "ls", "box", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["id"], "work");
    assert_eq!(listed[0]["cwd"], "/tmp");
    cli.ok(&["session", "close", "box", "work"]);
    assert_eq!(
        cli.run(&["session", "close", "box", "work"]).status.code(),
        Some(1)
    );
}

#[test]
fn cli_ctrl_c_interrupts_a_session_command_and_keeps_the_session() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    cli.ok(&["exec", "--session", "s", "box", "--", "cd /tmp"]);
    let child = cli
        .command(&[
            "exec",
            "--session",
            "s",
            "box",
            "--",
            "sleep 100.9191; echo never",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Matched exactly: the silo process's own command line mentions it too.
    while pids_running(&["sleep", "100.9191"]).is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    silo_tests::signal(child.id(), nix::sys::signal::Signal::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert!(out.stdout.is_empty());
    assert_eq!(
        cli.ok(&["exec", "--session", "s", "box", "--", "pwd"]),
        "/tmp\n"
    );
    assert!(pids_running(&["sleep", "100.9191"]).is_empty());
}

#[tokio::test]
async fn ctrl_c_in_a_busybox_sandbox_keeps_the_session_and_its_state() {
    let Some(_engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "bb", "--image", silo_tests::docker::BASE_IMAGE]);
    let exec = |script: &str| cli.ok(&["exec", "--session", "s", "bb", "--", script]);
    exec("cd /tmp; x=5; f() { echo \"f:$1\"; }");
    let child = cli
        .command(&[
            "exec",
            "--session",
            "s",
            "bb",
            "--",
            "sleep 100.9292; echo never",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // The sandbox's processes are visible from the host.
    while pids_running(&["sleep", "100.9292"]).is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = Instant::now();
    silo_tests::signal(child.id(), nix::sys::signal::Signal::SIGINT);
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    // Generous: a shell that is killed and restarted costs the grace (2 s) first.
    assert!(took < Duration::from_secs(2), "interrupt took {took:?}");
    assert!(out.stdout.is_empty());
    assert_eq!(exec("pwd; echo $x; f kept"), "/tmp\n5\nf:kept\n");
}

#[test]
fn session_ls_shows_the_running_command() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    let mut child = cli
        .command(&["exec", "--session", "s", "box", "--", "sleep 100.3131"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids_running(&["sleep", "100.3131"]).is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let table = cli.ok(&["session", "ls", "box"]);
    assert!(table.contains("sleep 100.3131"), "{table}");
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["session", "ls", "box", "--json"])).unwrap();
    assert_eq!(listed[0]["command"], "sleep 100.3131", "{listed}");
    cli.ok(&["session", "interrupt", "box", "s"]);
    let _ = child.wait();
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["session", "ls", "box", "--json"])).unwrap();
    assert!(listed[0].get("command").is_none(), "{listed}");
}
