//! `silo image base`: a small base image made with no registry at all,
//! `FROM scratch` plus the host's static busybox (Debian's `busybox-static`)
//! and a symlink per applet. It is what the demo and the tests run, and a
//! fair stand-in for a distroless or scratch-based image: no libc, no package
//! manager, only what busybox provides.

use std::path::Path;

use bollard::Docker;

use super::{BASE_ID_PATH, Context, ImageError, base_id, build};
use crate::agent_binary::is_static_executable;

/// The Dockerfile template (see `image/Dockerfile.base`).
const TEMPLATE: &str = include_str!("../../../image/Dockerfile.base");
/// The tag `silo image base` builds unless told otherwise.
pub const DEFAULT_BASE_TAG: &str = "silo-base:latest";
/// Where Debian's busybox-static installs its binary.
pub const DEFAULT_BUSYBOX: &str = "/bin/busybox";
/// Where busybox goes in the image; every applet links to it.
const BUSYBOX_IN_IMAGE: &str = "/bin/busybox";
/// Directories of the image, with their modes (`/tmp` is sticky and shared).
const DIRS: &[(&str, u32)] = &[
    ("bin", 0o755),
    ("sbin", 0o755),
    ("usr", 0o755),
    ("usr/bin", 0o755),
    ("usr/sbin", 0o755),
    ("etc", 0o755),
    ("home", 0o755),
    ("root", 0o700),
    // Engines mount their own files under it (Podman's `.containerenv`),
    // and make it when an image lacks it: here it is the image's on each.
    ("run", 0o755),
    ("tmp", 0o1777),
    ("var", 0o755),
    ("var/tmp", 0o1777),
];
/// Users, so `--user nobody` works and tools that look themselves up find an entry.
const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// Builds the base image from the static busybox at `busybox` as `tag`;
/// returns the image id.
pub async fn build_base(
    engine: &Docker,
    busybox: &Path,
    tag: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<String, ImageError> {
    let context = base_context(busybox).await?;
    build(engine, context, tag, progress).await
}

/// The build context: the Dockerfile and `rootfs/`.
async fn base_context(busybox: &Path) -> Result<Vec<u8>, ImageError> {
    let binary = tokio::fs::read(busybox)
        .await
        .map_err(|source| ImageError::Read {
            path: busybox.to_owned(),
            source,
        })?;
    if !is_static_executable(&binary) {
        return Err(ImageError::BusyboxNotStatic {
            path: busybox.to_owned(),
        });
    }
    let applets = applets(busybox).await?;

    // The rootfs is assembled twice: once to hash it for the base id, once
    // with the id in it.
    let assemble = |context: &mut Context, id: Option<&str>| -> std::io::Result<()> {
        let dockerfile = TEMPLATE.replace("{{BASE_ID}}", id.unwrap_or_default());
        context.file("Dockerfile", 0o644, dockerfile.as_bytes())?;
        context.dir("rootfs", 0o755)?;
        for (dir, mode) in DIRS {
            context.dir(&format!("rootfs/{dir}"), *mode)?;
        }
        context.file(&format!("rootfs{BUSYBOX_IN_IMAGE}"), 0o755, &binary)?;
        for applet in &applets {
            context.symlink(&format!("rootfs/{applet}"), BUSYBOX_IN_IMAGE)?;
        }
        context.file("rootfs/etc/passwd", 0o644, PASSWD.as_bytes())?;
        context.file("rootfs/etc/group", 0o644, GROUP.as_bytes())?;
        if let Some(id) = id {
            context.file(&format!("rootfs{BASE_ID_PATH}"), 0o644, id.as_bytes())?;
        }
        Ok(())
    };
    let mut unmarked = Context::new();
    assemble(&mut unmarked, None).map_err(ImageError::Context)?;
    let id = base_id(&[&unmarked.finish().map_err(ImageError::Context)?]);
    let mut context = Context::new();
    assemble(&mut context, Some(&id)).map_err(ImageError::Context)?;
    context.finish().map_err(ImageError::Context)
}

/// The applets' install paths (`bin/sh`, `usr/bin/wc`…), as busybox lists
/// them; busybox itself and anything odd are left out.
async fn applets(busybox: &Path) -> Result<Vec<String>, ImageError> {
    let failed = |reason: String| ImageError::Applets {
        path: busybox.to_owned(),
        reason,
    };
    let output = tokio::process::Command::new(busybox)
        .arg("--list-full")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        return Err(failed(format!(
            "`--list-full` exited with {}",
            output.status
        )));
    }
    let listed = String::from_utf8_lossy(&output.stdout);
    let applets: Vec<String> = listed
        .lines()
        .map(str::trim)
        .filter(|path| is_plain_relative(path) && *path != &BUSYBOX_IN_IMAGE[1..])
        .map(str::to_owned)
        .collect();
    if applets.is_empty() {
        return Err(failed("it listed none".into()));
    }
    Ok(applets)
}

/// A relative path under one of the image's directories, without `..`.
fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && DIRS.iter().any(|(dir, _)| {
            path.rsplit_once('/')
                .is_some_and(|(parent, _)| parent == *dir)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_applets_in_known_directories_are_linked() {
        assert!(is_plain_relative("bin/sh"));
        assert!(is_plain_relative("usr/bin/["));
        assert!(!is_plain_relative("/bin/sh"));
        assert!(!is_plain_relative("bin/../etc/passwd"));
        assert!(!is_plain_relative("opt/x"));
        assert!(!is_plain_relative("sh"));
    }
}
