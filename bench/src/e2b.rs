//! `e2b`: silo on E2B beside E2B's own API, both through the mock E2B
//! (`tests/mocks`: real containers, a real TLS proxy on loopback) in one
//! run:
//! - time to interactive: `up` of a fresh sandbox to the first output of
//!   `echo ready`, beside E2B's create plus envd's `process.Process/Start`
//!   of `echo ready` to its end; on the plain template (the agent uploaded)
//!   and on one made from `silo image bake` output (the agent in it);
//! - exec round trip: `true` through silo's agent behind the proxy (on a
//!   kept connection, and on a fresh one each time), beside envd's Start of
//!   `true` through the same proxy;
//! - resume: a paused sandbox to its first output, beside E2B's connect
//!   plus envd's Start;
//! - rewind: back to a snapshot of a 1 KiB change, to the first output (in
//!   place: the VM's agent puts back what changed), beside E2B's create
//!   plus first output, the floor of any fresh VM;
//! - forks across backends: an E2B snapshot onto Docker and a Docker
//!   snapshot onto E2B, to the first output;
//! - a memory fork (`silo fork --memory`): E2B's snapshot with memory and
//!   a new sandbox from it with its own agent, to the first output, beside
//!   E2B's snapshot, create from it and envd's Start of `echo ready`;
//! - the agent's upload and start, alone.
//!
//! The mock answers what E2B would and starts processes with `docker exec`,
//! so the absolute figures are the mock's; the ratios compare silo's path
//! with the provider's own through the same proxy and containers.

use std::collections::BTreeMap;
use std::time::Instant;

use silo::internals::e2b::NewSandbox;
use silo::internals::e2b::{Api, E2bConfig, E2bRef, Envd};
use silo::no_progress;
use silo::{BackendKind, ForkTarget, SandboxSpec, Silo, SiloOptions, UpRequest};
use silo_mocks::{MockE2b, MockE2bConfig};
use silo_protocol::exec::ExecSpec;

use crate::docker_common::first_output;
use crate::report::Row;
use crate::stats::Samples;

