//! A rewind and a fork give back exactly what the snapshot saw, on the
//! real engines, through the real CLI, with every tree read from the host
//! (`silo_tests::exact`): a designed case (a file two levels below an
//! image directory no step touched) and the property itself, seeded
//! random steps with snapshots, rewinds and forks, on the Docker and
//! Podman backends and on the E2B, Daytona and Kubernetes mocks (whose VMs
//! and pods are containers on the Docker engine, each running a real agent). `SILO_EXACT_SEED`, `SILO_EXACT_KINDS`,
//! `SILO_EXACT_REWINDS`, `SILO_EXACT_FORKS`, `SILO_EXACT_SHRINK_SECS` and
//! `SILO_EXACT_NANOS` steer the property (`scripts/exact.sh` runs it long);
//! `SILO_EXACT_AGENT` holds another build of the agent to the same promise.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::Instant;

use silo_mocks::{
    MockDaytona, MockDaytonaConfig, MockE2b, MockE2bConfig, MockKubernetes, MockKubernetesConfig,
};
use silo_tests::Cli;
use silo_tests::docker::BASE_IMAGE;
use silo_tests::exact::listing::{Compare, Listing, diff};
use silo_tests::exact::run::{Backend, MOCK_BASE, Target, listing_of};
use silo_tests::exact::{Settings, check};
use silo_tests::json;

use crate::sh;

/// Rewinds and forks of the Docker property run unless the environment
/// says otherwise.
const DOCKER_BUDGET: (usize, usize) = (100, 20);
/// The same for Podman: a second engine in the same CI run, so a smaller share.
const PODMAN_BUDGET: (usize, usize) = (60, 12);
/// The same for each mock: the remote layer and its provider's transport
/// on top of the agent the engines' runs already hold to the promise.
const MOCK_BUDGET: (usize, usize) = (20, 4);

/// An agent binary to run instead of the embedded one (`silo --agent`).
const AGENT_VAR: &str = "SILO_EXACT_AGENT";

/// The CLI against a fresh home, with the agent `SILO_EXACT_AGENT` names
/// when set.
fn cli() -> Cli {
    let cli = crate::cli();
    match std::env::var(AGENT_VAR) {
        Ok(agent) => {
            eprintln!("[exact] {AGENT_VAR}={agent}");
            cli.with_env([("SILO_AGENT", agent)])
        }
        Err(_) => cli,
    }
}

/// Makes sandbox `t` on the base image; its id.
fn up_t(cli: &Cli) -> String {
    let up = json(&cli.ok(&["up", "t", "--image", BASE_IMAGE, "--json"]));
    up["sandbox"]["id"].as_str().unwrap().to_owned()
}

/// A snapshot's id.
fn snapshot(cli: &Cli, name: &str) -> String {
    let report = json(&cli.ok(&["snapshot", name, "--json"]));
    report["snapshot"]["id"].as_str().unwrap().to_owned()
}

/// The differences, or nothing; fails naming `what` otherwise.
fn assert_same(expected: &Listing, actual: &Listing, what: &str) {
    let lines = diff(expected, actual, Compare::default());
    assert!(
        lines.is_empty(),
        "{what} (- only in the snapshot's, + only in the live one, ~ differs):\n  {}",
        lines.join("\n  ")
    );
}

#[tokio::test]
async fn a_file_two_levels_below_an_untouched_image_directory_is_captured() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let started = Instant::now();
    let cli = cli();
    let id = up_t(&cli);

    sh(&cli, "t", "mkdir /w");
    let s1 = snapshot(&cli, "t");
    let at_s1 = listing_of(&engine, &id).await.unwrap();
    // `/usr` and `/var` stay as the image has them; only their
    // subdirectories gain an entry.
    sh(
        &cli,
        "t",
        "echo new > /usr/bin/newfile; echo new > /var/tmp/newfile; echo top > /etc/newfile",
    );
    let s2 = snapshot(&cli, "t");
    let at_s2 = listing_of(&engine, &id).await.unwrap();
    for path in ["/usr/bin/newfile", "/var/tmp/newfile", "/etc/newfile"] {
        assert!(at_s2.contains_key(path.as_bytes()), "{path} was written");
    }

    let fork = json(&cli.ok(&["fork", &s2, "--name", "t-fork", "--json"]));
    let fork_id = fork["sandbox"]["id"].as_str().unwrap().to_owned();
    let forked = listing_of(&engine, &fork_id).await.unwrap();
    for path in ["/usr/bin/newfile", "/var/tmp/newfile"] {
        assert!(
            forked.contains_key(path.as_bytes()),
            "the fork of s2 lost {path}"
        );
    }
    assert_same(&at_s2, &forked, "the fork's tree is not s2's");
    cli.ok(&["rm", "t-fork"]);

    let rewound = json(&cli.ok(&["rewind", "t", &s1, "--json"]));
    assert!(rewound["new_machine_because"].is_null(), "{rewound}");
    let live = listing_of(&engine, &id).await.unwrap();
    for path in ["/usr/bin/newfile", "/var/tmp/newfile", "/etc/newfile"] {
        assert!(
            !live.contains_key(path.as_bytes()),
            "{path} is still there after the rewind to s1"
        );
    }
    assert_same(&at_s1, &live, "after the rewind, the tree is not s1's");
    eprintln!("designed case: {:.1} s", started.elapsed().as_secs_f64());
}

