//! `fork-many-pool`: `fork_many` of 4 from a pool standing on a snapshot of
//! a 2,000-file tree (a tree-search root), to each fork's first output of
//! `echo ready`, beside `docker run` of the base image (create, start, first
//! output), in the same run. The pool is refilled between rounds, untimed:
//! a fill brings each new member to the snapshot. Beside them, one fork
//! alone from the same pool, and the floor it sets for the four at once:
//! each claim checks its member's whole tree against the snapshot (the
//! rewind's walk, which exactness needs), so four claims on fewer cores run
//! partly one after another.

use std::time::Instant;

use silo::{ForkTarget, Silo};

use crate::docker_common::{
    DockerBench, first_output, plain_container, remove, start_to_first_output,
};
use crate::report::Row;
use crate::stats::Samples;

/// Fork to first output, p50, in milliseconds.
const TARGET_MS: f64 = 50.0;
/// Forks per round, and the pool's size.
const WIDTH: u32 = 4;
/// The snapshot's tree: 20 directories of 100 files.
const TREE: &str = "mkdir -p /work/repo && cd /work/repo && for d in $(seq 20); do \
                    mkdir d$d; for f in $(seq 100); do echo $d.$f > d$d/f$f; done; done";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let rounds = if quick { 2 } else { 5 };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let silo = &bench.silo;
    silo.create(DockerBench::request("bench-root")).await?;
    let step = silo
        .client(&silo.get("bench-root")?)?
        .run(silo_tests::sh(TREE))
        .await?;
    anyhow::ensure!(step.exit.code == Some(0), "making the tree failed");
    let snapshot = silo
        .snapshots_of("bench-root")?
        .take(None)
        .await?
        .snapshot
        .id;
    silo.create_pool_on_snapshot("bench-leaves", &snapshot, WIDTH)?;

    let forks = forks_to_output(silo, &snapshot, WIDTH, rounds).await?;
    // One claim alone, from the same pool: what each of the WIDTH claims
    // costs by itself. WIDTH claims on this machine's cores cannot finish
    // before cores-worth of them have run one after another, so this times
    // the floor under the target.
    let alone = forks_to_output(silo, &snapshot, 1, rounds * WIDTH).await?;
    silo.remove_pool("bench-leaves").await?;
    silo.remove("bench-root").await?;

    let mut docker_run = Samples::default();
    for round in 0..rounds * WIDTH.min(2) {
        let name = format!("bench-plain-run-{round}");
        let t = Instant::now();
        plain_container(&bench.engine, &name, &["echo", "ready"]).await?;
        start_to_first_output(&bench.engine, &name).await?;
        docker_run.push(t.elapsed());
        remove(&bench.engine, &name).await?;
    }

    let (fork_ms, run_ms) = (forks.percentile(50.0), docker_run.percentile(50.0));
    let count = rounds * WIDTH;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let alone_ms = alone.percentile(50.0);
    let floor_ms = alone_ms * (f64::from(WIDTH) / cores).max(1.0);
    Ok(vec![
        Row {
            scenario: "fork-many-pool",
            metric: format!(
                "fork_many of {WIDTH} from a pool on a 2,000-file snapshot, to each fork's output, p50 of {count}"
            ),
            unit: "ms",
            silo: fork_ms,
            baseline: Some(run_ms),
            baseline_name: "docker run (create, start, first output)",
            target: format!("<= {TARGET_MS} ms"),
            met: fork_ms <= TARGET_MS,
        },
        Row::untargeted(
            "fork-many-pool",
            format!("same, p99 of {count}"),
            "ms",
            forks.percentile(99.0),
            Some((docker_run.percentile(99.0), "docker run")),
        ),
        Row::untargeted(
            "fork-many-pool",
            format!("one fork alone from the same pool, to its output, p50 of {count}"),
            "ms",
            alone_ms,
            Some((run_ms, "docker run")),
        ),
        Row::untargeted(
            "fork-many-pool",
            format!("floor of the {WIDTH} at once on {cores} cores: one alone x {WIDTH}/{cores}"),
            "ms",
            floor_ms,
            None,
        ),
    ])
}

/// `rounds` of `fork_many` of `width` from the pool `bench-leaves` (filled
/// before each, untimed), timed from the call to each fork's first output.
async fn forks_to_output(
    silo: &Silo,
    snapshot: &str,
    width: u32,
    rounds: u32,
) -> anyhow::Result<Samples> {
    let target = ForkTarget::default();
    let mut forks = Samples::default();
    for round in 0..rounds {
        let filled = silo.fill_pool("bench-leaves").await?;
        anyhow::ensure!(filled.failed.is_empty(), "filling: {:?}", filled.failed);
        let t = Instant::now();
        let made = silo
            .fork_many(
                snapshot,
                &format!("bench-leaf-{width}-{round}"),
                width,
                &target,
            )
            .await?;
        let outputs = made.iter().map(|(name, outcome)| async move {
            let report = outcome
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            anyhow::ensure!(
                report.pool.is_some(),
                "{name} was made on a new machine: {:?}",
                report.new_machine_because
            );
            let conn = silo.connect(&report.sandbox).await?;
            first_output(&conn, &["echo", "ready"]).await?;
            Ok(t.elapsed())
        });
        for took in futures_util::future::join_all(outputs).await {
            forks.push(took?);
        }
        for (name, _) in &made {
            silo.remove(name).await?;
        }
    }
    Ok(forks)
}
