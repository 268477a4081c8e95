//! `cli`: what one `silo` command costs as a new process, end to end
//! (spawn to exit), on a local sandbox: `silo --version` (loading the
//! binary and parsing arguments) and `silo exec NAME -- true` (that, plus
//! opening the home, reaching the agent and a round trip of `true`),
//! beside spawning `/bin/true`, the floor of any process. The three are
//! timed in turn, round after round, so a busy moment costs each alike.

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use crate::docker_resume::silo_beside_this_program;
use crate::report::Row;
use crate::stats::Samples;

/// Most `silo exec NAME -- true` may cost at p50, as a multiple of
/// spawning `/bin/true` in the same run.
const TARGET_EXEC_RATIO: f64 = 2.0;
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
    let measured = measure(n, &silo);
    // Removed whatever the measurement said, so no agent outlives the run.
    let removed = silo(&["rm", SANDBOX]);
    let (plain, version, exec) = measured?;
    anyhow::ensure!(removed?.success(), "silo rm failed");

    let p50 = |s: &Samples| s.percentile(50.0);
    let exec_ratio = p50(&exec) / p50(&plain);
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
    ])
}

/// `n` rounds of: `/bin/true`, `silo --version`, `silo exec ... -- true`.
fn measure(
    n: usize,
    silo: &impl Fn(&[&str]) -> std::io::Result<ExitStatus>,
) -> anyhow::Result<(Samples, Samples, Samples)> {
    let exec_true = || silo(&["exec", SANDBOX, "--", "true"]);
    for _ in 0..5 {
        exec_true()?;
    }
    let (mut plain, mut version, mut exec) = Default::default();
    for _ in 0..n {
        let t = Instant::now();
        let status = quiet(&mut Command::new("/bin/true"))?;
        push(&mut plain, t, status, "/bin/true")?;
        let t = Instant::now();
        let status = silo(&["--version"])?;
        push(&mut version, t, status, "silo --version")?;
        let t = Instant::now();
        let status = exec_true()?;
        push(&mut exec, t, status, "silo exec")?;
    }
    Ok((plain, version, exec))
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

fn run_silo(bin: &Path, home: &Path, args: &[&str]) -> std::io::Result<ExitStatus> {
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
