//! `silo create`: make a sandbox and start it.

use silo::{BackendKind, CreateRequest, Silo};

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the sandbox runs.
    #[arg(long, default_value = "local")]
    backend: BackendKind,
    /// Its name (default: a generated one).
    #[arg(long)]
    name: Option<String>,
    /// Environment for every command in the sandbox.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
    env: Vec<(String, String)>,
    /// Stop the sandbox after this many seconds without a request.
    #[arg(long, value_name = "SECS")]
    idle_timeout: Option<u64>,
    /// A command the agent keeps running for the sandbox's life.
    #[arg(last = true, value_name = "WORKLOAD")]
    workload: Vec<String>,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let mut request = CreateRequest::new(args.backend);
    request.name = args.name;
    request.spec.env = args.env.into_iter().collect();
    request.spec.idle_timeout_secs = args.idle_timeout;
    request.spec.workload = args.workload;
    let sandbox = silo.create(request).await?;
    out.created(&sandbox)?;
    Ok(0)
}
