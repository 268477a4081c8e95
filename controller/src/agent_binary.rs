//! Finding the silo-agent binary that host-side backends run (and, later,
//! bind-mount into containers).
//!
//! Order: an explicit path (`--agent` or `$SILO_AGENT`), then `silo-agent`
//! beside the running executable (a release directory, or a package that ships
//! both) if it is a static binary, then the copy embedded in this binary at
//! build time, extracted once to `$SILO_HOME/bin/silo-agent-<sha256 prefix>`.
//! A dynamically linked agent beside `silo` (a workspace's debug build) is
//! passed over: it would run on this host but not inside an arbitrary image.
//! The hash in the extracted file's name means two silo versions sharing one
//! home never run each other's agent.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// Environment variable naming an agent binary to use instead of the built-in one.
pub const AGENT_ENV: &str = "SILO_AGENT";
/// File name of the agent, beside `silo` or in `$SILO_HOME/bin`.
pub const AGENT_FILE_NAME: &str = "silo-agent";
/// Hex digits of the content hash kept in an extracted agent's file name.
const HASH_PREFIX_LEN: usize = 16;

/// The target the embedded agent was built for (`<arch>-unknown-linux-musl`,
/// the static glibc fallback `<arch>-unknown-linux-gnu`), `prebuilt` when the
/// build embedded a given file, or `none` without the `embedded-agent` feature.
#[cfg(feature = "embedded-agent")]
pub const EMBEDDED_TARGET: &str = silo_embedded_agent::TARGET;
/// The target the embedded agent was built for: `none`, as this build was
/// made without the `embedded-agent` feature.
#[cfg(not(feature = "embedded-agent"))]
pub const EMBEDDED_TARGET: &str = "none";

/// The embedded agent, if this build carries one (the `embedded-agent`
/// feature; without it, the agent comes from `$SILO_AGENT` or beside the
/// executable).
pub fn embedded() -> Option<&'static [u8]> {
    #[cfg(feature = "embedded-agent")]
    return silo_embedded_agent::bytes();
    #[cfg(not(feature = "embedded-agent"))]
    None
}

/// Where a located agent came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentSource {
    /// `--agent` or `$SILO_AGENT`.
    Explicit,
    /// Next to the running executable.
    BesideExecutable,
    /// Extracted from this binary.
    Embedded,
}

/// A usable agent binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentBinary {
    /// The executable.
    pub path: PathBuf,
    /// How it was found.
    pub source: AgentSource,
}

/// Finds the agent on first use and remembers it, so commands that never
/// spawn an agent (exec, ls) never pay for the lookup or the extraction.
#[derive(Debug)]
pub struct AgentLocator {
    explicit: Option<PathBuf>,
    bin_dir: PathBuf,
    found: OnceLock<AgentBinary>,
}

impl AgentLocator {
    /// A locator preferring `explicit`, extracting into `bin_dir` if it must.
    pub fn new(explicit: Option<PathBuf>, bin_dir: PathBuf) -> Self {
        Self {
            explicit,
            bin_dir,
            found: OnceLock::new(),
        }
    }

    /// The agent, located now or on an earlier call. Failures are not
    /// remembered, so a later call can succeed once the cause is fixed.
    pub fn get(&self) -> Result<AgentBinary, AgentBinaryError> {
        if let Some(found) = self.found.get() {
            return Ok(found.clone());
        }
        let found = locate(self.explicit.as_deref(), &self.bin_dir)?;
        let _ = self.found.set(found.clone());
        Ok(found)
    }
}

