//! Making sure a sandbox's image is on the engine: inspect it, and pull it
//! once if it is absent, as `docker run` would. A failed pull (no registry,
//! no such image) says how to get an image without one.

use bollard::Docker;
use bollard::models::ImageInspect;
use bollard::query_parameters::CreateImageOptions;
use futures_util::StreamExt;

use super::engine::{Flavor, LONG_REQUEST_TIMEOUT};
use super::error::{DockerError, api, is_not_found};

/// The image as `flavor`'s engine describes it, pulled first if absent.
pub async fn ensure_image(
    engine: &Docker,
    flavor: &Flavor,
    image: &str,
) -> Result<ImageInspect, DockerError> {
    match engine.inspect_image(image).await {
        Ok(found) => return Ok(found),
        Err(error) if is_not_found(&error) => {}
        Err(error) => return Err(api(format!("inspect image {image}"))(error)),
    }
    tracing::info!(image, "image not present; pulling it");
    pull(engine, flavor, image).await?;
    engine
        .inspect_image(image)
        .await
        .map_err(api(format!("inspect image {image}")))
}

async fn pull(engine: &Docker, flavor: &Flavor, image: &str) -> Result<(), DockerError> {
    let unavailable = |source| DockerError::ImageUnavailable {
        image: image.to_owned(),
        backend: flavor.name,
        source: Box::new(source),
    };
    // A pull answers slowly on a cold registry; the normal request timeout
    // would cut it off before its progress stream starts.
    let engine = engine.clone().with_timeout(LONG_REQUEST_TIMEOUT);
    let options = CreateImageOptions {
        from_image: Some(image.to_owned()),
        tag: default_tag(image).map(str::to_owned),
        ..Default::default()
    };
    let mut progress = engine.create_image(Some(options), None, None);
    while let Some(step) = progress.next().await {
        step.map_err(unavailable)?;
    }
    Ok(())
}

/// `latest` for a reference with neither tag nor digest: the engine pulls
/// *every* tag of a repository when asked for one without a tag.
fn default_tag(image: &str) -> Option<&'static str> {
    let last = image.rsplit('/').next().unwrap_or(image);
    (!image.contains('@') && !last.contains(':')).then_some("latest")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bare_references_get_latest() {
        assert_eq!(default_tag("busybox"), Some("latest"));
        assert_eq!(default_tag("registry:5000/team/app"), Some("latest"));
        assert_eq!(default_tag("busybox:1.36"), None);
        assert_eq!(default_tag("app@sha256:abcd"), None);
    }
}
