//! `interrupt` rows for session runs: latency from the interrupt request to
//! the exit event of a command running in a shell session, for one that dies
//! of SIGINT and one that ignores it (killed at the grace; the shell survives
//! both). The baseline is the same command as a plain exec on the same agent.

use std::time::{Duration, Instant};

use silo::client::ExecConnection;
use silo_protocol::exec::ExecSpec;
use silo_tests::TestAgent;

use crate::report::Row;
use crate::stats::Samples;

const GRACE: Duration = Duration::from_millis(500);
/// Grace for the cooperative case: long, so a miss would show.
const LONG_GRACE: Duration = Duration::from_secs(2);
/// Added to the grace in the targets.
const TARGET_SLACK_MS: f64 = 20.0;
/// Time for the command to reach its steady state before the interrupt.
const SETTLE: Duration = Duration::from_millis(50);

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 5 } else { 20 };
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await?;
    let cases: [(&str, &str, Option<Duration>); 2] = [
        ("session: sleep 100", "sleep 100", None),
        (
            "session: SIGINT ignored",
            "sh -c \"trap '' INT; sleep 100\"",
            Some(GRACE),
        ),
    ];
    let mut rows = Vec::new();
    for (name, script, grace) in cases {
        let mut session = Samples::default();
        let mut plain = Samples::default();
        for _ in 0..n {
            let spec = ExecSpec {
                argv: vec![script.into()],
                session: Some("bench".into()),
                ..Default::default()
            };
            session.push(interrupt(&conn, spec, grace).await?);
            let spec = ExecSpec {
                argv: vec!["sh".into(), "-c".into(), format!("exec {script}")],
                ..Default::default()
            };
            plain.push(interrupt(&conn, spec, grace).await?);
        }
        let target_ms = grace.unwrap_or_default().as_secs_f64() * 1000.0 + TARGET_SLACK_MS;
        let grace_note = grace
            .map(|g| format!("grace {} ms + ", g.as_millis()))
            .unwrap_or_default();
        for (p, target) in [(50.0, true), (99.0, false)] {
            rows.push(Row {
                scenario: "interrupt",
                metric: format!("{name} p{p}"),
                unit: "ms",
                silo: session.percentile(p),
                baseline: Some(plain.percentile(p)),
                baseline_name: "plain exec, same agent",
                target: if target {
                    format!("<= {grace_note}{TARGET_SLACK_MS} ms")
                } else {
                    "-".into()
                },
                met: !target || session.percentile(p) <= target_ms,
            });
        }
    }
    // The session's shell survived every interrupt.
    let out = conn
        .run(ExecSpec {
            argv: vec!["echo alive".into()],
            session: Some("bench".into()),
            ..Default::default()
        })
        .await?;
    anyhow::ensure!(
        !out.exit.restored && out.stdout == b"alive\n",
        "the session did not survive: {out:?}"
    );
    Ok(rows)
}

async fn interrupt(
    conn: &ExecConnection,
    spec: ExecSpec,
    grace: Option<Duration>,
) -> anyhow::Result<Duration> {
    let exec = conn.exec(spec).await?;
    tokio::time::sleep(SETTLE).await;
    let t = Instant::now();
    exec.interrupt(Some(grace.unwrap_or(LONG_GRACE))).await?;
    let out = exec.collect().await?;
    anyhow::ensure!(out.exit.interrupted, "not interrupted: {:?}", out.exit);
    Ok(t.elapsed())
}
