//! Building images through the engine's build API, with build contexts made
//! in memory: `silo image bake` (an image with the agent as its entrypoint,
//! for places that cannot bind-mount it) and `silo image base` (a small base
//! image made with no registry). The Dockerfile templates live in the
//! repository's `image/` directory and are compiled in.
//!
//! Layout: `context` (the in-memory tar), `bake`, `base`, `service` (the
//! [`Images`] handle a caller builds through).
//!
//! Every image silo builds carries a **base id**: the SHA-256 of what it was
//! built from (the build context, and for a bake the base image's id), as
//! the label [`BASE_ID_LABEL`] and as the file [`BASE_ID_PATH`]. A provider
//! template made from such an image keeps the file, so silo can tell that
//! a Docker image and a template hold the same files before it restores a
//! snapshot taken on one onto the other. Labels pass to images built `FROM`
//! one, so a base id counts on an engine image only when the image has the
//! layer count [`BASE_LAYERS_LABEL`] says it was built with: an image that
//! added files has more layers, one that changed only settings has the same
//! files.

mod agent;
mod bake;
mod base;
mod context;
mod service;

use bollard::Docker;
use bollard::query_parameters::BuildImageOptionsBuilder;
use futures_util::StreamExt;

use sha2::{Digest, Sha256};

use crate::backend::DockerError;
use crate::backend::docker::LONG_REQUEST_TIMEOUT;

/// The image label holding an image's base id.
pub const BASE_ID_LABEL: &str = "silo.base-id";
/// The file holding an image's base id, in the image and in templates made
/// from it.
pub const BASE_ID_PATH: &str = "/etc/silo-base-id";
/// The image label holding how many layers the image had when built.
pub const BASE_LAYERS_LABEL: &str = "silo.base-layers";

/// The base id of an engine image with these labels and `layers` layers:
/// `None` if it has none, or has other files than the image that was given
/// it (a layer count other than the one recorded beside it).
pub fn base_id_of(label: impl Fn(&str) -> Option<String>, layers: usize) -> Option<String> {
    let built_with: usize = label(BASE_LAYERS_LABEL)?.parse().ok()?;
    (built_with == layers)
        .then(|| label(BASE_ID_LABEL))
        .flatten()
        .filter(|id| !id.is_empty())
}

/// The base id of an image built from these inputs, in order: the same
/// inputs give the same id.
fn base_id(inputs: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for input in inputs {
        hash.update((input.len() as u64).to_le_bytes());
        hash.update(input);
    }
    hex::encode(hash.finalize())
}

pub use agent::build_agent_image;
pub use bake::{BAKED_AGENT_PATH, BakeRequest, DEFAULT_LISTEN, bake};
pub use base::{DEFAULT_BASE_TAG, DEFAULT_BUSYBOX, build_base};
pub use context::Context;
pub use service::{EngineInfo, Images};

/// Whether the engine has an image by this name.
pub async fn exists(engine: &Docker, image: &str) -> Result<bool, ImageError> {
    match engine.inspect_image(image).await {
        Ok(_) => Ok(true),
        Err(error) if crate::backend::docker::is_not_found(&error) => Ok(false),
        Err(source) => Err(ImageError::Api {
            what: format!("inspect image {image}"),
            source: Box::new(source),
        }),
    }
}

/// Builds `context` (a tar holding a `Dockerfile`) as `tag`; returns the
/// image id. Each line of build output goes to `progress` as it arrives.
pub async fn build(
    engine: &Docker,
    context: Vec<u8>,
    tag: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<String, ImageError> {
    // The first answer comes only once the context is read and the first
    // step runs; the default request timeout is too short for a slow step.
    let engine = engine.clone().with_timeout(LONG_REQUEST_TIMEOUT);
    let options = BuildImageOptionsBuilder::new()
        .dockerfile("Dockerfile")
        .t(tag)
        .rm(true)
        .forcerm(true)
        .build();
    let mut stream = engine.build_image(options, None, Some(bollard::body_full(context.into())));
    let mut id = None;
    while let Some(step) = stream.next().await {
        let info = step.map_err(|source| ImageError::Build {
            tag: tag.to_owned(),
            source: Box::new(source),
        })?;
        if let Some(text) = info.stream.as_deref() {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                progress(line);
            }
        }
        if let Some(found) = info.aux.and_then(|aux| aux.id) {
            id = Some(found);
        }
    }
    match id {
        Some(id) => Ok(id),
        // Engines that send no aux record still tagged the result.
        None => engine
            .inspect_image(tag)
            .await
            .map_err(|source| ImageError::Build {
                tag: tag.to_owned(),
                source: Box::new(source),
            })?
            .id
            .ok_or_else(|| ImageError::NoId(tag.to_owned())),
    }
}

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The engine is unreachable.
    #[error(transparent)]
    Engine(#[from] DockerError),
    /// An Engine API call failed.
    #[error("docker engine: cannot {what}")]
    Api {
        /// The call, in words.
        what: String,
        /// The engine's answer.
        #[source]
        source: Box<bollard::errors::Error>,
    },
    /// The build failed.
    #[error("building image {tag} failed")]
    Build {
        /// The tag being built.
        tag: String,
        /// The engine's answer, with the failing step's message.
        #[source]
        source: Box<bollard::errors::Error>,
    },
    /// The build finished without naming the image it made.
    #[error("building image {0} reported no image id")]
    NoId(String),
    /// A host file needed for the context could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The context could not be assembled.
    #[error("cannot assemble the build context")]
    Context(#[source] std::io::Error),
    /// The busybox binary would not run in an image with no libraries.
    #[error(
        "{} is not a static busybox; install Debian's busybox-static \
         (apt-get install busybox-static) or pass --busybox PATH",
        path.display()
    )]
    BusyboxNotStatic {
        /// The binary.
        path: std::path::PathBuf,
    },
    /// busybox could not list its applets.
    #[error("cannot list the applets of {}: {reason}", path.display())]
    Applets {
        /// The binary.
        path: std::path::PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A bake setting that cannot go into a Dockerfile.
    #[error("bad {what} {value:?}: {reason}")]
    Invalid {
        /// The setting.
        what: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
}
