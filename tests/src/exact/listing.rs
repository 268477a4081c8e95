//! A live sandbox's tree as the host sees it, taken with none of silo's
//! code: the walk starts at `/proc/<pid>/root` of the container's init,
//! never follows a symlink, and skips the kernel's file systems (`/proc`,
//! `/sys`, `/dev`), silo's own `/.silo` and every mount point the
//! container's `mountinfo` lists (the engine's `/etc/hosts` and friends,
//! the agent's binary and socket), and the few files the engine makes in
//! every container (`/.dockerenv`, `/etc/mtab`). Paths are bytes, so names that are not
//! UTF-8 are listed as they are. [`diff`] spells out how two listings
//! differ, for a failure a person can read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CString;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Names at the root the listing never enters: the kernel's file systems,
/// whatever is mounted there, and silo's own state.
const SKIPPED_AT_ROOT: [&[u8]; 4] = [b"proc", b"sys", b"dev", b".silo"];
/// Paths the engine makes anew in every container (its init layer, above
/// the image), so a fork's are never the snapshot's: left out, as the
/// engine's bind-mounted files are.
const MADE_BY_THE_ENGINE: [&[u8]; 3] = [b"/.dockerenv", b"/etc/mtab", b"/run/.containerenv"];
/// How many differences [`diff`] spells out before it only counts them.
pub const DIFF_LINES: usize = 20;
/// A name longer than this is shown shortened in a difference.
const SHOWN_NAME_BYTES: usize = 40;
/// Extended attribute names a listing records besides `user.*`.
const RECORDED_XATTRS: [&[u8]; 1] = [b"security.capability"];

/// A path's type, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    Char,
    /// A block device.
    Block,
}

impl Type {
    fn of(file_type: fs::FileType) -> Self {
        if file_type.is_dir() {
            Self::Dir
        } else if file_type.is_symlink() {
            Self::Symlink
        } else if file_type.is_fifo() {
            Self::Fifo
        } else if file_type.is_socket() {
            Self::Socket
        } else if file_type.is_char_device() {
            Self::Char
        } else if file_type.is_block_device() {
            Self::Block
        } else {
            Self::File
        }
    }
}

/// One path of a listing: what a rewind or a fork must give back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its type.
    pub kind: Type,
    /// Permission bits with setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// A file's size.
    pub size: Option<u64>,
    /// A file's content, as SHA-256 in hex.
    pub sha256: Option<String>,
    /// A symlink's target, as bytes.
    pub target: Option<Vec<u8>>,
    /// Modification time, whole seconds. A directory's is recorded but
    /// never compared: it moves whenever a rewind touches its entries,
    /// and a snapshot's promise is about the entries, not that clock.
    pub mtime: i64,
    /// Modification time, the nanoseconds within the second; compared only
    /// when [`Compare::nanoseconds`] asks (layers may keep whole seconds).
    pub mtime_nsec: i64,
    /// `user.*` and `security.capability` attributes, name → value.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// For a path hard-linked to others in the listing: every path of its
    /// group, sorted, so two listings compare groups by their members and
    /// never by inode numbers (a name added to a group changes every name
    /// of it, as `silo diff` says). `None` when no other listed path shares
    /// its inode (a link outside the listing is not the tree's).
    pub link_group: Option<Vec<Vec<u8>>>,
}

/// A whole tree: container path (bytes, from `/`) → entry.
pub type Listing = BTreeMap<Vec<u8>, Entry>;

/// What two listings must agree on beyond type, mode, owners, content,
/// targets, attributes, link groups and files' whole-second times.
#[derive(Debug, Clone, Copy, Default)]
pub struct Compare {
    /// Modification times to the nanosecond (directories' never).
    pub nanoseconds: bool,
    /// Path prefixes of a machine's own plumbing, which a new machine has
    /// under other names (the Daytona mock's session FIFOs in
    /// `/tmp/tmp.*`): differences there do not count.
    pub machine_own: &'static [&'static [u8]],
    /// The two machines are on different engines, each of which makes the
    /// container's root directory (its mount point) its own way: Docker
    /// 0755, Podman 0555. The root's mode then does not count.
    pub across_engines: bool,
}