/// Finds the agent: `explicit`, else `$SILO_AGENT`, else beside the current
/// executable, else the embedded copy extracted into `bin_dir`.
pub fn locate(explicit: Option<&Path>, bin_dir: &Path) -> Result<AgentBinary, AgentBinaryError> {
    let from_env = std::env::var_os(AGENT_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    locate_with(
        explicit.map(Path::to_path_buf).or(from_env),
        std::env::current_exe().ok(),
        embedded(),
        bin_dir,
    )
}

/// [`locate`] with every input given, so the order can be tested.
fn locate_with(
    explicit: Option<PathBuf>,
    current_exe: Option<PathBuf>,
    embedded: Option<&[u8]>,
    bin_dir: &Path,
) -> Result<AgentBinary, AgentBinaryError> {
    if let Some(path) = explicit {
        return match fs::metadata(&path) {
            // Absolute, because the path is handed on to places with another
            // working directory: the local backend's agent process, and the
            // engine, which bind-mounts only absolute paths.
            Ok(meta) if meta.is_file() => match std::path::absolute(&path) {
                Ok(path) => Ok(AgentBinary {
                    path,
                    source: AgentSource::Explicit,
                }),
                Err(source) => Err(AgentBinaryError::Explicit { path, source }),
            },
            Ok(_) => Err(AgentBinaryError::Explicit {
                path,
                source: io::Error::other("not a regular file"),
            }),
            Err(source) => Err(AgentBinaryError::Explicit { path, source }),
        };
    }
    if let Some(beside) = current_exe
        .as_deref()
        .and_then(Path::parent)
        .map(|dir| dir.join(AGENT_FILE_NAME))
        .filter(|p| p.is_file() && fs::read(p).is_ok_and(|b| is_static_executable(&b)))
    {
        return Ok(AgentBinary {
            path: beside,
            source: AgentSource::BesideExecutable,
        });
    }
    match embedded {
        Some(bytes) => Ok(AgentBinary {
            path: extract(bytes, bin_dir)?,
            source: AgentSource::Embedded,
        }),
        None => Err(AgentBinaryError::NotFound),
    }
}

/// Whether `bytes` are a 64-bit little-endian ELF executable that asks for no
/// dynamic loader (no `PT_INTERP` segment), so it runs in any Linux image.
pub fn is_static_executable(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    let header = || -> Option<bool> {
        // ELF magic, 64-bit class, little-endian.
        if bytes.get(..6)? != b"\x7fELF\x02\x01" {
            return Some(false);
        }
        let table = usize::try_from(u64_at(0x20)?).ok()?;
        let (entry_size, entries) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
        for index in 0..entries {
            if u32_at(table.checked_add(index.checked_mul(entry_size)?)?)? == PT_INTERP {
                return Some(false);
            }
        }
        Some(true)
    };
    header().unwrap_or(false)
}

/// The embedded agent, extracted into `bin_dir` (skipping the other lookups):
/// for callers that need exactly the binary this build ships, such as tests
/// that must run the static agent rather than a stray debug build.
pub fn extract_embedded(bin_dir: &Path) -> Result<PathBuf, AgentBinaryError> {
    extract(embedded().ok_or(AgentBinaryError::NotFound)?, bin_dir)
}

/// Writes `bytes` to `bin_dir/silo-agent-<hash>` unless an intact copy is there.
fn extract(bytes: &[u8], bin_dir: &Path) -> Result<PathBuf, AgentBinaryError> {
    let hash = hex::encode(Sha256::digest(bytes));
    let path = bin_dir.join(format!("{AGENT_FILE_NAME}-{}", &hash[..HASH_PREFIX_LEN]));
    if intact(&path, bytes.len(), &hash) {
        return Ok(path);
    }
    let err = |source| AgentBinaryError::Extract {
        path: path.clone(),
        source,
    };
    crate::home::create_private_dir(bin_dir).map_err(err)?;
    crate::fsutil::write_atomic(&path, bytes, 0o755).map_err(err)?;
    Ok(path)
}

/// Whether `path` already holds exactly these bytes (checked by size, then hash).
fn intact(path: &Path, len: usize, hash: &str) -> bool {
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() == len as u64 => {}
        _ => return false,
    }
    fs::read(path).is_ok_and(|on_disk| hex::encode(Sha256::digest(on_disk)) == hash)
}

