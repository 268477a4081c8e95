//! `silo diff SANDBOX [SNAPSHOT]`: what differs between a sandbox's live
//! tree and one of its snapshots (its latest by default), path by path.

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each line is a path: + added since the snapshot, - removed, ~ changed, with how \
(kind, mode, owner, content, target, xattrs, mtime, links). Names are escaped: \
\\\\ for a backslash, \\n \\t \\r, and \\xNN for any other control character and \
every byte that is not UTF-8.

With --json each path is {\"path\", \"change\"} (and \"what\" when changed); \"path\" \
is exact when it is UTF-8. A path that is not UTF-8 also has \"path_raw\", its exact \
bytes as an array of numbers (\"path\" then shows each bad byte as U+FFFD): decode \
with bytes(p[\"path_raw\"]) if \"path_raw\" in p else p[\"path\"].encode().")]
pub struct Args {
    /// The sandbox (name or id).
    #[arg(value_name = "SANDBOX")]
    sandbox: String,
    /// A snapshot (id or unique prefix); the sandbox's latest by default.
    #[arg(value_name = "SNAPSHOT")]
    snapshot: Option<String>,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let report = silo
        .snapshots_of(&args.sandbox)?
        .diff(args.snapshot.as_deref())
        .await
        .with_context(|| format!("comparing {} with its snapshot", args.sandbox))?;
    out.diff(&report)?;
    Ok(0)
}
