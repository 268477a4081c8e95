//! `nonce-window`: signed requests to one agent, as fast as it answers them,
//! for longer than the 300 s signature window, so every nonce the replay
//! guard holds is one it must still remember. None may be refused. The
//! baseline is the same load of unsigned `GET /healthz` requests in the same
//! run: what the agent serves without signing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use silo::client::AgentClient;
use silo_protocol::http::PATH_EXEC;
use silo_protocol::limits::SIGNATURE_SKEW;
use silo_tests::TestAgent;

use crate::footprint::vm_rss_kib;
use crate::report::Row;

/// Requests in flight at once.
const CLIENTS: usize = 8;

#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let signed_for = if quick {
        Duration::from_secs(10)
    } else {
        SIGNATURE_SKEW + Duration::from_secs(30)
    };
    let baseline_for = Duration::from_secs(if quick { 3 } else { 20 });
    let agent = TestAgent::start().await;
    let idle_kib = vm_rss_kib(agent.pid()).unwrap_or(0.0);

    let plain = load(agent.client(), baseline_for, false).await;
    let signed = load(agent.client(), signed_for, true).await;
    let rss_kib = vm_rss_kib(agent.pid()).unwrap_or(f64::NAN);

    let refused = signed.refused.load(Ordering::Relaxed) as f64;
    let failed = signed.failed.load(Ordering::Relaxed) as f64;
    let rate =
        |c: &Counts, d: Duration| c.accepted.load(Ordering::Relaxed) as f64 / d.as_secs_f64();
    let (signed_rate, plain_rate) = (rate(&signed, signed_for), rate(&plain, baseline_for));
    let secs = signed_for.as_secs();
    Ok(vec![
        Row {
            scenario: "nonce-window",
            metric: format!("signed req/s over {secs} s"),
            unit: "req/s",
            silo: signed_rate,
            baseline: Some(plain_rate),
            baseline_name: "unsigned GET /healthz",
            target: "none refused".into(),
            met: refused == 0.0,
        },
        Row {
            scenario: "nonce-window",
            metric: "requests refused".into(),
            unit: "count",
            silo: refused,
            baseline: None,
            baseline_name: "-",
            target: "0".into(),
            met: refused == 0.0,
        },
        Row::untargeted(
            "nonce-window",
            "requests failed in transport",
            "count",
            failed,
            None,
        ),
        Row::untargeted(
            "nonce-window",
            "agent RSS growth",
            "MiB",
            (rss_kib - idle_kib) / 1024.0,
            None,
        ),
    ])
}

/// `CLIENTS` loops of one request each until `duration` has passed.
async fn load(client: AgentClient, duration: Duration, signed: bool) -> Counts {
    let counts = Arc::new(Counts::default());
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (client, counts) = (client.clone(), Arc::clone(&counts));
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let counter = if signed {
                    // A signed exec request without the upgrade: admitted
                    // (its nonce remembered), then answered 400.
                    match client
                        .request(http::Method::GET, PATH_EXEC, bytes::Bytes::new())
                        .await
                    {
                        Ok(answer) if answer.status == http::StatusCode::UNAUTHORIZED => {
                            &counts.refused
                        }
                        Ok(_) => &counts.accepted,
                        Err(_) => &counts.failed,
                    }
                } else {
                    match client.healthz().await {
                        Ok(_) => &counts.accepted,
                        Err(_) => &counts.failed,
                    }
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Arc::try_unwrap(counts).unwrap_or_default()
}
