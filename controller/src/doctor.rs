//! `silo doctor`: what this host has and lacks for silo, each finding with
//! the command that fixes it. It checks the home (state database, key), the
//! disk under it, the agent binary silo would run (static, musl or glibc),
//! the Docker engine, the registry-free base image, the Podman engine's API
//! socket, E2B when a key is set, and the fleet this host is part of (its
//! name, the state's location, and whether the shared store answers). It changes nothing
//! beyond what any first command does (the home, the extracted agent).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::agent_binary::{self, AgentLocator, AgentSource};
use crate::fsutil::{free_bytes, human_bytes};
use crate::home::Home;
use crate::image::{DEFAULT_BASE_TAG, DEFAULT_BUSYBOX};
use crate::{Silo, SiloOptions};

/// Free space under the home below which snapshots and pushes start failing.
pub const DISK_FAIL_BYTES: u64 = 64 * 1024 * 1024;
/// Free space under the home below which a warning is given.
pub const DISK_WARN_BYTES: u64 = 1024 * 1024 * 1024;
/// The target a fully static agent is built for.
const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// How to get the static musl agent embedded.
const MUSL_FIX: &str = "rustup target add x86_64-unknown-linux-musl && apt-get install \
                        musl-tools, then rebuild silo (the next build embeds the musl agent)";

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing to do.
    Ok,
    /// Works, but not as well as it could.
    Warn,
    /// Something silo needs is missing or broken.
    Fail,
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// How it came out.
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// The command or step that fixes it, for a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: String) -> Self {
        Self {
            name,
            verdict: Verdict::Ok,
            detail,
            fix: None,
        }
    }

    fn bad(name: &'static str, verdict: Verdict, detail: String, fix: impl Into<String>) -> Self {
        Self {
            name,
            verdict,
            detail,
            fix: Some(fix.into()),
        }
    }
}

/// Runs every check. Never fails: a check that cannot run is a finding.
pub async fn diagnose(options: SiloOptions) -> Vec<Check> {
    let mut checks = Vec::new();
    let home = match Home::resolve(options.home.clone()) {
        Ok(home) => home,
        Err(err) => {
            let detail = silo_protocol::http::error_chain(&err);
            checks.push(Check::bad(
                "home",
                Verdict::Fail,
                detail,
                "set SILO_HOME (or --home) to a directory silo may use",
            ));
            return checks;
        }
    };
    checks.push(disk(home.root()));
    let silo = match Silo::open_with(options.clone()) {
        Ok(silo) => {
            checks.push(Check::ok(
                "home",
                format!(
                    "{} (state database and key readable)",
                    home.root().display()
                ),
            ));
            Some(silo)
        }
        Err(err) => {
            checks.push(Check::bad(
                "home",
                Verdict::Fail,
                format!(
                    "{}: {}",
                    home.root().display(),
                    silo_protocol::http::error_chain(&err)
                ),
                "free space under it, fix its permissions (owner-only, 0700), or point \
                 SILO_HOME at another directory",
            ));
            None
        }
    };
    checks.push(agent(options.agent, home.bin_dir()));
    if let Some(silo) = silo {
        checks.push(fleet(&silo).await);
        checks.extend(engine(&silo).await);
    }
    checks.push(podman().await);
    checks.push(e2b().await);
    checks.push(daytona().await);
    checks.push(kubernetes().await);
    checks
}

/// The Kubernetes backend: off without a cluster configured (no failure),
/// else whether its API server answers, the namespace, and how agents are
/// reached (at pods' addresses from inside the cluster, else through
/// port-forward).
async fn kubernetes() -> Check {
    use crate::backend::kubernetes::{config::cluster_configured, survey};
    if !cluster_configured() {
        return Check::ok(
            "kubernetes",
            "off (no KUBECONFIG, ~/.kube/config or service account; set one to run \
             sandboxes as pods)"
                .into(),
        );
    }
    match survey().await {
        Ok(found) => Check::ok("kubernetes", found),
        Err(err) => Check::bad(
            "kubernetes",
            Verdict::Fail,
            silo_protocol::http::error_chain(&err),
            "check KUBECONFIG and the SILO_KUBERNETES_* settings it names",
        ),
    }
}

/// This host's name, where the state lives, and whether the fleet's
/// shared store (when there is one) answers.
async fn fleet(silo: &Silo) -> Check {
    let fleet = silo.fleet();
    let detail = format!("host {}, state {}", fleet.host, fleet.state);
    let Some(shared) = silo.shared_store() else {
        return Check::ok("fleet", format!("{detail}, snapshots in this home's store"));
    };
    match shared.has(&crate::store::Digest::of(b"")).await {
        Ok(_) => Check::ok(
            "fleet",
            format!("{detail}, shared store {} answers", shared.url()),
        ),
        Err(error) => Check::bad(
            "fleet",
            Verdict::Fail,
            format!("{detail}: {}", silo_protocol::http::error_chain(&error)),
            "start the S3 server, or check SILO_STORE_URL and the AWS_* variables \
             (docs/fleet.md)",
        ),
    }
}

