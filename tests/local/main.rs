//! End-to-end tests that need no container engine: the real agent as a
//! host process, and the real `silo` CLI on the local backend. One test
//! binary, one module per area, so the workspace links it once.

mod auth;
mod cli;
mod exec;
mod fanout;
mod files_cli;
mod handle;
mod lifecycle;
mod pty;
mod push_hostile;
mod push_swap;
mod rewind;
mod sessions;
mod versions;

/// The `silo` binary cargo built for these tests.
const SILO: &str = env!("CARGO_BIN_EXE_silo");

/// The real CLI against a fresh scratch home.
fn cli() -> silo_tests::Cli {
    silo_tests::Cli::new(SILO)
}
