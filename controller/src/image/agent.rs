//! `silo image agent -t TAG`: an image holding only the static agent, at
//! [`AGENT_IMAGE_PATH`]. A cluster's pod made from any image gets its agent
//! from it: an init container runs `silo-agent --install-to` into the
//! pod's shared volume (see `backend::kubernetes`).

use std::path::Path;

use bollard::Docker;

use super::{Context, ImageError, build};
use crate::agent_binary::is_static_executable;
use crate::backend::DockerError;
use crate::backend::kubernetes::config::AGENT_IMAGE_PATH;

/// Builds the agent image from the static `agent` as `tag`; answers its id.
pub async fn build_agent_image(
    engine: &Docker,
    agent: &Path,
    tag: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<String, ImageError> {
    let bytes = std::fs::read(agent).map_err(|source| ImageError::Read {
        path: agent.to_owned(),
        source,
    })?;
    if !is_static_executable(&bytes) {
        return Err(DockerError::AgentNotStatic {
            path: agent.to_owned(),
        }
        .into());
    }
    let dockerfile = format!(
        "FROM scratch\nCOPY silo-agent {AGENT_IMAGE_PATH}\nENTRYPOINT [\"{AGENT_IMAGE_PATH}\"]\n"
    );
    let mut context = Context::new();
    context
        .file("Dockerfile", 0o644, dockerfile.as_bytes())
        .and_then(|()| context.file("silo-agent", 0o755, &bytes))
        .map_err(ImageError::Context)?;
    let built = context.finish().map_err(ImageError::Context)?;
    build(engine, built, tag, progress).await
}
