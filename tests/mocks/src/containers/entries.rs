//! What a directory listing or a stat in a sandbox reports, read with the
//! container's own `stat` and `find` (busybox has both): a mode, a size, a
//! modification time, owners and the path, per entry. Shared by E2B's
//! `filesystem.Filesystem` and Daytona's file listing, which both print
//! modes as Go does ([`go_mode`], [`go_mode_string`]). Names with a newline
//! in them are not modelled.

use super::{Container, ContainerError};

/// Go's `os.ModeDir`.
const GO_DIR: u32 = 1 << 31;
/// Go's `os.ModeSymlink`.
const GO_SYMLINK: u32 = 1 << 27;
/// Go's `os.ModeDevice`.
const GO_DEVICE: u32 = 1 << 26;
/// Go's `os.ModeNamedPipe`.
const GO_PIPE: u32 = 1 << 25;
/// Go's `os.ModeSocket`.
const GO_SOCKET: u32 = 1 << 24;
/// Go's `os.ModeCharDevice`.
const GO_CHAR_DEVICE: u32 = 1 << 21;
/// Deepest listing walked (the daemons have no bound; a guard here).
pub const MAX_DEPTH: u32 = 64;
/// What `stat` prints per entry: raw mode (hex), size, mtime, uid, gid, name.
const STAT_FORMAT: &str = "%f %s %Y %u %g %n";
/// The file-type bits of a Unix mode.
const TYPE_BITS: u32 = 0o170000;

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The Unix mode (type and permission bits).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// The path as walked (the starting point joined with the names below it).
    pub path: String,
}

impl Entry {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & TYPE_BITS == 0o040000
    }

    /// Whether it is a symlink (only when not followed).
    pub fn is_symlink(&self) -> bool {
        self.mode & TYPE_BITS == 0o120000
    }

    /// Its last path component.
    pub fn name(&self) -> &str {
        self.path
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
    }
}

impl Container {
    /// The entry at `path` (absolute), its final symlink followed when
    /// `follow`; `None` if nothing is there.
    pub async fn entry(&self, path: &str, follow: bool) -> Result<Option<Entry>, ContainerError> {
        let argv: &[&str] = if follow {
            &["stat", "-L", "-c", STAT_FORMAT, path]
        } else {
            &["stat", "-c", STAT_FORMAT, path]
        };
        Ok(self.stat_lines(argv).await?.into_iter().next())
    }

    /// The entries below the directory `dir` (absolute) down to `depth`
    /// levels, `dir` itself left out and followed if it is a link, the
    /// links below it not followed; sorted by path.
    pub async fn walk(&self, dir: &str, depth: u32) -> Result<Vec<Entry>, ContainerError> {
        let depth = depth.clamp(1, MAX_DEPTH).to_string();
        // A trailing slash makes `find` go into a symlinked directory.
        let start = if dir == "/" {
            dir.to_owned()
        } else {
            format!("{}/", dir.trim_end_matches('/'))
        };
        let argv = [
            "find",
            &start,
            "-mindepth",
            "1",
            "-maxdepth",
            &depth,
            "-exec",
            "stat",
            "-c",
            STAT_FORMAT,
            "{}",
            "+",
        ];
        let mut entries = self.stat_lines(&argv).await?;
        for entry in &mut entries {
            entry.path = entry.path.replace("//", "/");
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    /// The target of the symlink at `path`.
    pub async fn link_target(&self, path: &str) -> Result<String, ContainerError> {
        let finished = self.run(&["readlink", path]).await?;
        Ok(String::from_utf8_lossy(&finished.stdout)
            .trim_end_matches('\n')
            .to_owned())
    }

    async fn stat_lines(&self, argv: &[&str]) -> Result<Vec<Entry>, ContainerError> {
        let finished = self.run(argv).await?;
        Ok(String::from_utf8_lossy(&finished.stdout)
            .lines()
            .filter_map(parse_stat)
            .collect())
    }
}

fn parse_stat(line: &str) -> Option<Entry> {
    let mut fields = line.splitn(6, ' ');
    Some(Entry {
        mode: u32::from_str_radix(fields.next()?, 16).ok()?,
        size: fields.next()?.parse().ok()?,
        mtime: fields.next()?.parse().ok()?,
        uid: fields.next()?.parse().ok()?,
        gid: fields.next()?.parse().ok()?,
        path: fields.next()?.to_owned(),
    })
}

/// A Unix mode as Go's `FileMode`.
pub fn go_mode(mode: u32) -> u32 {
    let kind = match mode & TYPE_BITS {
        0o040000 => GO_DIR,
        0o120000 => GO_SYMLINK,
        0o010000 => GO_PIPE,
        0o140000 => GO_SOCKET,
        0o060000 => GO_DEVICE,
        0o020000 => GO_DEVICE | GO_CHAR_DEVICE,
        _ => 0,
    };
    kind | (mode & 0o777)
}

/// Go's `FileMode.String()` for the type bits [`go_mode`] gives.
pub fn go_mode_string(mode: u32) -> String {
    let mut text = String::new();
    for (bit, letter) in [
        (GO_DIR, 'd'),
        (GO_SYMLINK, 'L'),
        (GO_DEVICE, 'D'),
        (GO_PIPE, 'p'),
        (GO_SOCKET, 'S'),
        (GO_CHAR_DEVICE, 'c'),
    ] {
        if mode & bit != 0 {
            text.push(letter);
        }
    }
    if text.is_empty() {
        text.push('-');
    }
    for (i, letter) in "rwxrwxrwx".chars().enumerate() {
        text.push(if mode & (1 << (8 - i)) != 0 {
            letter
        } else {
            '-'
        });
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_keep_spaces_in_names() {
        let entry = parse_stat("81a4 5 1700000000 1000 1000 /home/user/a b.txt").unwrap();
        assert_eq!(entry.mode, 0o100644);
        assert_eq!(entry.name(), "a b.txt");
        assert!(!entry.is_dir());
        assert_eq!(parse_stat("stat: can't stat"), None);
    }

    #[test]
    fn modes_print_as_go_prints_them() {
        assert_eq!(go_mode_string(go_mode(0o100644)), "-rw-r--r--");
        assert_eq!(go_mode_string(go_mode(0o040755)), "drwxr-xr-x");
        assert_eq!(go_mode_string(go_mode(0o120777)), "Lrwxrwxrwx");
        assert_eq!(go_mode(0o040755), (1 << 31) | 0o755);
    }
}
