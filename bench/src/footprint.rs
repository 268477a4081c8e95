//! `agent-footprint`: what the agent costs a sandbox: binary size, idle memory,
//! and time from exec to serving its first request. The baseline for the start
//! time is spawning and reaping `true`, the least any process start costs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use silo_tests::{TestAgent, agent_binary};

use crate::report::Row;
use crate::stats::Samples;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 5 } else { 20 };
    let size_mb = std::fs::metadata(agent_binary())?.len() as f64 / (1024.0 * 1024.0);

    let mut ready = Samples::default();
    let mut rss_kb = 0.0f64;
    for _ in 0..n {
        let t = Instant::now();
        let agent = TestAgent::start().await;
        ready.push(t.elapsed());
        // Idle: give it a moment after the health check, then read resident memory.
        tokio::time::sleep(Duration::from_millis(100)).await;
        rss_kb = rss_kb.max(vm_rss_kib(agent.pid()).unwrap_or(f64::NAN));
    }
    let mut spawn = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        Command::new("true").stdin(Stdio::null()).status()?;
        spawn.push(t.elapsed());
    }

    Ok(vec![
        Row {
            scenario: "agent-footprint",
            metric: "binary size".into(),
            unit: "MiB",
            silo: size_mb,
            baseline: None,
            baseline_name: "-",
            target: "<= 4 MiB".into(),
            met: size_mb <= 4.0,
        },
        Row {
            scenario: "agent-footprint",
            metric: "idle RSS (max)".into(),
            unit: "MiB",
            silo: rss_kb / 1024.0,
            baseline: None,
            baseline_name: "-",
            target: "<= 4 MiB".into(),
            met: rss_kb / 1024.0 <= 4.0,
        },
        Row {
            scenario: "agent-footprint",
            metric: "exec to ready p50".into(),
            unit: "ms",
            silo: ready.percentile(50.0),
            baseline: Some(spawn.percentile(50.0)),
            baseline_name: "spawn+reap `true`",
            target: "<= 10 ms".into(),
            met: ready.percentile(50.0) <= 10.0,
        },
    ])
}

/// Resident memory of a process, in KiB.
pub fn vm_rss_kib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