/// The Podman backend's engine: its API socket, where silo looks for it,
/// and whether an engine answers there. Podman is optional, so a missing
/// one is a warning.
async fn podman() -> Check {
    use crate::backend::docker::connect_to;
    use crate::backend::podman::{PODMAN, SOCKET_ENV, podman_host};
    let host = podman_host();
    match connect_to(&PODMAN).await {
        Ok(engine) => {
            let version = engine.version().await.unwrap_or_default();
            Check::ok(
                "podman",
                format!(
                    "engine {} (API {}) at {host}",
                    version.version.unwrap_or_default(),
                    version.api_version.unwrap_or_default()
                ),
            )
        }
        Err(err) => Check::bad(
            "podman",
            Verdict::Warn,
            format!(
                "no engine answers at {host} ({}); the podman backend is off",
                silo_protocol::http::error_chain(&err)
            ),
            format!(
                "to use it: apt-get install podman, then `podman system service --time=0 \
                 {host} &` (or set {SOCKET_ENV} to the socket your service serves)"
            ),
        ),
    }
}

/// The Daytona backend: off without a key (that is no failure), else
/// whether the control plane takes the key.
async fn daytona() -> Check {
    use crate::backend::daytona::config::ENV_API_KEY;
    use crate::backend::daytona::{Api, DaytonaConfig};
    let config = match DaytonaConfig::from_env() {
        Ok(config) => config,
        Err(err) => {
            return Check::bad(
                "daytona",
                Verdict::Fail,
                err.to_string(),
                "fix the variable it names",
            );
        }
    };
    if config.api_key.is_none() {
        return Check::ok(
            "daytona",
            format!("off ({ENV_API_KEY} is not set; set it to run sandboxes on Daytona)"),
        );
    }
    let checked = match Api::new(&config) {
        Ok(api) => api.check().await,
        Err(err) => Err(err),
    };
    match checked {
        Ok(()) => Check::ok("daytona", format!("{} accepts the key", config.api_url)),
        Err(err) => Check::bad(
            "daytona",
            Verdict::Fail,
            format!(
                "{}: {}",
                config.api_url,
                silo_protocol::http::error_chain(&err)
            ),
            format!("check {ENV_API_KEY} and DAYTONA_API_URL"),
        ),
    }
}

/// The E2B backend: off without a key (that is no failure), else whether
/// the control plane takes the key.
async fn e2b() -> Check {
    use crate::backend::e2b::{Api, E2bConfig, config::ENV_API_KEY};
    let config = match E2bConfig::from_env() {
        Ok(config) => config,
        Err(err) => {
            return Check::bad(
                "e2b",
                Verdict::Fail,
                err.to_string(),
                "fix the variable it names",
            );
        }
    };
    if config.api_key.is_none() {
        return Check::ok(
            "e2b",
            format!("off ({ENV_API_KEY} is not set; set it to run sandboxes on E2B)"),
        );
    }
    let checked = match Api::new(&config) {
        Ok(api) => api.check().await,
        Err(err) => Err(err),
    };
    match checked {
        Ok(()) => Check::ok("e2b", format!("{} accepts the key", config.api_url)),
        Err(err) => Check::bad(
            "e2b",
            Verdict::Fail,
            format!(
                "{}: {}",
                config.api_url,
                silo_protocol::http::error_chain(&err)
            ),
            format!("check {ENV_API_KEY}, E2B_DOMAIN and E2B_API_URL"),
        ),
    }
}

/// Free space on the file system that holds the home (or its nearest
/// existing ancestor, before the first run).
fn disk(root: &Path) -> Check {
    let existing = root.ancestors().find(|dir| dir.exists()).unwrap_or(root);
    let free = match free_bytes(existing) {
        Ok(free) => free,
        Err(err) => {
            return Check::bad(
                "disk",
                Verdict::Warn,
                format!("cannot measure free space at {}: {err}", existing.display()),
                "check that the home's parent directory is readable",
            );
        }
    };
    let detail = format!("{} free at {}", human_bytes(free), existing.display());
    let fix = "free space there, or set SILO_HOME to a larger file system";
    if free < DISK_FAIL_BYTES {
        Check::bad("disk", Verdict::Fail, detail, fix)
    } else if free < DISK_WARN_BYTES {
        Check::bad("disk", Verdict::Warn, detail, fix)
    } else {
        Check::ok("disk", detail)
    }
}

