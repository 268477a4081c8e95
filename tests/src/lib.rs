//! Shared harness for silo's end-to-end tests and for `silo-bench`.
//!
//! Everything here starts real parts: the static `silo-agent` binary that the
//! controller embeds, the real `silo` CLI binary, and scratch `$SILO_HOME`
//! directories. Nothing is mocked. The test binaries (`tests/local`,
//! `tests/docker`) are targets of the `silo-cli` package, so cargo builds
//! the CLI before them and hands them its path as `CARGO_BIN_EXE_silo`.
//!
//! Layout:
//! - [`TestAgent`]: one agent process on a private Unix socket with its own key.
//! - [`Cli`]: runs the `silo` binary against a scratch `$SILO_HOME`.
//! - [`agent_binary`]: the real agent, extracted once.
//! - [`docker`]: the real engine (required in CI), the base image, containers
//!   looked at (and removed behind silo's back) through the Engine API.
//! - [`podman`]: the real Podman engine through its API socket (required in
//!   CI), with the same base image built on it.
//! - [`proxy`]: a relay in front of an agent that drops every connection on demand.
//! - [`push`]: hand-made (hostile) bundles, raw pushes and tree snapshots.
//! - [`disk`]: a small tmpfs, for what a full disk does.
//! - [`tree`]: a sample tree for copies, and a digest two equal trees share.
//! - [`exact`]: the property that a rewind and a fork give back exactly
//!   what the snapshot saw: seeded operations, host-side listings, shrinking.
#![allow(
    clippy::unwrap_used,
    reason = "test harness: a broken environment should fail loudly"
)]
#![allow(
    clippy::expect_used,
    reason = "test harness: a broken environment should fail loudly"
)]

pub mod disk;
pub mod docker;
pub mod exact;
pub mod podman;
pub mod proxy;
pub mod push;
pub mod tree;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use silo::client::{AgentClient, Endpoint};
use silo_protocol::auth::Key;

/// How long a test waits for a fresh agent to answer its health check.
pub const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Root of the workspace (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The real static agent: the one the controller embeds, extracted once.
pub fn agent_binary() -> &'static Path {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT.get_or_init(|| {
        let home = std::env::temp_dir().join("silo-tests-agent");
        std::fs::create_dir_all(&home).expect("creating agent cache dir");
        silo::internals::extract_embedded(&home).expect("extracting the embedded silo-agent")
    })
}

/// One agent process serving a private Unix socket, killed on drop.
pub struct TestAgent {
    /// The scratch directory holding the socket, key and workdir.
    pub dir: tempfile::TempDir,
    /// The key requests must be signed with.
    pub key: Key,
    child: Child,
}

impl TestAgent {
    /// Starts an agent with default settings.
    pub async fn start() -> Self {
        Self::start_with(&[], &[]).await
    }

    /// Starts an agent with extra flags and an optional workload (`-- CMD...`).
    pub async fn start_with(flags: &[&str], workload: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("silo-agent-")
            .tempdir()
            .expect("tempdir");
        let key = Key::generate().expect("key");
        let key_file = dir.path().join("agent.key");
        std::fs::write(&key_file, key.to_hex()).expect("writing key");
        let workdir = dir.path().join("work");
        std::fs::create_dir_all(&workdir).expect("workdir");
        let mut cmd = Command::new(agent_binary());
        cmd.arg("--listen")
            .arg(format!("unix:{}", dir.path().join("agent.sock").display()))
            .arg("--key-file")
            .arg(&key_file)
            .arg("--workdir")
            .arg(&workdir)
            .args(flags);
        if !workload.is_empty() {
            cmd.arg("--").args(workload);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("agent.log")).expect("log file"));
        let child = cmd.spawn().expect("spawning silo-agent");
        let agent = Self { dir, key, child };
        agent
            .client()
            .wait_ready(AGENT_READY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("agent did not come up: {e}\nlog:\n{}", agent.log()));
        agent
    }

    /// The agent's pid on this host.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The socket the agent serves.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    /// The default working directory of execs.
    pub fn workdir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// A client signing with this agent's key.
    pub fn client(&self) -> AgentClient {
        AgentClient::new(Endpoint::Unix(self.socket()), self.key.clone())
    }

    /// A client signing with some other key.
    pub fn client_with_key(&self, key: Key) -> AgentClient {
        AgentClient::new(Endpoint::Unix(self.socket()), key)
    }

    /// What the agent logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the agent to exit, returning its status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(self.child.id(), nix::sys::signal::Signal::SIGTERM);
        self.child.wait().expect("waiting for agent")
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An exec of `sh -c SCRIPT` with everything else defaulted.
pub fn sh(script: &str) -> silo_protocol::exec::ExecSpec {
    silo_protocol::exec::ExecSpec {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

/// A command's `--json` output, parsed; fails with the text itself when it
/// is not JSON.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Bytes as text, for assertions with readable failures.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Sends `sig` to `pid`, ignoring a process that is already gone.
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// Whether a process with this pid exists (zombies count as gone).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(process_state(&stat), Some('Z') | Some('X')),
        Err(_) => false,
    }
}

