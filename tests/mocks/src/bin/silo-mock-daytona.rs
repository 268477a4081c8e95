//! `silo-mock-daytona`: starts a mock Daytona (control plane, TLS proxy,
//! toolbox) over the local Docker engine, prints the environment a client
//! needs as `KEY=value` lines, and runs until Ctrl-C or SIGTERM, then
//! removes every container it made.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use silo_mocks::cli::{image_pairs, wait_for_signal};
use silo_mocks::daytona::{AGENT_PORT, DEFAULT_PROXY_DOMAIN, DEFAULT_SNAPSHOT, DEFAULT_TARGET};
use silo_mocks::{MockDaytona, MockDaytonaConfig};

/// A mock Daytona over the local Docker engine, for silo's tests.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A snapshot as NAME=IMAGE (repeatable; default base=silo-base:latest).
    #[arg(long = "snapshot", value_name = "NAME=IMAGE")]
    snapshots: Vec<String>,
    /// A snapshot whose sandboxes are VMs (`linux-vm`, which Daytona
    /// pauses and resumes) as NAME=IMAGE (repeatable).
    #[arg(long = "vm-snapshot", value_name = "NAME=IMAGE")]
    vm_snapshots: Vec<String>,
    /// The snapshot a create without one gets (default: the first --snapshot).
    #[arg(long)]
    default_snapshot: Option<String>,
    /// The API key clients must send (random dtn_… if omitted).
    #[arg(long, env = "DAYTONA_API_KEY")]
    api_key: Option<String>,
    /// The proxy domain (previews are {port}-{sandboxId}.{domain}).
    #[arg(long, default_value = DEFAULT_PROXY_DOMAIN)]
    proxy_domain: String,
    /// The toolbox's host in toolboxProxyUrl (default proxy.{domain});
    /// `localhost` lets a client that resolves names itself reach it.
    #[arg(long)]
    toolbox_host: Option<String>,
    /// Regions a create may name, comma-separated; the first is the default.
    #[arg(long, value_delimiter = ',', default_values_t = [DEFAULT_TARGET.to_owned()])]
    targets: Vec<String>,
    /// Container ports to publish through the proxy, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [AGENT_PORT])]
    ports: Vec<u16>,
    /// Seconds one minute of autoStopInterval/autoDeleteInterval lasts.
    #[arg(long, default_value_t = 60.0)]
    minute_seconds: f64,
    /// Control-plane port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    api_port: u16,
    /// Proxy port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    proxy_port: u16,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let args = Args::parse();
    let mut snapshots = image_pairs("snapshot", &args.snapshots, DEFAULT_SNAPSHOT)?;
    let default_snapshot = match args.default_snapshot {
        Some(name) => name,
        None => snapshots
            .keys()
            .next()
            .cloned()
            .unwrap_or_else(|| DEFAULT_SNAPSHOT.0.to_owned()),
    };
    let mut vm_snapshots = BTreeSet::new();
    if !args.vm_snapshots.is_empty() {
        for (name, image) in image_pairs("vm-snapshot", &args.vm_snapshots, DEFAULT_SNAPSHOT)? {
            if snapshots.insert(name.clone(), image).is_some() {
                anyhow::bail!("snapshot {name:?} is given by both --snapshot and --vm-snapshot");
            }
            vm_snapshots.insert(name);
        }
    }
    let minute = Duration::try_from_secs_f64(args.minute_seconds)
        .context("--minute-seconds is not a duration")?;
    let config = MockDaytonaConfig {
        snapshots,
        default_snapshot,
        vm_snapshots,
        api_key: args.api_key,
        proxy_domain: args.proxy_domain,
        toolbox_host: args.toolbox_host,
        targets: args.targets,
        ports: args.ports,
        api_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, args.api_port)),
        proxy_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, args.proxy_port)),
        minute,
    };
    let mock = MockDaytona::start(config)
        .await
        .context("starting the mock Daytona")?;
    for (name, value) in mock.env() {
        println!("{name}={value}");
    }
    wait_for_signal()
        .await
        .context("listening for Ctrl-C and SIGTERM")?;
    let removed = mock.shutdown().await.context("stopping the mock Daytona")?;
    eprintln!("removed {removed} sandbox container(s)");
    Ok(())
}
