//! `silo demo`: the tour a new user runs first. On Docker when an engine
//! answers (building the registry-free base image if it is missing), on the
//! local backend otherwise, saying so. It opens a sandbox with `silo up`,
//! runs commands in it (output streamed as printed), keeps a shell session's
//! cwd and variables, pushes files, has second `silo` processes find it,
//! stops it and resumes it from a new process (its files intact), interrupts
//! a runaway command, snapshots it, rewinds a breaking change and forks the
//! snapshot (on Docker), and prints each step with its timing and a summary.
//! It leaves nothing behind unless asked to (`--keep`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use silo::PushOptions;
use silo::client::{ExecConnection, ExecEvent};
use silo::{BackendKind, SandboxSpec, Silo, UpRequest};
use silo::{DEFAULT_BASE_TAG, DEFAULT_BUSYBOX};
use silo_protocol::bundle::FileSet;
use silo_protocol::exec::ExecSpec;

use super::output::{DemoStep, Output};

/// Commands run back to back to show the per-exec cost.
const WARM_EXECS: usize = 100;
/// How long the runaway command runs before it is interrupted.
const RUNAWAY_HEAD_START: Duration = Duration::from_millis(100);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep the demo sandbox instead of removing it at the end.
    #[arg(long)]
    keep: bool,
    /// Run on this backend [default: docker if an engine answers, else local].
    #[arg(long)]
    backend: Option<BackendKind>,
    /// Image of the Docker demo; the default one is built if missing.
    #[arg(long, default_value = DEFAULT_BASE_TAG)]
    image: String,
}

/// The demo's record of steps, printed as they complete.
struct Steps<'a> {
    out: &'a Output,
    done: Vec<DemoStep>,
}

impl Steps<'_> {
    fn add(&mut self, name: &str, took: Duration, detail: String) {
        let step = DemoStep {
            step: name.to_owned(),
            millis: took.as_secs_f64() * 1000.0,
            detail,
        };
        self.out.demo_step(&step);
        self.done.push(step);
    }
}

