//! The mock Kubernetes against the real Docker engine (required when
//! `CI=true`): pods that run their command, reach Running, serve on their
//! own address and are deleted with a grace period; watches; Secrets and
//! `emptyDir` volumes shared with init containers; exec and port-forward
//! over WebSocket channels and over SPDY; the API's refusals (`Status` bodies),
//! selectors, discovery and tables; the binary. One test binary, one
//! module per area.
#![allow(
    clippy::unwrap_used,
    reason = "tests: a broken environment should fail loudly"
)]
#![allow(
    clippy::expect_used,
    reason = "tests: a broken environment should fail loudly"
)]

#[path = "../common/mod.rs"]
mod common;

mod api;
mod binary;
mod client;
mod exec;
mod lifecycle;
mod portforward;
mod volumes;

use std::time::Duration;

use bollard::Docker;
use serde_json::{Value, json};
use silo_mocks::containers::{LABEL_SANDBOX, labelled};
use silo_mocks::{MockKubernetes, MockKubernetesConfig};

use self::client::Kube;
pub use self::common::wait_for;

/// Longest a pod may take to reach a phase.
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// A mock on the real engine with the base image, and a client for it;
/// `None` (the test skips) only without an engine outside CI.
async fn mock() -> Option<(MockKubernetes, Kube, Docker)> {
    let engine = silo_tests::docker::engine_with_base().await?;
    let mock = MockKubernetes::start(MockKubernetesConfig::default())
        .await
        .unwrap();
    let client = Kube::new(&mock);
    Some((mock, client, engine))
}

/// Ids of the containers (running or not) of the pod with `uid`.
async fn containers_of(engine: &Docker, uid: &str) -> Vec<String> {
    labelled(engine, LABEL_SANDBOX, uid).await.unwrap()
}

/// A pod manifest: one container running `script` with `sh -c`.
fn pod(name: &str, labels: Value, script: &str, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"containerPort": p})).collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "silo-base:latest",
                "command": ["sh", "-c", script],
                "ports": ports,
            }],
        },
    })
}

/// A pod's phase, polled until it is `phase`; the pod then.
async fn until_phase(client: &Kube, namespace: &str, name: &str, phase: &str) -> Value {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
    let deadline = std::time::Instant::now() + PHASE_TIMEOUT;
    loop {
        let last = client.get(&path).await.json();
        if last["status"]["phase"] == phase {
            return last;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never reached {phase}: {last:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