/// Forks `snapshot` as `t-fork`, fails unless its tree is `expected`,
/// and removes it.
async fn assert_fork_same(cli: &Cli, engine: &bollard::Docker, snapshot: &str, expected: &Listing) {
    let fork = json(&cli.ok(&["fork", snapshot, "--name", "t-fork", "--json"]));
    let fork_id = fork["sandbox"]["id"].as_str().unwrap().to_owned();
    let forked = listing_of(engine, &fork_id).await.unwrap();
    assert_same(
        expected,
        &forked,
        &format!("the fork's tree is not {snapshot}'s"),
    );
    cli.ok(&["rm", "t-fork"]);
}

/// The blocks `path` takes in sandbox `name`, as `stat` counts them.
fn blocks(cli: &Cli, name: &str, path: &str) -> u64 {
    let out = cli.ok(&["exec", name, "--", "stat", "-c", "%b", path]);
    out.trim().parse().unwrap()
}

#[tokio::test]
async fn a_directory_swapped_for_a_symlink_and_back_odd_link_targets_and_sparse_files_come_back() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let cli = cli();
    let id = up_t(&cli);
    sh(
        &cli,
        "t",
        "mkdir -p /w/d/sub && echo a > /w/d/sub/f && ln -s x /w/d/sub/l && echo top > /w/d/t \
         && ln -s / /w/root && ln -s // /w/slashes && ln -s . /w/dot && ln -s .. /w/up \
         && ln -s 'a//b/' /w/tidy && truncate -s 1M /w/sparse \
         && printf x | dd of=/w/sparse bs=1 seek=524288 conv=notrunc 2>/dev/null",
    );
    let sparse_blocks = blocks(&cli, "t", "/w/sparse");
    snapshot(&cli, "t");
    sh(&cli, "t", "mv /w/d /w/held && ln -s /etc /w/d");
    snapshot(&cli, "t");
    sh(&cli, "t", "rm /w/d && mv /w/held /w/d");
    let s3 = snapshot(&cli, "t");
    let at_s3 = listing_of(&engine, &id).await.unwrap();
    for path in ["/w/d/sub/f", "/w/d/sub/l", "/w/d/t"] {
        assert!(at_s3.contains_key(path.as_bytes()), "{path} was made");
    }

    sh(
        &cli,
        "t",
        "rm -rf /w/d /w/root /w/slashes /w/dot /w/up /w/tidy /w/sparse && mkdir /w/d",
    );
    let rewound = json(&cli.ok(&["rewind", "t", &s3, "--json"]));
    assert!(rewound["new_machine_because"].is_null(), "{rewound}");
    let live = listing_of(&engine, &id).await.unwrap();
    assert_same(&at_s3, &live, "after the rewind, the tree is not s3's");
    assert_eq!(
        blocks(&cli, "t", "/w/sparse"),
        sparse_blocks,
        "the sparse file came back with other blocks"
    );

    assert_fork_same(&cli, &engine, &s3, &at_s3).await;
    cli.ok(&["rm", "t"]);
}

