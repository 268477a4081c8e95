//! The promise that a rewind and a fork give back exactly what the
//! snapshot saw, checked as a property: a seeded generator of file-system
//! operations, a listing of the live sandbox read from the host, the
//! listings compared after every rewind and fork, and a failure shrunk to a
//! short script a person can paste.
//!
//! Layout:
//! - [`listing`]: a sandbox's tree as the host sees it through
//!   `/proc/<pid>/root`, with none of silo's code, and the differences of two.
//! - [`rng`]: the seeded generator the whole run is drawn from.
//! - [`kinds`]: the kinds of operation, by the names `SILO_EXACT_KINDS` lists.
//! - [`ops`]: operations drawn by kind, each rendered as a line of `sh`.
//! - [`plan`]: a run as a list of actions (steps, snapshots, rewinds,
//!   forks), drawn from the seed, and printed as shell lines.
//! - [`run`]: a plan played on a fresh sandbox, the promise checked after
//!   each action.
//! - [`shrink`]: a shorter plan that fails the same way.
//!
//! [`check`] ties them together for a test; [`Settings`] reads the
//! environment that steers a run (`SILO_EXACT_*`).

pub mod behind;
pub mod kinds;
pub mod listing;
pub mod ops;
pub mod plan;
pub mod rng;
pub mod run;
pub mod shrink;

use std::time::{Duration, Instant};

use kinds::OpKind;
use listing::Compare;
use run::Target;

/// The seed of a run; without it, one is made from the clock.
pub const SEED_VAR: &str = "SILO_EXACT_SEED";
/// Comma-separated operation kinds to draw from (default: all).
pub const KINDS_VAR: &str = "SILO_EXACT_KINDS";
/// How many rewinds a run makes.
pub const REWINDS_VAR: &str = "SILO_EXACT_REWINDS";
/// How many forks a run makes.
pub const FORKS_VAR: &str = "SILO_EXACT_FORKS";
/// Seconds a failure may be shrunk for.
pub const SHRINK_SECS_VAR: &str = "SILO_EXACT_SHRINK_SECS";
/// `0` to compare modification times to the whole second only (by
/// default they are compared to the nanosecond, as layers keep them).
pub const NANOS_VAR: &str = "SILO_EXACT_NANOS";
/// The shrink budget under CI, where a run's time is shared.
const SHRINK_SECS_CI: u64 = 120;
/// The shrink budget elsewhere: a person waiting for a short script.
const SHRINK_SECS_LOCAL: u64 = 300;

/// What steers one property run, read from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The seed everything is drawn from; printed in every failure.
    pub seed: u64,
    /// The operation kinds steps are drawn from.
    pub kinds: Vec<OpKind>,
    /// Rewinds the run makes.
    pub rewinds: usize,
    /// Forks the run makes.
    pub forks: usize,
    /// How long a failure may be shrunk for.
    pub shrink: Duration,
    /// What two listings must agree on.
    pub compare: Compare,
}

impl Settings {
    /// The settings the environment asks for, with these budgets when it
    /// names none. Panics on a value it cannot read, so a typo never runs
    /// a different test than the one asked for.
    pub fn from_env(default_rewinds: usize, default_forks: usize) -> Self {
        let shrink_default = if crate::docker::in_ci() {
            SHRINK_SECS_CI
        } else {
            SHRINK_SECS_LOCAL
        };
        Self {
            seed: rng::seed_from_env(),
            kinds: OpKind::from_env(),
            rewinds: number(REWINDS_VAR, default_rewinds as u64) as usize,
            forks: number(FORKS_VAR, default_forks as u64) as usize,
            shrink: Duration::from_secs(number(SHRINK_SECS_VAR, shrink_default)),
            compare: Compare {
                nanoseconds: !std::env::var(NANOS_VAR).is_ok_and(|v| v == "0" || v == "false"),
                ..Compare::default()
            },
        }
    }
}

/// A whole number from the environment, or `default` when unset.
fn number(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{var}={value:?} is not a whole number: {e}")),
        Err(_) => default,
    }
}

/// Draws a plan from `settings`, plays it on a fresh sandbox called
/// `name`, and on a failure prints it whole, shrinks it and panics with the
/// shortest failing script. The seed is printed first, so even a run cut
/// short by a timeout can be repeated.
pub async fn check(target: &Target<'_>, settings: &Settings, name: &str) {
    let seed = settings.seed;
    let kinds: Vec<&str> = settings.kinds.iter().map(|k| k.name()).collect();
    eprintln!(
        "[exact] {SEED_VAR}={seed} on {}: {} rewinds, {} forks, kinds {}",
        target.backend.name(),
        settings.rewinds,
        settings.forks,
        kinds.join(",")
    );
    let budget = (settings.rewinds, settings.forks);
    let mut plan = plan::generate(seed, &settings.kinds, budget, !target.backend.is_remote());
    if target.backend.stop_deletes_machines() {
        plan = plan::with_restarts(plan, seed);
    }
    let started = Instant::now();
    let failure = match target.play(&plan, name, settings.compare, true).await {
        Ok(stats) => {
            eprintln!(
                "[exact] {SEED_VAR}={seed}: passed in {:.1} s: {stats}",
                started.elapsed().as_secs_f64()
            );
            return;
        }
        Err(failure) => failure,
    };
    let upto = &plan[..=failure.at.min(plan.len() - 1)];
    eprintln!(
        "[exact] {SEED_VAR}={seed}: FAILED at action {} after {:.1} s ({})\n{}\n\
         the plan so far:\n{}",
        failure.at,
        started.elapsed().as_secs_f64(),
        failure.class.name(),
        failure.detail,
        plan::render(upto, name, target.backend)
    );
    let shrunk = shrink::shrink(target, upto.to_vec(), failure.clone(), settings).await;
    panic!(
        "{SEED_VAR}={seed}: a rewind or fork did not give back what its snapshot saw \
         ({}; first at action {} of the full plan).\n\
         Shortest failing plan found ({} actions, {} tries in {:.0} s), failing at action {}:\n\
         {}\n{}",
        failure.class.name(),
        failure.at,
        shrunk.plan.len(),
        shrunk.tries,
        shrunk.spent.as_secs_f64(),
        shrunk.failure.at,
        shrunk.failure.detail,
        plan::render(&shrunk.plan, name, target.backend)
    );
}
