//! `silo cat SANDBOX PATH...`: files' bytes to stdout, as they are. A path
//! that cannot be read is reported and the rest still printed; the exit
//! code is then 1.

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// Files in the sandbox (relative ones start at its working directory).
    #[arg(required = true)]
    paths: Vec<String>,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = silo.running_sandbox(&args.sandbox).await?;
    let mut failed = false;
    for path in &args.paths {
        let read = sandbox
            .files()
            .read(path)
            .await
            .with_context(|| format!("reading {}:{path}", sandbox.name()));
        match read {
            Ok(bytes) => {
                let code = out.bytes(&bytes)?;
                if code != 0 {
                    return Ok(code);
                }
            }
            Err(err) => {
                out.error(&err);
                failed = true;
            }
        }
    }
    Ok(i32::from(failed))
}
