//! The `silo-mock-daytona` binary: one command starts everything, prints
//! the environment, and removes its containers when told to stop.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;
use silo_mocks::daytona::{ENV_API_KEY, ENV_API_URL, ENV_CA_PEM, ENV_PROXY_ADDR, ENV_TARGET};

use super::client::{Access, Client};
use super::containers_of;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_binary_prints_its_environment_and_cleans_up() {
    let Some(engine) = silo_tests::docker::engine_with_base().await else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_silo-mock-daytona"))
        .args([
            "--api-key",
            "dtn_binary",
            "--proxy-domain",
            "bin.test",
            "--snapshot",
            "base=silo-base:latest",
            "--targets",
            "eu,us",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .take(5)
            .map(|l| l.unwrap())
            .collect::<Vec<_>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(20), lines)
        .await
        .expect("the binary printed nothing")
        .unwrap();
    let env: HashMap<String, String> = lines
        .iter()
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=value");
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert_eq!(env[ENV_API_KEY], "dtn_binary");
    assert_eq!(env[ENV_TARGET], "eu");
    assert!(env[ENV_API_URL].starts_with("http://127.0.0.1:"));
    assert!(env[ENV_API_URL].ends_with("/api"));
    assert!(env[ENV_PROXY_ADDR].starts_with("127.0.0.1:"));
    assert!(std::path::Path::new(&env[ENV_CA_PEM]).exists());

    let client = Client::from_env(&env);
    let sandbox = client.create(json!({"target": "us"})).await;
    let id = sandbox["id"].as_str().unwrap().to_owned();
    assert_eq!(sandbox["target"], "us");
    let proxy_port = env[ENV_PROXY_ADDR].rsplit_once(':').unwrap().1;
    assert_eq!(
        sandbox["toolboxProxyUrl"],
        format!("https://proxy.bin.test:{proxy_port}/toolbox")
    );
    let ran = client
        .toolbox(
            &sandbox,
            Access::Bearer("dtn_binary"),
            Method::POST,
            "/process/execute",
            Some(json!({"command": "echo up"})),
        )
        .await;
    assert_eq!(ran.status, StatusCode::OK, "{}", ran.text());
    assert_eq!(ran.json()["result"], "up\n");

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (status, stderr)
    });
    let (status, stderr) = tokio::time::timeout(Duration::from_secs(20), status)
        .await
        .expect("the binary did not stop")
        .unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("removed 1 sandbox container(s)"),
        "{stderr}"
    );
    assert!(containers_of(&engine, &id).await.is_empty());
    assert!(!std::path::Path::new(&env[ENV_CA_PEM]).exists());
}
