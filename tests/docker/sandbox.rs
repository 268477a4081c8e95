//! What a Docker sandbox is made of, checked from inside (through the agent)
//! and from the engine's side: a sandbox without a network is still
//! reachable, bind mounts honour rw/ro, the spec's settings reach the
//! container, and two silo homes on one engine never touch each other's
//! containers.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use silo::internals::docker::{LABEL_HOME, LABEL_SANDBOX_NAME, LABEL_SPEC_HASH};
use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, container, containers_of, engine_with_base};
use silo_tests::json;

fn id_of(cli: &Cli, args: &[&str]) -> String {
    let out = json(&cli.ok(args));
    out["sandbox"]["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_sandbox_without_a_network_is_still_reachable() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = id_of(
        &cli,
        &[
            "up",
            "nonet",
            "--image",
            BASE_IMAGE,
            "--network",
            "none",
            "--json",
        ],
    );
    let info = container(&engine, &id).await.unwrap();
    let mode = info.host_config.unwrap().network_mode.unwrap();
    assert_eq!(mode, "none");
    // Only the loopback interface exists, and the agent answers anyway.
    let links = cli.ok(&["exec", "nonet", "--", "sh", "-c", "ls /sys/class/net"]);
    assert_eq!(links.split_whitespace().collect::<Vec<_>>(), ["lo"]);
}

#[tokio::test]
async fn bind_mounts_are_read_write_or_read_only_as_asked() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let rw = tempfile::tempdir().unwrap();
    let ro = tempfile::tempdir().unwrap();
    std::fs::write(rw.path().join("in.txt"), "from host\n").unwrap();
    std::fs::write(ro.path().join("data.txt"), "read me\n").unwrap();
    let cli = crate::cli();
    let rw_bind = format!("{}:/rw", rw.path().display());
    let ro_bind = format!("{}:/ro:ro", ro.path().display());
    cli.ok(&[
        "up", "binds", "--image", BASE_IMAGE, "--bind", &rw_bind, "--bind", &ro_bind,
    ]);
    let out = cli.ok(&[
        "exec",
        "binds",
        "--",
        "sh",
        "-c",
        "cat /rw/in.txt /ro/data.txt; echo from sandbox > /rw/out.txt",
    ]);
    assert_eq!(out, "from host\nread me\n");
    assert_eq!(
        std::fs::read_to_string(rw.path().join("out.txt")).unwrap(),
        "from sandbox\n"
    );
    let out = cli.run(&["exec", "binds", "--", "touch", "/ro/nope"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Read-only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ro.path().join("nope").exists());

    // A host path that does not exist is refused before anything is made.
    let out = cli.run(&[
        "up",
        "nobind",
        "--image",
        BASE_IMAGE,
        "--bind",
        "/no/such/dir:/x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    assert!(
        cli.run(&["events", "nobind"]).status.success(),
        "its history is kept"
    );
}

#[tokio::test]
async fn spec_settings_reach_the_container() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = id_of(
        &cli,
        &[
            "up",
            "settings",
            "--image",
            BASE_IMAGE,
            "--json",
            "--workdir",
            "/work",
            "--user",
            "nobody",
            "--env",
            "GREETING=hi there",
            "--cpus",
            "0.5",
            "--memory",
            "64m",
            "--pids-limit",
            "64",
            "--label",
            "team=infra",
        ],
    );
    let out = cli.ok(&[
        "exec",
        "settings",
        "--",
        "sh",
        "-c",
        "pwd; id -u; echo $GREETING",
    ]);
    assert_eq!(out, "/work\n65534\nhi there\n");

    let info = container(&engine, &id).await.unwrap();
    let host = info.host_config.unwrap();
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.memory, Some(64 << 20));
    assert_eq!(host.pids_limit, Some(64));
    let labels = info.config.unwrap().labels.unwrap();
    assert_eq!(labels["team"], "infra");
    assert_eq!(labels[LABEL_SANDBOX_NAME], "settings");
    assert_eq!(labels[LABEL_SPEC_HASH].len(), 64);
    // The key was deleted once the agent had read it.
    let run = cli.ok(&["exec", "settings", "--", "ls", "/.silo/run"]);
    assert_eq!(run, "agent.sock\n");
}

