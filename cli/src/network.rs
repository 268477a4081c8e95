//! `silo network`: a sandbox's outbound rules, shown, or changed in place
//! on the providers that can (e2b, daytona) without making it again.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// Let outbound traffic reach only this destination (repeatable), as
    /// `silo up --allow-out`; the given lists replace the sandbox's whole.
    #[arg(long = "allow-out", value_name = "DEST")]
    allow_out: Vec<String>,
    /// Keep outbound traffic from this IPv4 address or block (repeatable),
    /// as `silo up --deny-out` (e2b only).
    #[arg(long = "deny-out", value_name = "DEST")]
    deny_out: Vec<String>,
    /// Clear both lists: outbound traffic open again (unless --network none).
    #[arg(long, conflicts_with_all = ["allow_out", "deny_out"])]
    open: bool,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = if !args.open && args.allow_out.is_empty() && args.deny_out.is_empty() {
        silo.get(&args.sandbox)?
    } else {
        silo.set_network(&args.sandbox, &args.allow_out, &args.deny_out)
            .await?
    };
    out.network(&sandbox)?;
    Ok(0)
}
