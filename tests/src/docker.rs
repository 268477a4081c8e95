//! The real Docker engine in tests and benchmarks.
//!
//! [`engine`] connects the way silo does (`DOCKER_HOST`, version
//! negotiation). Without an engine, a test under CI (`CI=true`) fails, since
//! a green run must mean the Docker paths ran; elsewhere it is skipped with
//! the reason printed. [`base_image`] makes sure the registry-free base image
//! exists, building it once with the real `silo image base`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use silo::internals::docker::{LABEL_SANDBOX_ID, container_name};

/// The base image the Docker tests run (silo's default base tag).
pub const BASE_IMAGE: &str = silo::DEFAULT_BASE_TAG;
/// Pause between looks at a container that is expected to change state.
const POLL: Duration = Duration::from_millis(50);

/// Whether this run is CI, where a missing engine is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The engine, or `None` (with the reason printed) when there is none and
/// this is not CI. Under CI a missing engine panics.
pub async fn engine() -> Option<Docker> {
    match silo::internals::docker::connect().await {
        Ok(engine) => Some(engine),
        Err(error) if in_ci() => {
            panic!("CI=true but no Docker engine is reachable: {error}")
        }
        Err(error) => {
            eprintln!("skipping: no Docker engine is reachable ({error}); CI=true makes this fail");
            None
        }
    }
}

/// The engine with the base image present, or `None` as for [`engine`].
pub async fn engine_with_base() -> Option<Docker> {
    let engine = engine().await?;
    base_image(&engine).await;
    Some(engine)
}

/// Builds [`BASE_IMAGE`] with the real CLI unless the engine has it (with
/// its base id: an image from before base ids is built again); one test at
/// a time, so a test binary builds it at most once.
pub async fn base_image(engine: &Docker) {
    static BUILT: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let mut built = BUILT.lock().await;
    if !*built {
        build_base_unless_present(engine).await;
        *built = true;
    }
}

/// Builds [`BASE_IMAGE`] on `engine` (Docker's, or another with its API)
/// with silo's own image build, unless the engine has it with its base id.
pub async fn build_base_unless_present(engine: &Docker) {
    let present = match engine.inspect_image(BASE_IMAGE).await {
        Ok(image) => image
            .config
            .and_then(|c| c.labels)
            .is_some_and(|labels| labels.contains_key(silo::internals::image::BASE_LAYERS_LABEL)),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => false,
        Err(error) => panic!("inspecting the base image: {error}"),
    };
    if !present {
        let busybox = std::path::Path::new(silo::DEFAULT_BUSYBOX);
        silo::internals::image::build_base(engine, busybox, BASE_IMAGE, &mut |_| {})
            .await
            .expect("building the base image from the host's static busybox");
    }
}

/// The engine's view of a sandbox's container, if it exists.
pub async fn container(engine: &Docker, sandbox_id: &str) -> Option<ContainerInspectResponse> {
    engine
        .inspect_container(&container_name(sandbox_id), None)
        .await
        .ok()
}

/// The id of a sandbox's container; panics if there is none.
pub async fn container_id(engine: &Docker, sandbox_id: &str) -> String {
    container(engine, sandbox_id)
        .await
        .and_then(|c| c.id)
        .unwrap_or_else(|| panic!("sandbox {sandbox_id} has no container"))
}

/// Whether the sandbox's container is running.
pub async fn is_running(engine: &Docker, sandbox_id: &str) -> bool {
    container(engine, sandbox_id)
        .await
        .and_then(|c| c.state)
        .and_then(|s| s.running)
        .unwrap_or(false)
}

/// Waits until the sandbox's container has stopped; panics after `within`.
pub async fn wait_stopped(engine: &Docker, sandbox_id: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while is_running(engine, sandbox_id).await {
        assert!(
            Instant::now() < deadline,
            "container of {sandbox_id} still running after {within:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Imports an image of its own, `tag`: Debian's static busybox, its `sh`,
/// and a file `/etc/unique` holding `marker`, so its layer is shared with no
/// other image and removing it really takes its layer off the engine.
pub async fn unique_image(engine: &Docker, tag: &str, marker: &str) {
    let busybox = std::fs::read("/bin/busybox").expect("Debian's busybox-static at /bin/busybox");
    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |path: &str, mode: u32, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_entry_type(if path.ends_with('/') {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        archive.append_data(&mut header, path, data).unwrap();
    };
    for dir in ["bin/", "etc/", "root/", "tmp/"] {
        add(dir, 0o755, b"");
    }
    add("bin/busybox", 0o755, &busybox);
    add("etc/unique", 0o644, format!("{marker}\n").as_bytes());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    archive
        .append_link(&mut header, "bin/sh", "busybox")
        .unwrap();
    let body = archive.into_inner().unwrap();
    let (repo, tag) = tag.split_once(':').unwrap_or((tag, "latest"));
    let options = bollard::query_parameters::CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .build();
    let mut progress =
        engine.create_image(Some(options), Some(bollard::body_full(body.into())), None);
    while let Some(step) = futures_util::StreamExt::next(&mut progress).await {
        step.expect("importing a unique image");
    }
}

/// Removes an image from the engine (with `-f`); true if it was there.
pub async fn remove_image(engine: &Docker, image: &str) -> bool {
    let options = bollard::query_parameters::RemoveImageOptionsBuilder::new()
        .force(true)
        .build();
    engine
        .remove_image(image, Some(options), None)
        .await
        .is_ok()
}

/// Removes a sandbox's container behind silo's back.
pub async fn remove_behind_silos_back(engine: &Docker, sandbox_id: &str) {
    let options = RemoveContainerOptionsBuilder::new().force(true).build();
    engine
        .remove_container(&container_name(sandbox_id), Some(options))
        .await
        .expect("removing a container behind silo's back");
}

/// Ids of every container (running or not) labelled for this sandbox id.
pub async fn containers_of(engine: &Docker, sandbox_id: &str) -> Vec<String> {
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![format!("{LABEL_SANDBOX_ID}={sandbox_id}")],
    )]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    engine
        .list_containers(Some(options))
        .await
        .expect("listing containers")
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// Everything a sandbox's container has printed (the agent's log).
pub async fn container_log(engine: &Docker, sandbox_id: &str) -> String {
    let options = bollard::query_parameters::LogsOptionsBuilder::new()
        .stdout(true)
        .stderr(true)
        .build();
    let mut logs = engine.logs(&container_name(sandbox_id), Some(options));
    let mut text = String::new();
    while let Some(chunk) = futures_util::StreamExt::next(&mut logs).await {
        text.push_str(&chunk.expect("reading a container's log").to_string());
    }
    text
}