/// The tree of the container whose init is `pid`, read from the host.
pub fn of_pid(pid: u32) -> io::Result<Listing> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let mounts = mount_points(&proc.join("mountinfo"))?;
    let root = proc.join("root");
    let mut listing = Listing::new();
    // (dev, inode) → the listed paths sharing it, for link groups.
    let mut inodes: HashMap<(u64, u64), Vec<Vec<u8>>> = HashMap::new();
    // `root` is the kernel's link to the container's root: followed once.
    let meta = fs::metadata(&root)?;
    // With a trailing slash, so that the attribute calls (which never
    // follow a link) read the root's and not the kernel link's.
    listing.insert(b"/".to_vec(), entry(&root.join(""), &meta)?);
    let mut dirs = vec![b"/".to_vec()];
    while let Some(dir) = dirs.pop() {
        for child in fs::read_dir(host_path(&root, &dir))? {
            let name = child?.file_name();
            let name = name.as_bytes();
            if dir == b"/" && SKIPPED_AT_ROOT.contains(&name) {
                continue;
            }
            let path = join(&dir, name);
            if mounts.contains(&path) || MADE_BY_THE_ENGINE.contains(&path.as_slice()) {
                continue;
            }
            let host = host_path(&root, &path);
            let meta = match fs::symlink_metadata(&host) {
                Ok(meta) => meta,
                // Gone between the directory's read and the look: nothing
                // of silo's runs while a listing is taken, so say so loudly.
                Err(e) => return Err(io::Error::new(e.kind(), format!("{host:?}: {e}"))),
            };
            let found = entry(&host, &meta)?;
            // Groups go by inode alone: fuse-overlayfs reports a link
            // count of 1 for some names of a lower layer's hard-linked
            // inode while they share it.
            if found.kind == Type::Dir {
                dirs.push(path.clone());
            } else {
                inodes
                    .entry((meta.dev(), meta.ino()))
                    .or_default()
                    .push(path.clone());
            }
            listing.insert(path, found);
        }
    }
    for mut group in inodes.into_values().filter(|g| g.len() > 1) {
        group.sort();
        for path in &group {
            if let Some(found) = listing.get_mut(path) {
                found.link_group = Some(group.clone());
            }
        }
    }
    Ok(listing)
}

/// `dir/name` for a container path.
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = dir.to_vec();
    if path != b"/" {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// Where a container path is on the host, under `/proc/<pid>/root`.
fn host_path(root: &Path, path: &[u8]) -> PathBuf {
    root.join(std::ffi::OsStr::from_bytes(&path[1..]))
}

/// One path's entry, from its `lstat` and, by type, its content or target.
fn entry(host: &Path, meta: &fs::Metadata) -> io::Result<Entry> {
    let kind = Type::of(meta.file_type());
    let (size, sha256) = if kind == Type::File {
        (Some(meta.len()), Some(sha256_of(host)?))
    } else {
        (None, None)
    };
    let target = if kind == Type::Symlink {
        Some(fs::read_link(host)?.into_os_string().into_encoded_bytes())
    } else {
        None
    };
    Ok(Entry {
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        size,
        sha256,
        target,
        mtime: meta.mtime(),
        mtime_nsec: meta.mtime_nsec(),
        xattrs: xattrs(host)?,
        link_group: None,
    })
}

fn sha256_of(path: &Path) -> io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// The mount points of a `mountinfo` (its fifth field, octal escapes
/// decoded), relative to that process's root; the root itself left out.
fn mount_points(mountinfo: &Path) -> io::Result<BTreeSet<Vec<u8>>> {
    let text = fs::read(mountinfo)?;
    Ok(text
        .split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(unescape_octal)
        .filter(|point| point != b"/")
        .collect())
}

/// `\040`-style escapes (space, tab, newline, backslash) back to bytes.
fn unescape_octal(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8) + (b - b'0')));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// The recorded extended attributes of a path, never following a link.
fn xattrs(path: &Path) -> io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let names = read_sized(|buf, len| {
        // SAFETY: `c_path` is NUL-terminated; `buf` is valid for `len` bytes
        // (or null with `len` 0, which asks for the size only).
        unsafe { libc::llistxattr(c_path.as_ptr(), buf.cast(), len) }
    });
    let names = match names {
        Ok(names) => names,
        // A file system without attributes has none to compare.
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut out = BTreeMap::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if !(name.starts_with(b"user.") || RECORDED_XATTRS.contains(&name)) {
            continue;
        }
        let c_name = CString::new(name)?;
        let value = read_sized(|buf, len| {
            // SAFETY: both strings are NUL-terminated; `buf` is valid for
            // `len` bytes (or null with `len` 0).
            unsafe { libc::lgetxattr(c_path.as_ptr(), c_name.as_ptr(), buf.cast(), len) }
        });
        match value {
            Ok(value) => {
                out.insert(name.to_vec(), value);
            }
            // Removed between the list and the read.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Calls a `*xattr` function once for the size and once for the bytes,
/// again if the value grew in between (`ERANGE`).
fn read_sized(mut call: impl FnMut(*mut u8, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize];
        let got = call(buf.as_mut_ptr(), buf.len());
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ERANGE) {
            return Err(error);
        }
    }
}