fn sh(script: &str) -> ExecSpec {
    ExecSpec {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let demo_started = Instant::now();
    let mut steps = Steps {
        out,
        done: Vec::new(),
    };
    let spec = choose_backend(silo, &args, &mut steps).await?;
    let backend = spec.backend;
    let name = demo_name()?;

    let t = Instant::now();
    let opened = silo
        .up(UpRequest {
            name: name.clone(),
            spec: Some(spec),
            recreate: false,
        })
        .await
        .context("creating the demo sandbox")?;
    let sandbox = opened.sandbox;
    steps.add(
        "up (create)",
        t.elapsed(),
        format!(
            "`silo up {name}` made sandbox {} on the {backend} backend (tier {})",
            sandbox.id, opened.tier
        ),
    );

    let conn = silo.connect(&sandbox).await?;
    let t = Instant::now();
    let first = conn
        .run(sh(
            "echo hello > note.txt; echo \"$(cat note.txt) from $(hostname), PID 1 is $(cat /proc/1/comm)\"",
        ))
        .await?;
    steps.add(
        "first exec",
        t.elapsed(),
        String::from_utf8_lossy(&first.stdout).trim().to_owned(),
    );

    streaming(&conn, &mut steps).await?;

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
    steps.add(
        "warm exec",
        t.elapsed() / WARM_EXECS as u32,
        format!("mean of {WARM_EXECS} runs of `true` on one connection"),
    );

    // A different process, knowing only the name, finds the sandbox and its files.
    let t = Instant::now();
    let cat = second_process(silo, &["exec", &name, "--", "cat", "note.txt"]).await?;
    steps.add(
        "second process",
        t.elapsed(),
        format!("`silo exec {name} -- cat note.txt` printed {cat:?}"),
    );
    session(&conn, &mut steps).await?;
    drop(conn);
    push(silo, &name, &mut steps).await?;

    let t = Instant::now();
    silo.stop(&name).await?;
    steps.add(
        "stop",
        t.elapsed(),
        "its machine stopped; its files stay".into(),
    );

    let t = Instant::now();
    let resumed = second_process(silo, &["up", &name]).await?;
    let took = t.elapsed();
    let cat = second_process(silo, &["exec", &name, "--", "cat", "note.txt"]).await?;
    steps.add(
        "resume",
        took,
        format!("a new process ran `silo up {name}`: {resumed:?}; note.txt still says {cat:?}"),
    );

    let conn = silo.connect(&silo.get(&name)?).await?;
    let runaway = conn
        .exec(ExecSpec {
            argv: vec!["sleep".into(), "100".into()],
            ..Default::default()
        })
        .await?;
    tokio::time::sleep(RUNAWAY_HEAD_START).await;
    let t = Instant::now();
    runaway.interrupt(None).await?;
    let stopped = runaway.collect().await?;
    steps.add(
        "interrupt",
        t.elapsed(),
        format!(
            "`sleep 100` ended (interrupted: {}, exit {})",
            stopped.exit.interrupted,
            stopped.exit.shell_code()
        ),
    );
    drop(conn);

    let snapshot = if backend == BackendKind::Docker {
        let snapshot = snapshot_and_rewind(silo, &name, &mut steps).await?;
        fork(silo, &name, &snapshot, &mut steps).await?;
        Some(snapshot)
    } else {
        steps.add(
            "snapshot",
            Duration::ZERO,
            "skipped: snapshots, rewind and fork need the docker backend".into(),
        );
        None
    };

    if args.keep {
        steps.add(
            "keep",
            Duration::ZERO,
            format!("try: silo exec {name} -- ls -l"),
        );
    } else {
        let t = Instant::now();
        silo.remove(&name).await?;
        // A snapshot a sandbox runs from is kept, so the sandbox goes first.
        if let Some(snapshot) = &snapshot {
            silo.remove_snapshot(snapshot).await?;
            silo.gc_store(false).await?;
        }
        steps.add(
            "remove",
            t.elapsed(),
            "sandbox (and its snapshot) removed; its events remain in `silo events`".into(),
        );
    }
    out.demo_done(&steps.done, demo_started.elapsed())?;
    Ok(0)
}

/// A command that prints a line every 300 ms: each line arrives as it is
/// printed, not when the command ends.
async fn streaming(conn: &ExecConnection, steps: &mut Steps<'_>) -> anyhow::Result<()> {
    let t = Instant::now();
    let mut handle = conn
        .exec(sh("for i in 1 2 3; do echo tick $i; sleep 0.3; done"))
        .await?;
    let mut arrivals = Vec::new();
    while let Some(event) = handle.next_event().await {
        match event {
            ExecEvent::Output { data, .. } => {
                let lines = data.iter().filter(|b| **b == b'\n').count();
                arrivals.extend(std::iter::repeat_n(t.elapsed(), lines));
            }
            ExecEvent::Exit(exit) => ensure!(exit.code == Some(0), "the ticker failed: {exit:?}"),
        }
    }
    let at: Vec<String> = arrivals
        .iter()
        .map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
        .collect();
    steps.add(
        "streaming",
        t.elapsed(),
        format!("3 lines printed 300 ms apart arrived at {}", at.join(", ")),
    );
    Ok(())
}

/// A named shell session keeps its cwd and variables from one call to the next.
async fn session(conn: &ExecConnection, steps: &mut Steps<'_>) -> anyhow::Result<()> {
    let in_session = |line: &str| ExecSpec {
        argv: vec![line.into()],
        session: Some("demo".into()),
        ..Default::default()
    };
    let t = Instant::now();
    conn.run(in_session(
        "cd /tmp && GREETING=hello && export PROJECT=silo",
    ))
    .await?;
    let said = conn
        .run(in_session(
            "echo \"$GREETING from $(pwd), project $PROJECT\"",
        ))
        .await?;
    steps.add(
        "session",
        t.elapsed(),
        format!(
            "`cd /tmp`, a variable and an export, then a second call printed {:?}",
            String::from_utf8_lossy(&said.stdout).trim()
        ),
    );
    Ok(())
}

/// Pushes a small tree to a mount, swapped in whole, and reads it back.
async fn push(silo: &Silo, name: &str, steps: &mut Steps<'_>) -> anyhow::Result<()> {
    const MOUNT: &str = "/workspace/managed/app";
    let mut files = FileSet::new();
    files.insert_bytes("hello.txt", b"pushed by silo\n".to_vec(), false)?;
    files.insert_bytes("run.sh", b"#!/bin/sh\necho run.sh ran\n".to_vec(), true)?;
    let t = Instant::now();
    let report = silo
        .push_to_sandboxes(
            MOUNT,
            vec![(silo.get(name)?, files)],
            &PushOptions::default(),
        )
        .await?;
    let took = t.elapsed();
    if let Some(failure) = report.failures.first() {
        bail!("pushing to the demo sandbox: {}", failure.detail);
    }
    // The local backend roots mounts under the sandbox's directory, which is
    // also a command's default working directory there.
    let read = second_process(
        silo,
        &[
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "cd /workspace/managed/app 2>/dev/null || cd workspace/managed/app; cat hello.txt; ./run.sh",
        ],
    )
    .await?;
    steps.add(
        "push",
        took,
        format!("2 files to {MOUNT}, swapped in at once; reading them gave {read:?}"),
    );
    Ok(())
}

/// Forks the snapshot into a second sandbox, which has the snapshot's files
/// and leaves the first alone; then removes the fork.
async fn fork(
    silo: &Silo,
    name: &str,
    snapshot: &str,
    steps: &mut Steps<'_>,
) -> anyhow::Result<()> {
    let fork_name = format!("{name}-fork");
    let t = Instant::now();
    let target = silo::ForkTarget::default();
    silo.fork(snapshot, &fork_name, &target, &silo::no_progress())
        .await
        .context("forking the demo snapshot")?;
    let took = t.elapsed();
    let read = second_process(silo, &["exec", &fork_name, "--", "cat", "note.txt"]).await?;
    silo.remove(&fork_name).await?;
    steps.add(
        "fork",
        took,
        format!(
            "`silo fork {snapshot} --name {fork_name}`: its note.txt says {read:?} (removed again)"
        ),
    );
    Ok(())
}

/// Snapshots the sandbox, breaks its note, and rewinds it back; returns
/// the snapshot's id.
async fn snapshot_and_rewind(
    silo: &Silo,
    name: &str,
    steps: &mut Steps<'_>,
) -> anyhow::Result<String> {
    let snapshots = silo.snapshots_of(name)?;
    // The first snapshot on an image stores the image once: worth a bar.
    let progress = steps.out.snapshot_progress();
    let taken = snapshots
        .clone()
        .with_progress(progress.callback())
        .take(Some("demo".into()))
        .await;
    progress.finish();
    let taken = taken.context("snapshotting the demo sandbox")?;
    steps.add(
        "snapshot",
        Duration::from_secs_f64(taken.durable_ms / 1000.0),
        format!(
            "`silo snapshot {name}`: {} ({} entries, layer {} bytes); captured {:.0} ms, \
             durable {:.0} ms",
            taken.snapshot.id,
            taken.entries,
            taken.snapshot.layer_bytes,
            taken.captured_ms,
            taken.durable_ms
        ),
    );
    let conn = silo.connect(&silo.get(name)?).await?;
    conn.run(sh("echo broken > note.txt; rm -f /etc/passwd"))
        .await?;
    drop(conn);
    let t = Instant::now();
    let rewound = snapshots
        .rewind(&taken.snapshot.id)
        .await
        .context("rewinding the demo sandbox")?;
    let conn = silo.connect(&rewound.sandbox).await?;
    let back = conn
        .run(sh(
            "cat note.txt; test -e /etc/passwd && echo passwd is back",
        ))
        .await?;
    steps.add(
        "rewind",
        t.elapsed(),
        format!(
            "broke note.txt and deleted /etc/passwd, then `silo rewind`: {:?}",
            String::from_utf8_lossy(&back.stdout).trim()
        ),
    );
    drop(conn);
    Ok(taken.snapshot.id)
}

/// Docker when an engine answers (with the demo image present, built if it
/// is the default one), else the local backend; says which and why.
async fn choose_backend(
    silo: &Silo,
    args: &Args,
    steps: &mut Steps<'_>,
) -> anyhow::Result<SandboxSpec> {
    let local = SandboxSpec::new(BackendKind::Local);
    if args.backend == Some(BackendKind::Local) {
        steps.add(
            "backend",
            Duration::ZERO,
            "local, as asked (no isolation)".into(),
        );
        return Ok(local);
    }
    let forced = args.backend == Some(BackendKind::Docker);
    let t = Instant::now();
    let images = silo.images();
    let engine = match images.engine().await {
        Ok(engine) => engine,
        Err(error) if !forced => {
            steps.add(
                "backend",
                t.elapsed(),
                format!(
                    "no Docker engine reachable ({error}); running on the local backend \
                     instead (no isolation)"
                ),
            );
            return Ok(local);
        }
        Err(error) => return Err(error.into()),
    };
    steps.add(
        "engine",
        t.elapsed(),
        format!(
            "docker {} (API {}) at {}",
            engine.version, engine.api_version, engine.host
        ),
    );

    let t = Instant::now();
    if images.exists(&args.image).await? {
        steps.add("image", t.elapsed(), format!("{} is present", args.image));
    } else if args.image == DEFAULT_BASE_TAG {
        let busybox = std::path::Path::new(DEFAULT_BUSYBOX);
        match images.build_base(busybox, &args.image, &mut |_| {}).await {
            Ok(_) => steps.add(
                "image",
                t.elapsed(),
                format!(
                    "built {} (FROM scratch + {DEFAULT_BUSYBOX}, no registry)",
                    args.image
                ),
            ),
            // An engine is there, so falling back to no isolation would hide
            // what is missing: say it and how to get it.
            Err(error) => {
                return Err(anyhow::Error::new(error).context(format!(
                    "cannot build {} for the demo; install Debian's busybox-static \
                     (apt-get install busybox-static), pass --image IMAGE, or run \
                     --backend local (no isolation)",
                    args.image
                )));
            }
        }
    } else {
        steps.add(
            "image",
            t.elapsed(),
            format!("{} is not on the engine; it will be pulled", args.image),
        );
    }
    Ok(SandboxSpec {
        image: Some(args.image.clone()),
        ..SandboxSpec::new(BackendKind::Docker)
    })
}

/// A fresh name, so the demo never touches a sandbox of the user's.
fn demo_name() -> anyhow::Result<String> {
    let mut suffix = [0u8; 3];
    getrandom::fill(&mut suffix).map_err(|_| anyhow::anyhow!("no randomness for a name"))?;
    Ok(format!("demo-{}", hex::encode(suffix)))
}

/// Runs `silo ARGS...` as a separate process on the same home; returns
/// its trimmed stdout.
async fn second_process(silo: &Silo, args: &[&str]) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("finding the silo executable")?;
    let output = tokio::process::Command::new(exe)
        .arg("--home")
        .arg(silo.home().root())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running a second silo process")?;
    if !output.status.success() {
        bail!(
            "`silo {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
