//! Small file helpers shared by the modules that write into `$SILO_HOME`, and
//! the one way sizes are written for people.

use std::ffi::OsString;
use std::fs::{self, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tempfile::NamedTempFile;

/// Writes `bytes` to `path` with `mode`, atomically: a reader (in any process)
/// sees the old file or the whole new one, never a partial write.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    filled_temp(path, bytes, mode)?
        .persist(path)
        .map_err(|err| err.error)?;
    Ok(())
}

/// Writes `bytes` to `path` with `mode` unless `path` exists, atomically.
/// Of writers racing to create it, exactly one wins and the others leave it
/// alone, so all of them can go on to read the same file.
pub(crate) fn create_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    match filled_temp(path, bytes, mode)?.persist_noclobber(path) {
        Err(err) if err.error.kind() != io::ErrorKind::AlreadyExists => Err(err.error),
        _ => Ok(()),
    }
}

/// `bytes`, on disk, in a temp file beside `path` (`.<name>.tmp-…`, so it
/// is recognisable and on the same file system). Dropping it removes it.
fn filled_temp(path: &Path, bytes: &[u8], mode: u32) -> io::Result<NamedTempFile> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("path has no file name"))?;
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut prefix = OsString::from(".");
    prefix.push(name);
    prefix.push(".tmp-");
    let mut file = tempfile::Builder::new()
        .prefix(&prefix)
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    Ok(file)
}

/// Removes a file, treating "already gone" as success.
pub(crate) fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The last `max_lines` lines of a text file (at most its last 8 KiB), for
/// error messages; empty if it cannot be read.
pub(crate) fn tail(path: &Path, max_lines: usize) -> String {
    const MAX_BYTES: u64 = 8 * 1024;
    let Ok(bytes) = fs::read(path) else {
        return String::new();
    };
    let start = bytes.len().saturating_sub(MAX_BYTES as usize);
    let text = String::from_utf8_lossy(&bytes[start..]);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(max_lines)..].join("\n")
}

/// Free space below which a disk counts as full: less than SQLite needs to
/// open a database in WAL mode (its shared-memory file is 32 KiB).
const FULL_BELOW_BYTES: u64 = 1024 * 1024;

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> nix::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(dir)?;
    Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
}

/// Whether the file system holding `dir` has (next to) no space left.
pub(crate) fn disk_is_full(dir: &Path) -> bool {
    free_bytes(dir).is_ok_and(|free| free < FULL_BELOW_BYTES)
}

/// `1.5 MiB`-style sizes.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_sets_mode_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        remove_if_present(&path).unwrap();
        remove_if_present(&path).unwrap();
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        fs::write(&path, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&path, 2), "b\nc");
        assert_eq!(tail(&dir.path().join("none"), 2), "");
    }
}