/// How `actual` differs from `expected`: one line per differing path, the
/// first [`DIFF_LINES`] of them, then a count of the rest. Empty when they
/// agree.
pub fn diff(expected: &Listing, actual: &Listing, compare: Compare) -> Vec<String> {
    let mut lines = Vec::new();
    let mut more = 0usize;
    for (path, difference) in differences(expected, actual, compare) {
        if lines.len() == DIFF_LINES {
            more += 1;
            continue;
        }
        lines.push(match difference {
            Difference::Missing(want) => format!("- {}: missing ({})", escape(path), summary(want)),
            Difference::Extra(got) => format!("+ {}: extra ({})", escape(path), summary(got)),
            Difference::Fields(fields) => format!("~ {}: {}", escape(path), fields.join(", ")),
        });
    }
    if more > 0 {
        lines.push(format!("… and {more} more differences"));
    }
    lines
}

/// Every path at which `actual` differs from `expected`, sorted.
pub fn differing_paths(expected: &Listing, actual: &Listing, compare: Compare) -> Vec<Vec<u8>> {
    differences(expected, actual, compare)
        .map(|(path, _)| path.clone())
        .collect()
}

/// How one path differs.
enum Difference<'a> {
    /// Only `expected` has it.
    Missing(&'a Entry),
    /// Only `actual` has it.
    Extra(&'a Entry),
    /// Both, with these fields differing (`name want → got`).
    Fields(Vec<String>),
}

/// Each path at which the listings differ, in order, and how.
fn differences<'a>(
    expected: &'a Listing,
    actual: &'a Listing,
    compare: Compare,
) -> impl Iterator<Item = (&'a Vec<u8>, Difference<'a>)> {
    let paths: BTreeSet<&Vec<u8>> = expected.keys().chain(actual.keys()).collect();
    paths.into_iter().filter_map(move |path| {
        if compare.machine_own.iter().any(|own| path.starts_with(own)) {
            return None;
        }
        let difference = match (expected.get(path), actual.get(path)) {
            (Some(want), None) => Difference::Missing(want),
            (None, Some(got)) => Difference::Extra(got),
            (Some(want), Some(got)) => {
                let mut fields = fields_differing(want, got, compare);
                if compare.across_engines && path.as_slice() == b"/" {
                    fields.retain(|field| !field.starts_with("mode "));
                }
                if fields.is_empty() {
                    return None;
                }
                Difference::Fields(fields)
            }
            (None, None) => return None,
        };
        Some((path, difference))
    })
}

/// Each field that differs, as `name want → got`.
fn fields_differing(want: &Entry, got: &Entry, compare: Compare) -> Vec<String> {
    // A directory's times move with its entries; see `Entry::mtime`.
    let times = want.kind != Type::Dir && got.kind != Type::Dir;
    fields(want, compare, times)
        .into_iter()
        .zip(fields(got, compare, times))
        .filter(|(a, b)| a.1 != b.1)
        .map(|((name, a), (_, b))| format!("{name} {a} → {b}"))
        .collect()
}

