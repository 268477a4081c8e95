//! `silo cp`, `silo cat` and `silo ls-files` against a container made from
//! the silo-base image (busybox, `FROM scratch`): the sample tree in and
//! out, compared by digest, with the sandbox's own `sha256sum` as a witness.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use silo_tests::docker::{BASE_IMAGE, engine_with_base};
use silo_tests::json;
use silo_tests::tree;

#[tokio::test]
async fn cp_round_trips_a_tree_through_a_base_image_sandbox() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "cpd", "--image", BASE_IMAGE]);
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("tree");
    tree::sample(&src);
    let want = tree::digest(&src);
    let src_text = src.display().to_string();

    // Into an existing directory of the image: the tree lands inside it.
    let copied = json(&cli.ok(&["cp", &src_text, "cpd:/tmp", "--json"]));
    assert_eq!(copied["to"], "cpd:/tmp/tree", "{copied}");
    let big = std::fs::read(src.join("big.bin")).unwrap();
    let sum = cli.ok(&["exec", "cpd", "--", "sha256sum", "/tmp/tree/big.bin"]);
    assert!(sum.starts_with(&tree::sha256_hex(&big)), "{sum}");
    let modes = cli.ok(&[
        "exec",
        "cpd",
        "--",
        "stat",
        "-c",
        "%a %n",
        "/tmp/tree/run.sh",
        "/tmp/tree/nested/private.key",
    ]);
    assert_eq!(
        modes,
        "755 /tmp/tree/run.sh\n600 /tmp/tree/nested/private.key\n"
    );
    assert_eq!(
        cli.ok(&["cat", "cpd", "/tmp/tree/nested/deeper/deepest/leaf.txt"]),
        "leaf\n"
    );
    let listed = json(&cli.ok(&["ls-files", "cpd", "/tmp/tree", "-o", "json"]));
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["big.bin", "binary.bin", "empty", "nested", "run.sh"]
    );

    // Back out to a new host path: the same tree, byte for byte and mode for mode.
    let back = host.path().join("back");
    cli.ok(&["cp", "cpd:/tmp/tree", &back.display().to_string()]);
    assert_eq!(tree::digest(&back), want);

    // A symlink made in the sandbox comes out as a symlink.
    cli.ok(&["exec", "cpd", "--", "ln", "-s", "run.sh", "/tmp/tree/alias"]);
    let linked = host.path().join("linked");
    cli.ok(&["cp", "cpd:/tmp/tree/alias", &linked.display().to_string()]);
    assert_eq!(
        std::fs::read_link(&linked).unwrap().to_str(),
        Some("run.sh")
    );
}

/// `silo mv`, `silo ps` and `silo timeout` on a Docker sandbox: a rename
/// that lands in one step, the commands the agent runs, and a lifetime
/// deadline that stops the sandbox with a command still running.
#[tokio::test]
async fn mv_ps_and_timeout_work_on_a_docker_sandbox() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "mvd", "--image", BASE_IMAGE]);
    cli.ok(&["exec", "mvd", "--", "sh", "-c", "echo one > /tmp/a.txt"]);
    let moved = json(&cli.ok(&["mv", "mvd", "/tmp/a.txt", "/tmp/new/b.txt", "--json"]));
    assert_eq!(moved[0]["name"], "b.txt", "{moved}");
    assert_eq!(cli.ok(&["cat", "mvd", "/tmp/new/b.txt"]), "one\n");
    let missing = cli.fails(&["mv", "mvd", "/tmp/a.txt", "/tmp/c.txt"]);
    assert!(
        missing.contains("/tmp/a.txt") && missing.contains("does not exist"),
        "{missing}"
    );

    // A command started from another process shows in `ps`, with its words.
    let mut sleeper = cli
        .command(&["exec", "mvd", "--", "sleep", "300"])
        .spawn()
        .unwrap();
    let listed = (0..100)
        .find_map(|_| {
            let listed = json(&cli.ok(&["ps", "mvd", "--json"]));
            let found = listed
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["argv"][0] == "sleep");
            if found {
                return Some(listed);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            None
        })
        .expect("the sleeper shows in ps");
    let sleeping = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["argv"][0] == "sleep")
        .unwrap();
    assert_eq!(sleeping["argv"], serde_json::json!(["sleep", "300"]));
    assert_eq!(sleeping["state"], "running");
    let all = json(&cli.ok(&["ps", "mvd", "--all", "--json"]));
    assert!(
        all.as_array().unwrap().len() > listed.as_array().unwrap().len(),
        "--all shows the commands that ended too: {all}"
    );

    // A deadline stops the sandbox though the sleeper runs; its files stay.
    assert!(cli.ok(&["timeout", "mvd"]).contains("no lifetime deadline"));
    let set = json(&cli.ok(&["timeout", "mvd", "3600", "--json"]));
    assert!(set["remaining_ms"].as_u64().unwrap() > 3_590_000, "{set}");
    assert!(
        cli.ok(&["timeout", "mvd", "--clear"])
            .contains("no lifetime deadline")
    );
    cli.ok(&["timeout", "mvd", "2"]);
    let stopped = (0..150).any(|_| {
        let listed = json(&cli.ok(&["ls", "--json"]));
        let state = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "mvd")
            .map(|s| s["status"].clone());
        if state == Some(serde_json::json!("stopped")) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        false
    });
    assert!(stopped, "the sandbox stopped at its deadline");
    let _ = sleeper.wait();
    cli.ok(&["start", "mvd"]);
    assert_eq!(cli.ok(&["cat", "mvd", "/tmp/new/b.txt"]), "one\n");
}

/// `silo watch` prints a Docker sandbox's changes as they happen, those
/// in a directory made after the watch began included.
#[tokio::test]
async fn watch_prints_changes_as_they_happen() {
    use std::io::BufRead;
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "watchd", "--image", BASE_IMAGE]);
    cli.ok(&["exec", "watchd", "--", "mkdir", "-p", "/tmp/w"]);
    let refused = cli.fails(&["watch", "watchd", "/tmp/none"]);
    assert!(
        refused.contains("/tmp/none") && refused.contains("does not exist"),
        "{refused}"
    );
    let mut watcher = cli
        .command(&["watch", "watchd", "/tmp/w", "--recursive", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = watcher.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(json(&line)).is_err() {
                break;
            }
        }
    });
    // The watch is set up once the first change shows; make changes until then.
    let first = (0..100).find_map(|i| {
        cli.ok(&["exec", "watchd", "--", "touch", &format!("/tmp/w/probe{i}")]);
        rx.recv_timeout(std::time::Duration::from_millis(200)).ok()
    });
    assert!(first.is_some(), "the watch reported nothing");
    cli.ok(&[
        "exec",
        "watchd",
        "--",
        "sh",
        "-c",
        "mkdir /tmp/w/new && sleep 0.5 && echo x > /tmp/w/new/a.txt && rm /tmp/w/new/a.txt",
    ]);
    let mut seen = Vec::new();
    let wanted = |seen: &[serde_json::Value], kind: &str, name: &str| {
        seen.iter().any(|e| e["kind"] == kind && e["name"] == name)
    };
    while !wanted(&seen, "remove", "new/a.txt") {
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(event) => seen.push(event),
            Err(_) => panic!("no removal seen: {seen:?}"),
        }
    }
    assert!(wanted(&seen, "create", "new"), "{seen:?}");
    assert!(wanted(&seen, "create", "new/a.txt"), "{seen:?}");
    let _ = watcher.kill();
    let _ = watcher.wait();
}