#[tokio::test]
async fn two_homes_on_one_engine_never_touch_each_others_containers() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    // Each home's own database, which A then loses.
    let (a, b) = (
        crate::cli().with_home_state(),
        crate::cli().with_home_state(),
    );
    let in_a = id_of(&a, &["up", "same", "--image", BASE_IMAGE, "--json"]);
    let in_b = id_of(&b, &["up", "same", "--image", BASE_IMAGE, "--json"]);
    assert_ne!(in_a, in_b);
    let home_of = |info: bollard::models::ContainerInspectResponse| {
        info.config.unwrap().labels.unwrap()[LABEL_HOME].clone()
    };
    assert_ne!(
        home_of(container(&engine, &in_a).await.unwrap()),
        home_of(container(&engine, &in_b).await.unwrap())
    );

    // Home A forgets its sandbox (its database is lost): A's container is an
    // orphan that A's gc removes, and B's is left alone.
    for file in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(a.home.path().join(file));
    }
    let swept = a.ok(&["gc"]);
    assert!(swept.contains(&format!("silo-{in_a}")), "{swept}");
    assert!(containers_of(&engine, &in_a).await.is_empty());
    assert_eq!(containers_of(&engine, &in_b).await.len(), 1);
    assert_eq!(b.ok(&["exec", "same", "--", "echo", "ok"]), "ok\n");
}

#[tokio::test]
async fn the_demo_shows_the_whole_product_on_docker() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let steps = json(&cli.ok(&["demo", "--json"]));
    let detail = |name: &str| {
        steps
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no {name} step: {steps}"))["detail"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(detail("up (create)").contains("docker backend"), "{steps}");
    assert!(
        detail("first exec").contains("PID 1 is silo-agent"),
        "{steps}"
    );
    assert!(detail("streaming").contains("arrived at"), "{steps}");
    assert!(
        detail("session").contains("hello from /tmp, project silo"),
        "{steps}"
    );
    assert!(detail("push").contains("pushed by silo"), "{steps}");
    assert!(detail("resume").contains("still says \"hello\""), "{steps}");
    assert!(detail("interrupt").contains("exit 130"), "{steps}");
    assert!(detail("rewind").contains("passwd is back"), "{steps}");
    assert!(detail("fork").contains("says \"hello\""), "{steps}");
    assert!(detail("remove").contains("removed"), "{steps}");
    // Nothing is left behind.
    assert_eq!(json(&cli.ok(&["ls", "--json"])), serde_json::json!([]));
}

/// Whether capability `bit` is in the hex capability mask of `line` from
/// /proc/PID/status (`CapEff:\t00000000a80425fb`).
fn has_capability(status: &str, field: &str, bit: u32) -> bool {
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
    mask & (1 << bit) != 0
}

