//! The `silo-mock-kubernetes` binary: one command starts it, prints
//! `KUBECONFIG=…`, answers with the token given, and removes its
//! containers when told to stop.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use super::client::Kube;
use super::{containers_of, pod, until_phase};

#[tokio::test]
async fn the_binary_prints_its_kubeconfig_and_cleans_up() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_silo-mock-kubernetes"))
        .args(["--token", "binary-token"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout).lines().next().unwrap().unwrap()
    });
    let line = tokio::time::timeout(Duration::from_secs(30), line)
        .await
        .expect("the binary printed nothing")
        .unwrap();
    let path = line.strip_prefix("KUBECONFIG=").expect("KUBECONFIG=path");
    let kubeconfig = std::fs::read_to_string(path).unwrap();
    assert!(kubeconfig.contains("token: \"binary-token\""));
    assert!(kubeconfig.contains("current-context: silo-mock"));
    assert!(kubeconfig.contains("namespace: \"default\""));
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    assert!(server.starts_with("https://127.0.0.1:"), "{server}");
    let ca = std::path::Path::new(path).with_file_name("ca.pem");
    let client = Kube::from_parts(&server, "binary-token", &ca);
    let made = client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("bin", json!({}), "sleep 1000", &[]),
        )
        .await;
    until_phase(&client, "default", "bin", "Running").await;
    let uid = made["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(containers_of(&engine, &uid).await.len(), 1);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
    assert!(containers_of(&engine, &uid).await.is_empty());
    assert!(!std::path::Path::new(path).exists());
}
