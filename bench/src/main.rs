//! `silo-bench`: runs silo and the plain alternative side by side, in one run,
//! and prints both with their ratio.
//!
//! Each scenario lives in its own module and returns [`report::Row`]s; the
//! report module owns the table and the JSON file. Timing targets live here,
//! never in tests.
#![allow(
    clippy::unwrap_used,
    reason = "a benchmark on a broken machine should stop loudly"
)]
#![allow(
    clippy::expect_used,
    reason = "a benchmark on a broken machine should stop loudly"
)]

mod big_files;
mod cli;
mod cli_snapshot;
mod daytona;
mod docker_common;
mod docker_exec_rtt;
mod docker_gvisor;
mod docker_resume;
mod docker_tti;
mod e2b;
mod exec_floor;
mod exec_memory;
mod exec_rtt;
mod files;
mod fleet;
mod footprint;
mod fork_many_pool;
mod fork_pool;
mod interrupt;
mod kubernetes;
mod long_use;
mod nonce_window;
mod pool;
mod push_big;
mod push_fanout;
mod report;
mod rewind;
mod scale;
mod session_interrupt;
mod session_rtt;
mod snapshot;
mod snapshot_chain;
mod stats;
mod tree_search;

use std::path::PathBuf;

use clap::Parser;

/// Every scenario, in the order they run by default.
const SCENARIOS: &[&str] = &[
    "tree-search",
    "exec-rtt",
    "cli",
    "cli-snapshot",
    "exec-memory",
    "session-rtt",
    "interrupt",
    "agent-footprint",
    "push-big",
    "push-fanout",
    "nonce-window",
    "docker-exec-rtt",
    "tti",
    "resume",
    "snapshot",
    "snapshot-chain",
    "rewind",
    "big-files",
    "pool",
    "fork-pool",
    "fork-many-pool",
    "scale",
    "files",
    "soak",
    "push-many",
    "gvisor",
    "e2b",
    "daytona",
    "fleet",
    "kubernetes",
];

#[derive(Parser)]
#[command(about = "Benchmarks silo against the plain alternative, side by side")]
struct Args {
    /// Scenarios to run (all when none): tree-search (a search of
    /// branching 4 and depth 5 over a 3,000-file repository, a checkpoint
    /// per node and a rewind per later sibling, beside `docker commit` and
    /// a new container per branch), exec-rtt, cli (`silo --version` and
    /// `silo exec` as new processes on a local sandbox, beside spawning
    /// `/bin/true`), exec-memory (agent memory
    /// under four chatty commands), session-rtt, interrupt
    /// (plain execs and session runs), agent-footprint,
    /// push-big, push-fanout, nonce-window (signed requests for longer than
    /// the 300 s signature window), docker-exec-rtt, tti, resume, snapshot,
    /// snapshot-chain (100 snapshots of one sandbox, a 1 KB change each,
    /// and rewinds along the chain), rewind (in place to first output after
    /// a 1 KB step beside a new machine, and the change list's cost as the
    /// tree grows), big-files (in place after 4 KiB changed in a 50 MB file,
    /// 1 MiB appended to a 50 MB log and 20 of 1,000 files of 1-5 MB
    /// changed, beside `docker commit` and a new container), pool (`up --pool` to first output
    /// beside a plain container's create and start), scale (`silo ls` and
    /// `silo exec` with 1,000 local and 100 Docker sandboxes, and memory),
    /// files (write and read through the agent beside docker cp), soak
    /// (1,000 commands of 1 MiB under --memory 64m: time beside docker exec,
    /// agent RSS at start, peak and end), push-many (100,000 entries onto
    /// the container root beside tar xzf in the same container), gvisor
    /// (tti, exec rtt and snapshot under runsc beside runc), e2b (time to
    /// interactive, exec and resume beside E2B's own API, through the mock
    /// E2B), daytona (the same beside Daytona's own API and toolbox, through
    /// the mock Daytona), fleet (on a fleet's PostgreSQL and S3 server,
    /// from `scripts/fleet.sh up`, beside the home's SQLite and store:
    /// checkpoint durability, a cold-cache fork on another host, a pool
    /// claim, `silo ls` with 1,000 records), kubernetes (time to
    /// interactive, exec and pool claim beside `kubectl run`, `wait` and
    /// `exec`, through the mock API server). The Docker ones are skipped, with a note, when no engine
    /// answers outside CI. A scenario that cannot run is named with its
    /// error after the table, and the run exits 1.
    scenarios: Vec<String>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/silo-bench.json")]
    json: PathBuf,
    /// Fewer iterations, for a smoke run.
    #[arg(long)]
    quick: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let chosen: Vec<&str> = if args.scenarios.is_empty() {
        SCENARIOS.to_vec()
    } else {
        args.scenarios.iter().map(String::as_str).collect()
    };
    if let Some(unknown) = chosen.iter().find(|name| !SCENARIOS.contains(name)) {
        anyhow::bail!(
            "unknown scenario {unknown:?}; known: {}",
            SCENARIOS.join(", ")
        );
    }
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for scenario in chosen {
        eprintln!("running {scenario}...");
        // A scenario that cannot run is reported; the others still run
        // and print.
        match run(scenario, args.quick).await {
            Ok(mut found) => rows.append(&mut found),
            Err(error) => {
                eprintln!("{scenario} could not run: {error:#}");
                failed.push(report::Failure {
                    scenario: scenario.to_owned(),
                    error: format!("{error:#}"),
                });
            }
        }
    }
    report::print(&rows);
    report::print_failures(&failed);
    report::write_json(&args.json, &rows, &failed)?;
    eprintln!("wrote {}", args.json.display());
    anyhow::ensure!(
        failed.is_empty(),
        "{} of the scenarios could not run",
        failed.len()
    );
    Ok(())
}

