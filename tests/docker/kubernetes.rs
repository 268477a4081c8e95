//! The Kubernetes backend through the mock API server (`tests/mocks`),
//! whose pods are real containers running the real agent, with the real
//! CLI and the real `kubectl`: a sandbox's whole life as a pod reached
//! through port-forward, pods reached at their own addresses with the agent
//! copied in by an init container and a NetworkPolicy written, a pod
//! deleted outside silo coming back from its latest snapshot, and what a
//! pod has no field for refused by name. After `rm` and `gc` nothing silo
//! made is left: no pod, no Secret, no policy.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::process::Command;
use std::time::{Duration, Instant};

use silo_mocks::{MockKubernetes, MockKubernetesConfig};
use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, engine_with_base};
use silo_tests::json;

use crate::rewind::{differences, entries, rewind, snapshot};
use crate::sh;

/// The base image with the agent baked in.
const BAKED: &str = "silo-test-kubernetes:latest";
/// An image holding only the agent, for init containers.
const AGENT_IMAGE: &str = "silo-test-kubernetes-agent:latest";
/// The label every object silo makes carries.
const MANAGED: &str = "app.kubernetes.io/managed-by=silo";

/// The mock, and a CLI that talks to it; the images built once.
async fn cluster(extra: &[(&str, &str)]) -> Option<(MockKubernetes, Cli)> {
    engine_with_base().await?;
    let mock = MockKubernetes::start(MockKubernetesConfig::default())
        .await
        .unwrap();
    let mut env = mock.env();
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let cli = crate::cli().with_env(env);
    cli.ok(&["image", "bake", BASE_IMAGE, "-t", BAKED]);
    cli.ok(&["image", "agent", "-t", AGENT_IMAGE]);
    Some((mock, cli))
}

