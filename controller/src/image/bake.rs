//! `silo image bake BASE -t TAG`: BASE with the static agent copied in and
//! set as its entrypoint, and BASE's own entrypoint and command kept as the
//! agent's workload. For places that cannot bind-mount the agent (remote
//! providers' templates, hosts where images are built once and shipped).

use std::path::Path;

use bollard::Docker;

use super::{Context, ImageError, base_id, build};
use crate::agent_binary::is_static_executable;
use crate::backend::DockerError;
use crate::backend::docker::Flavor;

/// The Dockerfile template (see `image/Dockerfile.bake`).
const TEMPLATE: &str = include_str!("../../../image/Dockerfile.bake");
/// Where the agent goes in a baked image; a remote backend starts the one
/// it finds there instead of uploading its own.
pub const BAKED_AGENT_PATH: &str = "/usr/local/bin/silo-agent";
/// Where a baked agent listens unless told otherwise: the same socket the
/// Docker backend uses, in a directory a host can bind-mount.
pub const DEFAULT_LISTEN: &str = "unix:/.silo/run/agent.sock";

/// What to bake.
#[derive(Debug, Clone)]
pub struct BakeRequest<'a> {
    /// The base image (must be on the engine, or pullable).
    pub base: &'a str,
    /// The tag of the result.
    pub tag: &'a str,
    /// The static agent to copy in.
    pub agent: &'a Path,
    /// The agent's `--listen` address.
    pub listen: &'a str,
}

/// Bakes the agent into `request.base`; returns the new image's id.
pub async fn bake(
    engine: &Docker,
    flavor: &Flavor,
    request: &BakeRequest<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<String, ImageError> {
    for (what, value) in [
        ("base image", request.base),
        ("listen address", request.listen),
    ] {
        if value.is_empty()
            || value
                .chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '\\')
        {
            return Err(ImageError::Invalid {
                what,
                value: value.to_owned(),
                reason: "it may not be empty or hold spaces, quotes or backslashes",
            });
        }
    }
    let agent = std::fs::read(request.agent).map_err(|source| ImageError::Read {
        path: request.agent.to_owned(),
        source,
    })?;
    if !is_static_executable(&agent) {
        return Err(DockerError::AgentNotStatic {
            path: request.agent.to_owned(),
        }
        .into());
    }
    let base = crate::backend::docker::ensure_image(engine, flavor, request.base).await?;
    let base_image_id = base.id.clone().unwrap_or_default();
    // The base's layers and one per COPY of the template.
    let layers = base
        .root_fs
        .as_ref()
        .and_then(|r| r.layers.as_ref())
        .map_or(0, Vec::len)
        + 2;
    let config = base.config.unwrap_or_default();
    let mut workload = config.entrypoint.unwrap_or_default();
    workload.extend(config.cmd.unwrap_or_default());
    let unmarked = render(request, &workload, "", layers);
    let id = base_id(&[base_image_id.as_bytes(), &agent, unmarked.as_bytes()]);
    let dockerfile = render(request, &workload, &id, layers);

    let mut context = Context::new();
    context
        .file("Dockerfile", 0o644, dockerfile.as_bytes())
        .and_then(|()| context.file("silo-agent", 0o755, &agent))
        .and_then(|()| context.file("silo-base-id", 0o644, id.as_bytes()))
        .map_err(ImageError::Context)?;
    let bytes = context.finish().map_err(ImageError::Context)?;
    build(engine, bytes, request.tag, progress).await
}

/// The template with its placeholders filled in.
fn render(request: &BakeRequest<'_>, workload: &[String], base_id: &str, layers: usize) -> String {
    // A JSON array of strings is exactly a Dockerfile exec-form CMD.
    let workload = serde_json::to_string(workload).unwrap_or_else(|_| "[]".to_owned());
    TEMPLATE
        .replace("{{BASE}}", request.base)
        .replace("{{LISTEN}}", request.listen)
        .replace("{{WORKLOAD}}", &workload)
        .replace("{{BASE_ID}}", base_id)
        .replace("{{AGENT_PATH}}", BAKED_AGENT_PATH)
        .replace("{{BASE_LAYERS}}", &layers.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_is_filled_in() {
        let request = BakeRequest {
            base: "silo-base:latest",
            tag: "x",
            agent: Path::new("/a"),
            listen: DEFAULT_LISTEN,
        };
        let text = render(
            &request,
            &["/bin/sh".into(), "-c".into(), "echo \"hi\"".into()],
            "abc",
            3,
        );
        assert!(text.contains("FROM silo-base:latest\n"), "{text}");
        assert!(
            text.contains(r#""--listen", "unix:/.silo/run/agent.sock""#),
            "{text}"
        );
        assert!(
            text.contains(r#"CMD ["/bin/sh","-c","echo \"hi\""]"#),
            "{text}"
        );
        assert!(text.contains(r#"silo.base-id="abc""#), "{text}");
        assert!(text.contains(r#"silo.base-layers="3""#), "{text}");
        assert!(!text.contains("{{"), "{text}");
    }
}
