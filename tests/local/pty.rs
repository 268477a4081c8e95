//! PTY execs through the real agent, and the CLI's terminal handling driven
//! through a real terminal: tmux, whose `send-keys C-c` is exactly a user's
//! Ctrl-C (the pane's line discipline signals the foreground process, or in
//! raw mode passes the byte on).

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use silo::client::ExecEvent;
use silo_protocol::exec::{ExecSpec, WindowSize};
use silo_tests::{Cli, TestAgent, pids_running, pids_with_cmdline, text};

fn tty(argv: &[&str], window: WindowSize) -> ExecSpec {
    ExecSpec {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        tty: true,
        window: Some(window),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_pty_exec_sees_a_terminal_and_only_a_pty_exec_does() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let out = conn
        .run(tty(
            &["sh", "-c", "tty; echo err >&2"],
            WindowSize::default(),
        ))
        .await
        .unwrap();
    let shown = text(&out.stdout);
    assert!(shown.starts_with("/dev/pts/"), "{shown:?}");
    assert!(
        shown.contains("err"),
        "stderr shares the terminal: {shown:?}"
    );
    assert!(out.stderr.is_empty());
    assert_eq!(out.exit.code, Some(0));

    let out = conn.run(silo_tests::sh("tty")).await.unwrap();
    assert_eq!(text(&out.stdout), "not a tty\n");
    assert_eq!(out.exit.code, Some(1));
}

#[tokio::test]
async fn stty_sees_the_window_and_its_resize() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let mut exec = conn
        .exec(tty(
            &["sh", "-c", "stty size; read line; stty size"],
            WindowSize { rows: 24, cols: 80 },
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !text(&seen).contains("24 80") {
        match exec.next_event().await.unwrap() {
            ExecEvent::Output { data, .. } => seen.extend(data),
            ExecEvent::Exit(exit) => panic!("exited early: {exit:?} {}", text(&seen)),
        }
    }
    exec.resize(WindowSize {
        rows: 50,
        cols: 132,
    })
    .await
    .unwrap();
    exec.write_stdin(b"\n").await.unwrap();
    let rest = exec.collect().await.unwrap();
    assert!(
        text(&rest.stdout).contains("50 132"),
        "{}",
        text(&rest.stdout)
    );
    assert_eq!(rest.exit.code, Some(0));
}

#[tokio::test]
async fn ctrl_c_is_a_byte_the_line_discipline_turns_into_sigint() {
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await.unwrap();
    let mut exec = conn
        .exec(tty(
            &["sh", "-c", "echo ready; exec sleep 100.3232"],
            WindowSize::default(),
        ))
        .await
        .unwrap();
    assert!(matches!(
        exec.next_event().await,
        Some(ExecEvent::Output { .. })
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids_with_cmdline("sleep 100.3232").is_empty() {
        assert!(Instant::now() < deadline, "sleep never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    exec.write_stdin(&[0x03]).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), exec.collect())
        .await
        .expect("the byte interrupts")
        .unwrap();
    assert_eq!(out.exit.signal, Some(2), "{:?}", out.exit);
    assert!(!out.exit.interrupted, "no in-band interrupt was needed");
}

#[test]
fn cli_exec_t_gives_the_command_a_terminal() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    assert!(
        cli.ok(&["exec", "-t", "box", "--", "tty"])
            .starts_with("/dev/pts/")
    );
    assert_eq!(
        cli.run(&["exec", "box", "--", "tty"]).status.code(),
        Some(1)
    );
}

/// A private tmux server, killed on drop.
struct Tmux {
    socket: String,
    dir: tempfile::TempDir,
}

impl Tmux {
    /// `None` (the test is skipped) when tmux is not installed; in CI,
    /// which installs it, its absence fails the test.
    fn start(command: &str) -> Option<Self> {
        if Command::new("tmux").arg("-V").output().is_err() {
            assert!(
                !silo_tests::docker::in_ci(),
                "tmux is not installed (CI installs it)"
            );
            eprintln!("skipped: tmux is not installed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let socket = format!("silo-test-{}-{n}", std::process::id());
        let tmux = Self { socket, dir };
        let script = format!(
            "{command}; echo $? > {}; sleep 60",
            tmux.rc_file().display()
        );
        let status = tmux
            .cmd(&[
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "100",
                "-y",
                "30",
                "-s",
                "t",
            ])
            .arg(script)
            .status()
            .unwrap();
        assert!(status.success());
        Some(tmux)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &self.socket]).args(args);
        cmd
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status().unwrap().success());
    }

    fn resize(&self, cols: u16, rows: u16) {
        let (x, y) = (cols.to_string(), rows.to_string());
        let status = self
            .cmd(&["resize-window", "-t", "t", "-x", &x, "-y", &y])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn screen(&self) -> String {
        text(
            &self
                .cmd(&["capture-pane", "-p", "-t", "t"])
                .output()
                .unwrap()
                .stdout,
        )
    }

    fn rc_file(&self) -> PathBuf {
        self.dir.path().join("rc")
    }

    /// The exit code of the command in the pane, once it has one.
    fn exit_code(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(code) = std::fs::read_to_string(self.rc_file())
                && let Ok(code) = code.trim().parse()
            {
                return code;
            }
            assert!(
                Instant::now() < deadline,
                "no exit code; screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for_screen(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.screen().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} never shown:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).status();
    }
}

/// `silo ARGS` as a shell command line for the pane, with the CLI's
/// environment (its shared state's URL, when it has one).
fn silo_line(cli: &Cli, args: &str) -> String {
    let env: String = cli
        .env
        .iter()
        .map(|(name, value)| format!("{name}='{value}' "))
        .collect();
    format!(
        "env -u SILO_AGENT {env}SILO_HOME={} {} {args}",
        cli.home.path().display(),
        std::path::Path::new(crate::SILO).display()
    )
}

/// Whether `sleep SECS` runs (the pane's shell and tmux only mention it).
fn sleeping(secs: &str) -> bool {
    !pids_running(&["sleep", secs]).is_empty()
}

fn wait_for_sleep(secs: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !sleeping(secs) {
        assert!(Instant::now() < deadline, "sleep {secs} never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_in_a_terminal_interrupts_silo_exec_which_exits_130() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    let Some(tmux) = Tmux::start(&silo_line(&cli, "exec box -- sleep 100.6161")) else {
        return;
    };
    wait_for_sleep("100.6161");
    tmux.keys(&["C-c"]);
    assert_eq!(tmux.exit_code(), 130);
    assert!(!sleeping("100.6161"), "the command was interrupted");
    // The sandbox takes the next command at once.
    assert_eq!(cli.ok(&["exec", "box", "--", "echo", "next"]), "next\n");
}

#[test]
fn ctrl_c_interrupts_a_session_command_in_a_terminal_and_the_session_keeps_its_cwd() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    cli.ok(&["exec", "--session", "s", "box", "--", "cd /tmp"]);
    let Some(tmux) = Tmux::start(&silo_line(&cli, "exec --session s box -- 'sleep 100.6262'"))
    else {
        return;
    };
    wait_for_sleep("100.6262");
    tmux.keys(&["C-c"]);
    assert_eq!(tmux.exit_code(), 130);
    assert_eq!(
        cli.ok(&["exec", "--session", "s", "box", "--", "pwd"]),
        "/tmp\n"
    );
}

#[test]
fn exec_it_is_raw_follows_the_window_and_passes_ctrl_c_through() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    let line = silo_line(
        &cli,
        "exec -it box -- sh -c 'stty size; read line; stty size; exec sleep 100.6363'",
    );
    let Some(tmux) = Tmux::start(&line) else {
        return;
    };
    tmux.wait_for_screen("30 100");
    tmux.resize(120, 40);
    // Give SIGWINCH a moment to travel before the read returns.
    std::thread::sleep(Duration::from_millis(300));
    tmux.keys(&["Enter"]);
    tmux.wait_for_screen("40 120");
    wait_for_sleep("100.6363");
    tmux.keys(&["C-c"]);
    assert_eq!(tmux.exit_code(), 130);
    // The local terminal is cooked again: the shell in the pane echoes input.
    tmux.keys(&["-l", "typed-after"]);
    tmux.wait_for_screen("typed-after");
}

#[test]
fn silo_shell_starts_from_a_sessions_state() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "box"]);
    cli.ok(&[
        "exec",
        "--session",
        "s",
        "box",
        "--",
        "cd /tmp && export MARK=from-session",
    ]);
    let Some(tmux) = Tmux::start(&silo_line(&cli, "shell box --session s")) else {
        return;
    };
    tmux.keys(&["-l", "echo \"at=$(pwd) mark=$MARK\""]);
    tmux.keys(&["Enter"]);
    tmux.wait_for_screen("at=/tmp mark=from-session");
    tmux.keys(&["-l", "exit 3"]);
    tmux.keys(&["Enter"]);
    assert_eq!(tmux.exit_code(), 3);
}