/// Runs one scenario (a name of [`SCENARIOS`]).
async fn run(scenario: &str, quick: bool) -> anyhow::Result<Vec<report::Row>> {
    Ok(match scenario {
        "tree-search" => tree_search::run(quick).await?,
        "exec-rtt" => exec_rtt::run(quick).await?,
        "cli" => cli::run(quick).await?,
        "cli-snapshot" => cli_snapshot::run(quick).await?,
        "exec-memory" => exec_memory::run(quick).await?,
        "session-rtt" => session_rtt::run(quick).await?,
        "interrupt" => {
            let mut rows = interrupt::run(quick).await?;
            rows.append(&mut session_interrupt::run(quick).await?);
            rows
        }
        "agent-footprint" => footprint::run(quick).await?,
        "push-big" => push_big::run(quick).await?,
        "push-fanout" => push_fanout::run(quick).await?,
        "nonce-window" => nonce_window::run(quick).await?,
        "docker-exec-rtt" => docker_exec_rtt::run(quick).await?,
        "tti" => docker_tti::run(quick).await?,
        "resume" => docker_resume::run(quick).await?,
        "snapshot" => snapshot::run(quick).await?,
        "snapshot-chain" => snapshot_chain::run(quick).await?,
        "rewind" => rewind::run(quick).await?,
        "big-files" => big_files::run(quick).await?,
        "pool" => pool::run(quick).await?,
        "fork-pool" => fork_pool::run(quick).await?,
        "fork-many-pool" => fork_many_pool::run(quick).await?,
        "scale" => scale::run(quick).await?,
        "files" => files::run(quick).await?,
        "soak" => long_use::soak(quick).await?,
        "push-many" => long_use::push_many(quick).await?,
        "e2b" => e2b::run(quick).await?,
        "daytona" => daytona::run(quick).await?,
        "fleet" => fleet::run(quick).await?,
        "kubernetes" => kubernetes::run(quick).await?,
        "gvisor" => docker_gvisor::run(quick).await?,
        other => anyhow::bail!("no scenario {other:?}"),
    })
}
