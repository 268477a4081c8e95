//! `cli`: what one `silo` command costs as a new process, end to end
//! (spawn to exit), on a local sandbox: `silo --version` (loading the
//! binary and parsing arguments) and `silo exec NAME -- true` (that, plus
//! opening the home, reaching the agent and a round trip of `true`),
//! beside spawning `/bin/true`, the floor of any process. The three are
//! timed in turn, round after round, so a busy moment costs each alike,
//! with a fourth: `true` on a connection this program holds open, the part
//! of `silo exec` no CLI can shed. A new CLI process that runs a command in
//! a sandbox pays at least its own start plus that round trip, which the
//! report prints as the floor of `silo exec`. Two more parts of a new
//! process's call are timed in this program, in the same rounds, to show
//! what the rest is: a new connection to the agent (connect and WebSocket
//! upgrade, by a client that has not learned the agent's versions), and
//! opening the home with one sandbox look-up (the state database's first
//! connection, which rebuilds SQLite's WAL index).

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use silo::Silo;
use silo::client::{AgentClient, ExecConnection};
use silo_protocol::exec::ExecSpec;

use crate::docker_resume::silo_beside_this_program;
use crate::report::Row;
use crate::stats::Samples;

/// Most `silo exec NAME -- true` may cost at p50, as a multiple of
/// spawning `/bin/true` in the same run.
const TARGET_EXEC_RATIO: f64 = 2.0;
/// Most `silo exec NAME -- true` may cost above its floor (`--version`
/// plus a round trip on an open connection) at p50, in milliseconds.
const TARGET_ABOVE_FLOOR_MS: f64 = 1.0;
/// The sandbox the scenario makes (and removes) in its own home.
const SANDBOX: &str = "bench-cli";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 30 } else { 300 };
    let silo_bin = silo_beside_this_program()?;
    let home = tempfile::Builder::new()
        .prefix("silo-bench-cli-")
        .tempdir()?;
    let silo = |args: &[&str]| run_silo(&silo_bin, home.path(), args);
    let status = silo(&["up", SANDBOX, "--backend", "local"])?;
    anyhow::ensure!(status.success(), "silo up --backend local failed: {status}");
    let measured = measure(n, &silo, home.path()).await;
    // Removed whatever the measurement said, so no agent outlives the run.
    let removed = silo(&["rm", SANDBOX]);
    let Rounds {
        plain,
        version,
        exec,
        open,
        connect,
        home_open,
    } = measured?;
    anyhow::ensure!(removed?.success(), "silo rm failed");

    let p50 = |s: &Samples| s.percentile(50.0);
    let exec_ratio = p50(&exec) / p50(&plain);
    let floor = p50(&version) + p50(&open);
    let row = |metric: String, samples: &Samples, p: f64| {
        let baseline = (plain.percentile(p), "spawn /bin/true");
        Row::untargeted("cli", metric, "ms", samples.percentile(p), Some(baseline))
    };
    Ok(vec![
        row(format!("`silo --version`, p50 of {n}"), &version, 50.0),
        Row {
            scenario: "cli",
            metric: format!("`silo exec NAME -- true` (local), p50 of {n}"),
            unit: "ms",
            silo: p50(&exec),
            baseline: Some(p50(&plain)),
            baseline_name: "spawn /bin/true",
            target: format!("<= {TARGET_EXEC_RATIO}x"),
            met: exec_ratio <= TARGET_EXEC_RATIO,
        },
        row(format!("`silo exec NAME -- true`, p99 of {n}"), &exec, 99.0),
        row(
            format!("`true` on an open connection, p50 of {n}"),
            &open,
            50.0,
        ),
        Row::untargeted(
            "cli",
            "floor of `silo exec`: `--version` + open-connection `true`, p50s",
            "ms",
            floor,
            Some((p50(&plain), "spawn /bin/true")),
        ),
        Row::untargeted(
            "cli",
            format!("a new connection: connect + upgrade, in-process, p50 of {n}"),
            "ms",
            p50(&connect),
            None,
        ),
        Row::untargeted(
            "cli",
            format!("opening the home + one look-up, in-process, p50 of {n}"),
            "ms",
            p50(&home_open),
            None,
        ),
        Row::untargeted(
            "cli",
            "`silo exec` above floor + new connection + home, p50s",
            "ms",
            p50(&exec) - floor - p50(&connect) - p50(&home_open),
            None,
        ),
        Row {
            scenario: "cli",
            metric: "`silo exec` above its floor, p50s".into(),
            unit: "ms",
            silo: p50(&exec) - floor,
            baseline: None,
            baseline_name: "-",
            target: format!("<= {TARGET_ABOVE_FLOOR_MS} ms"),
            met: p50(&exec) - floor <= TARGET_ABOVE_FLOOR_MS,
        },
    ])
}

