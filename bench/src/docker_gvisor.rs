//! `gvisor`: the same silo sandbox of the base image under gVisor (`runsc`)
//! beside the engine's default runtime (`runc`), in one run: time to
//! interactive (create to the first output of `echo ready`), exec round
//! trip (`true`), and a snapshot after a 1 KB change. Skipped, with a note,
//! when the engine has no `runsc` runtime outside CI (`.ci/run` registers it).

use std::time::Instant;

use silo_tests::docker::in_ci;
use silo_tests::sh;

use crate::docker_common::{DockerBench, first_output};
use crate::report::Row;
use crate::stats::Samples;

/// gVisor's runtime, as `.ci/run` registers it.
const RUNSC: &str = "runsc";
const SCENARIO: &str = "gvisor";

/// One runtime's figures.
#[derive(Default)]
struct Figures {
    tti: Samples,
    exec: Samples,
    snapshot: Samples,
}

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (rounds, execs) = if quick { (2, 50) } else { (5, 300) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let runtimes = bench.engine.info().await?.runtimes.unwrap_or_default();
    if !runtimes.contains_key(RUNSC) {
        anyhow::ensure!(!in_ci(), "CI=true but the engine has no {RUNSC} runtime");
        eprintln!("skipping gvisor: the engine has no {RUNSC} runtime (.ci/run registers it)");
        return Ok(Vec::new());
    }
    let mut runc = Figures::default();
    let mut runsc = Figures::default();
    // Round 0 of each is untimed, so the engine's caches are warm for both.
    for round in 0..=rounds {
        for (runtime, figures) in [(None, &mut runc), (Some(RUNSC), &mut runsc)] {
            let name = format!("bench-gvisor-{}-{round}", runtime.unwrap_or("runc"));
            let mut request = DockerBench::request(&name);
            request.spec.runtime = runtime.map(str::to_owned);
            let t = Instant::now();
            let sandbox = bench.silo.create(request).await?;
            let conn = bench.silo.connect(&sandbox).await?;
            first_output(&conn, &["echo", "ready"]).await?;
            let tti = t.elapsed();
            let exec =
                crate::exec_rtt::time_true(&conn, if round == 0 { 10 } else { execs }).await?;
            conn.run(sh("head -c 1024 /dev/urandom > /root/changed"))
                .await?;
            let t = Instant::now();
            bench.silo.snapshots_of(&name)?.take(None).await?;
            let snapshot = t.elapsed();
            drop(conn);
            bench.silo.remove(&sandbox.id).await?;
            if round > 0 {
                figures.tti.push(tti);
                figures.exec.append(exec);
                figures.snapshot.push(snapshot);
            }
        }
    }
    let row = |metric: &str, unit, gvisor: f64, runc: f64| {
        Row::untargeted(SCENARIO, metric, unit, gvisor, Some((runc, "runc")))
    };
    Ok(vec![
        row(
            &format!("time to interactive p50 ({rounds} each)"),
            "ms",
            runsc.tti.percentile(50.0),
            runc.tti.percentile(50.0),
        ),
        row(
            &format!("exec rtt p50 ({} each)", rounds * execs),
            "ms",
            runsc.exec.percentile(50.0),
            runc.exec.percentile(50.0),
        ),
        row(
            &format!("exec rtt p99 ({} each)", rounds * execs),
            "ms",
            runsc.exec.percentile(99.0),
            runc.exec.percentile(99.0),
        ),
        row(
            &format!("snapshot of a 1 KB change p50 ({rounds} each)"),
            "ms",
            runsc.snapshot.percentile(50.0),
            runc.snapshot.percentile(50.0),
        ),
    ])
}