/// Pids of zombie children of `parent`.
pub fn zombie_children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            process_state(&stat) == Some('Z') && process_ppid(&stat) == Some(parent)
        })
        .collect()
}

/// Pids whose command line contains `needle`.
pub fn pids_with_cmdline(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    String::from_utf8_lossy(&raw)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
                && process_alive(*pid)
        })
        .collect()
}

/// Live pids whose argument vector is exactly `argv`. Stricter than
/// [`pids_with_cmdline`]: a `silo` or `tmux` process whose own command line
/// merely mentions the command does not count.
pub fn pids_running(argv: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| raw == wanted)
                && process_alive(*pid)
        })
        .collect()
}

fn stat_fields(stat: &str) -> Vec<&str> {
    // The command name sits in parentheses and may contain spaces.
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default()
}

fn process_state(stat: &str) -> Option<char> {
    stat_fields(stat).first().and_then(|s| s.chars().next())
}

fn process_ppid(stat: &str) -> Option<u32> {
    stat_fields(stat).get(1).and_then(|s| s.parse().ok())
}

/// When set (a PostgreSQL database's URL), every [`Cli`] keeps its state
/// there, in a schema of its own, instead of in its home: the suite run
/// once more on a fleet's shared state (`.ci/run`).
pub const TEST_STATE_URL_ENV: &str = "SILO_TEST_STATE_URL";
/// When set too (`s3://bucket/prefix`), every [`Cli`]'s snapshots go to a
/// prefix of their own in that bucket (the `AWS_*` variables reach it).
pub const TEST_STORE_URL_ENV: &str = "SILO_TEST_STORE_URL";

/// Runs the `silo` CLI against one scratch `$SILO_HOME`.
pub struct Cli {
    /// The scratch state directory.
    pub home: tempfile::TempDir,
    /// The `silo` executable (a test's `CARGO_BIN_EXE_silo`).
    pub binary: PathBuf,
    /// Environment every command gets besides the home (a provider's
    /// endpoints and key, say), clean-up included.
    pub env: Vec<(String, String)>,
    /// Its schema in the shared state, when [`TEST_STATE_URL_ENV`] is set;
    /// dropped (with everything in it) after the clean-up.
    state: Option<silo::internals::ScratchSchema>,
}

