//! `exec-rtt`: round trip of `true` through an agent on one connection, beside
//! spawning `true` directly on the host (what any exec pays), one of each
//! per round; then the floor of a round trip over a WebSocket
//! ([`crate::exec_floor`]) beside the host's spawn, in rounds of its own.

use std::process::{Command, Stdio};
use std::time::Instant;

use silo_protocol::exec::ExecSpec;
use silo_tests::TestAgent;

use crate::exec_floor::Floor;
use crate::report::Row;
use crate::stats::Samples;

/// Most a p50 round trip may cost, as a multiple of the host spawning
/// `true` itself in the same rounds.
const TARGET_RATIO: f64 = 1.15;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 100 } else { 1000 };
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await?;
    let spec = ExecSpec {
        argv: vec!["true".into()],
        ..Default::default()
    };
    for _ in 0..20 {
        conn.run(spec.clone()).await?;
    }
    // Alternating, one of each per round, so a busy moment of the machine
    // costs both alike.
    let mut silo = Samples::default();
    let mut plain = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let out = conn.run(spec.clone()).await?;
        silo.push(t.elapsed());
        anyhow::ensure!(out.exit.code == Some(0), "true failed: {:?}", out.exit);
        let t = Instant::now();
        spawn_true()?;
        plain.push(t.elapsed());
    }

    // The floor in rounds of its own, after silo's, so silo's rounds are
    // timed exactly as before it was added.
    let mut floor = Floor::start().await?;
    for _ in 0..20 {
        floor.round_trip().await?;
    }
    let mut bare = Samples::default();
    let mut beside_bare = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        floor.round_trip().await?;
        bare.push(t.elapsed());
        let t = Instant::now();
        spawn_true()?;
        beside_bare.push(t.elapsed());
    }

    // The target is a ratio: spawning `true` is most of a round trip, and
    // what it costs differs from machine to machine and moment to moment
    // (compare it over several runs).
    let row = |metric: &str, p: f64, target: Option<f64>| Row {
        scenario: "exec-rtt",
        metric: format!("{metric} of {n}, alternating"),
        unit: "ms",
        silo: silo.percentile(p),
        baseline: Some(plain.percentile(p)),
        baseline_name: "spawn `true` on host",
        target: target
            .map(|t| format!("<= {t}x host spawn"))
            .unwrap_or_else(|| "-".into()),
        met: target.is_none_or(|t| silo.percentile(p) <= t * plain.percentile(p)),
    };
    Ok(vec![
        row("p50", 50.0, Some(TARGET_RATIO)),
        row("p99", 99.0, None),
        Row::untargeted(
            "exec-rtt",
            format!("floor: bare WebSocket server spawning `true`, p50 of {n}, alternating"),
            "ms",
            bare.percentile(50.0),
            Some((beside_bare.percentile(50.0), "spawn `true` on host")),
        ),
        Row::untargeted(
            "exec-rtt",
            format!("silo against that floor, p50s of {n}, separate rounds"),
            "ms",
            silo.percentile(50.0),
            Some((bare.percentile(50.0), "bare WebSocket + spawn")),
        ),
    ])
}

/// Spawns and reaps `true` on the host, its output piped as an exec's is.
fn spawn_true() -> std::io::Result<()> {
    Command::new("true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()?;
    Ok(())
}

/// Round trips of `true` on one open connection, `n` of them.
pub async fn time_true(conn: &silo::client::ExecConnection, n: usize) -> anyhow::Result<Samples> {
    let spec = ExecSpec {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let mut samples = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let out = conn.run(spec.clone()).await?;
        samples.push(t.elapsed());
        anyhow::ensure!(out.exit.code == Some(0), "true failed: {:?}", out.exit);
    }
    Ok(samples)
}
