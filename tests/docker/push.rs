//! Push into Docker sandboxes: the same agent code path as the local
//! backend, at the sandbox's real `/workspace/managed`. A fan-out with one
//! container killed, an unchanged repeat chosen by label, and a hostile
//! bundle refused without a trace inside the container.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use silo::Silo;
use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, container_id, engine_with_base};
use silo_tests::json;
use silo_tests::push::{bundle_of, push_raw, push_to_all, tar_entry, tar_file};

const MOUNT: &str = "/workspace/managed/app";

fn sandbox_id(cli: &Cli, name: &str) -> String {
    let listed = json(&cli.ok(&["ls", "--json"]));
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap();
    entry["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn push_fans_out_to_docker_sandboxes_and_refuses_hostile_bundles() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    for name in ["d0", "d1"] {
        cli.ok(&["up", name, "--image", BASE_IMAGE, "--label", "tier=web"]);
    }
    for name in ["d2", "d3"] {
        cli.ok(&["up", name, "--image", BASE_IMAGE]);
    }
    // Kill one container behind silo's back.
    let dead = container_id(&engine, &sandbox_id(&cli, "d2")).await;
    let killed = std::process::Command::new("docker")
        .args(["kill", &dead])
        .output()
        .unwrap();
    assert!(
        killed.status.success(),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );

    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("src")).unwrap();
    std::fs::write(src.path().join("src/main.py"), "print('hi')\n").unwrap();
    let dir = src.path().display().to_string();
    let out = push_to_all(&cli, src.path(), MOUNT);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(report["succeeded"], 3, "{report}");
    assert_eq!(report["failures"][0]["sandbox"], "d2", "{report}");
    // A killed container is known to the engine as stopped: reported at
    // once, not retried for the whole budget.
    assert_eq!(report["failures"][0]["reason"], "stopped", "{report}");
    assert_eq!(report["failures"][0]["attempts"], 0, "{report}");

    assert_eq!(
        cli.ok(&[
            "exec",
            "d0",
            "--",
            "cat",
            "/workspace/managed/app/src/main.py"
        ]),
        "print('hi')\n"
    );
    let link = cli.ok(&["exec", "d3", "--", "readlink", MOUNT]);
    assert!(link.starts_with(".versions/app/000001-"), "{link}");

    // Chosen by label this time: only d0 and d1, which have the files already.
    let again = json(&cli.ok(&[
        "push", &dir, "--mount", MOUNT, "--label", "tier=web", "--json",
    ]));
    assert_eq!(
        (again["targets"].as_u64(), again["unchanged"].as_u64()),
        (Some(2), Some(2)),
        "{again}"
    );

    // A hostile bundle straight to one agent: refused, nothing written.
    let silo = Silo::open(Some(cli.home.path().to_path_buf())).unwrap();
    let client = silo.client(&silo.get("d1").unwrap()).unwrap();
    let listing = |cli: &Cli| {
        cli.ok(&[
            "exec",
            "d1",
            "--",
            "sh",
            "-c",
            "ls -a /workspace /workspace/managed; readlink /workspace/managed/app",
        ])
    };
    let before = listing(&cli);
    for entries in [
        vec![tar_file("../../escape.txt", b"x")],
        vec![
            tar_entry(b"out", b'2', b"", b"/etc"),
            tar_file("out/passwd", b"x"),
        ],
    ] {
        let (status, answer) = push_raw(&client, MOUNT, bundle_of(&entries)).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["kind"], "rejected_entry");
    }
    assert_eq!(listing(&cli), before);
    let passwd = cli.run(&["exec", "d1", "--", "cat", "/etc/passwd"]);
    assert_ne!(passwd.stdout, b"x", "/etc/passwd was overwritten");
}

#[tokio::test]
async fn a_push_whose_client_is_killed_stops_and_frees_its_mount_at_once() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "many", "--image", BASE_IMAGE]);
    // 60,000 empty files: the agent takes seconds to write them and as long
    // again to remove them, while the bundle itself is sent in a moment.
    let big = tempfile::tempdir().unwrap();
    for i in 0..60_000 {
        std::fs::write(big.path().join(format!("f{i:05}")), "").unwrap();
    }
    let small = tempfile::tempdir().unwrap();
    std::fs::write(small.path().join("a.txt"), "small\n").unwrap();

    let mut first = cli
        .command(&[
            "push",
            big.path().to_str().unwrap(),
            "--mount",
            MOUNT,
            "many",
        ])
        .spawn()
        .unwrap();
    // Wait until the agent is writing files, then kill the client.
    let partial = "ls -d /workspace/managed/.versions/app/.partial-* 2>/dev/null | head -1";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cli
        .ok(&["exec", "many", "--", "sh", "-c", partial])
        .trim()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the big push never started extracting"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();

    let started = std::time::Instant::now();
    cli.ok(&[
        "push",
        small.path().to_str().unwrap(),
        "--mount",
        MOUNT,
        "many",
    ]);
    let took = started.elapsed();
    assert_eq!(
        cli.ok(&["exec", "many", "--", "cat", &format!("{MOUNT}/a.txt")]),
        "small\n"
    );
    assert!(
        took < std::time::Duration::from_secs(5),
        "the next push waited {took:?}"
    );
    // What the killed push wrote goes, in the background.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cli
        .ok(&["exec", "many", "--", "sh", "-c", partial])
        .trim()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed push's staging stayed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
