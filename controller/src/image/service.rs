//! [`Images`]: what a caller may build on the engine a container backend
//! (Docker's, Podman's) uses (`silo image bake`, `silo image base`) and what it may ask of that
//! engine, without the engine's client type in any signature.

use std::path::Path;

use super::{BakeRequest, ImageError, bake, build_base, exists};
use crate::backend::DockerBackend;

/// The engine the Docker backend uses, as [`Images::engine`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Its address (`DOCKER_HOST` or the local socket for Docker, Podman's
    /// API socket for Podman).
    pub host: String,
    /// Its version, empty when it did not say.
    pub version: String,
    /// The Engine API version it speaks, empty when it did not say.
    pub api_version: String,
}

/// Image builds on a container backend's engine.
#[derive(Debug, Clone)]
pub struct Images {
    docker: DockerBackend,
}

impl Images {
    pub(crate) fn new(docker: DockerBackend) -> Self {
        Self { docker }
    }

    /// The engine, reached (or the error saying why it cannot be).
    pub async fn engine(&self) -> Result<EngineInfo, ImageError> {
        let engine = self.docker.engine().await?;
        let version = engine.version().await.unwrap_or_default();
        Ok(EngineInfo {
            host: (self.docker.flavor().host)(),
            version: version.version.unwrap_or_default(),
            api_version: version.api_version.unwrap_or_default(),
        })
    }

    /// Whether the engine has `image` (by tag or id).
    pub async fn exists(&self, image: &str) -> Result<bool, ImageError> {
        exists(self.docker.engine().await?, image).await
    }

    /// Bakes this silo's agent into `base` as `tag`, listening on `listen`
    /// (see [`super::DEFAULT_LISTEN`]); answers the new image's id.
    pub async fn bake(
        &self,
        base: &str,
        tag: &str,
        listen: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<String, ImageError> {
        let engine = self.docker.engine().await?;
        let agent = self.docker.agent_binary()?;
        let request = BakeRequest {
            base,
            tag,
            agent: &agent,
            listen,
        };
        bake(engine, self.docker.flavor(), &request, progress).await
    }

    /// Builds an image holding only this silo's agent (for a cluster's init
    /// containers) as `tag`; answers its id.
    pub async fn build_agent_image(
        &self,
        tag: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<String, ImageError> {
        let engine = self.docker.engine().await?;
        let agent = self.docker.agent_binary()?;
        super::build_agent_image(engine, &agent, tag, progress).await
    }

    /// Builds the small base image from the static busybox at `busybox` as
    /// `tag`; answers its id.
    pub async fn build_base(
        &self,
        busybox: &Path,
        tag: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<String, ImageError> {
        let engine = self.docker.engine().await?;
        build_base(engine, busybox, tag, progress).await
    }
}
