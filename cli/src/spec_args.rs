//! The flags that describe a sandbox, shared by `silo create` and `silo up`,
//! and their translation into a [`SandboxSpec`].

use anyhow::Context;
use silo::BackendKind;
use silo::SandboxSpec;
use silo::spec::{BindMount, RestartPolicy, parse_cpus, parse_memory};

#[derive(Debug, Default, clap::Args)]
pub struct SpecArgs {
    /// Where the sandbox runs [default: docker when --image is given, else local].
    #[arg(long)]
    backend: Option<BackendKind>,
    /// Image to run (docker and podman backends; any image works, nothing is baked in),
    /// or the template to make the VM from (e2b backend, `base` by default;
    /// daytona backend: a Daytona snapshot, Daytona's default if none).
    #[arg(long, visible_alias = "template")]
    image: Option<String>,
    /// Environment for every command in the sandbox.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
    env: Vec<(String, String)>,
    /// Mount a host directory (docker and podman backends).
    #[arg(long = "bind", value_name = "HOST:TARGET[:ro|:rw]")]
    binds: Vec<BindMount>,
    /// Default working directory of commands [default: the image's, or /].
    #[arg(long, value_name = "DIR")]
    workdir: Option<String>,
    /// Network: none, bridge or an engine network's name [default: bridge].
    #[arg(long, value_name = "NET")]
    network: Option<String>,
    /// Let outbound traffic reach only this destination (repeatable): an
    /// IPv4 address, a CIDR block or a host name (`*.example.com` for its
    /// subdomains); everything else is blocked, by the provider's firewall
    /// (e2b, daytona; docker and local cannot enforce it).
    #[arg(long = "allow-out", value_name = "DEST")]
    allow_out: Vec<String>,
    /// Keep outbound traffic from this IPv4 address or CIDR block
    /// (repeatable; 0.0.0.0/0 for every one), the rest open; beside it,
    /// --allow-out names exceptions (e2b only).
    #[arg(long = "deny-out", value_name = "DEST")]
    deny_out: Vec<String>,
    /// CPU limit, e.g. 1.5.
    #[arg(long, value_name = "N", value_parser = parse_cpus)]
    cpus: Option<u64>,
    /// Memory limit, e.g. 512m.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    memory: Option<u64>,
    /// Most processes the sandbox may run at once [default: 4096].
    #[arg(long, value_name = "N")]
    pids_limit: Option<u64>,
    /// Give back a capability silo drops by default (NET_RAW, MKNOD,
    /// AUDIT_WRITE, SETFCAP, SETPCAP, SYS_CHROOT), or add another.
    #[arg(long = "cap-add", value_name = "CAP")]
    cap_add: Vec<String>,
    /// Run privileged: every capability and device, no confinement.
    #[arg(long)]
    privileged: bool,
    /// Let setuid programs (sudo, su) gain privileges [default: they cannot].
    #[arg(long)]
    new_privileges: bool,
    /// The engine's container runtime, e.g. runsc for gVisor.
    #[arg(long, value_name = "NAME")]
    runtime: Option<String>,
    /// User the agent and every command run as (name or uid[:gid]).
    #[arg(long)]
    user: Option<String>,
    /// Stop the sandbox after this many seconds without a request.
    #[arg(long, value_name = "SECS")]
    idle_timeout: Option<u64>,
    /// Extra label on the sandbox's container.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
    labels: Vec<(String, String)>,
    /// What the agent supervises: `image` (the image's entrypoint and
    /// command), `none`, or a command line [default: none].
    #[arg(long, value_name = "image|none|CMD", conflicts_with = "workload_argv")]
    workload: Option<String>,
    /// When the agent starts the workload again after it exits
    /// (always, on-failure, never) [default: on-failure].
    #[arg(long, value_name = "POLICY")]
    restart: Option<RestartPolicy>,
    /// A command the agent keeps running for the sandbox's life.
    #[arg(last = true, value_name = "WORKLOAD")]
    workload_argv: Vec<String>,
}

impl SpecArgs {
    /// Whether any setting was given (`silo up NAME` alone opens what exists).
    pub fn given(&self) -> bool {
        self.backend.is_some()
            || self.image.is_some()
            || !self.env.is_empty()
            || !self.binds.is_empty()
            || self.workdir.is_some()
            || self.network.is_some()
            || !self.allow_out.is_empty()
            || !self.deny_out.is_empty()
            || self.cpus.is_some()
            || self.memory.is_some()
            || self.pids_limit.is_some()
            || !self.cap_add.is_empty()
            || self.privileged
            || self.new_privileges
            || self.runtime.is_some()
            || self.user.is_some()
            || self.idle_timeout.is_some()
            || !self.labels.is_empty()
            || self.workload.is_some()
            || self.restart.is_some()
            || !self.workload_argv.is_empty()
    }

