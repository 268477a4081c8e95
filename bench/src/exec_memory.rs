//! `exec-memory`: the agent's memory while four commands each print ten
//! million single bytes (one `write` per byte), all followed by one client.
//! Output is held by real memory, not by read count, and the running execs
//! share one budget, so the agent's resident memory must stay within 8 MiB
//! of its idle figure. The baseline column is what the commands printed.

use std::time::Duration;

use silo::client::ExecEvent;
use silo_tests::{TestAgent, sh};

use crate::footprint::vm_rss_kib;
use crate::report::Row;

/// Commands printing at once.
const EXECS: usize = 4;
/// Target: growth of the agent's resident memory over idle.
const TARGET_MIB: f64 = 8.0;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let bytes_each: u64 = if quick { 1_000_000 } else { 10_000_000 };
    let agent = TestAgent::start().await;
    let conn = agent.client().connect().await?;
    // Warm the agent's allocator and runtime before reading the idle figure.
    conn.run(sh("true")).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle_kib = vm_rss_kib(agent.pid()).unwrap_or(f64::NAN);

    let mut handles = Vec::new();
    for _ in 0..EXECS {
        // dd with a one-byte block size makes one write per byte.
        let script = format!("dd if=/dev/zero bs=1 count={bytes_each} 2>/dev/null");
        handles.push(conn.exec(sh(&script)).await?);
    }
    let pid = agent.pid();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let sampler = tokio::spawn(async move {
        let mut peak = 0.0f64;
        loop {
            peak = peak.max(vm_rss_kib(pid).unwrap_or(0.0));
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = &mut stopped => return peak,
            }
        }
    });
    // Every exec is followed at once: one left unread would back up the
    // connection for all of them.
    let readers = handles.into_iter().map(|mut handle| {
        tokio::spawn(async move {
            let mut received = 0u64;
            while let Some(event) = handle.next_event().await {
                if let ExecEvent::Output { data, .. } = event {
                    received += data.len() as u64;
                }
            }
            received
        })
    });
    let mut received = 0u64;
    for reader in readers.collect::<Vec<_>>() {
        received += reader.await?;
    }
    let _ = stop.send(());
    let peak_kib = sampler.await?;
    let growth_mib = (peak_kib - idle_kib) / 1024.0;
    let printed_mib = (bytes_each * EXECS as u64) as f64 / (1024.0 * 1024.0);
    Ok(vec![
        Row {
            scenario: "exec-memory",
            metric: format!("agent RSS over idle, {EXECS} execs of 1-byte writes"),
            unit: "MiB",
            silo: growth_mib,
            baseline: Some(printed_mib),
            baseline_name: "output printed",
            target: format!("<= {TARGET_MIB} MiB"),
            met: growth_mib <= TARGET_MIB,
        },
        Row::untargeted(
            "exec-memory",
            "output received by the client",
            "MiB",
            received as f64 / (1024.0 * 1024.0),
            Some((printed_mib, "output printed")),
        ),
    ])
}