#[tokio::test]
async fn the_root_s_own_metadata_and_empty_xattrs_come_back_in_place_and_in_a_fork() {
    use silo_tests::exact::behind::{remove_xattr, set_xattr};
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let cli = cli();
    let id = up_t(&cli);
    sh(
        &cli,
        "t",
        "mkdir -p /w/d && echo f > /w/f && ln /w/f /w/g && chmod 1777 / && chown 1000:1000 /",
    );
    let pid = silo_tests::exact::run::pid_of(&engine, &id).await.unwrap();
    let xattrs: [(&[u8], &str, &[u8]); 5] = [
        (b"/", "user.root", b"v"),
        (b"/", "user.empty", b""),
        (b"/w/d", "user.empty", b""),
        (b"/w/f", "user.empty", b""),
        (
            b"/w/f", "user.nl", b"a
b",
        ),
    ];
    for (path, name, value) in xattrs {
        set_xattr(pid, path, name, value).unwrap();
    }
    let s1 = snapshot(&cli, "t");
    let at_s1 = listing_of(&engine, &id).await.unwrap();
    let root = &at_s1[&b"/"[..]];
    assert_eq!(root.xattrs.len(), 2, "{root:?}");

    sh(&cli, "t", "chmod 755 / && chown 0:0 / && rm /w/g");
    for (path, name, _) in xattrs {
        remove_xattr(pid, path, name).unwrap();
    }
    let diff = json(&cli.ok(&["diff", "t", &s1, "--json"]));
    let paths: Vec<&str> = diff["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    for path in ["/", "/w/d", "/w/f", "/w/g"] {
        assert!(paths.contains(&path), "silo diff misses {path}: {diff}");
    }

    let rewound = json(&cli.ok(&["rewind", "t", &s1, "--json"]));
    assert!(rewound["new_machine_because"].is_null(), "{rewound}");
    let live = listing_of(&engine, &id).await.unwrap();
    assert_same(&at_s1, &live, "after the rewind, the tree is not s1's");

    assert_fork_same(&cli, &engine, &s1, &at_s1).await;

    // A step that changed the root alone is a change all the same: its
    // snapshot keeps a layer.
    snapshot(&cli, "t");
    sh(&cli, "t", "chmod 711 /");
    let s2 = snapshot(&cli, "t");
    let at_s2 = listing_of(&engine, &id).await.unwrap();
    assert_fork_same(&cli, &engine, &s2, &at_s2).await;
    cli.ok(&["rm", "t"]);
}

#[tokio::test]
async fn every_rewind_and_fork_gives_back_exactly_what_its_snapshot_saw_on_docker() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let cli = cli();
    let settings = Settings::from_env(DOCKER_BUDGET.0, DOCKER_BUDGET.1);
    let target = Target {
        cli: &cli,
        engine: &engine,
        backend: Backend::Docker,
    };
    check(&target, &settings, "exact").await;
}

#[tokio::test]
async fn every_rewind_and_fork_gives_back_exactly_what_its_snapshot_saw_on_podman() {
    let Some(engine) = silo_tests::podman::engine_with_base().await else {
        return;
    };
    let cli = cli();
    let settings = Settings::from_env(PODMAN_BUDGET.0, PODMAN_BUDGET.1);
    let target = Target {
        cli: &cli,
        engine: &engine,
        backend: Backend::Podman,
    };
    check(&target, &settings, "exact-pod").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rewind_and_fork_gives_back_exactly_what_its_snapshot_saw_on_e2b() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let config = MockE2bConfig {
        templates: [(MOCK_BASE.to_owned(), BASE_IMAGE.to_owned())].into(),
        ..MockE2bConfig::default()
    };
    let mock = MockE2b::start(config).await.unwrap();
    let cli = cli().with_env(mock.env());
    let settings = Settings::from_env(MOCK_BUDGET.0, MOCK_BUDGET.1);
    let target = Target {
        cli: &cli,
        engine: &engine,
        backend: Backend::E2b,
    };
    check(&target, &settings, "exact-e2b").await;
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rewind_and_fork_gives_back_exactly_what_its_snapshot_saw_on_daytona() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    // Its default snapshot is the base image, called `MOCK_BASE`.
    let mock = MockDaytona::start(MockDaytonaConfig::default())
        .await
        .unwrap();
    let cli = cli().with_env(mock.env());
    let settings = Settings::from_env(MOCK_BUDGET.0, MOCK_BUDGET.1);
    let target = Target {
        cli: &cli,
        engine: &engine,
        backend: Backend::Daytona,
    };
    check(&target, &settings, "exact-day").await;
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rewind_and_fork_gives_back_exactly_what_its_snapshot_saw_on_kubernetes() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let mock = MockKubernetes::start(MockKubernetesConfig::default())
        .await
        .unwrap();
    // Pods of the plain base image, the agent copied in by an init
    // container from the agent image.
    let agent_image = "silo-test-exact-agent:latest";
    let cli = cli()
        .with_env(mock.env())
        .with_env([("SILO_KUBERNETES_AGENT_IMAGE", agent_image.to_owned())]);
    cli.ok(&["image", "agent", "-t", agent_image]);
    let settings = Settings::from_env(MOCK_BUDGET.0, MOCK_BUDGET.1);
    let target = Target {
        cli: &cli,
        engine: &engine,
        backend: Backend::Kubernetes,
    };
    check(&target, &settings, "exact-k8s").await;
    drop(cli);
    mock.shutdown().await.unwrap();
}
