//! Mock remote providers for silo's tests. A provider's public API is
//! followed field for field, and each sandbox is a real Docker container in
//! which silo's real agent can run, so a backend under test takes the same
//! path it takes against the provider: create, upload, start a process,
//! reach a port through the provider's TLS proxy, pause or stop, resume or
//! start, time out.
//!
//! Layout:
//! - [`containers`]: sandboxes as containers (create with published ports,
//!   files in and out, `docker exec` with in-container pids, on a terminal
//!   if asked, signals to a process or a process tree, pause, stop and
//!   start, removal by instance label). Shared by every provider.
//! - [`proxy`]: the TLS side of a provider's port proxy (a test CA and a
//!   wildcard certificate) and the relay to a published port, WebSocket
//!   upgrades spliced byte for byte. Shared.
//! - [`http`]: one body type, response helpers and the accept loop. Shared.
//! - [`instance`]: one running mock (instance id, engine, scratch directory
//!   and CA, listeners, server tasks, cleanup on shutdown or drop) and
//!   [`MockError`]. Shared.
//! - [`secret`]: random ids and tokens, constant-time comparison. Shared.
//! - [`faults`]: switches for what a real provider does that a local mock
//!   would not show (cut connections, an unready proxy, rate limits,
//!   lapsed tokens), set by a test in process or through a test-only route.
//! - [`journal`]: the control-plane requests a mock was asked (method,
//!   path, JSON body), for tests to assert what a client sent.
//! - [`cli`]: what the mock binaries share (image flags, stop signals).
//! - [`e2b`]: E2B's control plane, proxy rules and envd; [`MockE2b`] starts
//!   them all.
//! - [`daytona`]: Daytona's control plane, proxy (previews and toolbox) and
//!   toolbox daemon, as its last published spec has them; [`MockDaytona`]
//!   starts them all.
//! - [`kubernetes`]: a Kubernetes API server (pods as containers running
//!   their own command, Secrets, NetworkPolicies, watches, exec and
//!   port-forward over WebSocket and SPDY) typed by `k8s-openapi`; [`MockKubernetes`]
//!   starts it and writes a kubeconfig.

pub mod cli;
pub mod containers;
pub mod daytona;
pub mod e2b;
pub mod faults;
pub mod http;
pub mod instance;
pub mod journal;
pub mod kubernetes;
pub mod proxy;
pub mod secret;

pub use daytona::{MockDaytona, MockDaytonaConfig};
pub use e2b::{MockE2b, MockE2bConfig};
pub use instance::MockError;
pub use kubernetes::{MockKubernetes, MockKubernetesConfig};
