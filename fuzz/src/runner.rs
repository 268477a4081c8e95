//! The case loop: per-case seeds, `catch_unwind`, saved findings, the report.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use fastrand::Rng;

use crate::targets::Target;

/// How one target is run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Cases to run.
    pub cases: u64,
    /// The run's seed; case `i` uses [`case_seed`]`(seed, i)`.
    pub seed: u64,
    /// Where reproducing inputs of findings are written.
    pub out: PathBuf,
    /// Print findings as they happen.
    pub verbose: bool,
}

/// What one target's run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The target.
    pub target: &'static str,
    /// Cases run.
    pub cases: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Panics.
    pub crashes: u64,
    /// Oracle failures: writes outside the target directory, forgeries accepted.
    pub escapes: u64,
    /// Saved inputs of the findings (the first few).
    pub saved: Vec<PathBuf>,
}

/// Inputs saved per target at most, so a systematic bug does not fill the disk.
const MAX_SAVED: usize = 20;

impl Report {
    /// Cases per second.
    pub fn rate(&self) -> f64 {
        self.cases as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// No crash and no escape.
    pub fn clean(&self) -> bool {
        self.crashes == 0 && self.escapes == 0
    }
}

/// The seed of case `index` of a run seeded `seed` (splitmix64, so
/// neighbouring cases get unrelated streams).
pub fn case_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `options.cases` cases of `target`.
pub fn run_target(target: &mut dyn Target, options: &Options) -> anyhow::Result<Report> {
    let mut report = Report {
        target: target.name(),
        ..Report::default()
    };
    let start = Instant::now();
    for index in 0..options.cases {
        let seed = case_seed(options.seed, index);
        let input = target.generate(&mut Rng::with_seed(seed));
        let outcome = run_one(target, &input);
        report.cases += 1;
        let what = match outcome {
            Outcome::Fine => continue,
            Outcome::Crash(message) => {
                report.crashes += 1;
                format!("crash: {message}")
            }
            Outcome::Escape(message) => {
                report.escapes += 1;
                format!("escape: {message}")
            }
        };
        let saved = if report.saved.len() < MAX_SAVED {
            let path = save(&options.out, target.name(), seed, &input)?;
            report.saved.push(path.clone());
            path.display().to_string()
        } else {
            "not saved (too many)".to_owned()
        };
        if options.verbose {
            eprintln!(
                "{}: case {index} (case seed {seed:#018x}) {what}; input: {saved}",
                target.name()
            );
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// What one case did.
#[derive(Debug)]
pub enum Outcome {
    /// Accepted or refused, without harm.
    Fine,
    /// Panicked, with the panic's message.
    Crash(String),
    /// The target's oracle failed.
    Escape(String),
}

/// Runs one input under `catch_unwind`.
pub fn run_one(target: &mut dyn Target, input: &[u8]) -> Outcome {
    match catch_unwind(AssertUnwindSafe(|| target.run(input))) {
        Ok(Ok(())) => Outcome::Fine,
        Ok(Err(escape)) => Outcome::Escape(escape),
        Err(payload) => Outcome::Crash(
            payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned()),
        ),
    }
}

fn save(out: &Path, target: &str, seed: u64, input: &[u8]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join(format!("{target}-{seed:016x}.bin"));
    std::fs::write(&path, input).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
