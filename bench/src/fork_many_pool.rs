//! `fork-many-pool`: `fork_many` of 4 from a pool standing on a snapshot of
//! a 2,000-file tree (a tree-search root), to each fork's first output of
//! `echo ready`, beside `docker run` of the base image (create, start, first
//! output), in the same run. The pool is refilled between rounds, untimed:
//! a fill brings each new member to the snapshot.

use std::time::Instant;

use silo::ForkTarget;

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

    let target = ForkTarget::default();
    let mut forks = Samples::default();
    for round in 0..rounds {
        let filled = silo.fill_pool("bench-leaves").await?;
        anyhow::ensure!(filled.failed.is_empty(), "filling: {:?}", filled.failed);
        let t = Instant::now();
        let made = silo
            .fork_many(&snapshot, &format!("bench-leaf-{round}"), WIDTH, &target)
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
    ])
}
