//! The real Podman engine in tests, through its Docker-compatible API
//! socket, found as the Podman backend finds it (`SILO_PODMAN_SOCKET`, else
//! Podman's default socket). Without one, a test under CI (`CI=true`) fails,
//! since a green run must mean the Podman paths ran; elsewhere it is
//! skipped with the reason printed.

use bollard::Docker;

use crate::docker::{build_base_unless_present, in_ci};

/// The engine, or `None` (with the reason printed) when there is none and
/// this is not CI. Under CI a missing engine panics.
pub async fn engine() -> Option<Docker> {
    use silo::internals::podman::{PODMAN, connect_to, podman_host};
    match connect_to(&PODMAN).await {
        Ok(engine) => Some(engine),
        Err(error) if in_ci() => {
            panic!(
                "CI=true but no Podman engine answers at {}: {error}",
                podman_host()
            )
        }
        Err(error) => {
            eprintln!("skipping: no Podman engine answers ({error}); CI=true makes this fail");
            None
        }
    }
}

/// The engine with the base image built on it (by silo's own image build,
/// through the same socket), or `None` as for [`engine`].
pub async fn engine_with_base() -> Option<Docker> {
    static BUILT: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let engine = engine().await?;
    let mut built = BUILT.lock().await;
    if !*built {
        build_base_unless_present(&engine).await;
        *built = true;
    }
    Some(engine)
}
