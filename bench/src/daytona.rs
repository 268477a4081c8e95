//! `daytona`: silo on Daytona beside Daytona's own API, both through the
//! mock Daytona (`tests/mocks`: real containers, a real TLS proxy for
//! previews and the toolbox, on loopback) in one run:
//! - time to interactive: `up` of a fresh sandbox to the first output of
//!   `echo ready`, beside Daytona's create, the wait until started, and the
//!   toolbox's `process/execute` of `echo ready`;
//! - exec round trip: `true` through silo's agent behind the preview proxy
//!   (kept connection), beside the toolbox's `process/execute` of `true`
//!   through the same proxy;
//! - resume from a new process: a stopped sandbox to its first output,
//!   beside Daytona's start, the wait, and `process/execute`.
//!
//! The mock runs processes with `docker exec`, so the absolute figures are
//! the mock's; the ratios compare silo's path with the provider's own.

use std::collections::BTreeMap;
use std::time::Instant;

use silo::internals::daytona::NewSandbox;
use silo::internals::daytona::{Api, DaytonaConfig, Toolbox};
use silo::{BackendKind, SandboxSpec, Silo, SiloOptions, UpRequest};
use silo_mocks::{MockDaytona, MockDaytonaConfig};
use silo_protocol::exec::ExecSpec;

use crate::docker_common::first_output;
use crate::report::Row;
use crate::stats::Samples;

/// silo's exec through the preview proxy may take at most this many times
/// the toolbox's own.
const EXEC_TARGET: f64 = 1.0;
/// The mock's snapshot (Daytona's template) of the base image.
const SNAPSHOT: &str = "base";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (rounds, execs) = if quick { (2, 20) } else { (8, 200) };
    if silo_tests::docker::engine_with_base().await.is_none() {
        return Ok(Vec::new());
    }
    let mock = MockDaytona::start(MockDaytonaConfig::default()).await?;
    let vars: BTreeMap<String, String> = mock
        .env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let config = DaytonaConfig::from_lookup(|name| vars.get(name).cloned())?;
    let home = tempfile::Builder::new()
        .prefix("silo-bench-daytona-")
        .tempdir()?;
    let silo = Silo::open_with(SiloOptions {
        home: Some(home.path().join("home")),
        daytona: Some(config.clone()),
        ..SiloOptions::default()
    })?;
    let api = Api::new(&config)?;

    // Time to interactive, one untimed round first for both.
    let (mut silo_tti, mut daytona_tti) = (Samples::default(), Samples::default());
    for round in 0..=rounds {
        let name = format!("bench-daytona-{round}");
        let t = Instant::now();
        let (sandbox, _) = silo.up_sandbox(up(&name)).await?;
        let conn = silo.connect(sandbox.record()).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        let took = t.elapsed();
        drop(conn);
        sandbox.remove().await?;

        let t = Instant::now();
        let (id, toolbox) = plain_sandbox(&api, &config).await?;
        let ran = toolbox.execute("echo ready").await?;
        let plain_took = t.elapsed();
        anyhow::ensure!(
            ran.result.trim() == "ready",
            "the toolbox printed {:?}",
            ran.result
        );
        api.delete(&id).await?;
        if round > 0 {
            silo_tti.push(took);
            daytona_tti.push(plain_took);
        }
    }

    // Exec round trips on one sandbox of each.
    let (sandbox, _) = silo.up_sandbox(up("bench-daytona-rtt")).await?;
    let conn = silo.connect(sandbox.record()).await?;
    let mut kept = Samples::default();
    for _ in 0..execs {
        let t = Instant::now();
        conn.run(ExecSpec::argv(["true"])).await?;
        kept.push(t.elapsed());
    }
    drop(conn);
    let (id, toolbox) = plain_sandbox(&api, &config).await?;
    let mut toolbox_rtt = Samples::default();
    for _ in 0..execs / 4 {
        let t = Instant::now();
        toolbox.execute("true").await?;
        toolbox_rtt.push(t.elapsed());
    }

    // Resume from a new process: stop, then up, to the first output.
    let (mut silo_resume, mut daytona_resume) = (Samples::default(), Samples::default());
    for _ in 0..rounds {
        silo.stop(sandbox.id()).await?;
        let t = Instant::now();
        let (again, _) = silo.up_sandbox(up("bench-daytona-rtt")).await?;
        let conn = silo.connect(again.record()).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        silo_resume.push(t.elapsed());

        api.stop(&id).await?;
        api.wait_for(&id, "stopped").await?;
        let t = Instant::now();
        api.start(&id).await?;
        api.wait_for(&id, "started").await?;
        toolbox.execute("echo ready").await?;
        daytona_resume.push(t.elapsed());
    }
    api.delete(&id).await?;
    sandbox.remove().await?;
    mock.shutdown().await?;

    let ms = |s: &Samples| s.percentile(50.0);
    let exec_ratio = ms(&kept) / ms(&toolbox_rtt);
    Ok(vec![
        Row::untargeted(
            "daytona",
            format!("tti p50 of {rounds}"),
            "ms",
            ms(&silo_tti),
            Some((ms(&daytona_tti), "create + wait + toolbox execute echo")),
        ),
        Row {
            scenario: "daytona",
            metric: format!("exec true p50 of {execs}, kept connection"),
            unit: "ms",
            silo: ms(&kept),
            baseline: Some(ms(&toolbox_rtt)),
            baseline_name: "toolbox execute true via proxy",
            target: format!("<= {EXEC_TARGET}x"),
            met: exec_ratio <= EXEC_TARGET,
        },
        Row::untargeted(
            "daytona",
            format!("resume from stop to first output p50 of {rounds}"),
            "ms",
            ms(&silo_resume),
            Some((ms(&daytona_resume), "start + wait + toolbox execute echo")),
        ),
    ])
}

fn up(name: &str) -> UpRequest {
    UpRequest {
        name: name.to_owned(),
        spec: Some(SandboxSpec {
            image: Some(SNAPSHOT.into()),
            ..SandboxSpec::new(BackendKind::Daytona)
        }),
        recreate: false,
    }
}

/// A Daytona sandbox made as Daytona's SDKs make one, started, with its
/// toolbox.
async fn plain_sandbox(api: &Api, config: &DaytonaConfig) -> anyhow::Result<(String, Toolbox)> {
    let created = api
        .create(&NewSandbox {
            snapshot: Some(SNAPSHOT.into()),
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            public: false,
            network_block_all: false,
            network_allow_list: None,
            domain_allow_list: None,
            auto_stop_interval: 0,
            target: config.own.target.clone(),
        })
        .await?;
    let started = api.wait_for(&created.id, "started").await?;
    let url = started
        .toolbox_proxy_url
        .ok_or_else(|| anyhow::anyhow!("the sandbox has no toolboxProxyUrl"))?;
    let toolbox = Toolbox::new(config, &url, &created.id)?;
    Ok((created.id, toolbox))
}
