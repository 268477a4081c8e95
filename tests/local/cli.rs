//! The `silo` CLI on the local backend, one real process per command: each
//! call is a brand-new controller process finding the sandbox that an earlier
//! one made.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_tests::Cli;
use silo_tests::json;

#[test]
fn create_exec_ls_events_rm_across_processes() {
    let cli = crate::cli();
    let created = json(&cli.ok(&["create", "--backend", "local", "--name", "alpha", "--json"]));
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sbx-"), "{created}");

    // A new process finds the sandbox the previous one made; the agent outlived its creator.
    assert_eq!(
        cli.ok(&["exec", "alpha", "--", "sh", "-c", "echo hello > f; cat f"]),
        "hello\n"
    );
    assert_eq!(cli.ok(&["exec", &id, "--", "cat", "f"]), "hello\n");

    let out = cli.run(&[
        "exec",
        "alpha",
        "--env",
        "X=42",
        "--",
        "sh",
        "-c",
        "echo $X >&2; exit 5",
    ]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "silo exec returns the command's code"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "42\n");

    let listed = json(&cli.ok(&["ls", "--json"]));
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "alpha")
        .expect("alpha listed");
    assert_eq!(entry["id"], id.as_str());
    assert_eq!(entry["backend"], "local");

    cli.ok(&["rm", "alpha"]);
    assert!(
        !json(&cli.ok(&["ls", "--json"]))
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "alpha")
    );
    let events = cli.ok(&["events", &id, "--json"]);
    let kinds: Vec<String> = json(&events)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("created"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("removed"),
        "events outlive the sandbox: {kinds:?}"
    );
}

#[test]
fn stop_and_start_keep_the_sandbox_files() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "beta"]);
    cli.ok(&["exec", "beta", "--", "sh", "-c", "echo kept > marker"]);
    cli.ok(&["stop", "beta"]);
    let out = cli.run(&["exec", "beta", "--", "true"]);
    assert!(!out.status.success(), "exec on a stopped sandbox must fail");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("beta"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cli.ok(&["start", "beta"]), "started beta\n");
    assert_eq!(cli.ok(&["exec", "beta", "--", "cat", "marker"]), "kept\n");
    assert_eq!(
        cli.ok(&["start", "beta"]),
        "beta was already running\n",
        "a start that found it running says so"
    );
}

