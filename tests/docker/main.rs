//! End-to-end tests on the real Docker engine, and on Podman's for the
//! Podman backend (each required when `CI=true`):
//! sandboxes, their security settings, leases, images, push, file copies
//! and snapshots, mostly driven through the real `silo` CLI. One test
//! binary, one module per area, so the workspace links it once.

mod backend;
mod daytona;
mod daytona_provider;
mod e2b;
mod e2b_routes;
mod e2b_snapshots;
mod exact;
mod files_cli;
mod fleet;
mod fork_pool;
mod image;
mod incremental;
mod kubernetes;
mod lease;
mod listing;
mod long_use;
mod memory;
mod podman;
mod pool;
mod push;
mod remote_rewind;
mod rewind;
mod sandbox;
mod security;
mod snapshot;

/// The `silo` binary cargo built for these tests.
const SILO: &str = env!("CARGO_BIN_EXE_silo");

/// The real CLI against a fresh scratch home.
fn cli() -> silo_tests::Cli {
    silo_tests::Cli::new(SILO)
}

/// `silo exec NAME -- sh -c SCRIPT`, its stdout.
fn sh(cli: &silo_tests::Cli, name: &str, script: &str) -> String {
    cli.ok(&["exec", name, "--", "sh", "-c", script])
}
