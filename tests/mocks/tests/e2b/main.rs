//! The mock E2B against the real Docker engine (required when `CI=true`):
//! silo's real agent started and reached the way a backend would,
//! the control plane's refusals and listings, a sandbox's whole life
//! (files, processes, a port through the TLS proxy, pause, resume,
//! timeout), envd's tokens and signatures, processes that time out or are
//! signalled, WebSocket splicing, the binary, the routes the current SDK
//! calls (v2 create and connect, envd's filesystem service), E2B's own
//! fork, snapshots and egress rules, and the fault switches. One test
//! binary, one module per area.
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
mod envd;
mod faults;
mod lifecycle;
mod native;
mod proxy;

use bollard::Docker;
use silo_mocks::containers::{LABEL_SANDBOX, labelled};
use silo_mocks::{MockE2b, MockE2bConfig};

use self::client::Client;
pub use self::common::wait_for;

/// A mock on the real engine with the base image, and a client for it;
/// `None` (the test skips) only without an engine outside CI.
async fn mock() -> Option<(MockE2b, Client, Docker)> {
    let engine = silo_tests::docker::engine_with_base().await?;
    let mock = MockE2b::start(MockE2bConfig::default()).await.unwrap();
    let client = Client::new(&mock);
    Some((mock, client, engine))
}

/// Ids of the containers (running or not) backing `sandbox_id`.
async fn containers_of(engine: &Docker, sandbox_id: &str) -> Vec<String> {
    labelled(engine, LABEL_SANDBOX, sandbox_id).await.unwrap()
}
