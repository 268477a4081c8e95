//! `kubernetes`: silo on a cluster beside `kubectl`, both against the mock
//! API server (`tests/mocks`: its pods are real containers, each at its own
//! loopback address) in one run:
//! - time to interactive: `up` of a fresh sandbox (a pod from an image that
//!   carries the agent) to the first output of `echo ready`, beside
//!   `kubectl run` of a pod of the same image and `kubectl wait` for it to
//!   be ready; with the agent reached through port-forward and at the pod's
//!   address;
//! - exec round trip: `true` through the agent on a kept connection (both
//!   ways of reaching it), beside `kubectl exec POD -- true`;
//! - pool claim: `up --pool` of a started pod to its first output.
//!
//! The mock answers as the API server would and runs containers on the
//! local engine, so the absolute figures are the mock's; the ratios
//! compare silo's path with kubectl's against the same server and pods.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use silo::{BackendKind, KubernetesConfig, SandboxSpec, Silo, SiloOptions, UpRequest};
use silo_mocks::{MockKubernetes, MockKubernetesConfig};
use silo_protocol::exec::ExecSpec;

use crate::docker_common::first_output;
use crate::report::Row;
use crate::stats::Samples;

/// The base image with the agent baked in.
const BAKED_IMAGE: &str = "silo-bench-kubernetes:latest";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (rounds, execs) = if quick { (2, 20) } else { (8, 200) };
    if silo_tests::docker::engine_with_base().await.is_none() {
        return Ok(Vec::new());
    }
    crate::docker_common::bake_base(BAKED_IMAGE).await?;
    let mock = MockKubernetes::start(MockKubernetesConfig::default()).await?;
    // The kube client reads KUBECONFIG like every Kubernetes client; this
    // process has no other cluster.
    // SAFETY: set before any other thread of this scenario reads the
    // environment; the bench runs one scenario at a time.
    unsafe { std::env::set_var("KUBECONFIG", mock.kubeconfig_path()) };
    let home = tempfile::Builder::new()
        .prefix("silo-bench-kubernetes-")
        .tempdir()?;
    // Two handles on one home, each reaching agents its way (as two
    // processes, one inside the cluster and one outside, would).
    let open = |reach: &str| -> anyhow::Result<Silo> {
        let config = KubernetesConfig::from_vars(|name| {
            (name == silo::internals::kubernetes::ENV_REACH).then(|| reach.to_owned())
        })?;
        Ok(Silo::open_with(SiloOptions {
            home: Some(home.path().join("home")),
            kubernetes: Some(config),
            ..SiloOptions::default()
        })?)
    };
    let forwarded = open("port-forward")?;
    let direct = open("pod-ip")?;
    let kubectl = Kubectl(mock.kubeconfig_path().to_owned());

    // Time to interactive, one untimed round first for each.
    let (mut forwarded_tti, mut direct_tti) = (Samples::default(), Samples::default());
    let mut kubectl_tti = Samples::default();
    for round in 0..=rounds {
        let took_forwarded = tti(&forwarded, &format!("bench-k8s-pf-{round}")).await?;
        let took_direct = tti(&direct, &format!("bench-k8s-ip-{round}")).await?;
        let pod = format!("bench-kubectl-{round}");
        let t = Instant::now();
        kubectl.run(&[
            "run",
            &pod,
            "--image",
            BAKED_IMAGE,
            "--restart=Never",
            "--command",
            "--",
            "/bin/sh",
            "-c",
            "sleep 1000",
        ])?;
        kubectl.run(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{pod}"),
            "--timeout=60s",
        ])?;
        let took_kubectl = t.elapsed();
        kubectl.run(&["delete", "pod", &pod, "--grace-period=0", "--wait=false"])?;
        if round > 0 {
            forwarded_tti.push(took_forwarded);
            direct_tti.push(took_direct);
            kubectl_tti.push(took_kubectl);
        }
    }

    // Exec round trips on one pod, reached both ways, beside kubectl exec.
    let (sandbox, _) = forwarded.up_sandbox(up("bench-k8s-rtt")).await?;
    let (mut kept_forwarded, mut kept_direct) = (Samples::default(), Samples::default());
    let conn = forwarded.connect(sandbox.record()).await?;
    for _ in 0..execs {
        let t = Instant::now();
        conn.run(ExecSpec::argv(["true"])).await?;
        kept_forwarded.push(t.elapsed());
    }
    drop(conn);
    let record = sandbox.record().clone();
    let pod = record.backend_ref["pod"]
        .as_str()
        .and_then(|p| p.split_once('/'))
        .map(|(_, name)| name.to_owned())
        .unwrap_or_default();
    let direct_conn = direct.connect(&record).await?;
    for _ in 0..execs {
        let t = Instant::now();
        direct_conn.run(ExecSpec::argv(["true"])).await?;
        kept_direct.push(t.elapsed());
    }
    drop(direct_conn);
    let mut kubectl_exec = Samples::default();
    for _ in 0..execs / 10 {
        let t = Instant::now();
        kubectl.run(&["exec", &pod, "--", "true"])?;
        kubectl_exec.push(t.elapsed());
    }
    sandbox.remove().await?;

    // Pool claim to first output.
    let pool_size = if quick { 2 } else { 6 };
    let spec = up("unused")
        .spec
        .unwrap_or_else(|| SandboxSpec::new(BackendKind::Kubernetes));
    direct.create_pool("bench-k8s", spec, pool_size)?;
    let filled = direct.fill_pool("bench-k8s").await?;
    anyhow::ensure!(
        filled.failed.is_empty(),
        "filling the pool: {:?}",
        filled.failed
    );
    let mut claim = Samples::default();
    for round in 0..pool_size {
        let name = format!("bench-k8s-pool-{round}");
        let t = Instant::now();
        let outcome = direct.up_from_pool(&name, "bench-k8s").await?;
        let conn = direct.connect(&outcome.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        claim.push(t.elapsed());
        drop(conn);
        direct.remove(&name).await?;
    }
    direct.remove_pool("bench-k8s").await?;
    drop((forwarded, direct));
    mock.shutdown().await?;

    let ms = |s: &Samples| s.percentile(50.0);
    let kubectl_run = "kubectl run + wait Ready";
    Ok(vec![
        Row::untargeted(
            "kubernetes",
            format!("tti p50 of {rounds}, port-forward"),
            "ms",
            ms(&forwarded_tti),
            Some((ms(&kubectl_tti), kubectl_run)),
        ),
        Row::untargeted(
            "kubernetes",
            format!("tti p50 of {rounds}, pod address"),
            "ms",
            ms(&direct_tti),
            Some((ms(&kubectl_tti), kubectl_run)),
        ),
        Row::untargeted(
            "kubernetes",
            format!("exec true p50 of {execs}, kept, port-forward"),
            "ms",
            ms(&kept_forwarded),
            Some((ms(&kubectl_exec), "kubectl exec true")),
        ),
        Row::untargeted(
            "kubernetes",
            format!("exec true p50 of {execs}, kept, pod address"),
            "ms",
            ms(&kept_direct),
            Some((ms(&kubectl_exec), "kubectl exec true")),
        ),
        Row::untargeted(
            "kubernetes",
            format!("up --pool to output p50 of {pool_size}"),
            "ms",
            ms(&claim),
            Some((ms(&kubectl_tti), kubectl_run)),
        ),
    ])
}

/// `up` of a fresh sandbox to the first output of `echo ready`, then its
/// removal (not timed).
async fn tti(silo: &Silo, name: &str) -> anyhow::Result<std::time::Duration> {
    let t = Instant::now();
    let (sandbox, _) = silo.up_sandbox(up(name)).await?;
    let conn = silo.connect(sandbox.record()).await?;
    first_output(&conn, &["echo", "ready"]).await?;
    let took = t.elapsed();
    drop(conn);
    sandbox.remove().await?;
    Ok(took)
}

fn up(name: &str) -> UpRequest {
    UpRequest {
        name: name.to_owned(),
        spec: Some(SandboxSpec {
            image: Some(BAKED_IMAGE.into()),
            ..SandboxSpec::new(BackendKind::Kubernetes)
        }),
        recreate: false,
    }
}

/// The real `kubectl`, against the mock's kubeconfig.
struct Kubectl(std::path::PathBuf);

impl Kubectl {
    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(Path::new(&self.0))
            .args(args)
            .output()
            .map_err(|e| anyhow::anyhow!("kubectl cannot run ({e}): apt-get install kubectl"))?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}
