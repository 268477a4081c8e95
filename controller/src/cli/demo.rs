//! `silo demo`: the tour a new user runs first. It makes a sandbox, runs
//! commands in it, has a second `silo` process pick it up, interrupts a
//! runaway command, and prints what happened with timings. It leaves nothing
//! behind unless asked to (`--keep`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use silo::{BackendKind, CreateRequest, Silo};
use silo_protocol::exec::ExecSpec;

use super::output::{DemoStep, Output};

/// Commands run back to back to show the per-exec cost.
const WARM_EXECS: usize = 100;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep the demo sandbox instead of removing it at the end.
    #[arg(long)]
    keep: bool,
}

fn sh(script: &str) -> ExecSpec {
    ExecSpec {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let mut steps = Vec::new();
    let mut step = |name: &str, took: Duration, detail: String| {
        let step = DemoStep {
            step: name.to_owned(),
            millis: took.as_secs_f64() * 1000.0,
            detail,
        };
        out.demo_step(&step);
        steps.push(step);
    };

    let t = Instant::now();
    let sandbox = silo
        .create(CreateRequest::new(BackendKind::Local))
        .await
        .context("creating the demo sandbox")?;
    step(
        "create",
        t.elapsed(),
        format!(
            "sandbox {} ({}) on the local backend",
            sandbox.name, sandbox.id
        ),
    );

    let conn = silo.connect(&sandbox).await?;
    let t = Instant::now();
    let first = conn
        .run(sh("echo hello from $(pwd) > note.txt; cat note.txt"))
        .await?;
    step(
        "first exec",
        t.elapsed(),
        String::from_utf8_lossy(&first.stdout).trim().to_owned(),
    );

    let t = Instant::now();
    for _ in 0..WARM_EXECS {
        let done = conn
            .run(ExecSpec {
                argv: vec!["true".into()],
                ..Default::default()
            })
            .await?;
        ensure!(
            done.exit.code == Some(0),
            "`true` failed in the sandbox: {:?}",
            done.exit
        );
    }
    let each = t.elapsed() / WARM_EXECS as u32;
    step(
        "warm exec",
        each,
        format!("mean of {WARM_EXECS} runs of `true` on one connection"),
    );

    // A different process, knowing only the name, finds the sandbox and its files.
    let t = Instant::now();
    let exe = std::env::current_exe().context("finding the silo executable")?;
    let second = tokio::process::Command::new(exe)
        .arg("--home")
        .arg(silo.home().root())
        .args(["exec", &sandbox.name, "--", "cat", "note.txt"])
        .stdin(Stdio::null())
        .output()
        .await
        .context("running a second silo process")?;
    ensure!(
        second.status.success(),
        "the second silo process failed: {}",
        String::from_utf8_lossy(&second.stderr)
    );
    step(
        "second process",
        t.elapsed(),
        format!(
            "`silo exec {} -- cat note.txt` printed {:?}",
            sandbox.name,
            String::from_utf8_lossy(&second.stdout).trim()
        ),
    );

    let runaway = conn
        .exec(ExecSpec {
            argv: vec!["sleep".into(), "100".into()],
            ..Default::default()
        })
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    runaway.interrupt(None).await?;
    let stopped = runaway.collect().await?;
    step(
        "interrupt",
        t.elapsed(),
        format!(
            "`sleep 100` ended (interrupted: {}, exit {})",
            stopped.exit.interrupted,
            stopped.exit.shell_code()
        ),
    );

    drop(conn);
    if args.keep {
        step(
            "keep",
            Duration::ZERO,
            format!("try: silo exec {} -- ls -l", sandbox.name),
        );
    } else {
        let t = Instant::now();
        silo.remove(&sandbox.id).await?;
        step(
            "remove",
            t.elapsed(),
            "sandbox removed; its events remain in `silo events`".into(),
        );
    }
    out.demo_done(&steps)?;
    Ok(0)
}
