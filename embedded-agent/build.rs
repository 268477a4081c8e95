//! Builds the silo-agent binary that this crate embeds, so the `silo`
//! command (and any program that opts in) is one file with its agent inside.
//!
//! With `SILO_AGENT_BIN` set, that file is embedded as is (an empty file, e.g.
//! `/dev/null`, embeds nothing and leaves the run-time lookup to find the agent
//! elsewhere). Otherwise the agent is built by a nested cargo for the static
//! musl target, falling back to a static glibc build when that target is missing;
//! while the fallback is in use the musl build is retried at every build, so the
//! static musl agent is embedded as soon as its target and C compiler exist.
//!
//! The nested build uses its own target directory: cargo holds a lock on the
//! outer one for the whole build, so sharing it would deadlock.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Cargo profile of the agent embedded in release builds (`[profile.agent]`, tuned for size).
const AGENT_PROFILE_RELEASE: &str = "agent";
/// Cargo profile of the agent embedded in debug builds (`[profile.agent-dev]`, quick to relink).
const AGENT_PROFILE_DEV: &str = "agent-dev";

/// The agent profile matching the outer build: shipped binaries carry the
/// size-tuned agent, while tests and development get one that rebuilds fast.
fn agent_profile() -> &'static str {
    match env::var("PROFILE").as_deref() {
        Ok("release") => AGENT_PROFILE_RELEASE,
        _ => AGENT_PROFILE_DEV,
    }
}

/// Variables that describe the outer build (its wrappers, flags, target and
/// package) and would leak into the nested one. The jobserver (`CARGO_MAKEFLAGS`,
/// `MAKEFLAGS`), `CARGO_HOME`, `PATH` and `RUSTUP_TOOLCHAIN` are deliberately kept.
const LEAKY_VARS: &[&str] = &[
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTC_WRAPPER",
    "RUSTC_LINKER",
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_CRATE_NAME",
    "TARGET",
    "HOST",
    "OUT_DIR",
    "PROFILE",
    "OPT_LEVEL",
    "DEBUG",
    "NUM_JOBS",
];
const LEAKY_PREFIXES: &[&str] = &[
    "CARGO_CFG_",
    "CARGO_FEATURE_",
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "DEP_",
    "__CARGO",
];

fn main() {
    if let Err(message) = run() {
        // A build script reports failure by panicking; the message is what the user sees.
        panic!("{message}");
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .ok_or("embedded-agent crate has no parent directory")?
        .to_path_buf();
    let out_dir = PathBuf::from(var("OUT_DIR")?);

    println!("cargo:rerun-if-env-changed=SILO_AGENT_BIN");
    for watched in [
        // The workspace's profiles say how the agent is built.
        "Cargo.toml",
        "agent/src",
        "agent/Cargo.toml",
        "protocol/src",
        "protocol/Cargo.toml",
        "Cargo.lock",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }

    let (built, target) = match env::var_os("SILO_AGENT_BIN") {
        Some(path) => {
            let path = PathBuf::from(path);
            println!("cargo:rerun-if-changed={}", path.display());
            (path, "prebuilt".to_owned())
        }
        None => {
            // The agent runs on the same architecture as the binary embedding it.
            let arch = var("CARGO_CFG_TARGET_ARCH")?;
            build_agent(&workspace, &out_dir, &arch)?
        }
    };
    // What `silo doctor` reports about the agent it carries.
    println!("cargo:rustc-env=SILO_EMBEDDED_AGENT_TARGET={target}");

    let embedded = out_dir.join("silo-agent.embedded");
    // Read and write rather than copy: the source may be /dev/null.
    let bytes = fs::read(&built).map_err(|e| format!("reading agent {}: {e}", built.display()))?;
    // An unchanged file keeps its mtime, so the crate is not recompiled for nothing.
    if fs::read(&embedded).ok().as_deref() != Some(bytes.as_slice()) {
        fs::write(&embedded, &bytes).map_err(|e| format!("writing {}: {e}", embedded.display()))?;
    }
    println!("cargo:rustc-env=SILO_EMBEDDED_AGENT={}", embedded.display());
    Ok(())
}

fn build_agent(workspace: &Path, out_dir: &Path, arch: &str) -> Result<(PathBuf, String), String> {
    let musl = format!("{arch}-unknown-linux-musl");
    let gnu = format!("{arch}-unknown-linux-gnu");
    let target_dir = match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("agent"),
        None => workspace.join("target").join("agent"),
    };
    let musl_build = nested_cargo(workspace, &target_dir, &musl, false)?;
    if musl_build.success {
        return Ok((binary_path(&target_dir, &musl), musl));
    }
    println!(
        "cargo:warning=building silo-agent for {musl} failed; embedding a static glibc \
         build instead (for musl: `rustup target add {musl}` and a musl C compiler, \
         e.g. Debian's musl-tools)"
    );
    for line in musl_build
        .stderr
        .lines()
        .filter(|l| l.trim_start().starts_with("error"))
        .take(3)
    {
        println!("cargo:warning=  {musl}: {}", line.trim());
    }
    let gnu_build = nested_cargo(workspace, &target_dir, &gnu, true)?;
    if gnu_build.success {
        // Cargo reruns a build script whose watched path is missing on every
        // build, so the musl build is tried again until it works: a target or
        // C compiler installed later replaces the glibc agent at the next build.
        let never_written = out_dir.join("musl-agent-retry");
        println!("cargo:rerun-if-changed={}", never_written.display());
        return Ok((binary_path(&target_dir, &gnu), gnu));
    }
    Err(format!(
        "building the embedded silo-agent failed for both {musl} and {gnu}.\n\
         Set SILO_AGENT_BIN to a prebuilt agent (or /dev/null to embed none).\n\
         --- {musl} ---\n{}\n--- {gnu} ---\n{}",
        musl_build.stderr, gnu_build.stderr
    ))
}

struct Outcome {
    success: bool,
    stderr: String,
}

fn nested_cargo(
    workspace: &Path,
    target_dir: &Path,
    target: &str,
    crt_static: bool,
) -> Result<Outcome, String> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .args([
            "build",
            "--profile",
            agent_profile(),
            "-p",
            "silo-agent",
            "--target",
            target,
        ])
        .arg("--target-dir")
        .arg(target_dir);
    for (name, _) in env::vars_os() {
        if is_leaky(&name) {
            command.env_remove(&name);
        }
    }
    if crt_static {
        command.env("RUSTFLAGS", "-C target-feature=+crt-static");
    }
    let output = command
        .output()
        .map_err(|e| format!("running nested cargo for silo-agent: {e}"))?;
    Ok(Outcome {
        success: output.status.success(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

fn is_leaky(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    LEAKY_VARS.contains(&name) || LEAKY_PREFIXES.iter().any(|p| name.starts_with(p))
}

fn binary_path(target_dir: &Path, target: &str) -> PathBuf {
    target_dir
        .join(target)
        .join(agent_profile())
        .join("silo-agent")
}

fn var(name: &str) -> Result<String, String> {
    env::var(name).map_err(|_| format!("cargo did not set {name}"))
}
