//! Push into Docker sandboxes: the same agent code path as the local
//! backend, at the sandbox's real `/workspace/managed`. A fan-out with one
//! container killed, an unchanged repeat chosen by label, and a hostile
//! bundle refused without a trace inside the container.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

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
    let silo = cli.silo();
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

/// Readers inside a sandbox while 40 pushes swap its mount, on whatever
/// storage driver the engine has (fuse-overlayfs here): one that resolves
/// a file under the mount path in a loop finds it every time, and walkers
/// that enter the mount once and read every file see one version per walk.
#[tokio::test]
async fn readers_of_a_mount_see_the_old_tree_or_the_new_one_through_every_swap() {
    const SWAPS: usize = 40;
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "swap", "--image", BASE_IMAGE]);
    let push = |version: usize| {
        let src = tempfile::tempdir().unwrap();
        for dir in ["a", "b", "c", "d"] {
            std::fs::create_dir(src.path().join(dir)).unwrap();
            for file in 0..5 {
                let path = src.path().join(dir).join(format!("f{file}"));
                std::fs::write(path, format!("v{version}\n")).unwrap();
            }
        }
        let src = src.path().to_str().unwrap().to_owned();
        cli.ok(&["push", &src, "--mount", MOUNT, "swap"]);
    };
    push(0);
    // Each reader counts until /tmp/stop exists, then prints its counts.
    let resolver = format!(
        "ok=0; miss=0; while [ ! -e /tmp/stop ]; do \
         if [ -e {MOUNT}/a/f0 ]; then ok=$((ok+1)); else miss=$((miss+1)); fi; done; \
         echo \"$ok $miss\""
    );
    let walker = format!(
        "whole=0; mixed=0; while [ ! -e /tmp/stop ]; do \
         n=$(cd {MOUNT} 2>/dev/null && cat */* | sort -u | wc -l); \
         if [ \"$n\" = 1 ]; then whole=$((whole+1)); else mixed=$((mixed+1)); fi; done; \
         echo \"$whole $mixed\""
    );
    let mut readers: Vec<(&str, std::process::Child)> = Vec::new();
    for (kind, script) in [
        ("resolver", &resolver),
        ("resolver", &resolver),
        ("walker", &walker),
        ("walker", &walker),
        ("walker", &walker),
        ("walker", &walker),
    ] {
        let child = cli
            .command(&["exec", "swap", "--", "sh", "-c", script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        readers.push((kind, child));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    for version in 1..=SWAPS {
        push(version);
    }
    cli.ok(&["exec", "swap", "--", "touch", "/tmp/stop"]);
    for (kind, child) in readers {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let counts: Vec<u64> = text
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        let [good, bad] = counts[..] else {
            panic!("{kind} printed {text:?}");
        };
        assert!(good > 0, "the {kind} never read the mount: {text}");
        assert_eq!(
            bad, 0,
            "a {kind} saw no tree or a mix {bad} times ({good} whole)"
        );
    }
    let versions = cli.ok(&["exec", "swap", "--", "cat", &format!("{MOUNT}/d/f4")]);
    assert_eq!(versions.trim(), format!("v{SWAPS}"));
    cli.ok(&["rm", "swap"]);
}

/// A bundle over the entry cap that declares nothing, as a client other
/// than silo's own may send, is refused within seconds with nothing written
/// (nothing left under the mount's `.versions`, no version of the mount),
/// and the mount takes the next push at once; one within the caps that
/// declares nothing is extracted whole.
#[tokio::test]
async fn an_undeclared_bundle_over_the_entry_cap_is_refused_in_seconds_and_leaves_nothing() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "caps", "--image", BASE_IMAGE]);
    let silo = cli.silo();
    let client = silo.client(&silo.get("caps").unwrap()).unwrap();
    // 200,000 empty files: 100 MiB of headers, well under the body cap
    // once compressed.
    let over: Vec<Vec<u8>> = (0..200_000)
        .map(|i| tar_file(&format!("f{i:06}"), b""))
        .collect();
    let over = bundle_of(&over);
    let started = std::time::Instant::now();
    let (status, answer) = push_raw(&client, MOUNT, over).await;
    let took = started.elapsed();
    assert_eq!(status, 413, "{answer}");
    assert!(
        took < std::time::Duration::from_secs(5),
        "refused after {took:?}: {answer}"
    );
    let left = cli.ok(&[
        "exec",
        "caps",
        "--",
        "sh",
        "-c",
        "ls -A /workspace/managed/.versions 2>/dev/null; ls -A /workspace/managed",
    ]);
    assert_eq!(left.trim(), ".versions", "left behind: {left}");

    let within = vec![tar_file("a.txt", b"a\n"), tar_file("b/c.txt", b"c\n")];
    let (status, answer) = push_raw(&client, MOUNT, bundle_of(&within)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["files"], 2, "{answer}");
    let read = cli.ok(&["exec", "caps", "--", "cat", &format!("{MOUNT}/b/c.txt")]);
    assert_eq!(read, "c\n");
    let spools = cli.ok(&[
        "exec",
        "caps",
        "--",
        "sh",
        "-c",
        "ls -A /workspace/managed/.versions/app | grep -c partial; true",
    ]);
    assert_eq!(spools.trim(), "0", "a spool or staging directory was left");
    cli.ok(&["rm", "caps"]);
}

/// A push to a sandbox that `silo rm` removes while the agent is writing
/// the bundle fails within a second of the removal, and says the sandbox
/// was removed, not that it may come back.
#[tokio::test]
async fn a_push_to_a_sandbox_removed_mid_push_reports_it_at_once() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "doomed", "--image", BASE_IMAGE]);
    let big = tempfile::tempdir().unwrap();
    for i in 0..60_000 {
        std::fs::write(big.path().join(format!("f{i:05}")), "").unwrap();
    }
    let push = cli
        .command(&[
            "push",
            big.path().to_str().unwrap(),
            "--mount",
            MOUNT,
            "doomed",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let partial = "ls -d /workspace/managed/.versions/app/.partial-* 2>/dev/null | head -1";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cli
        .ok(&["exec", "doomed", "--", "sh", "-c", partial])
        .trim()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the push never started extracting"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cli.ok(&["rm", "doomed"]);
    let removed = std::time::Instant::now();
    let out = push.wait_with_output().unwrap();
    let took = removed.elapsed();
    let report = json(&String::from_utf8_lossy(&out.stdout));
    let failure = &report["failures"][0];
    assert_eq!(failure["reason"], "removed", "{report}");
    assert!(
        failure["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("has been removed"),
        "{report}"
    );
    assert!(
        took < std::time::Duration::from_secs(1),
        "reported {took:?} after the removal: {report}"
    );
}