/// The agent silo would run: found, static, and built for musl.
fn agent(explicit: Option<PathBuf>, bin_dir: PathBuf) -> Check {
    let found = match AgentLocator::new(explicit, bin_dir).get() {
        Ok(found) => found,
        Err(err) => {
            return Check::bad(
                "agent",
                Verdict::Fail,
                silo_protocol::http::error_chain(&err),
                format!("rebuild silo so it embeds the agent ({MUSL_FIX}), or pass --agent PATH"),
            );
        }
    };
    let path = found.path.display();
    let is_static = std::fs::read(&found.path)
        .map(|bytes| agent_binary::is_static_executable(&bytes))
        .unwrap_or(false);
    if !is_static {
        return Check::bad(
            "agent",
            Verdict::Fail,
            format!("{path} is not a static executable, so it cannot run in most images"),
            format!(
                "use the embedded agent (drop --agent / SILO_AGENT) or build one with {MUSL_FIX}"
            ),
        );
    }
    match (found.source, agent_binary::EMBEDDED_TARGET) {
        (AgentSource::Embedded, MUSL_TARGET) => Check::ok(
            "agent",
            format!("embedded, static ({MUSL_TARGET}), at {path}"),
        ),
        (AgentSource::Embedded, target) if target != "prebuilt" => Check::bad(
            "agent",
            Verdict::Warn,
            format!(
                "embedded agent is a static {target} build: it runs, but glibc's static name lookups fail in some images"
            ),
            MUSL_FIX,
        ),
        (source, _) => Check::ok("agent", format!("static, at {path} ({source:?})")),
    }
}

/// The Docker engine and the base image the demo and tests use.
async fn engine(silo: &Silo) -> Vec<Check> {
    let host = crate::backend::docker::engine_host();
    let engine = match silo.docker_backend().engine().await {
        Ok(engine) => engine,
        Err(err) => {
            return vec![Check::bad(
                "docker",
                Verdict::Fail,
                format!(
                    "no engine answers at {host}: {}",
                    silo_protocol::http::error_chain(&err)
                ),
                "install and start one (Debian: apt-get install docker.io, then start \
                 dockerd), or set DOCKER_HOST; without it only the local backend works, \
                 with no isolation",
            )];
        }
    };
    let version = engine.version().await.unwrap_or_default();
    let mut checks = vec![Check::ok(
        "docker",
        format!(
            "engine {} (API {}) at {host}",
            version.version.unwrap_or_default(),
            version.api_version.unwrap_or_default()
        ),
    )];
    let base = match crate::image::exists(engine, DEFAULT_BASE_TAG).await {
        Ok(true) => Check::ok("base image", format!("{DEFAULT_BASE_TAG} is present")),
        Ok(false) if Path::new(DEFAULT_BUSYBOX).exists() => Check::bad(
            "base image",
            Verdict::Warn,
            format!("{DEFAULT_BASE_TAG} is missing (built on first use)"),
            "silo image base",
        ),
        Ok(false) => Check::bad(
            "base image",
            Verdict::Warn,
            format!("{DEFAULT_BASE_TAG} is missing and {DEFAULT_BUSYBOX} is not there to build it"),
            "apt-get install busybox-static && silo image base",
        ),
        Err(err) => Check::bad(
            "base image",
            Verdict::Warn,
            silo_protocol::http::error_chain(&err),
            "check the engine with `docker info`",
        ),
    };
    checks.push(base);
    if let Some(check) = storage_driver(engine).await {
        checks.push(check);
    }
    checks
}

/// The engine's storage driver, when it has a limit a sandbox can reach:
/// on `fuse-overlayfs` one process serves each container's files and holds
/// a file open for every file open inside, up to its own open-file limit
/// (the engine's, which it inherits). A workload holding that many leaves
/// the sandbox's agent unable to start a command or take a snapshot.
async fn storage_driver(engine: &bollard::Docker) -> Option<Check> {
    let info = engine.info().await.ok()?;
    let driver = info.driver.unwrap_or_default();
    if driver != "fuse-overlayfs" {
        return Some(Check::ok("storage", format!("driver {driver}")));
    }
    let limit = ["fuse-overlayfs", "dockerd"]
        .into_iter()
        .find_map(open_file_limit_of);
    let detail = match limit {
        Some(limit) => format!(
            "driver fuse-overlayfs: each sandbox's files are served by one process that \
             may hold {limit} open files; a workload holding that many, across all its \
             processes, leaves the sandbox's agent unable to start commands or take snapshots"
        ),
        None => "driver fuse-overlayfs: each sandbox's files are served by one process whose \
                 open-file limit a workload can exhaust (its limit could not be read here)"
            .to_owned(),
    };
    Some(Check::bad(
        "storage",
        Verdict::Warn,
        detail,
        "raise the engine's open-file limit (LimitNOFILE=1048576 in dockerd's service, \
         then restart it), or run the engine on the overlay2 driver",
    ))
}

/// The soft open-file limit of the first process whose name is `comm`, if
/// this host lets it be read.
fn open_file_limit_of(comm: &str) -> Option<u64> {
    let pid = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .find(|entry| {
            std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == comm)
        })?;
    let limits = std::fs::read_to_string(pid.path().join("limits")).ok()?;
    limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}