/// silo's exec through the proxy may take at most this many times envd's.
const EXEC_TARGET: f64 = 1.0;
/// silo's time to interactive may take at most this many times E2B's own.
const TTI_TARGET: f64 = 1.2;
/// The image `silo image bake` makes of the base for the template below.
const BAKED_IMAGE: &str = "silo-bench-baked:latest";
/// The mock's template that carries the agent.
const BAKED_TEMPLATE: &str = "baked";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (rounds, execs) = if quick { (2, 20) } else { (8, 200) };
    if silo_tests::docker::engine_with_base().await.is_none() {
        return Ok(Vec::new());
    }
    crate::docker_common::bake_base(BAKED_IMAGE).await?;
    let mut mock_config = MockE2bConfig::default();
    mock_config
        .templates
        .insert(BAKED_TEMPLATE.into(), BAKED_IMAGE.into());
    let mock = MockE2b::start(mock_config).await?;
    let vars: BTreeMap<String, String> = mock
        .env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let config = E2bConfig::from_lookup(|name| vars.get(name).cloned())?;
    let home = tempfile::Builder::new()
        .prefix("silo-bench-e2b-")
        .tempdir()?;
    let silo = Silo::open_with(SiloOptions {
        home: Some(home.path().join("home")),
        e2b: Some(config.clone()),
        ..SiloOptions::default()
    })?;
    let api = Api::new(&config)?;

    // Time to interactive, one untimed round first for both: silo on the
    // plain template (the agent uploaded) and on one that carries it.
    let (mut silo_tti, mut e2b_tti) = (Samples::default(), Samples::default());
    let mut baked_tti = Samples::default();
    for round in 0..=rounds {
        let name = format!("bench-e2b-{round}");
        let t = Instant::now();
        let (sandbox, _) = silo.up_sandbox(up(&name)).await?;
        let conn = silo.connect(sandbox.record()).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        let took = t.elapsed();
        drop(conn);
        sandbox.remove().await?;

        let t = Instant::now();
        let mut request = up(&format!("bench-e2b-baked-{round}"));
        if let Some(spec) = &mut request.spec {
            spec.image = Some(BAKED_TEMPLATE.into());
        }
        let (sandbox, _) = silo.up_sandbox(request).await?;
        let conn = silo.connect(sandbox.record()).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        let baked_took = t.elapsed();
        drop(conn);
        sandbox.remove().await?;

        let t = Instant::now();
        let created = api.create(&plain_sandbox()).await?;
        let e2b = E2bRef::new(created, "base".into());
        let ended = Envd::of(&config, &e2b)
            .run(&argv(&["echo", "ready"]))
            .await?;
        let plain_took = t.elapsed();
        anyhow::ensure!(ended.output == "ready\n", "envd printed {:?}", ended.output);
        api.kill(&e2b.sandbox_id).await?;
        if round > 0 {
            silo_tti.push(took);
            baked_tti.push(baked_took);
            e2b_tti.push(plain_took);
        }
    }

    // Exec round trips on one sandbox of each.
    let (sandbox, _) = silo.up_sandbox(up("bench-e2b-rtt")).await?;
    let conn = silo.connect(sandbox.record()).await?;
    let (mut kept, mut fresh) = (Samples::default(), Samples::default());
    for _ in 0..execs {
        let t = Instant::now();
        conn.run(ExecSpec::argv(["true"])).await?;
        kept.push(t.elapsed());
    }
    for _ in 0..execs / 4 {
        let t = Instant::now();
        sandbox.commands().run(ExecSpec::argv(["true"])).await?;
        fresh.push(t.elapsed());
    }
    let created = api.create(&plain_sandbox()).await?;
    let e2b = E2bRef::new(created, "base".into());
    let envd = Envd::of(&config, &e2b);
    let mut envd_rtt = Samples::default();
    for _ in 0..execs / 4 {
        let t = Instant::now();
        envd.run(&argv(&["true"])).await?;
        envd_rtt.push(t.elapsed());
    }

    // Resume: silo's pause then up, beside E2B's pause then connect and Start.
    let (mut silo_resume, mut e2b_resume) = (Samples::default(), Samples::default());
    for _ in 0..rounds {
        silo.pause(sandbox.id()).await?;
        let t = Instant::now();
        let (again, _) = silo.up_sandbox(up("bench-e2b-rtt")).await?;
        let conn = silo.connect(again.record()).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        silo_resume.push(t.elapsed());

        api.pause(&e2b.sandbox_id).await?;
        let t = Instant::now();
        api.connect(&e2b.sandbox_id, 600, e2b.api).await?;
        envd.run(&argv(&["echo", "ready"])).await?;
        e2b_resume.push(t.elapsed());
    }
    api.kill(&e2b.sandbox_id).await?;
    drop(conn);

    // Rewind to a snapshot of a 1 KiB change, after another change.
    let name = sandbox.id().to_owned();
    let change = |text: &str| ExecSpec::argv(["sh", "-c", &format!("echo {text} > /root/a")]);
    sandbox
        .commands()
        .run(ExecSpec::argv([
            "sh",
            "-c",
            "head -c 1024 /dev/zero > /root/kb",
        ]))
        .await?;
    let snapshot = silo.snapshots_of(&name)?.take(None).await?.snapshot;
    let mut rewind = Samples::default();
    for _ in 0..rounds {
        let again = silo.sandbox(&name).await?;
        again.commands().run(change("broken")).await?;
        let t = Instant::now();
        let restored = silo.snapshots_of(&name)?.rewind(&snapshot.id).await?;
        let conn = silo.connect(&restored.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        rewind.push(t.elapsed());
    }

    // Forks across backends: this snapshot onto Docker, a snapshot of that
    // fork back onto E2B.
    let (mut to_docker, mut to_e2b) = (Samples::default(), Samples::default());
    for round in 0..rounds {
        let docker_name = format!("bench-e2b-fork-docker-{round}");
        let t = Instant::now();
        let onto = ForkTarget {
            backend: Some(BackendKind::Docker),
            image: None,
        };
        let forked = silo
            .fork(&snapshot.id, &docker_name, &onto, &no_progress())
            .await?;
        let conn = silo.connect(&forked.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        to_docker.push(t.elapsed());
        let on_docker = silo.snapshots_of(&docker_name)?.take(None).await?;

        let e2b_name = format!("bench-e2b-fork-e2b-{round}");
        let t = Instant::now();
        let onto = ForkTarget {
            backend: Some(BackendKind::E2b),
            image: Some("base".into()),
        };
        let back = silo
            .fork(&on_docker.snapshot.id, &e2b_name, &onto, &no_progress())
            .await?;
        let conn = silo.connect(&back.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        to_e2b.push(t.elapsed());
        silo.remove(&docker_name).await?;
        silo.remove(&e2b_name).await?;
    }
    // Memory forks of the running sandbox, beside E2B's own snapshot and
    // create from it of a plain sandbox.
    let (mut memory_fork, mut e2b_memory_fork) = (Samples::default(), Samples::default());
    let created = api.create(&plain_sandbox()).await?;
    let source = E2bRef::new(created, "base".into());
    for round in 0..rounds {
        let fork_name = format!("bench-e2b-memory-{round}");
        let t = Instant::now();
        let forked = silo.fork_with_memory(&name, &fork_name).await?;
        let conn = silo.connect(&forked).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        memory_fork.push(t.elapsed());
        drop(conn);
        silo.remove(&fork_name).await?;

        let t = Instant::now();
        let snapshot_id = api
            .snapshot(&source.sandbox_id, &format!("bench-{round}"))
            .await?;
        let created = api
            .create(&NewSandbox {
                template_id: snapshot_id.clone(),
                ..plain_sandbox()
            })
            .await?;
        let copy = E2bRef::new(created, snapshot_id.clone());
        Envd::of(&config, &copy)
            .run(&argv(&["echo", "ready"]))
            .await?;
        e2b_memory_fork.push(t.elapsed());
        api.kill(&copy.sandbox_id).await?;
        api.delete_template(&snapshot_id).await?;
    }
    api.kill(&source.sandbox_id).await?;
    silo.remove(&name).await?;
    mock.shutdown().await?;

    let ms = |s: &Samples| s.percentile(50.0);
    let tti_ratio = ms(&silo_tti) / ms(&e2b_tti);
    let baked_ratio = ms(&baked_tti) / ms(&e2b_tti);
    let exec_ratio = ms(&kept) / ms(&envd_rtt);
    Ok(vec![
        Row {
            scenario: "e2b",
            metric: format!("tti p50 of {rounds}"),
            unit: "ms",
            silo: ms(&silo_tti),
            baseline: Some(ms(&e2b_tti)),
            baseline_name: "E2B create + envd Start echo",
            target: format!("<= {TTI_TARGET}x"),
            met: tti_ratio <= TTI_TARGET,
        },
        Row {
            scenario: "e2b",
            metric: format!("tti p50 of {rounds}, template carrying the agent"),
            unit: "ms",
            silo: ms(&baked_tti),
            baseline: Some(ms(&e2b_tti)),
            baseline_name: "E2B create + envd Start echo",
            target: format!("<= {TTI_TARGET}x"),
            met: baked_ratio <= TTI_TARGET,
        },
        Row {
            scenario: "e2b",
            metric: format!("exec true p50 of {execs}, kept connection"),
            unit: "ms",
            silo: ms(&kept),
            baseline: Some(ms(&envd_rtt)),
            baseline_name: "envd Start true via proxy",
            target: format!("<= {EXEC_TARGET}x"),
            met: exec_ratio <= EXEC_TARGET,
        },
        Row::untargeted(
            "e2b",
            format!("exec true p50 of {}, new connection each", execs / 4),
            "ms",
            ms(&fresh),
            Some((ms(&envd_rtt), "envd Start true via proxy")),
        ),
        Row::untargeted(
            "e2b",
            format!("resume to first output p50 of {rounds}"),
            "ms",
            ms(&silo_resume),
            Some((ms(&e2b_resume), "E2B connect + envd Start echo")),
        ),
        Row::untargeted(
            "e2b",
            format!("rewind (1 KiB change) to first output p50 of {rounds}"),
            "ms",
            ms(&rewind),
            Some((ms(&e2b_tti), "E2B create + envd Start echo")),
        ),
        Row::untargeted(
            "e2b",
            format!("fork E2B snapshot onto Docker, to first output p50 of {rounds}"),
            "ms",
            ms(&to_docker),
            None,
        ),
        Row::untargeted(
            "e2b",
            format!("fork Docker snapshot onto E2B, to first output p50 of {rounds}"),
            "ms",
            ms(&to_e2b),
            Some((ms(&e2b_tti), "E2B create + envd Start echo")),
        ),
        Row::untargeted(
            "e2b",
            format!("memory fork (silo fork --memory) to first output p50 of {rounds}"),
            "ms",
            ms(&memory_fork),
            Some((
                ms(&e2b_memory_fork),
                "E2B snapshot + create from it + envd Start echo",
            )),
        ),
        Row::untargeted(
            "e2b",
            "agent upload + start (tti less E2B's)",
            "ms",
            (ms(&silo_tti) - ms(&e2b_tti)).max(0.0),
            None,
        ),
    ])
}

fn up(name: &str) -> UpRequest {
    UpRequest {
        name: name.to_owned(),
        spec: Some(SandboxSpec {
            image: Some("base".into()),
            ..SandboxSpec::new(BackendKind::E2b)
        }),
        recreate: false,
    }
}

fn plain_sandbox() -> NewSandbox {
    NewSandbox {
        template_id: "base".into(),
        timeout: 600,
        auto_pause: false,
        allow_internet_access: true,
        network: None,
        metadata: BTreeMap::new(),
    }
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}