/// Why no agent binary could be found.
#[derive(Debug, thiserror::Error)]
pub enum AgentBinaryError {
    /// The explicitly named agent is unusable.
    #[error("agent binary {} (from --agent or {AGENT_ENV}) is unusable", path.display())]
    Explicit {
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Nothing embedded and nothing beside the executable.
    #[error(
        "no silo-agent found: this silo was built without an embedded agent and there is \
         no {AGENT_FILE_NAME} beside it; pass --agent PATH or set {AGENT_ENV}"
    )]
    NotFound,
    /// The embedded agent could not be written out.
    #[error("cannot extract the embedded agent to {}", path.display())]
    Extract {
        /// The destination.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A 64-bit ELF header with an empty program header table.
    fn minimal_static_elf() -> Vec<u8> {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf
    }

    #[test]
    fn only_binaries_without_an_interpreter_count_as_static() {
        assert!(is_static_executable(&minimal_static_elf()));
        let mut dynamic = minimal_static_elf();
        dynamic[0x20] = 64; // program headers right after the ELF header
        dynamic[0x36] = 56;
        dynamic[0x38] = 1;
        dynamic.extend_from_slice(&[3, 0, 0, 0]); // PT_INTERP
        dynamic.resize(64 + 56, 0);
        assert!(!is_static_executable(&dynamic));
        assert!(!is_static_executable(b"#!/bin/sh\n"));
        assert!(
            !is_static_executable(&dynamic[..70]),
            "truncated tables are not static"
        );
    }

    /// `path` relative to `base`, climbing with `..` as far as needed.
    fn pathdiff(path: &Path, base: &Path) -> PathBuf {
        let common = path
            .components()
            .zip(base.components())
            .take_while(|(a, b)| a == b)
            .count();
        let mut relative = PathBuf::new();
        for _ in base.components().skip(common) {
            relative.push("..");
        }
        relative.extend(path.components().skip(common));
        relative
    }

    fn touch(path: &Path) {
        fs::write(path, b"#!/bin/sh\n").unwrap();
    }

    #[test]
    fn explicit_wins_then_beside_then_embedded() {
        let dir = tempfile::tempdir().unwrap();
        let exe_dir = dir.path().join("release");
        fs::create_dir(&exe_dir).unwrap();
        let exe = exe_dir.join("silo");
        let custom = dir.path().join("custom-agent");
        touch(&custom);
        let bin = dir.path().join("home/bin");

        let found = locate_with(Some(custom.clone()), Some(exe.clone()), Some(b"x"), &bin);
        assert_eq!(found.unwrap().source, AgentSource::Explicit);

        // A relative path is made absolute: the engine and the local
        // backend's agent process resolve it from elsewhere.
        let cwd = std::env::current_dir().unwrap();
        let relative = pathdiff(&custom, &cwd);
        let found = locate_with(Some(relative), None, None, &bin).unwrap();
        assert!(found.path.is_absolute(), "{}", found.path.display());
        assert_eq!(fs::read(&found.path).unwrap(), fs::read(&custom).unwrap());

        let found = locate_with(None, Some(exe.clone()), Some(b"embedded"), &bin).unwrap();
        assert_eq!(found.source, AgentSource::Embedded);
        assert!(found.path.starts_with(&bin));
        assert_eq!(fs::read(&found.path).unwrap(), b"embedded");
        let mode = fs::metadata(&found.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);

        // A script (or a dynamically linked build) beside silo is passed over.
        touch(&exe_dir.join(AGENT_FILE_NAME));
        let found = locate_with(None, Some(exe.clone()), Some(b"embedded"), &bin).unwrap();
        assert_eq!(found.source, AgentSource::Embedded);

        fs::write(exe_dir.join(AGENT_FILE_NAME), minimal_static_elf()).unwrap();
        let found = locate_with(None, Some(exe.clone()), Some(b"embedded"), &bin).unwrap();
        assert_eq!(found.source, AgentSource::BesideExecutable);
        assert_eq!(found.path, exe_dir.join(AGENT_FILE_NAME));
    }

    #[test]
    fn missing_explicit_and_nothing_at_all_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let err = locate_with(Some(dir.path().join("nope")), None, Some(b"x"), &bin).unwrap_err();
        assert!(matches!(err, AgentBinaryError::Explicit { .. }), "{err}");
        let err = locate_with(None, None, None, &bin).unwrap_err();
        assert!(err.to_string().contains("--agent"), "{err}");
    }

    #[test]
    fn extraction_is_reused_and_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let first = extract(b"agent-v1", &bin).unwrap();
        assert_eq!(extract(b"agent-v1", &bin).unwrap(), first);
        fs::write(&first, b"agent-XX").unwrap();
        assert_eq!(extract(b"agent-v1", &bin).unwrap(), first);
        assert_eq!(fs::read(&first).unwrap(), b"agent-v1");
        // Another version gets its own file rather than replacing this one.
        assert_ne!(extract(b"agent-v2", &bin).unwrap(), first);
        // No temp files are left behind.
        assert_eq!(fs::read_dir(&bin).unwrap().count(), 2);
    }
}
