//! Command-line flags ([`Args`]), then the validated settings the agent runs
//! with ([`Config`]).
//!
//! Parsing is two-staged so every check with a human-facing error (a key is
//! present and well-formed, TLS goes with TCP, the workdir exists) happens in
//! one place, before anything is bound or spawned. The controller relies on
//! these exact flags.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use silo_protocol::auth::{AuthError, Key};
use silo_protocol::bundle::{
    BundleLimits, DEFAULT_MAX_BUNDLE_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_RATIO, DEFAULT_MAX_UNPACKED_BYTES,
};
use silo_protocol::limits::{DEFAULT_GRACE, DEFAULT_RING_BYTES, MAX_GRACE};
use silo_protocol::version::{PROTOCOL_VERSION, VersionError, Versions};

use crate::exec::detach::DEFAULT_DETACH_TIMEOUT;
use crate::exec::{DEFAULT_FINISHED_OUTPUT_BUDGET, DEFAULT_OUTPUT_BUDGET};
use crate::memory;
use crate::push::{
    DEFAULT_KEEP_VERSIONS, DEFAULT_PUSH_DEADLINE, DEFAULT_PUSH_ROOT, DEFAULT_VERSION_GRACE,
    PushConfig,
};
use crate::workload::RestartPolicy;

/// Environment variable that may carry the sandbox key (hex). The agent
/// removes it from its environment before anything else, so children never see it.
pub const KEY_ENV: &str = "SILO_AGENT_KEY";
/// Where the agent listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "unix:/run/silo/agent.sock";
const DEFAULT_GRACE_MS: u64 = DEFAULT_GRACE.as_millis() as u64;
const DEFAULT_VERSION_GRACE_SECS: u64 = DEFAULT_VERSION_GRACE.as_secs();

