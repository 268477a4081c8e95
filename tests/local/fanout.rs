//! `silo push` through the real CLI on local sandboxes: a fan-out to 21
//! sandboxes with one of them dead, the report, the events, and a repeat
//! that changes nothing.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::os::unix::fs::PermissionsExt;

use silo_tests::json;
use silo_tests::push::push_to_all;

const MOUNT: &str = "/workspace/managed/app";

#[test]
fn fan_out_to_many_sandboxes_survives_a_dead_one() {
    const SANDBOXES: usize = 21;
    let cli = crate::cli();
    let mut ids = Vec::new();
    for i in 0..SANDBOXES {
        let created = json(&cli.ok(&[
            "create",
            "--backend",
            "local",
            "--name",
            &format!("s{i:02}"),
            "--json",
        ]));
        ids.push(created["id"].as_str().unwrap().to_owned());
    }
    // Kill one agent outright: its sandbox is still recorded, but nobody answers.
    let dead = "s07";
    let pid_file = cli
        .home
        .path()
        .join("sandboxes")
        .join(&ids[7])
        .join("agent.pid");
    let pid: u32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    silo_tests::signal(pid, nix::sys::signal::Signal::SIGKILL);

    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("src")).unwrap();
    std::fs::create_dir_all(src.path().join("empty")).unwrap();
    std::fs::write(src.path().join("src/main.py"), "print('hi')\n").unwrap();
    std::fs::write(src.path().join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(
        src.path().join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let dir = src.path().display().to_string();

    let out = push_to_all(&cli, src.path(), MOUNT);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed target fails the command"
    );
    let report = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(report["targets"], SANDBOXES);
    assert_eq!(report["succeeded"], SANDBOXES - 1);
    assert_eq!(report["unchanged"], 0);
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{report}");
    assert_eq!(failures[0]["sandbox"], dead);
    assert_eq!(failures[0]["reason"], "stopped", "{report}");
    assert_eq!(
        failures[0]["attempts"], 0,
        "a sandbox known to be down is reported at once, not retried: {report}"
    );

    // Every live sandbox has the tree, executable bit included.
    assert_eq!(
        cli.ok(&[
            "exec",
            "s00",
            "--",
            "cat",
            "workspace/managed/app/src/main.py"
        ]),
        "print('hi')\n"
    );
    assert_eq!(
        cli.ok(&["exec", "s20", "--", "./workspace/managed/app/run.sh"]),
        "ran\n"
    );
    let root = cli.home.path().join("sandboxes").join(&ids[3]).join("root");
    assert!(root.join("workspace/managed/app/empty").is_dir());
    assert!(
        std::fs::symlink_metadata(root.join("workspace/managed/app"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    let events = json(&cli.ok(&["events", "s00", "--json"]));
    let pushed: Vec<&serde_json::Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "pushed")
        .collect();
    assert_eq!(pushed.len(), 1, "{events}");
    assert_eq!(pushed[0]["detail"]["mount"], MOUNT);
    assert_eq!(pushed[0]["detail"]["files"], 2);
    assert_eq!(pushed[0]["detail"]["hash"], report["pushed"][0]["sha256"]);

    // The same files again: nothing to do, and no event.
    let table = cli.ok(&["push", &dir, "--mount", MOUNT, "s00", "s01"]);
    assert!(table.contains("unchanged"), "{table}");
    assert!(table.contains("2 of 2 sandboxes"), "{table}");
    let events = json(&cli.ok(&["events", "s00", "--json"]));
    assert_eq!(
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "pushed")
            .count(),
        1
    );
}

#[test]
fn push_refusals_are_reported_not_retried() {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", "solo"]);
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("a"), "a").unwrap();
    let dir = src.path().display().to_string();
    let out = cli.run(&["push", &dir, "--mount", "/etc/app", "solo", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        report["failures"][0]["reason"], "mount_not_allowed",
        "{report}"
    );
    assert_eq!(report["failures"][0]["attempts"], 1, "a 403 is not retried");

    // A symlink in the directory is refused on the host, naming it.
    std::os::unix::fs::symlink("/etc/passwd", src.path().join("link")).unwrap();
    let out = cli.run(&["push", &dir, "--mount", MOUNT, "solo"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("link"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