#[test]
fn unknown_sandboxes_and_taken_names_are_clear_errors() {
    let cli = crate::cli();
    let out = cli.run(&["exec", "nope", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope"), "error names the sandbox: {err}");

    cli.ok(&["create", "--backend", "local", "--name", "gamma"]);
    let out = cli.run(&["create", "--backend", "local", "--name", "gamma"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gamma"));
    // The refused create left the first sandbox alone.
    assert_eq!(cli.ok(&["exec", "gamma", "--", "echo", "ok"]), "ok\n");

    let out = cli.run(&["create", "--backend", "local", "--name", "../evil"]);
    assert!(!out.status.success(), "path-like names are refused");

    // Snapshots need a backend that has them; the refusal says which does.
    let out = cli.run(&["snapshot", "gamma"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("local backend") && err.contains("docker"),
        "{err}"
    );
    let out = cli.run(&["snapshot", "nope"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    let out = cli.run(&["fork", "snap-000000000000", "--name", "delta"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown snapshot"));
    assert_eq!(cli.ok(&["snapshots", "--json"]).trim(), "[]");
    assert_eq!(cli.ok(&["exec", "gamma", "--", "echo", "ok"]), "ok\n");
}

#[test]
fn ctrl_c_interrupts_the_command_not_the_sandbox() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "delta"]);
    let mut child = cli
        .command(&["exec", "delta", "--", "sleep", "100.4242"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    // What a terminal does on Ctrl-C: SIGINT to the CLI process.
    silo_tests::signal(child.id(), nix::sys::signal::Signal::SIGINT);
    let sent = Instant::now();
    let deadline = sent + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "silo exec did not return after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    assert!(sent.elapsed() < Duration::from_secs(3));
    // The sandbox is fine and nothing is left running in it.
    assert_eq!(cli.ok(&["exec", "delta", "--", "echo", "fine"]), "fine\n");
    // The local backend shares the host's process table, so look there.
    assert!(
        silo_tests::pids_with_cmdline("100.4242").is_empty(),
        "the interrupted sleep survived"
    );
}

#[test]
fn missing_and_unexecutable_commands_exit_as_a_shell_does() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "shellish"]);
    let out = cli.run(&["exec", "shellish", "--", "no-such-command-here"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.contains("no-such-command-here: command not found"),
        "{err}"
    );

    cli.ok(&[
        "exec",
        "shellish",
        "--",
        "sh",
        "-c",
        "echo echo hi > plain && chmod 0644 plain",
    ]);
    let out = cli.run(&["exec", "shellish", "--", "./plain"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("./plain: cannot execute"), "{err}");
}

#[test]
fn a_push_to_a_stopped_sandbox_says_so_at_once() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "idle"]);
    cli.ok(&["stop", "idle"]);
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("a"), "a").unwrap();
    let dir = src.path().display().to_string();
    let started = std::time::Instant::now();
    let mount = "/workspace/managed/app";
    let out = cli.run(&["push", &dir, "--mount", mount, "idle", "--json"]);
    // The default retry budget is 20 s; a stopped sandbox is not retried.
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failure = &report["failures"][0];
    assert_eq!(failure["reason"], "stopped", "{report}");
    assert_eq!(failure["attempts"], 0, "{report}");
    let detail = failure["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("silo start idle"), "{report}");
}

#[test]
fn completions_and_the_manual_page_come_from_the_parser() {
    let cli = crate::cli();
    let bash = cli.ok(&["completions", "bash"]);
    assert!(bash.contains("_silo()"), "{bash}");
    assert!(
        bash.contains("snapshots"),
        "every subcommand completes: {bash}"
    );
    for shell in ["zsh", "fish"] {
        assert!(
            cli.ok(&["completions", shell]).contains("rewind"),
            "{shell}"
        );
    }
    let page = cli.ok(&["man"]);
    assert!(page.contains(".TH silo 1"), "{page}");
    let out = cli.run(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn doctor_names_each_problem_with_its_fix() {
    let cli = crate::cli();
    let out = cli
        .command(&["doctor", "--json"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .env("SILO_PODMAN_SOCKET", "/nonexistent/podman.sock")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a missing engine fails the doctor"
    );
    let checks = json(&String::from_utf8_lossy(&out.stdout));
    let check = |name: &str| {
        checks
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} check: {checks}"))
            .clone()
    };
    let docker = check("docker");
    assert_eq!(docker["verdict"], "fail", "{docker}");
    assert!(
        docker["detail"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/docker.sock")
    );
    assert!(
        docker["fix"].as_str().unwrap().contains("docker.io"),
        "{docker}"
    );
    // Podman is optional: its missing socket is a warning naming where
    // silo looked and how to start one.
    let podman = check("podman");
    assert_eq!(podman["verdict"], "warn", "{podman}");
    assert!(
        podman["detail"]
            .as_str()
            .unwrap()
            .contains("unix:///nonexistent/podman.sock"),
        "{podman}"
    );
    assert!(
        podman["fix"]
            .as_str()
            .unwrap()
            .contains("podman system service"),
        "{podman}"
    );
    assert_eq!(check("home")["verdict"], "ok", "{checks}");
    assert_ne!(check("disk")["verdict"], "fail", "{checks}");
    let agent = check("agent");
    assert!(
        agent["detail"].as_str().unwrap().contains("static"),
        "{agent}"
    );

    let table =
        String::from_utf8_lossy(&cli.command(&["doctor"]).output().unwrap().stdout).into_owned();
    assert!(table.contains("agent"), "{table}");
}

#[test]
fn every_listing_takes_one_output_flag() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "fmt"]);
    for listing in [
        &["ls"][..],
        &["events", "fmt"],
        &["snapshots"],
        &["session", "ls", "fmt"],
    ] {
        let with_flag = json(&cli.ok(&[listing, &["--json"]].concat()));
        let with_output = json(&cli.ok(&[listing, &["-o", "json"]].concat()));
        assert_eq!(with_flag.is_array(), with_output.is_array(), "{listing:?}");
        let table = cli.ok(&[listing, &["-o", "table"]].concat());
        assert!(
            serde_json::from_str::<serde_json::Value>(&table).is_err(),
            "{table}"
        );
    }
    let out = cli
        .command(&["ls"])
        .env("SILO_LOG", "debug")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        !out.stderr.contains(&0x1b),
        "no escape codes when stderr is not a terminal"
    );
}

/// Fills the file system holding `dir` to the last byte.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    for size in [1 << 20, 4096, 1] {
        let block = vec![0u8; size];
        while file.write_all(&block).is_ok() {}
    }
    let _ = file.sync_all();
    path
}

#[test]
fn a_full_home_still_reads_and_names_the_full_disk() {
    let Some(disk) = silo_tests::disk::SmallDisk::mount(32 << 20) else {
        return;
    };
    let home = tempfile::Builder::new()
        .prefix("home-")
        .tempdir_in(disk.path())
        .unwrap();
    // The home's own database is what fills up here.
    let cli = Cli::in_home(crate::SILO, home).with_home_state();
    cli.ok(&["create", "--backend", "local", "--name", "before"]);
    let filler = fill(disk.path());

    let out = cli.run(&["ls", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a command that only reads works: {err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("before"));
    assert!(
        err.contains("is full"),
        "and says why it cannot write: {err}"
    );
    let out = cli.run(&["create", "--backend", "local", "--name", "after"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("is full"), "{err}");
    assert!(!err.contains("disk I/O error"), "{err}");

    std::fs::remove_file(filler).unwrap();
    cli.ok(&["create", "--backend", "local", "--name", "after"]);
    assert!(cli.ok(&["ls"]).contains("after"));
}

/// Lines in the sandbox file `runs`, which the workload appends to per run.
fn runs(cli: &Cli, sandbox: &str) -> usize {
    let out = cli.run(&["exec", sandbox, "--", "sh", "-c", "cat runs 2>/dev/null"]);
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn the_workload_restart_policy_is_set_from_up() {
    let cli = crate::cli();
    let refused = cli.run(&["up", "bare", "--backend", "local", "--restart", "always"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("--restart") && err.contains("workload"),
        "{err}"
    );
    let unknown = cli.run(&["up", "bad", "--backend", "local", "--restart", "sometimes"]);
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(err.contains("on-failure"), "{err}");

    // A clean exit is restarted under `always` (the default, on-failure, would not).
    let line = "echo run >> runs";
    cli.ok(&[
        "up",
        "again",
        "--backend",
        "local",
        "--restart",
        "always",
        "--",
        "sh",
        "-c",
        line,
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while runs(&cli, "again") < 3 {
        assert!(
            Instant::now() < deadline,
            "an always workload was not restarted"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A failing one is left alone under `never`.
    let failing = "echo run >> runs; exit 3";
    cli.ok(&[
        "up",
        "once",
        "--backend",
        "local",
        "--restart",
        "never",
        "--",
        "sh",
        "-c",
        failing,
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while runs(&cli, "once") < 1 {
        assert!(Instant::now() < deadline, "the workload never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The agent's first restart would come 100 ms after the exit.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(runs(&cli, "once"), 1, "a never workload was restarted");
    let ls = json(&cli.ok(&["ls", "-o", "json"]));
    assert!(
        ls.to_string().contains("never"),
        "the spec keeps the policy: {ls}"
    );
}