/// silo-agent: runs as PID 1 in a sandbox, reaps orphans, supervises an
/// optional workload, and runs commands for the silo controller over a signed
/// WebSocket channel.
///
/// The sandbox key comes from --key-file or the SILO_AGENT_KEY environment
/// variable (64 hex digits); without one the agent refuses to start. Set
/// SILO_AGENT_LOG to error, warn, info, debug or trace to change log detail.
#[derive(Debug, Parser)]
#[command(name = "silo-agent", version, verbatim_doc_comment)]
pub struct Args {
    /// Where to listen: unix:/PATH or tcp:HOST:PORT.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN, value_parser = parse_listen)]
    pub listen: ListenAddr,
    /// PEM certificate chain; serves TLS (TCP only).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Copy this agent's executable to PATH (mode 0755) and exit: how an
    /// init container puts the agent into a pod's shared volume.
    #[arg(long, value_name = "PATH", exclusive = true)]
    pub install_to: Option<PathBuf>,
    /// File holding the sandbox key (64 hex digits); overrides SILO_AGENT_KEY.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Delete --key-file once the key is read, before serving, so commands
    /// on the machine can never read it; the agent refuses to start if it
    /// cannot.
    #[arg(long, requires = "key_file")]
    pub remove_key_file: bool,
    /// This agent is the sandbox's agent on a machine it does not own as
    /// PID 1, such as a provider VM: a snapshot stops the processes
    /// descended from the agent (its commands and their orphans), never
    /// the machine's own.
    #[arg(long)]
    pub machine_agent: bool,
    /// The machine's root directory for layer applies, path indexes and
    /// snapshots [default: --push-base, itself / by default]; tests point
    /// it at a scratch directory.
    #[arg(long, value_name = "DIR")]
    pub apply_root: Option<PathBuf>,
    /// Working directory for execs that name none [default: the agent's cwd].
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Bytes of recent output each exec keeps for re-attach.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RING_BYTES)]
    pub ring_bytes: usize,
    /// Bytes of recent output all running execs keep together; a command
    /// printing past it gives up its own oldest output first.
    /// Lowered to a share of the sandbox's memory limit when that is less.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_OUTPUT_BUDGET)]
    pub output_budget: usize,
    /// Bytes of output all finished execs keep together for clients that
    /// re-attach late; past it the oldest output is dropped (and reported
    /// as lost). Lowered to a share of the memory limit when that is less.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_FINISHED_OUTPUT_BUDGET)]
    pub finished_output_budget: usize,
    /// Default grace between SIGINT and SIGKILL on interrupt, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_GRACE_MS)]
    pub grace_ms: u64,
    /// Interrupt a command after this many seconds with no client attached,
    /// unless its request says otherwise; 0 lets such commands run on.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_DETACH_TIMEOUT.as_secs())]
    pub detach_timeout_secs: u64,
    /// When to restart the workload after it exits.
    #[arg(long, value_name = "always|on-failure|never", default_value_t = RestartPolicy::OnFailure)]
    pub restart: RestartPolicy,
    /// Exit after this many seconds with no request, no connection and no running exec.
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<u64>,
    /// Directory that pushed mounts must lie under (repeatable).
    #[arg(long = "push-root", value_name = "DIR", default_value = DEFAULT_PUSH_ROOT)]
    pub push_roots: Vec<PathBuf>,
    /// Directory that sandbox paths of pushes are placed under on disk; a
    /// host-process agent (local backend) has no private `/`.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub push_base: PathBuf,
    /// Largest file a pushed bundle may hold, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FILE_BYTES)]
    pub push_max_file_bytes: u64,
    /// Largest pushed bundle (compressed), in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BUNDLE_BYTES)]
    pub push_max_bundle_bytes: u64,
    /// Most bytes a pushed bundle may unpack to.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_UNPACKED_BYTES)]
    pub push_max_unpacked_bytes: u64,
    /// Most entries a pushed bundle may hold.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ENTRIES)]
    pub push_max_entries: u64,
    /// Largest unpacked/compressed ratio of a pushed bundle.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_RATIO)]
    pub push_max_ratio: u64,
    /// Seconds a replaced version of a mount is kept for readers still in it.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_VERSION_GRACE_SECS)]
    pub push_grace_secs: u64,
    /// Most replaced versions kept per mount, whatever their age.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_KEEP_VERSIONS)]
    pub push_keep: usize,
    /// Seconds one push may take to extract and swap before it is cancelled
    /// (its mount is then free for the next).
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_PUSH_DEADLINE.as_secs())]
    pub push_deadline_secs: u64,
    /// Newest protocol version to speak, to test a controller against an
    /// older agent: requests announcing a newer one are refused, and
    /// `/healthz` and every answer report this as the newest. Endpoints
    /// stay served; only the versions change.
    #[arg(long, value_name = "N", default_value_t = PROTOCOL_VERSION)]
    pub max_protocol: u32,
    /// Command to supervise (after --).
    #[arg(last = true, value_name = "WORKLOAD")]
    pub workload: Vec<String>,
}

/// A listening address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket path.
    Unix(PathBuf),
    /// `HOST:PORT` for TCP.
    Tcp(String),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

fn parse_listen(text: &str) -> Result<ListenAddr, String> {
    if let Some(path) = text.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("unix: needs a socket path".into());
        }
        Ok(ListenAddr::Unix(PathBuf::from(path)))
    } else if let Some(addr) = text.strip_prefix("tcp:") {
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(ListenAddr::Tcp(addr.to_owned()))
            }
            _ => Err("tcp: needs HOST:PORT".into()),
        }
    } else {
        Err("expected unix:/PATH or tcp:HOST:PORT".into())
    }
}

/// The validated settings.
#[derive(Debug)]
pub struct Config {
    /// Where to listen.
    pub listen: ListenAddr,
    /// Certificate and key files, when serving TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The sandbox key.
    pub key: Key,
    /// The file the key came from, if any: a suspended agent wakes on its
    /// new key there (see [`crate::suspend`]).
    pub key_file: Option<KeyFile>,
    /// Default working directory of execs.
    pub workdir: PathBuf,
    /// Output bytes kept per exec.
    pub ring_bytes: usize,
    /// Output bytes kept by all running execs together.
    pub output_budget: usize,
    /// Output bytes kept by all finished execs together.
    pub finished_output_budget: usize,
    /// The sandbox's memory limit, when it has one.
    pub memory_limit: Option<u64>,
    /// Default interrupt grace.
    pub grace: Duration,
    /// Default detach timeout of execs; `None` for none.
    pub detach_timeout: Option<Duration>,
    /// Workload restart policy.
    pub restart: RestartPolicy,
    /// Exit when idle this long.
    pub idle_timeout: Option<Duration>,
    /// Workload command; empty for none.
    pub workload: Vec<String>,
    /// Push roots, caps and version retention.
    pub push: PushConfig,
    /// The protocol versions requests may announce.
    pub protocols: Versions,
    /// The machine's root for layers, indexes and snapshots, canonical.
    pub apply_root: PathBuf,
    /// Started as the machine's agent without being PID 1.
    pub machine_agent: bool,
}

