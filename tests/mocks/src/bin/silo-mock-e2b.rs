//! `silo-mock-e2b`: starts a mock E2B (control plane, TLS proxy, envd) over
//! the local Docker engine, prints the environment a client needs as
//! `KEY=value` lines, and runs until Ctrl-C or SIGTERM, then removes every
//! container it made.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::Context;
use clap::Parser;
use silo_mocks::cli::{image_pairs, wait_for_signal};
use silo_mocks::e2b::{AGENT_PORT, DEFAULT_DOMAIN, DEFAULT_TEMPLATE, Generations};
use silo_mocks::{MockE2b, MockE2bConfig};

/// A mock E2B over the local Docker engine, for silo's tests.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A template as ID=IMAGE (repeatable; default base=silo-base:latest).
    #[arg(long = "template", value_name = "ID=IMAGE")]
    templates: Vec<String>,
    /// The API key clients must send (must start with e2b_; random if omitted).
    #[arg(long, env = "E2B_API_KEY")]
    api_key: Option<String>,
    /// The sandbox domain (hosts are {port}-{sandboxID}.{domain}).
    #[arg(long, default_value = DEFAULT_DOMAIN)]
    domain: String,
    /// Container ports to publish through the proxy, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [AGENT_PORT])]
    ports: Vec<u16>,
    /// Control-plane port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    api_port: u16,
    /// Proxy port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    proxy_port: u16,
    /// Serve only the v1 create and connect routes (an older E2B).
    #[arg(long, conflicts_with = "only_v2")]
    only_v1: bool,
    /// Serve only the v2 create and connect routes (a newer E2B).
    #[arg(long)]
    only_v2: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let args = Args::parse();
    let templates = image_pairs("template", &args.templates, DEFAULT_TEMPLATE)?;
    let config = MockE2bConfig {
        templates,
        api_key: args.api_key,
        domain: args.domain,
        ports: args.ports,
        api_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, args.api_port)),
        proxy_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, args.proxy_port)),
        routes: Generations {
            v1: !args.only_v2,
            v2: !args.only_v1,
        },
    };
    let mock = MockE2b::start(config)
        .await
        .context("starting the mock E2B")?;
    for (name, value) in mock.env() {
        println!("{name}={value}");
    }
    wait_for_signal()
        .await
        .context("listening for Ctrl-C and SIGTERM")?;
    let removed = mock.shutdown().await.context("stopping the mock E2B")?;
    eprintln!("removed {removed} sandbox container(s)");
    Ok(())
}
