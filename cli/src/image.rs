//! `silo image`: build images through the engine. `bake` puts the agent into
//! an image as its entrypoint; `base` makes a small base image from the
//! host's static busybox, with no registry.

use std::path::PathBuf;

use anyhow::anyhow;
use silo::{BackendKind, Silo};
use silo::{DEFAULT_BASE_TAG, DEFAULT_BUSYBOX, DEFAULT_LISTEN};

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The backend whose engine builds it (docker or podman).
    #[arg(long, global = true, default_value_t = BackendKind::Docker)]
    backend: BackendKind,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Build BASE with silo-agent as its entrypoint (BASE's own entrypoint
    /// and command become the agent's workload).
    Bake {
        /// The image to start from.
        base: String,
        /// The tag to give the result.
        #[arg(short = 't', long = "tag")]
        tag: String,
        /// Where the baked agent listens: unix:/PATH or tcp:HOST:PORT.
        #[arg(long, default_value = DEFAULT_LISTEN)]
        listen: String,
    },
    /// Build an image holding only the static agent (at /silo-agent): the
    /// Kubernetes backend's init containers copy it into pods made from
    /// any image (SILO_KUBERNETES_AGENT_IMAGE).
    Agent {
        /// The tag to give it.
        #[arg(short = 't', long = "tag")]
        tag: String,
    },
    /// Build a small base image: FROM scratch plus a static busybox.
    Base {
        /// The tag to give it.
        #[arg(short = 't', long = "tag", default_value = DEFAULT_BASE_TAG)]
        tag: String,
        /// The static busybox to put in it (Debian's busybox-static).
        #[arg(long, default_value = DEFAULT_BUSYBOX)]
        busybox: PathBuf,
    },
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let images = silo.images_on(args.backend).ok_or_else(|| {
        anyhow!(
            "the {} backend has no engine to build images on (use --backend docker or podman)",
            args.backend
        )
    })?;
    images.engine().await?;
    let mut progress = |line: &str| out.progress(line);
    let (tag, id) = match args.command {
        Command::Bake { base, tag, listen } => {
            let id = images.bake(&base, &tag, &listen, &mut progress).await?;
            (tag, id)
        }
        Command::Agent { tag } => {
            let id = images.build_agent_image(&tag, &mut progress).await?;
            (tag, id)
        }
        Command::Base { tag, busybox } => {
            let id = images.build_base(&busybox, &tag, &mut progress).await?;
            (tag, id)
        }
    };
    out.image_built(&tag, &id)?;
    Ok(0)
}
