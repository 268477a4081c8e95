//! `interrupt`: latency from the interrupt request to the exit event, for a
//! command that dies of SIGINT and one that ignores it (so the agent must wait
//! the grace and SIGKILL). The baseline does the same by hand on the host:
//! kill(SIGINT), wait, and for the stubborn one sleep the grace and SIGKILL.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use silo_protocol::exec::ExecSpec;
use silo_tests::TestAgent;

use crate::report::Row;
use crate::stats::Samples;

const GRACE: Duration = Duration::from_millis(500);

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 5 } else { 20 };
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await?;
    let cases: [(&str, &str, Option<Duration>); 2] = [
        ("sleep 100", "exec sleep 100", None),
        ("SIGINT ignored", "trap '' INT; sleep 100", Some(GRACE)),
    ];
    let mut rows = Vec::new();
    for (name, script, grace) in cases {
        let mut silo = Samples::default();
        let mut plain = Samples::default();
        for _ in 0..n {
            let spec = ExecSpec {
                argv: vec!["sh".into(), "-c".into(), script.into()],
                ..Default::default()
            };
            let exec = conn.exec(spec).await?;
            // Let the shell reach its sleep so the signal meets the steady state.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let t = Instant::now();
            exec.interrupt(Some(grace.unwrap_or(Duration::from_secs(2))))
                .await?;
            exec.collect().await?;
            silo.push(t.elapsed());

            plain.push(by_hand(script, grace)?);
        }
        let target_ms = grace.unwrap_or_default().as_secs_f64() * 1000.0 + 20.0;
        let grace_note = grace
            .map(|g| format!("grace {} ms + ", g.as_millis()))
            .unwrap_or_default();
        rows.push(Row {
            scenario: "interrupt",
            metric: format!("{name} p50"),
            unit: "ms",
            silo: silo.percentile(50.0),
            baseline: Some(plain.percentile(50.0)),
            baseline_name: "killpg by hand on host",
            target: format!("<= {grace_note}20 ms"),
            met: silo.percentile(50.0) <= target_ms,
        });
        rows.push(Row::untargeted(
            "interrupt",
            format!("{name} p99"),
            "ms",
            silo.percentile(99.0),
            Some((plain.percentile(99.0), "killpg by hand on host")),
        ));
    }
    Ok(rows)
}

/// The plain alternative: the same escalation done directly with signals.
fn by_hand(script: &str, grace: Option<Duration>) -> anyhow::Result<Duration> {
    let mut child = Command::new("sh")
        .args(["-c", script])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(50));
    let group = Pid::from_raw(i32::try_from(child.id())?);
    let t = Instant::now();
    killpg(group, Signal::SIGINT)?;
    if let Some(grace) = grace {
        std::thread::sleep(grace);
        let _ = killpg(group, Signal::SIGKILL);
    }
    child.wait()?;
    Ok(t.elapsed())
}