#[tokio::test]
async fn sandboxes_are_confined_by_default_and_each_flag_loosens_one_thing() {
    const CAP_MKNOD: u32 = 27;
    const CAP_NET_RAW: u32 = 13;
    const CAP_CHOWN: u32 = 0;
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let id = id_of(&cli, &["up", "tight", "--image", BASE_IMAGE, "--json"]);
    let status = cli.ok(&["exec", "tight", "--", "cat", "/proc/self/status"]);
    assert!(!has_capability(&status, "CapEff:", CAP_MKNOD), "{status}");
    assert!(!has_capability(&status, "CapEff:", CAP_NET_RAW), "{status}");
    assert!(has_capability(&status, "CapEff:", CAP_CHOWN), "{status}");
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
    let out = cli.run(&["exec", "tight", "--", "mknod", "/tmp/null", "c", "1", "3"]);
    assert!(!out.status.success(), "mknod must be refused");
    let host = container(&engine, &id).await.unwrap().host_config.unwrap();
    assert_eq!(host.pids_limit, Some(4096));
    // A snapshot still stops and continues every process under these caps.
    let snap = json(&cli.ok(&["snapshot", "tight", "--json"]));
    assert!(snap["snapshot"]["id"].is_string(), "{snap}");

    // Loosening is a spec change, listed like any other.
    let out = cli.run(&["up", "tight", "--image", BASE_IMAGE, "--cap-add", "NET_RAW"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cap_add"), "{err}");

    cli.ok(&[
        "up",
        "loose",
        "--image",
        BASE_IMAGE,
        "--cap-add",
        "NET_RAW",
        "--new-privileges",
        "--pids-limit",
        "64",
    ]);
    let status = cli.ok(&["exec", "loose", "--", "cat", "/proc/self/status"]);
    assert!(has_capability(&status, "CapEff:", CAP_NET_RAW), "{status}");
    assert!(!has_capability(&status, "CapEff:", CAP_MKNOD), "{status}");
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t0"), "{status}");

    let out = cli.run(&["up", "odd", "--image", BASE_IMAGE, "--cap-add", "net raw"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cap-add"));
}

/// Whether the engine has the gVisor runtime (`.ci/run` registers it; in CI
/// its absence fails the test).
pub(crate) async fn has_runsc(engine: &bollard::Docker) -> bool {
    let info = engine.info().await.unwrap();
    let found = info.runtimes.is_some_and(|r| r.contains_key("runsc"));
    assert!(
        found || !silo_tests::docker::in_ci(),
        "the engine has no runsc runtime"
    );
    if !found {
        eprintln!("skipped: the engine has no runsc runtime");
    }
    found
}

#[tokio::test]
async fn a_gvisor_sandbox_runs_commands_takes_pushes_and_snapshots() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    if !has_runsc(&engine).await {
        return;
    }
    let cli = crate::cli();
    cli.ok(&[
        "up",
        "gv",
        "--image",
        BASE_IMAGE,
        "--runtime",
        "runsc",
        "--network",
        "none",
    ]);
    // gVisor's own kernel answers.
    assert_eq!(cli.ok(&["exec", "gv", "--", "uname", "-r"]), "4.4.0\n");
    let out = cli.run(&["exec", "gv", "--timeout", "1", "--", "sleep", "100"]);
    assert_eq!(out.status.code(), Some(130));
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("a.txt"), "pushed\n").unwrap();
    let mount = "/workspace/managed/app";
    cli.ok(&["push", src.path().to_str().unwrap(), "--mount", mount, "gv"]);
    assert_eq!(
        cli.ok(&["exec", "gv", "--", "cat", &format!("{mount}/a.txt")]),
        "pushed\n"
    );
    cli.ok(&["exec", "gv", "--", "sh", "-c", "echo v1 > /note"]);
    let snap = json(&cli.ok(&["snapshot", "gv", "--json"]));
    let id = snap["snapshot"]["id"].as_str().unwrap().to_owned();
    cli.ok(&["exec", "gv", "--", "sh", "-c", "echo broken > /note"]);
    cli.ok(&["rewind", "gv", &id]);
    assert_eq!(cli.ok(&["exec", "gv", "--", "cat", "/note"]), "v1\n");
    assert_eq!(
        cli.ok(&["exec", "gv", "--", "uname", "-r"]),
        "4.4.0\n",
        "still gVisor"
    );

    let out = cli.run(&[
        "up",
        "nort",
        "--image",
        BASE_IMAGE,
        "--runtime",
        "no-such-runtime",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no runtime \"no-such-runtime\"") && err.contains("daemon.json"),
        "{err}"
    );
}

#[tokio::test]
async fn an_up_killed_before_its_machine_existed_is_finished_not_called_removed() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    // An engine that accepts connections and never answers holds the first
    // `up` after it has recorded the sandbox and before any machine exists.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let _held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().flatten() {
            open.push(stream);
        }
    });
    let cli = crate::cli();
    let mut first = cli
        .command(&["up", "half", "--image", BASE_IMAGE])
        .env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cli.ok(&["ls", "--json"]).contains("\"half\"") {
        assert!(
            std::time::Instant::now() < deadline,
            "the first up never recorded the sandbox"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();

    let out = cli.ok(&["up", "half", "--image", BASE_IMAGE]);
    assert!(!out.contains("removed outside silo"), "{out}");
    assert!(out.contains("never made"), "{out}");
    assert_eq!(cli.ok(&["exec", "half", "--", "echo", "up"]), "up\n");
}

/// `silo doctor` names the storage driver, and on fuse-overlayfs the open
/// file limit of the process that serves a sandbox's files, which a
/// workload can exhaust, with how to raise it.
#[tokio::test]
async fn doctor_names_a_storage_driver_limit_a_sandbox_can_exhaust() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let driver = engine.info().await.unwrap().driver.unwrap_or_default();
    let cli = crate::cli();
    let checks = json(&cli.ok(&["doctor", "--json"]));
    let storage = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|check| check["name"] == "storage")
        .unwrap_or_else(|| panic!("no storage check: {checks}"));
    let detail = storage["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(&driver), "{storage}");
    if driver == "fuse-overlayfs" {
        assert_eq!(storage["verdict"], "warn", "{storage}");
        assert!(detail.contains("open files"), "{storage}");
        assert!(
            storage["fix"]
                .as_str()
                .unwrap_or_default()
                .contains("LimitNOFILE"),
            "{storage}"
        );
    } else {
        assert_eq!(storage["verdict"], "ok", "{storage}");
    }
}