/// Every compared field of an entry as text, in one order for all.
fn fields(entry: &Entry, compare: Compare, times: bool) -> Vec<(&'static str, String)> {
    let mut out = vec![
        ("type", format!("{:?}", entry.kind)),
        ("mode", format!("{:04o}", entry.mode)),
        ("owner", owner(entry)),
        ("size", opt(entry.size)),
        ("sha256", short_hash(&entry.sha256)),
        ("target", target(entry)),
        ("xattrs", xattr_text(&entry.xattrs)),
        ("link group", group_text(&entry.link_group)),
    ];
    if times {
        out.push(("mtime", entry.mtime.to_string()));
        if compare.nanoseconds {
            out.push(("mtime_nsec", entry.mtime_nsec.to_string()));
        }
    }
    out
}

/// One entry in a few words, for a path only one listing has.
fn summary(entry: &Entry) -> String {
    let mut text = format!("{:?} {:04o} {}", entry.kind, entry.mode, owner(entry));
    if let Some(size) = entry.size {
        let _ = write!(text, " {size} bytes");
    }
    if entry.target.is_some() {
        let _ = write!(text, " → {}", target(entry));
    }
    text
}

fn owner(entry: &Entry) -> String {
    format!("{}:{}", entry.uid, entry.gid)
}

fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A content hash cut to 64 bits: short enough to read, far too long to
/// collide in a listing.
fn short_hash(hash: &Option<String>) -> String {
    hash.as_deref()
        .map_or_else(|| "-".to_owned(), |h| h[..16.min(h.len())].to_owned())
}

fn target(entry: &Entry) -> String {
    entry
        .target
        .as_deref()
        .map_or_else(|| "-".to_owned(), escape)
}

fn xattr_text(xattrs: &BTreeMap<Vec<u8>, Vec<u8>>) -> String {
    let pairs: Vec<String> = xattrs
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect();
    format!("{{{}}}", pairs.join(","))
}

fn group_text(group: &Option<Vec<Vec<u8>>>) -> String {
    group.as_deref().map_or_else(
        || "-".to_owned(),
        |names| {
            let names: Vec<String> = names.iter().map(|name| escape(name)).collect();
            names.join(" ")
        },
    )
}

/// A path (or any name) as text: UTF-8 as it is, other bytes as `\xNN`,
/// a backslash doubled, and a very long name cut to its start and length.
pub fn escape(bytes: &[u8]) -> String {
    bytes
        .split(|b| *b == b'/')
        .map(|name| {
            if name.len() > SHOWN_NAME_BYTES {
                format!(
                    "{}…[{} bytes]",
                    escape_bytes(&name[..SHOWN_NAME_BYTES / 2]),
                    name.len()
                )
            } else {
                escape_bytes(name)
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_come_back_as_bytes() {
        assert_eq!(unescape_octal(b"/a\\040b\\134c"), b"/a b\\c");
        assert_eq!(unescape_octal(b"/plain\\"), b"/plain\\");
    }

    #[test]
    fn names_that_are_not_utf8_are_shown_escaped() {
        assert_eq!(escape(b"/w/x\xffy"), "/w/x\\xffy");
        assert_eq!(escape("/w/é".as_bytes()), "/w/é");
        let long = [b'L'; 255];
        assert!(escape(&long).ends_with("…[255 bytes]"));
    }

    #[test]
    fn directories_times_are_not_compared_and_files_are() {
        let dir = Entry {
            kind: Type::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            size: None,
            sha256: None,
            target: None,
            mtime: 1,
            mtime_nsec: 0,
            xattrs: BTreeMap::new(),
            link_group: None,
        };
        let moved = Entry {
            mtime: 2,
            ..dir.clone()
        };
        assert!(fields_differing(&dir, &moved, Compare::default()).is_empty());
        let file = Entry {
            kind: Type::File,
            ..dir.clone()
        };
        let touched = Entry {
            mtime_nsec: 5,
            ..file.clone()
        };
        assert!(fields_differing(&file, &touched, Compare::default()).is_empty());
        let nanos = Compare {
            nanoseconds: true,
            ..Compare::default()
        };
        assert_eq!(fields_differing(&file, &touched, nanos).len(), 1);
    }
}