/// `kubectl` against the mock; its stdout, failing the test on an error.
fn kubectl(mock: &MockKubernetes, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(mock.kubeconfig_path())
        .args(args)
        .output()
        .expect("kubectl runs (apt-get install kubectl)");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names of the objects of `kind` carrying silo's label.
fn managed(mock: &MockKubernetes, kind: &str) -> Vec<String> {
    let listed = json(&kubectl(mock, &["get", kind, "-l", MANAGED, "-o", "json"]));
    listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// A sandbox's row of `silo ls --json`.
fn row_of(cli: &Cli, name: &str) -> serde_json::Value {
    let listed = json(&cli.ok(&["ls", "--json"]));
    listed
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {listed}"))
        .clone()
}

/// The pod of a sandbox, from `silo ls --json`.
fn pod_of(cli: &Cli, name: &str) -> String {
    let row = row_of(cli, name);
    let pod = row["backend_ref"]["pod"].as_str().unwrap();
    pod.split_once('/').unwrap().1.to_owned()
}

/// The state `silo ls` shows for a sandbox.
fn state_of(cli: &Cli, name: &str) -> String {
    row_of(cli, name)["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Nothing silo made is left in the cluster once its sandboxes are removed
/// and gc has run.
fn nothing_left(mock: &MockKubernetes, cli: &Cli) {
    cli.ok(&["gc"]);
    for kind in ["pods", "secrets", "networkpolicies"] {
        assert_eq!(managed(mock, kind), Vec::<String>::new(), "{kind} left");
    }
}

/// The end of a test: nothing left, then the CLI's own clean-up (which
/// talks to the mock) before the mock stops.
async fn finish(mock: MockKubernetes, cli: Cli) {
    nothing_left(&mock, &cli);
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_lives_as_a_pod_reached_through_port_forward() {
    let Some((mock, k8s)) = cluster(&[("SILO_KUBERNETES_REACH", "port-forward")]).await else {
        return;
    };
    let up = json(&k8s.ok(&[
        "up",
        "box",
        "--backend",
        "kubernetes",
        "--image",
        BAKED,
        "--json",
    ]));
    assert_eq!(up["tier"], 3, "{up}");
    let pod = pod_of(&k8s, "box");
    // kubectl sees exactly silo's pod, with silo's labels.
    assert_eq!(managed(&mock, "pods"), std::slice::from_ref(&pod));
    let labels =
        json(&kubectl(&mock, &["get", "pod", &pod, "-o", "json"]))["metadata"]["labels"].clone();
    assert!(labels["silo.sandbox.id"].is_string(), "{labels}");
    assert!(labels["silo.home"].is_string(), "{labels}");
    let doctor = k8s.ok(&["doctor"]);
    assert!(doctor.contains("port-forward"), "{doctor}");

    // The agent is the pod's PID 1.
    let out = sh(&k8s, "box", "echo hello; tr '\\0' ' ' < /proc/1/cmdline");
    assert!(out.starts_with("hello\n"), "{out}");
    assert!(out.contains("silo-agent"), "the agent is PID 1: {out}");

    // An interrupted runaway returns at once.
    let start = Instant::now();
    let out = k8s.run(&["exec", "box", "--timeout", "1", "--", "sleep", "100"]);
    assert!(!out.status.success());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    // A session keeps its cwd and variables across processes.
    k8s.ok(&[
        "exec",
        "--session",
        "dev",
        "box",
        "--",
        "cd /tmp && export G=hi",
    ]);
    let out = k8s.ok(&["exec", "--session", "dev", "box", "--", "echo $PWD $G"]);
    assert_eq!(out.trim(), "/tmp hi");

    // Files both ways.
    sh(&k8s, "box", "mkdir -p /work");
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("in.txt");
    std::fs::write(&local, "copied in\n").unwrap();
    k8s.ok(&["cp", local.to_str().unwrap(), "box:/work/in.txt"]);
    assert_eq!(sh(&k8s, "box", "cat /work/in.txt"), "copied in\n");
    sh(&k8s, "box", "echo made inside > /work/out.txt");
    let back = dir.path().join("out.txt");
    k8s.ok(&["cp", "box:/work/out.txt", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "made inside\n");

    // A push to five pods lands whole on each, with a report.
    let names = ["p1", "p2", "p3", "p4"];
    for name in names {
        k8s.ok(&["up", name, "--backend", "kubernetes", "--image", BAKED]);
    }
    let tree = tempfile::tempdir().unwrap();
    std::fs::write(tree.path().join("app.txt"), "pushed\n").unwrap();
    let mut push = vec![
        "push",
        tree.path().to_str().unwrap(),
        "--mount",
        "/workspace/managed/app",
        "--json",
        "box",
    ];
    push.extend(names);
    let report = json(&k8s.ok(&push));
    let report = report.to_string();
    for name in ["box", "p1", "p2", "p3", "p4"] {
        assert!(report.contains(name), "{name} missing from {report}");
        assert_eq!(
            sh(&k8s, name, "cat /workspace/managed/app/app.txt"),
            "pushed\n"
        );
    }
    assert_eq!(managed(&mock, "pods").len(), 5);
    let mut rm = vec!["rm"];
    rm.extend(names);
    k8s.ok(&rm);

    // Snapshot and rewind in place: the same pod, the snapshot's tree.
    sh(&k8s, "box", "echo one > /work/file");
    let first = snapshot(&k8s, "box");
    let first_tree = entries(&k8s, "box");
    sh(&k8s, "box", "echo two > /work/file; mkdir -p /work/new");
    let report = rewind(&k8s, "box", &first);
    assert!(report["image"]["in_place"].is_object(), "{report}");
    assert_eq!(pod_of(&k8s, "box"), pod, "rewound on the same pod");
    let differ = differences(&first_tree, &entries(&k8s, "box"));
    assert!(differ.is_empty(), "not the snapshot's tree: {differ:#?}");

    // A fork onto Docker, a change made there, and a fork back.
    let docker = json(&k8s.ok(&[
        "fork",
        &first,
        "--name",
        "on-docker",
        "--backend",
        "docker",
        "--image",
        BASE_IMAGE,
        "--json",
    ]));
    assert_eq!(docker["sandbox"]["backend"], "docker", "{docker}");
    assert_eq!(sh(&k8s, "on-docker", "cat /work/file"), "one\n");
    sh(&k8s, "on-docker", "echo from docker > /work/docker.txt");
    let on_docker = snapshot(&k8s, "on-docker");
    k8s.ok(&[
        "fork",
        &on_docker,
        "--name",
        "back",
        "--backend",
        "kubernetes",
        "--image",
        BAKED,
    ]);
    assert_eq!(
        sh(&k8s, "back", "cat /work/file /work/docker.txt"),
        "one\nfrom docker\n"
    );
    k8s.ok(&["rm", "on-docker", "back"]);

    // Stop snapshots, then deletes the pod; start makes one from it.
    sh(&k8s, "box", "echo kept > /work/kept");
    k8s.ok(&["stop", "box"]);
    assert_eq!(
        managed(&mock, "pods"),
        Vec::<String>::new(),
        "stop deletes the pod"
    );
    assert_eq!(state_of(&k8s, "box"), "stopped");
    let refused = k8s.fails(&["exec", "box", "--", "true"]);
    assert!(refused.contains("silo start box"), "{refused}");
    k8s.ok(&["start", "box"]);
    assert_ne!(pod_of(&k8s, "box"), pod, "a new pod");
    assert_eq!(sh(&k8s, "box", "cat /work/kept"), "kept\n");

    k8s.ok(&["rm", "box"]);
    finish(mock, k8s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_are_reached_at_their_addresses_with_the_agent_copied_in() {
    let Some((mock, k8s)) = cluster(&[
        ("SILO_KUBERNETES_REACH", "pod-ip"),
        ("SILO_KUBERNETES_AGENT_IMAGE", AGENT_IMAGE),
        ("SILO_KUBERNETES_NETWORK_POLICY", "app=api-server"),
    ])
    .await
    else {
        return;
    };
    // Any image: the agent comes from the agent image's init container.
    k8s.ok(&[
        "up",
        "box",
        "--backend",
        "kubernetes",
        "--image",
        BASE_IMAGE,
    ]);
    let pod = pod_of(&k8s, "box");
    let listed = json(&kubectl(&mock, &["get", "pod", &pod, "-o", "json"]));
    let ip = listed["status"]["podIP"].as_str().unwrap().to_owned();
    assert!(ip.starts_with("127."), "a loopback pod address: {ip}");
    assert_eq!(
        listed["spec"]["initContainers"][0]["image"], AGENT_IMAGE,
        "{listed}"
    );
    let doctor = k8s.ok(&["doctor"]);
    assert!(doctor.contains("pod-ip"), "{doctor}");
    let out = sh(&k8s, "box", "tr '\\0' ' ' < /proc/1/cmdline");
    assert!(out.starts_with("/.silo/silo-agent "), "{out}");

    // The policy admits the agent's port from the pods named, only.
    let policy = json(&kubectl(
        &mock,
        &["get", "networkpolicy", &pod, "-o", "json"],
    ));
    let from = &policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    assert_eq!(from["app"], "api-server", "{policy}");
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 49999);

    // A pod without network gets a policy with no egress.
    k8s.ok(&[
        "up",
        "offline",
        "--backend",
        "kubernetes",
        "--image",
        BASE_IMAGE,
        "--network",
        "none",
    ]);
    let offline = pod_of(&k8s, "offline");
    let policy = json(&kubectl(
        &mock,
        &["get", "networkpolicy", &offline, "-o", "json"],
    ));
    assert_eq!(policy["spec"]["egress"], serde_json::json!([]), "{policy}");

    k8s.ok(&["rm", "box", "offline"]);
    finish(mock, k8s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_deleted_outside_silo_comes_back_from_its_latest_snapshot() {
    let Some((mock, k8s)) = cluster(&[]).await else {
        return;
    };
    k8s.ok(&["up", "box", "--backend", "kubernetes", "--image", BAKED]);
    sh(&k8s, "box", "mkdir -p /work && echo saved > /work/saved");
    snapshot(&k8s, "box");
    sh(&k8s, "box", "echo lost > /work/lost");
    let pod = pod_of(&k8s, "box");
    kubectl(&mock, &["delete", "pod", &pod, "--grace-period=0"]);

    assert_eq!(state_of(&k8s, "box"), "missing");
    let gone = k8s.fails(&["exec", "box", "--", "true"]);
    assert!(gone.contains("silo up box"), "{gone}");
    let up = json(&k8s.ok(&["up", "box", "--json"]));
    assert_eq!(up["tier"], 2, "{up}");
    let notes = up["notes"].to_string();
    assert!(notes.contains("removed outside silo"), "{notes}");
    assert_eq!(
        sh(&k8s, "box", "cat /work/saved; ls /work"),
        "saved\nsaved\n"
    );

    k8s.ok(&["rm", "box"]);
    finish(mock, k8s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_a_pod_has_no_field_for_is_refused_by_name_and_nothing_is_made() {
    let Some((mock, k8s)) = cluster(&[]).await else {
        return;
    };
    for (flag, value, named) in [
        ("--pids-limit", "10", "pids-limit"),
        ("--bind", "/tmp:/mnt", "bind"),
        ("--user", "nobody", "numeric"),
        ("--network", "mynet", "network"),
    ] {
        let refused = k8s.fails(&[
            "up",
            "box",
            "--backend",
            "kubernetes",
            "--image",
            BAKED,
            flag,
            value,
        ]);
        assert!(refused.contains(named), "{flag}: {refused}");
    }
    // An image the cluster cannot have: the pod's status is in the error,
    // and the create leaves nothing.
    let refused = k8s.fails(&[
        "up",
        "box",
        "--backend",
        "kubernetes",
        "--image",
        "silo-test-no-such-image:1",
    ]);
    assert!(refused.contains("silo-test-no-such-image"), "{refused}");
    finish(mock, k8s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_deletes_this_homes_orphans_and_nothing_else() {
    let Some((mock, k8s)) = cluster(&[]).await else {
        return;
    };
    k8s.ok(&["up", "box", "--backend", "kubernetes", "--image", BAKED]);
    let pod = pod_of(&k8s, "box");
    let home = std::fs::read_to_string(k8s.home.path().join("home-id")).unwrap();
    // What a create cut short leaves (a Secret of a sandbox silo never
    // recorded), and another home's Secret.
    let secret = |name: &str, home: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "labels": {
                "app.kubernetes.io/managed-by": "silo",
                "silo.home": home,
                "silo.sandbox.id": "sbx-000000000000",
            }},
            "data": { "key": "eA==" },
        })
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, home) in [("silo-orphan", home.trim()), ("silo-other-home", "another")] {
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, secret(name, home).to_string()).unwrap();
        kubectl(
            &mock,
            &["create", "--validate=false", "-f", file.to_str().unwrap()],
        );
    }
    let dry = k8s.ok(&["gc", "--dry-run"]);
    assert!(
        dry.contains("silo-orphan") && !dry.contains("silo-other-home"),
        "{dry}"
    );
    k8s.ok(&["gc"]);
    let mut secrets = managed(&mock, "secrets");
    secrets.sort();
    let mut want = [pod.clone(), "silo-other-home".to_owned()];
    want.sort();
    assert_eq!(secrets, want);
    assert_eq!(
        sh(&k8s, "box", "echo alive"),
        "alive\n",
        "gc left the live pod"
    );
    kubectl(&mock, &["delete", "secret", "silo-other-home"]);
    k8s.ok(&["rm", "box"]);
    finish(mock, k8s).await;
}