    /// The spec these flags describe.
    pub fn into_spec(self) -> anyhow::Result<SandboxSpec> {
        let backend = self.backend.unwrap_or(if self.image.is_some() {
            BackendKind::Docker
        } else {
            BackendKind::Local
        });
        let mut spec = SandboxSpec::new(backend);
        match self.workload.as_deref() {
            None | Some("none") => spec.workload = self.workload_argv,
            Some("image") => spec.workload_from_image = true,
            Some(line) => {
                spec.workload =
                    split_words(line).with_context(|| format!("reading --workload {line:?}"))?;
            }
        }
        spec.restart = self.restart;
        spec.image = self.image;
        spec.env = self.env.into_iter().collect();
        spec.binds = self.binds;
        spec.workdir = self.workdir;
        spec.network = self.network;
        // One form, sorted: the same destinations make the same spec.
        spec.allow_out = silo::spec::egress::canonical(&self.allow_out)
            .map_err(|reason| anyhow::anyhow!("bad allow-out: {reason}"))?;
        spec.deny_out = silo::spec::egress::canonical_denied(&self.deny_out)
            .map_err(|reason| anyhow::anyhow!("bad deny-out: {reason}"))?;
        spec.milli_cpus = self.cpus;
        spec.memory_bytes = self.memory;
        spec.pids_limit = self.pids_limit;
        spec.cap_add = canonical_capabilities(self.cap_add);
        spec.privileged = self.privileged;
        spec.new_privileges = self.new_privileges;
        spec.runtime = self.runtime;
        spec.user = self.user;
        spec.idle_timeout_secs = self.idle_timeout;
        spec.labels = self.labels.into_iter().collect();
        spec.check()?;
        Ok(spec)
    }
}

/// Capability names in one form (`CAP_` dropped), sorted and without
/// repeats, so the same capabilities given in another order or spelling
/// make the same spec, and the same spec hash (no false drift).
fn canonical_capabilities(caps: Vec<String>) -> Vec<String> {
    let mut caps: Vec<String> = caps
        .into_iter()
        .map(|c| c.strip_prefix("CAP_").map(str::to_owned).unwrap_or(c))
        .collect();
    caps.sort();
    caps.dedup();
    caps
}

/// Splits a command line into words as a POSIX shell would, for quoting
/// only: single quotes, double quotes (with `\"` and `\\`) and backslashes.
/// No expansion of any kind happens.
fn split_words(line: &str) -> anyhow::Result<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let current = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => current.push(c),
                        None => anyhow::bail!("unterminated single quote"),
                    }
                }
            }
            '"' => {
                let current = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => current.push(c),
                            Some(c) => {
                                current.push('\\');
                                current.push(c);
                            }
                            None => anyhow::bail!("unterminated double quote"),
                        },
                        Some(c) => current.push(c),
                        None => anyhow::bail!("unterminated double quote"),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => anyhow::bail!("trailing backslash"),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    anyhow::ensure!(!words.is_empty(), "the command is empty");
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_like_a_shell_without_expansion() {
        assert_eq!(
            split_words(r#"python -m http.server 'a b' "c \"d\"" e\ f $HOME"#).unwrap(),
            [
                "python",
                "-m",
                "http.server",
                "a b",
                r#"c "d""#,
                "e f",
                "$HOME"
            ]
        );
        assert_eq!(split_words("''").unwrap(), [""]);
        assert!(split_words("'open").is_err());
        assert!(split_words("   ").is_err());
    }

    #[test]
    fn image_implies_docker_and_workload_modes_map() {
        let args = SpecArgs {
            image: Some("busybox".into()),
            workload: Some("image".into()),
            ..SpecArgs::default()
        };
        assert!(args.given());
        let spec = args.into_spec().unwrap();
        assert_eq!(spec.backend, BackendKind::Docker);
        assert!(spec.workload_from_image);
        let spec = SpecArgs {
            workload: Some("sleep 'inf'".into()),
            ..SpecArgs::default()
        }
        .into_spec()
        .unwrap();
        assert_eq!(spec.backend, BackendKind::Local);
        assert_eq!(spec.workload, ["sleep", "inf"]);
        assert!(!SpecArgs::default().given());
    }

    #[test]
    fn capabilities_in_any_order_or_spelling_make_one_spec() {
        let spec = |caps: &[&str]| {
            SpecArgs {
                image: Some("busybox".into()),
                cap_add: caps.iter().map(|c| (*c).to_owned()).collect(),
                ..SpecArgs::default()
            }
            .into_spec()
            .unwrap()
        };
        let a = spec(&["NET_RAW", "CAP_SYS_PTRACE"]);
        let b = spec(&["SYS_PTRACE", "CAP_NET_RAW", "NET_RAW"]);
        assert_eq!(a.cap_add, ["NET_RAW", "SYS_PTRACE"]);
        assert_eq!(a.hash(), b.hash());
    }
}