impl Cli {
    /// The CLI at `binary` with an empty state directory.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        let home = tempfile::Builder::new()
            .prefix("silo-home-")
            .tempdir()
            .expect("tempdir");
        Self::in_home(binary, home)
    }

    /// The CLI at `binary` on the (empty) state directory `home`.
    pub fn in_home(binary: impl Into<PathBuf>, home: tempfile::TempDir) -> Self {
        let state = std::env::var(TEST_STATE_URL_ENV)
            .ok()
            .filter(|url| !url.is_empty())
            .map(|url| {
                silo::internals::ScratchSchema::create(&url)
                    .expect("a schema for this test's state in SILO_TEST_STATE_URL")
            });
        let mut env: Vec<(String, String)> = state
            .iter()
            .map(|schema| (silo::fleet::STATE_URL_ENV.to_owned(), schema.url.clone()))
            .collect();
        if let (Some(schema), Ok(bucket)) = (&state, std::env::var(TEST_STORE_URL_ENV)) {
            if !bucket.is_empty() {
                let prefix = schema.name();
                env.push((
                    silo::fleet::STORE_URL_ENV.to_owned(),
                    format!("{}/{prefix}", bucket.trim_end_matches('/')),
                ));
            }
        }
        Self {
            home,
            binary: binary.into(),
            env,
            state,
        }
    }

    /// The same CLI with its state in its home whatever the run: for a
    /// test of the home's own database (a full disk under it, say).
    pub fn with_home_state(mut self) -> Self {
        self.env.retain(|(name, _)| {
            name != silo::fleet::STATE_URL_ENV && name != silo::fleet::STORE_URL_ENV
        });
        self.state = None;
        self
    }

    /// The library on this CLI's home and state.
    pub fn silo(&self) -> silo::Silo {
        let fleet = self.state.as_ref().map(|schema| silo::fleet::Fleet {
            host: silo::fleet::this_host(),
            state: silo::StateLocation::Postgres(schema.url.clone()),
            store: self
                .env
                .iter()
                .find(|(name, _)| name == silo::fleet::STORE_URL_ENV)
                .map(|(_, url)| url.clone()),
        });
        silo::Silo::open_with(silo::SiloOptions {
            home: Some(self.home.path().to_owned()),
            fleet,
            ..silo::SiloOptions::default()
        })
        .expect("opening the CLI's home as a library")
    }

    /// The same CLI with `env` added to every command's environment.
    pub fn with_env<K: Into<String>>(mut self, env: impl IntoIterator<Item = (K, String)>) -> Self {
        self.env.extend(env.into_iter().map(|(k, v)| (k.into(), v)));
        self
    }

    /// A command line for `silo ARGS...`, not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.env("SILO_HOME", self.home.path())
            .env_remove("SILO_AGENT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `silo ARGS...` to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("running silo")
    }

    /// Runs `silo ARGS...`, requires success, and returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "silo {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `silo ARGS...`, requires failure, and returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "silo {args:?} should have failed");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Cli {
    /// `field` of each item a `--json` listing prints; none when it fails
    /// (for cleanup, which goes on whatever happens).
    pub fn listed(&self, args: &[&str], field: &str) -> Vec<String> {
        let out = self.command(args).output();
        out.ok()
            .and_then(|out| serde_json::from_slice::<serde_json::Value>(&out.stdout).ok())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|item| item[field].as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        // Pools first: a claim starts a refill in the background, which
        // would make members after `rm --all`; removing a pool waits for it.
        for name in &self.listed(&["pool", "ls", "--json"], "name") {
            let _ = self.command(&["pool", "rm", name]).output();
        }
        // Sandboxes outlive the CLI by design; a test's own must not outlive the test.
        let _ = self.command(&["rm", "--all"]).output();
        if self.home.path().join("store").exists() {
            // Snapshot images live on the shared engine; a test's go with it.
            let ids = self.listed(&["snapshots", "--json"], "id");
            if !ids.is_empty() {
                let mut args = vec!["snapshot", "rm"];
                args.extend(ids.iter().map(String::as_str));
                let _ = self.command(&args).output();
            }
            // On the shared services, the test's own prefix of the bucket
            // goes too (nothing else names its blobs).
            let age = if self.state.is_some() { "0s" } else { "1d" };
            let _ = self.command(&["gc", "--older-than", age]).output();
        }
        for entry in std::fs::read_dir(self.home.path().join("sandboxes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(pid) = std::fs::read_to_string(entry.path().join("agent.pid")) {
                if let Ok(pid) = pid.trim().parse() {
                    signal(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    }
}
