//! `silo-mock-kubernetes`: starts a mock Kubernetes API server over the
//! local Docker engine, writes a kubeconfig for it, prints
//! `KUBECONFIG=<path>`, and runs until Ctrl-C or SIGTERM, then removes
//! every container it made.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::Context;
use clap::Parser;
use silo_mocks::cli::wait_for_signal;
use silo_mocks::{MockKubernetes, MockKubernetesConfig};

/// A mock Kubernetes API server over the local Docker engine, for silo's tests.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The API's port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    api_port: u16,
    /// The bearer token clients must send (random if omitted).
    #[arg(long)]
    token: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let args = Args::parse();
    let config = MockKubernetesConfig {
        token: args.token,
        api_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, args.api_port)),
    };
    let mock = MockKubernetes::start(config)
        .await
        .context("starting the mock Kubernetes")?;
    for (name, value) in mock.env() {
        println!("{name}={value}");
    }
    wait_for_signal()
        .await
        .context("listening for Ctrl-C and SIGTERM")?;
    let removed = mock
        .shutdown()
        .await
        .context("stopping the mock Kubernetes")?;
    eprintln!("removed {removed} container(s)");
    Ok(())
}