/// Why the settings are unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Neither --key-file nor the environment variable gave a key.
    #[error("no sandbox key: pass --key-file FILE or set {KEY_ENV} (64 hex digits)")]
    NoKey,
    /// The key file cannot be read.
    #[error("cannot read key file {}", .path.display())]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key file cannot be deleted (`--remove-key-file`).
    #[error(
        "cannot delete key file {} (--remove-key-file): commands on the machine could read it",
        .path.display()
    )]
    KeyFileRemove {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The apply root is unusable.
    #[error("--apply-root {} is not a directory", .path.display())]
    ApplyRoot {
        /// The directory given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key is not 64 hex digits.
    #[error("bad sandbox key from {origin}")]
    BadKey {
        /// Where it came from.
        origin: String,
        /// What is wrong with it.
        #[source]
        source: AuthError,
    },
    /// TLS was asked for on a Unix socket.
    #[error("--tls-cert and --tls-key need a tcp: listen address")]
    TlsNeedsTcp,
    /// The working directory is unusable.
    #[error("working directory {} is not a directory", .0.display())]
    Workdir(PathBuf),
    /// The current directory cannot be determined.
    #[error("cannot determine the current directory")]
    Cwd(#[source] std::io::Error),
    /// `--max-protocol` names a version this build does not speak.
    #[error("--max-protocol {max}: this agent speaks protocol {}", Versions::OURS)]
    MaxProtocol {
        /// The version given.
        max: u32,
        /// Why it is refused.
        #[source]
        source: VersionError,
    },
    /// A push root or the push base is not a plain absolute path.
    #[error("{flag} {} must be an absolute path without '.' or '..'", path.display())]
    PushPath {
        /// The flag.
        flag: &'static str,
        /// The path given.
        path: PathBuf,
    },
}

/// Whether `path` is absolute and made of plain components only.
fn plain_absolute(path: &std::path::Path) -> bool {
    use std::path::Component;
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

impl Config {
    /// Validates `args`; `env_key` is the key variable's value, already removed
    /// from the environment.
    pub fn resolve(args: Args, env_key: Option<OsString>) -> Result<Self, ConfigError> {
        let key_file = args.key_file.clone().map(|path| KeyFile {
            path,
            remove: args.remove_key_file,
        });
        let key = match (&key_file, env_key) {
            (Some(file), _) => file.read()?,
            (None, Some(value)) => {
                let bad = |source| ConfigError::BadKey {
                    origin: KEY_ENV.to_owned(),
                    source,
                };
                Key::from_hex(value.to_str().ok_or(bad(AuthError::MalformedKey))?).map_err(bad)?
            }
            (None, None) => return Err(ConfigError::NoKey),
        };
        let tls = match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => {
                if !matches!(args.listen, ListenAddr::Tcp(_)) {
                    return Err(ConfigError::TlsNeedsTcp);
                }
                Some((cert, key))
            }
            _ => None,
        };
        let workdir = match args.workdir {
            Some(dir) => dir,
            None => std::env::current_dir().map_err(ConfigError::Cwd)?,
        };
        if !workdir.is_dir() {
            return Err(ConfigError::Workdir(workdir));
        }
        for root in &args.push_roots {
            if !plain_absolute(root) {
                return Err(ConfigError::PushPath {
                    flag: "--push-root",
                    path: root.clone(),
                });
            }
        }
        if !plain_absolute(&args.push_base) {
            return Err(ConfigError::PushPath {
                flag: "--push-base",
                path: args.push_base,
            });
        }
        let protocols =
            Versions::capped(args.max_protocol).map_err(|source| ConfigError::MaxProtocol {
                max: args.max_protocol,
                source,
            })?;
        let apply_root = resolve_apply_root(args.apply_root, &args.push_base)?;
        let memory_limit = memory::cgroup_limit();
        let push = PushConfig {
            roots: args.push_roots,
            base: args.push_base,
            limits: BundleLimits {
                max_file_bytes: args.push_max_file_bytes,
                max_bundle_bytes: args.push_max_bundle_bytes,
                max_unpacked_bytes: args.push_max_unpacked_bytes,
                max_entries: args.push_max_entries,
                max_ratio: args.push_max_ratio,
            },
            grace: Duration::from_secs(args.push_grace_secs),
            keep: args.push_keep,
            deadline: Duration::from_secs(args.push_deadline_secs.max(1)),
        };
        Ok(Self {
            listen: args.listen,
            tls,
            key,
            key_file,
            workdir,
            ring_bytes: args.ring_bytes,
            output_budget: memory::bounded_budget(args.output_budget, memory_limit),
            finished_output_budget: memory::bounded_budget(
                args.finished_output_budget,
                memory_limit,
            ),
            memory_limit,
            grace: Duration::from_millis(args.grace_ms).min(MAX_GRACE),
            detach_timeout: (args.detach_timeout_secs > 0)
                .then(|| Duration::from_secs(args.detach_timeout_secs)),
            restart: args.restart,
            idle_timeout: args.idle_timeout.map(Duration::from_secs),
            workload: args.workload,
            push,
            protocols,
            apply_root,
            machine_agent: args.machine_agent,
        })
    }
}

/// The apply root: `--apply-root`, which must be a directory, or else the
/// push base. Canonical where it exists, so mount points (listed by their
/// real paths) are found under it; a push base that does not exist yet
/// (pushes make it) is taken as given.
fn resolve_apply_root(given: Option<PathBuf>, push_base: &Path) -> Result<PathBuf, ConfigError> {
    let Some(root) = given else {
        return Ok(std::fs::canonicalize(push_base).unwrap_or_else(|_| push_base.to_path_buf()));
    };
    if !plain_absolute(&root) {
        return Err(ConfigError::PushPath {
            flag: "--apply-root",
            path: root,
        });
    }
    std::fs::canonicalize(&root)
        .and_then(|dir| match dir.is_dir() {
            true => Ok(dir),
            false => Err(std::io::Error::other("not a directory")),
        })
        .map_err(|source| ConfigError::ApplyRoot { path: root, source })
}

/// Where the sandbox key is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFile {
    /// The file.
    pub path: PathBuf,
    /// Whether it is deleted once read (`--remove-key-file`).
    pub remove: bool,
}

impl KeyFile {
    /// Reads the key, then deletes the file when asked to (before the key
    /// is even checked, so a bad key leaves nothing readable either).
    pub fn read(&self) -> Result<Key, ConfigError> {
        let path = &self.path;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::KeyFile {
            path: path.clone(),
            source,
        })?;
        if self.remove {
            std::fs::remove_file(path).map_err(|source| ConfigError::KeyFileRemove {
                path: path.clone(),
                source,
            })?;
        }
        Key::from_hex(&text).map_err(|source| ConfigError::BadKey {
            origin: path.display().to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("silo-agent").chain(extra.iter().copied())).unwrap()
    }

    #[test]
    fn defaults_and_workload_after_dashes() {
        let a = args(&["--", "sleep", "--flag", "1"]);
        assert_eq!(a.listen, ListenAddr::Unix("/run/silo/agent.sock".into()));
        assert_eq!(a.restart, RestartPolicy::OnFailure);
        assert_eq!(a.workload, ["sleep", "--flag", "1"]);
        let c = Config::resolve(a, Some(KEY.into())).unwrap();
        assert_eq!(c.grace, DEFAULT_GRACE);
        assert_eq!(c.ring_bytes, DEFAULT_RING_BYTES);
        assert_eq!(c.push.roots, [PathBuf::from(DEFAULT_PUSH_ROOT)]);
        assert_eq!(c.push.limits, BundleLimits::default());
    }

    #[test]
    fn push_roots_repeat_and_must_be_plain() {
        let a = args(&["--push-root", "/a", "--push-root", "/b/c"]);
        assert_eq!(a.push_roots, [PathBuf::from("/a"), PathBuf::from("/b/c")]);
        for bad in ["rel", "/a/../b"] {
            let a = args(&["--push-root", bad]);
            assert!(matches!(
                Config::resolve(a, Some(KEY.into())),
                Err(ConfigError::PushPath { .. })
            ));
        }
    }

    #[test]
    fn the_protocol_can_be_capped_to_an_older_version_only() {
        let c = Config::resolve(args(&[]), Some(KEY.into())).unwrap();
        assert_eq!(c.protocols, Versions::OURS);
        let c = Config::resolve(args(&["--max-protocol", "1"]), Some(KEY.into())).unwrap();
        assert_eq!(c.protocols.max, 1);
        for bad in ["0", "99"] {
            let err = Config::resolve(args(&["--max-protocol", bad]), Some(KEY.into()));
            assert!(matches!(err, Err(ConfigError::MaxProtocol { .. })), "{bad}");
        }
    }

    #[test]
    fn a_removed_key_file_is_gone_before_serving() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.key");
        std::fs::write(&file, KEY).unwrap();
        let path = file.to_str().unwrap();
        let kept = Config::resolve(args(&["--key-file", path]), None).unwrap();
        assert!(file.exists());
        let removed =
            Config::resolve(args(&["--key-file", path, "--remove-key-file"]), None).unwrap();
        assert!(!file.exists());
        assert_eq!(kept.key, removed.key);
        // procfs refuses unlink: the agent must refuse to start.
        let err = Config::resolve(
            args(&["--key-file", "/proc/version", "--remove-key-file"]),
            None,
        );
        assert!(
            matches!(err, Err(ConfigError::KeyFileRemove { .. })),
            "{err:?}"
        );
        assert!(Args::try_parse_from(["silo-agent", "--remove-key-file"]).is_err());
    }

    #[test]
    fn the_apply_root_follows_the_push_base_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_str().unwrap();
        let c = Config::resolve(args(&["--push-base", base]), Some(KEY.into())).unwrap();
        assert_eq!(c.apply_root, dir.path().canonicalize().unwrap());
        let c = Config::resolve(args(&[]), Some(KEY.into())).unwrap();
        assert_eq!(c.apply_root, PathBuf::from("/"));
        assert!(!c.machine_agent);
        let missing = dir.path().join("missing");
        let err = Config::resolve(
            args(&["--apply-root", missing.to_str().unwrap()]),
            Some(KEY.into()),
        );
        assert!(matches!(err, Err(ConfigError::ApplyRoot { .. })), "{err:?}");
    }

    #[test]
    fn listen_addresses_are_checked() {
        assert_eq!(
            parse_listen("tcp:[::1]:7000"),
            Ok(ListenAddr::Tcp("[::1]:7000".into()))
        );
        assert!(parse_listen("tcp:7000").is_err());
        assert!(parse_listen("unix:").is_err());
        assert!(parse_listen("/run/x.sock").is_err());
        let a = args(&["--restart", "never", "--listen", "tcp:0.0.0.0:1"]);
        assert_eq!(a.restart, RestartPolicy::Never);
    }

    #[test]
    fn key_is_required_and_checked_and_never_echoed() {
        assert!(matches!(
            Config::resolve(args(&[]), None),
            Err(ConfigError::NoKey)
        ));
        let err = Config::resolve(args(&[]), Some("secretsecret".into())).unwrap_err();
        assert!(!format!("{err:#?}").contains("secretsecret"));
        let tls_on_unix = args(&["--tls-cert", "c", "--tls-key", "k"]);
        assert!(matches!(
            Config::resolve(tls_on_unix, Some(KEY.into())),
            Err(ConfigError::TlsNeedsTcp)
        ));
    }
}
