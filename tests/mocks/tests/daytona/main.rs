//! The mock Daytona against the real Docker engine (required when
//! `CI=true`): the control plane's authentication, refusals and listing,
//! a sandbox's whole life (create, stop, start, delete, auto-stop), the
//! toolbox (files, execute, sessions) and its access rules, silo's real
//! agent started through a session and reached through the preview proxy
//! with the sandbox's token, WebSocket splicing, the binary, what the
//! current clients need (required fields, bulk files, output shaped by the
//! SDK version, the refused Socket.IO path), Daytona's own pause and
//! network rules, and the fault switches. One test binary, one module per
//! area.
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

mod agent;
mod api;
mod binary;
mod client;
mod current;
mod faults;
mod lifecycle;
mod native;
mod proxy;
mod toolbox;

use std::time::{Duration, Instant};

use bollard::Docker;
use http::StatusCode;
use serde_json::Value;
use silo_mocks::containers::{LABEL_SANDBOX, labelled};
use silo_mocks::{MockDaytona, MockDaytonaConfig};

use self::client::Client;
pub use self::common::wait_for;

/// A mock on the real engine with the base image, and a client for it;
/// `None` (the test skips) only without an engine outside CI.
async fn mock() -> Option<(MockDaytona, Client, Docker)> {
    mock_with(MockDaytonaConfig::default()).await
}

/// As [`mock`], with `config`.
async fn mock_with(config: MockDaytonaConfig) -> Option<(MockDaytona, Client, Docker)> {
    let engine = silo_tests::docker::engine_with_base().await?;
    let mock = MockDaytona::start(config).await.unwrap();
    let client = Client::new(&mock);
    Some((mock, client, engine))
}

/// Ids of the containers (running or not) backing `sandbox_id`.
async fn containers_of(engine: &Docker, sandbox_id: &str) -> Vec<String> {
    labelled(engine, LABEL_SANDBOX, sandbox_id).await.unwrap()
}

/// Whether the container backing `sandbox_id` runs.
async fn running(engine: &Docker, sandbox_id: &str) -> bool {
    let Some(id) = containers_of(engine, sandbox_id).await.pop() else {
        return false;
    };
    engine
        .inspect_container(&id, None)
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.running)
        .unwrap_or(false)
}

/// How long a lifecycle change may take.
const LIFECYCLE_WITHIN: Duration = Duration::from_secs(20);

/// Polls the sandbox until its `state` is `state`; its JSON then.
async fn wait_state(client: &Client, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + LIFECYCLE_WITHIN;
    loop {
        let reply = client.get(id).await;
        if reply.status == StatusCode::OK && reply.json()["state"] == state {
            return reply.json();
        }
        assert!(
            Instant::now() < deadline,
            "sandbox {id} not {state} within {LIFECYCLE_WITHIN:?}: {} {}",
            reply.status,
            reply.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until the sandbox is gone; the `404` body then.
async fn wait_gone(client: &Client, id: &str) -> Value {
    let deadline = Instant::now() + LIFECYCLE_WITHIN;
    loop {
        let reply = client.get(id).await;
        if reply.status == StatusCode::NOT_FOUND {
            return reply.json();
        }
        assert!(
            Instant::now() < deadline,
            "sandbox {id} still there after {LIFECYCLE_WITHIN:?}: {}",
            reply.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