/// One sample set per thing timed in each round.
#[derive(Default)]
struct Rounds {
    plain: Samples,
    version: Samples,
    exec: Samples,
    open: Samples,
    connect: Samples,
    home_open: Samples,
}

/// `n` rounds of: `/bin/true`, `silo --version`, `silo exec ... -- true`,
/// and `true` on an open connection to the same sandbox.
async fn measure(
    n: usize,
    silo: &impl Fn(&[&str]) -> std::io::Result<ExitStatus>,
    home: &Path,
) -> anyhow::Result<Rounds> {
    let exec_true = || silo(&["exec", SANDBOX, "--", "true"]);
    for _ in 0..5 {
        exec_true()?;
    }
    let (conn, fresh) = open_connection(home).await?;
    let spec = ExecSpec {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let mut rounds = Rounds::default();
    for _ in 0..n {
        let t = Instant::now();
        let status = quiet(&mut Command::new("/bin/true"))?;
        push(&mut rounds.plain, t, status, "/bin/true")?;
        let t = Instant::now();
        let status = silo(&["--version"])?;
        push(&mut rounds.version, t, status, "silo --version")?;
        let t = Instant::now();
        let status = exec_true()?;
        push(&mut rounds.exec, t, status, "silo exec")?;
        let t = Instant::now();
        let out = conn.run(spec.clone()).await?;
        rounds.open.push(t.elapsed());
        anyhow::ensure!(out.exit.code == Some(0), "true failed: {:?}", out.exit);
        let client = fresh();
        let t = Instant::now();
        let connection = client.connect().await?;
        rounds.connect.push(t.elapsed());
        drop(connection);
        let t = Instant::now();
        let silo = Silo::open(Some(home.to_path_buf()))?;
        silo.get(SANDBOX)?;
        drop(silo);
        rounds.home_open.push(t.elapsed());
    }
    Ok(rounds)
}

/// A connection to the scenario's sandbox, through the library on the
/// home the CLI uses, and a maker of clients that know nothing yet of the
/// agent, as a new process's. The home is closed again, so each CLI
/// process opens the state database as its only connection.
async fn open_connection(
    home: &Path,
) -> anyhow::Result<(ExecConnection, impl Fn() -> AgentClient)> {
    let silo = Silo::open(Some(home.to_path_buf()))?;
    let sandbox = silo.get(SANDBOX)?;
    let connection = silo.connect(&sandbox).await?;
    let client = silo.client(&sandbox)?;
    let (endpoint, key) = (client.endpoint().clone(), silo.sandbox_key(&sandbox));
    Ok((connection, move || {
        AgentClient::new(endpoint.clone(), key.clone())
    }))
}

fn push(
    samples: &mut Samples,
    start: Instant,
    status: ExitStatus,
    what: &str,
) -> anyhow::Result<()> {
    samples.push(start.elapsed());
    anyhow::ensure!(status.success(), "{what} failed: {status}");
    Ok(())
}

pub(crate) fn run_silo(bin: &Path, home: &Path, args: &[&str]) -> std::io::Result<ExitStatus> {
    quiet(
        Command::new(bin)
            .env("SILO_HOME", home)
            .env_remove("SILO_AGENT")
            .args(args),
    )
}

fn quiet(cmd: &mut Command) -> std::io::Result<ExitStatus> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}
