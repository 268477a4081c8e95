//! `silo-fuzz`: runs the fuzz targets and reports cases, cases/s, crashes
//! and escapes per target. Exits non-zero on any crash or escape.
//!
//! `cargo run --release -p silo-fuzz -- [--target NAME|all] [--cases N]
//! [--seed S] [--out DIR]`, or `--replay FILE --target NAME` to run one
//! saved input again.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use silo_fuzz::runner::{Outcome, run_one};
use silo_fuzz::{Options, TARGET_NAMES, make_target, run_target};

/// Cases per target when `--cases` is not given.
const DEFAULT_CASES: u64 = 10_000;

#[derive(Debug, Parser)]
#[command(about = "Fuzz silo's parsers of untrusted input on the stable toolchain")]
struct Args {
    /// A target (exec, admit, layer, extract, archive) or `all`.
    #[arg(long, default_value = "all")]
    target: String,
    /// Cases per target.
    #[arg(long, default_value_t = DEFAULT_CASES)]
    cases: u64,
    /// Seed of the run (the time when not given).
    #[arg(long)]
    seed: Option<u64>,
    /// Where the inputs of crashes and escapes are saved.
    #[arg(long, default_value = "fuzz-findings")]
    out: PathBuf,
    /// Run one saved input of `--target` again and print what it does.
    #[arg(long)]
    replay: Option<PathBuf>,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    // Panics are findings, reported by the runner: keep the default hook quiet.
    std::panic::set_hook(Box::new(|_| {}));
    if let Some(path) = &args.replay {
        let input =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut target = make_target(&args.target)?;
        let outcome = run_one(target.as_mut(), &input);
        println!("{}: {outcome:?}", target.name());
        return Ok(if matches!(outcome, Outcome::Fine) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let seed = match args.seed {
        Some(seed) => seed,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default(),
    };
    let names: Vec<&str> = if args.target == "all" {
        TARGET_NAMES.to_vec()
    } else {
        vec![args.target.as_str()]
    };
    println!("seed {seed}");
    println!(
        "{:<8} {:>12} {:>10} {:>8} {:>8}",
        "target", "cases", "cases/s", "crashes", "escapes"
    );
    let options = Options {
        cases: args.cases,
        seed,
        out: args.out.clone(),
        verbose: true,
    };
    let mut clean = true;
    for name in names {
        let mut target = make_target(name)?;
        let report = run_target(target.as_mut(), &options)?;
        println!(
            "{:<8} {:>12} {:>10.0} {:>8} {:>8}",
            report.target,
            report.cases,
            report.rate(),
            report.crashes,
            report.escapes
        );
        clean &= report.clean();
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
