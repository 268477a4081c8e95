//! `tti` (time to interactive): from nothing to the first output of
//! `echo ready` in a fresh Docker sandbox of the base image, beside the
//! Engine API creating, starting and waiting for a plain container of the
//! same image that runs `echo ready`. The wait includes the container's
//! exit, which silo's figure does not, so a second row compares with the
//! plain container's first output instead (attached before its start).

use std::time::Instant;

use crate::docker_common::{
    DockerBench, first_output, plain_container, remove, start_and_wait, start_to_first_output,
};
use crate::report::Row;
use crate::stats::Samples;

/// silo may take at most this many times the plain container's time.
const TARGET_RATIO: f64 = 1.1;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 3 } else { 15 };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    // One untimed round each, so the engine's caches are warm for both.
    let mut silo = Samples::default();
    let mut plain = Samples::default();
    let mut plain_output = Samples::default();
    for round in 0..=n {
        let name = format!("bench-tti-{round}");
        let t = Instant::now();
        let sandbox = bench.silo.create(DockerBench::request(&name)).await?;
        let conn = bench.silo.connect(&sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        let took = t.elapsed();
        drop(conn);
        bench.silo.remove(&sandbox.id).await?;

        let container = format!("silo-bench-tti-plain-{}-{round}", std::process::id());
        let t = Instant::now();
        plain_container(&bench.engine, &container, &["echo", "ready"]).await?;
        start_and_wait(&bench.engine, &container).await?;
        let plain_took = t.elapsed();
        remove(&bench.engine, &container).await?;

        let t = Instant::now();
        plain_container(&bench.engine, &container, &["echo", "ready"]).await?;
        let created = t.elapsed();
        let output_took = created + start_to_first_output(&bench.engine, &container).await?;
        remove(&bench.engine, &container).await?;

        if round > 0 {
            silo.push(took);
            plain.push(plain_took);
            plain_output.push(output_took);
        }
    }
    let row = |baseline: &Samples, baseline_name: &'static str| {
        let ratio = silo.percentile(50.0) / baseline.percentile(50.0);
        Row {
            scenario: "tti",
            metric: format!("p50 of {n}"),
            unit: "ms",
            silo: silo.percentile(50.0),
            baseline: Some(baseline.percentile(50.0)),
            baseline_name,
            target: format!("<= {TARGET_RATIO}x"),
            met: ratio <= TARGET_RATIO,
        }
    };
    Ok(vec![
        row(&plain, "create+start+wait"),
        row(&plain_output, "create+start to output"),
    ])
}
