//! `session-rtt`: round trip of `true` run in a shell session, beside the
//! same `true` as a plain exec through the same agent on the same connection.
//! A session run skips the fork and exec of a new process but goes through a
//! shell (a line to parse, a script to source, records to send back), so the
//! two should be close.

use std::time::Instant;

use silo_protocol::exec::ExecSpec;
use silo_tests::TestAgent;

use crate::report::Row;
use crate::stats::Samples;

/// Target p50 of a session round trip, in milliseconds.
const TARGET_P50_MS: f64 = 1.5;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 100 } else { 1000 };
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await?;
    let in_session = ExecSpec {
        argv: vec!["true".into()],
        session: Some("bench".into()),
        ..Default::default()
    };
    let plain = ExecSpec {
        argv: vec!["true".into()],
        ..Default::default()
    };
    for _ in 0..20 {
        conn.run(in_session.clone()).await?;
        conn.run(plain.clone()).await?;
    }
    let mut session = Samples::default();
    let mut exec = Samples::default();
    // Interleaved, so both see the same machine load.
    for _ in 0..n {
        let t = Instant::now();
        let out = conn.run(in_session.clone()).await?;
        session.push(t.elapsed());
        anyhow::ensure!(
            out.exit.code == Some(0),
            "session true failed: {:?}",
            out.exit
        );
        let t = Instant::now();
        let out = conn.run(plain.clone()).await?;
        exec.push(t.elapsed());
        anyhow::ensure!(out.exit.code == Some(0), "true failed: {:?}", out.exit);
    }
    let row = |metric: &str, p: f64, target: Option<f64>| Row {
        scenario: "session-rtt",
        metric: format!("{metric} of {n}"),
        unit: "ms",
        silo: session.percentile(p),
        baseline: Some(exec.percentile(p)),
        baseline_name: "plain exec, same agent",
        target: target.map_or_else(|| "-".into(), |t| format!("<= {t} ms")),
        met: target.is_none_or(|t| session.percentile(p) <= t),
    };
    Ok(vec![
        row("p50", 50.0, Some(TARGET_P50_MS)),
        row("p99", 99.0, None),
    ])
}
