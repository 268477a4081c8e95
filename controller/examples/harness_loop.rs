//! The loop an agent harness runs over silo: open (or create) a sandbox,
//! push the task's files in, then for each step run a command, keep a
//! snapshot after every step that succeeded, and rewind to the last good
//! one when a step fails, so a bad step never poisons the next.
//!
//! ```sh
//! silo image base    # once: silo-base:latest, built without a registry
//! cargo run -p silo --example harness_loop -- silo-base:latest
//! ```
//!
//! The argument is the Docker image to run (`silo-base:latest` when
//! absent). The agent comes from `$SILO_AGENT`, or from beside the program;
//! the `silo` binary carries one inside and needs neither.

use std::error::Error;

use silo::{BackendKind, ExecSpec, FileSet, PushOptions, SandboxSpec, Silo, UpRequest};

/// The steps a model might have proposed: the third one breaks the tree.
const STEPS: &[&str] = &[
    "cd /workspace/managed/task && sh ./build.sh > /tmp/built && cat /tmp/built",
    "echo 'step two ran' >> /tmp/built && wc -l < /tmp/built",
    "rm -rf /tmp/built && false",
    "cat /tmp/built",
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let image = std::env::args().nth(1);
    let mut spec = SandboxSpec::new(BackendKind::Docker);
    spec.image = Some(image.unwrap_or_else(|| "silo-base:latest".into()));

    let silo = Silo::open(None)?;
    let (sandbox, outcome) = silo
        .up_sandbox(UpRequest {
            name: "harness-example".into(),
            spec: Some(spec),
            recreate: false,
        })
        .await?;
    println!(
        "sandbox {} ({:?}, tier {})",
        sandbox.name(),
        outcome.action,
        outcome.tier
    );

    // The task's files arrive whole or not at all.
    let mut files = FileSet::new();
    files.insert_bytes("build.sh", &b"echo built\n"[..], true)?;
    let pushed = sandbox
        .push("/workspace/managed/task", files, &PushOptions::default())
        .await?;
    println!(
        "pushed to {} of {} sandbox(es)",
        pushed.succeeded, pushed.targets
    );

    let mut last_good = None;
    for (n, step) in STEPS.iter().enumerate() {
        let out = sandbox.commands().run(ExecSpec::shell(step)).await?;
        let ok = out.exit.code == Some(0);
        print!(
            "step {n}: exit {:?}: {}",
            out.exit.code,
            String::from_utf8_lossy(&out.stdout)
        );
        if ok {
            let report = sandbox
                .snapshots()
                .take(Some(format!("after step {n}")))
                .await?;
            println!(
                "  snapshot {} ({} bytes new)",
                report.snapshot.id, report.snapshot.new_bytes
            );
            last_good = Some(report.snapshot.id);
        } else {
            match &last_good {
                Some(snapshot) => {
                    let restored = sandbox.snapshots().rewind(snapshot).await?;
                    println!("  failed: rewound to {snapshot} in {:.0} ms", restored.ms);
                }
                None => println!("  failed, and there is no snapshot to go back to"),
            }
        }
    }

    sandbox.remove().await?;
    Ok(())
}
