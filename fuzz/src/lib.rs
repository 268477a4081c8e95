//! silo-fuzz: a fuzz harness that runs on the stable toolchain.
//!
//! cargo-fuzz needs nightly; this crate gets the same kind of coverage of
//! silo's parsers of untrusted input without it. Each target makes inputs two
//! ways: structure-aware generation (the `arbitrary` crate turns random bytes
//! into typed descriptions, e.g. tar entries with hostile names, types and
//! lying sizes, which are then serialized) and byte mutation of valid seeds
//! (`mutate`). Every case runs under `catch_unwind`; a panic is a crash, and a
//! target's own oracle (a write outside the target directory, a request
//! accepted that was never signed) is an escape. The reproducing input of
//! each finding is saved, and `--replay` runs it again.
//!
//! # Layout
//! - `runner`: the case loop, per-case seeds, findings and the report.
//! - `mutate`: the byte mutation engine over seeds.
//! - `tarspec`: structured tar (and gzip) generation.
//! - `targets`: one module per target (extract, exec, admit, layer, archive).

pub mod mutate;
pub mod runner;
pub mod targets;
pub mod tarspec;

pub use runner::{Options, Report, run_target};
pub use targets::{TARGET_NAMES, Target, make_target};

#[cfg(test)]
mod tests {
    use super::*;

    /// Cases per target in the workspace test run (debug build).
    const CI_CASES: u64 = 2_000;
    /// Fixed, so a failure in CI reproduces.
    const CI_SEED: u64 = 0x5110_f022;

    #[test]
    fn every_target_runs_clean() {
        let out = tempfile::tempdir().unwrap();
        let options = Options {
            cases: CI_CASES,
            seed: CI_SEED,
            out: out.path().to_path_buf(),
            verbose: true,
        };
        for name in TARGET_NAMES {
            let mut target = make_target(name).unwrap();
            let report = run_target(target.as_mut(), &options).unwrap();
            assert!(report.clean(), "{name}: {report:?}");
        }
    }
}
