//! Staging and placing on real files in temporary directories: every
//! reject leaves the tree as it was, and the layer semantics (whiteouts,
//! opaque directories, hard links, symlinks, metadata) come out as an
//! engine would apply them.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::sync::atomic::AtomicBool;

use sha2::{Digest, Sha256};
use silo_protocol::blocks::{BLOCK_BYTES as BLOCK, Patch};
use silo_protocol::extras::{Extras, Mtime};
use tar::{EntryType, Header};

use super::*;
use crate::push::extract::Reject;

/// The layer's modification time of every entry.
const MTIME: u64 = 1_600_000_000;

/// One entry of a hand-built layer.
enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
    Hard(&'a str, &'a str),
    Other(&'a [u8], EntryType),
}

fn owner() -> (u64, u64) {
    if nix::unistd::geteuid().is_root() {
        (4242, 4343)
    } else {
        (
            u64::from(nix::unistd::getuid().as_raw()),
            u64::from(nix::unistd::getgid().as_raw()),
        )
    }
}

/// A tar of `entries`, names written raw (a hostile writer's `..` included).
fn layer(entries: &[E<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = Header::new_gnu();
        header.set_mtime(MTIME);
        let (uid, gid) = owner();
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_size(0);
        header.set_mode(0o644);
        let (name, data): (&[u8], &[u8]) = match entry {
            E::Dir(name, mode) => {
                header.set_entry_type(EntryType::Directory);
                header.set_mode(*mode);
                (name.as_bytes(), &[])
            }
            E::File(name, data, mode) => {
                header.set_entry_type(EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(data.len() as u64);
                (name.as_bytes(), data)
            }
            E::Symlink(name, target) => {
                header.set_entry_type(EntryType::Symlink);
                header.set_link_name_literal(target.as_bytes()).unwrap();
                (name.as_bytes(), &[])
            }
            E::Hard(name, target) => {
                header.set_entry_type(EntryType::Link);
                header.set_link_name_literal(target.as_bytes()).unwrap();
                (name.as_bytes(), &[])
            }
            E::Other(name, kind) => {
                header.set_entry_type(*kind);
                (*name, &[])
            }
        };
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Stages and places `bytes` onto `root`, as the service does.
fn apply_signed(root: &Path, bytes: &[u8], claimed: &str) -> Result<Applied, ApplyError> {
    let staged = stage(
        root,
        "test-1",
        bytes,
        claimed,
        &layer_limits(),
        &AtomicBool::new(false),
    )?;
    staged.place(root)
}

fn apply(root: &Path, bytes: &[u8]) -> Result<Applied, ApplyError> {
    apply_signed(root, bytes, &sha(bytes))
}

/// Every path under `root` with what it is: the type, mode and contents
/// or link target, so two trees compare whole.
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.mode() & 0o7777;
            let what = if meta.file_type().is_symlink() {
                format!("link {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {mode:o}")
            } else if meta.file_type().is_fifo() {
                format!("fifo {mode:o}")
            } else {
                let data = fs::read(&path).unwrap();
                format!("file {mode:o} {}", String::from_utf8_lossy(&data))
            };
            out.insert(rel, what);
        }
    }
    out
}

/// A machine: `etc/keep`, `old/sub/file`, `data/a`, `data/b`, `ln` (a link
/// to `data`), `plain`, and a directory outside the root a link points to.
fn machine() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    for sub in ["etc", "old/sub", "data", "outside"] {
        let base = if sub == "outside" { dir.path() } else { &root };
        fs::create_dir_all(base.join(sub)).unwrap();
    }
    fs::write(root.join("etc/keep"), "keep").unwrap();
    fs::write(root.join("old/sub/file"), "old").unwrap();
    fs::write(root.join("data/a"), "a").unwrap();
    fs::write(root.join("data/b"), "b").unwrap();
    fs::write(root.join("plain"), "plain").unwrap();
    fs::write(dir.path().join("outside/secret"), "secret").unwrap();
    symlink("data", root.join("ln")).unwrap();
    symlink(dir.path().join("outside"), root.join("escape")).unwrap();
    (dir, root)
}

/// `tree` without the agent's own directory.
fn live(root: &Path) -> BTreeMap<String, String> {
    let mut all = tree(root);
    all.retain(|path, _| !path.starts_with(STATE_DIR));
    all
}

fn assert_no_staging_left(root: &Path) {
    let staging = root.join(STATE_DIR).join(STAGING_DIR);
    let left: Vec<_> = fs::read_dir(&staging)
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "staging left behind: {left:?}");
}

#[test]
fn a_layer_is_placed_with_its_metadata() {
    let (_dir, root) = machine();
    let bytes = layer(&[
        E::Dir("./", 0o751),
        E::Dir("usr", 0o755),
        E::Dir("usr/bin", 0o555),
        E::File("usr/bin/tool", b"#!/bin/sh\n", 0o4755),
        E::Hard("usr/bin/tool2", "usr/bin/tool"),
        E::Symlink("usr/bin/sh", "/bin/busybox"),
        E::Dir("tmp", 0o1777),
        E::File("etc/keep", b"new", 0o600),
    ]);
    let applied = apply(&root, &bytes).unwrap();
    let answer = applied.answer(0);
    assert_eq!(
        (
            answer.dirs,
            answer.files,
            answer.symlinks,
            answer.hard_links
        ),
        (4, 2, 1, 1)
    );
    assert_eq!(answer.bytes, 13);
    assert_eq!(answer.entries, 8);
    assert_eq!(answer.sha256, sha(&bytes));
    assert_eq!(answer.skipped_count, 0);
    let meta = |rel: &str| fs::symlink_metadata(root.join(rel)).unwrap();
    // The root's own entry is set last, so its time is the layer's too.
    assert_eq!(meta("").mode() & 0o7777, 0o751);
    assert_eq!(fs::read(root.join("usr/bin/tool")).unwrap(), b"#!/bin/sh\n");
    assert_eq!(meta("usr/bin/tool").mode() & 0o7777, 0o4755);
    assert_eq!(meta("usr/bin/tool").ino(), meta("usr/bin/tool2").ino());
    assert_eq!(meta("usr/bin").mode() & 0o7777, 0o555);
    assert_eq!(meta("tmp").mode() & 0o7777, 0o1777);
    assert_eq!(
        fs::read_link(root.join("usr/bin/sh")).unwrap(),
        Path::new("/bin/busybox")
    );
    assert_eq!(fs::read(root.join("etc/keep")).unwrap(), b"new");
    // Times are the layer's, directories' too (set after their entries).
    for rel in ["usr/bin/tool", "usr/bin", "usr/bin/sh", "tmp", ""] {
        assert_eq!(meta(rel).mtime(), MTIME as i64, "{rel}");
    }
    let (uid, gid) = owner();
    assert_eq!(
        (
            u64::from(meta("usr/bin/tool").uid()),
            u64::from(meta("usr/bin").gid())
        ),
        (uid, gid)
    );
    assert_eq!(answer.owners_applied, nix::unistd::geteuid().is_root());
    assert_no_staging_left(&root);
}

#[test]
fn whiteouts_remove_without_following_links_and_come_before_entries() {
    let (dir, root) = machine();
    let bytes = layer(&[
        E::File(".wh.old", b"", 0o644),
        E::File(".wh.escape", b"", 0o644),
        E::File(".wh.ln", b"", 0o644),
        E::File(".wh.missing", b"", 0o644),
        // A layer's own entry survives its own whiteout, in either order.
        E::File("etc/new", b"n", 0o644),
        E::File("etc/.wh.new", b"", 0o644),
    ]);
    let answer = apply(&root, &bytes).unwrap().answer(0);
    assert_eq!(answer.whiteouts, 5);
    let now = live(&root);
    assert!(!now.contains_key("old") && !now.contains_key("old/sub/file"));
    assert!(!now.contains_key("escape") && !now.contains_key("ln"));
    assert_eq!(now["etc/new"], "file 644 n");
    // What the links pointed at is untouched.
    assert_eq!(now["data/a"], "file 644 a");
    assert_eq!(
        fs::read(dir.path().join("outside/secret")).unwrap(),
        b"secret"
    );
}

#[test]
fn an_opaque_directory_keeps_only_what_the_layer_brings() {
    let (_dir, root) = machine();
    fs::create_dir_all(root.join("proc/self")).unwrap();
    fs::create_dir_all(root.join(STATE_DIR)).unwrap();
    fs::write(root.join(".silo/keep"), "agent").unwrap();
    let bytes = layer(&[
        E::Dir("data", 0o750),
        E::File("data/.wh..wh..opq", b"", 0o644),
        E::File("data/c", b"c", 0o644),
    ]);
    apply(&root, &bytes).unwrap();
    let now = live(&root);
    assert_eq!(now["data"], "dir 750");
    assert_eq!(now["data/c"], "file 644 c");
    assert!(!now.contains_key("data/a") && !now.contains_key("data/b"));
    assert_eq!(now["plain"], "file 644 plain");

    // At the root, only what may never be touched survives beside the new.
    let bytes = layer(&[
        E::File(".wh..wh..opq", b"", 0o644),
        E::File("fresh", b"f", 0o644),
    ]);
    apply(&root, &bytes).unwrap();
    let now = live(&root);
    assert_eq!(
        now.keys().map(String::as_str).collect::<Vec<_>>(),
        ["fresh", "proc", "proc/self"]
    );
    assert_eq!(fs::read(root.join(".silo/keep")).unwrap(), b"agent");
}

#[test]
fn entries_replace_whatever_is_in_their_way() {
    let (_dir, root) = machine();
    let bytes = layer(&[
        // A file over a directory tree, a directory over a file, a symlink
        // over a file, a hard link over a symlink.
        E::File("old", b"now a file", 0o644),
        E::Dir("plain", 0o700),
        E::File("plain/inside", b"i", 0o644),
        E::Symlink("etc/keep", "elsewhere"),
        E::File("data/a", b"A", 0o644),
        E::Hard("ln", "data/a"),
    ]);
    apply(&root, &bytes).unwrap();
    let now = live(&root);
    assert_eq!(now["old"], "file 644 now a file");
    assert!(!now.contains_key("old/sub"));
    assert_eq!(now["plain"], "dir 700");
    assert_eq!(now["plain/inside"], "file 644 i");
    assert_eq!(now["etc/keep"], "link elsewhere");
    assert_eq!(now["ln"], "file 644 A");
}

#[test]
fn devices_and_engine_files_are_skipped_and_listed() {
    let (_dir, root) = machine();
    let before = live(&root);
    let bytes = layer(&[
        E::Other(b"dev0", EntryType::Char),
        E::Other(b"blk", EntryType::Block),
        E::Other(b".wh..wh.plnk", EntryType::Directory),
        E::Other(b"etc/.wh..wh.aufs", EntryType::Regular),
    ]);
    let answer = apply(&root, &bytes).unwrap().answer(0);
    use silo_protocol::layers::SkipReason::*;
    let reasons: Vec<_> = answer.skipped.iter().map(|s| s.reason).collect();
    assert_eq!(reasons, [Device, Device, EngineMetadata, EngineMetadata]);
    assert_eq!(answer.entries, 0);
    assert_eq!(live(&root), before);
}

#[test]
fn a_name_of_255_bytes_is_removed_by_its_marker_of_259() {
    let (_dir, root) = machine();
    let long = "l".repeat(255);
    fs::write(root.join("data").join(&long), "x").unwrap();
    // Names over 100 bytes go in GNU long-name entries.
    let long_layer = |name: &str| {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = Header::new_gnu();
        header.set_entry_type(EntryType::Regular);
        header.set_mtime(MTIME);
        header.set_size(0);
        builder.append_data(&mut header, name, &[][..]).unwrap();
        builder.into_inner().unwrap()
    };
    apply(&root, &long_layer(&format!("data/.wh.{long}"))).unwrap();
    assert!(!root.join("data").join(&long).exists());
    // A name no file system holds is refused before anything is touched.
    let before = live(&root);
    let too_long = long_layer(&format!("data/{}", "x".repeat(259)));
    let refused = apply(&root, &too_long).unwrap_err().to_string();
    assert!(refused.contains("name too long"), "{refused}");
    assert_eq!(live(&root), before);
}

#[test]
fn a_file_of_zeros_comes_back_with_holes_and_the_same_bytes() {
    let (dir, root) = machine();
    let mut data = vec![0u8; 1 << 20];
    data[5000] = 7; // one block of data amid holes, across a block edge
    data[8200] = 9;
    let bytes = layer(&[E::File("sparse", &data, 0o644)]);
    apply(&root, &bytes).unwrap();
    let placed = root.join("sparse");
    assert_eq!(fs::read(&placed).unwrap(), data);
    // Only where the file system makes holes at all.
    let probe = dir.path().join("probe");
    fs::File::create(&probe).unwrap().set_len(1 << 20).unwrap();
    if fs::metadata(&probe).unwrap().blocks() == 0 {
        let allocated = fs::metadata(&placed).unwrap().blocks() * 512;
        assert!(allocated <= 64 * 1024, "{allocated} bytes allocated");
    }
}

#[test]
fn names_that_are_not_utf8_are_placed_linked_and_removed() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let (_dir, root) = machine();
    let at = |name: &[u8]| root.join(OsStr::from_bytes(name));
    fs::write(at(b"old\xff"), "old").unwrap();
    fs::create_dir(at(b"gone\xfe")).unwrap();
    fs::write(at(b"gone\xfe/in"), "in").unwrap();
    let mut builder = tar::Builder::new(Vec::new());
    let (uid, gid) = owner();
    let mut add = |kind: EntryType, name: &[u8], link: Option<&[u8]>, data: &[u8]| {
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mtime(MTIME);
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_mode(if kind == EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_size(data.len() as u64);
        if let Some(link) = link {
            header.set_link_name_literal(link).unwrap();
        }
        builder
            .append_data(&mut header, OsStr::from_bytes(name), data)
            .unwrap();
    };
    add(EntryType::Regular, b".wh.old\xff", None, b"");
    add(EntryType::Regular, b".wh.gone\xfe", None, b"");
    add(EntryType::Directory, b"d\xff", None, b"");
    add(EntryType::Regular, b"d\xff/f\xfe", None, b"data");
    add(EntryType::Link, b"h\xfd", Some(b"d\xff/f\xfe"), b"");
    add(EntryType::Symlink, b"s\xfc", Some(b"to\xfb"), b"");
    let bytes = builder.into_inner().unwrap();
    let answer = apply(&root, &bytes).unwrap().answer(0);
    assert_eq!(answer.skipped_count, 0, "{:?}", answer.skipped);
    assert!(!at(b"old\xff").exists() && !at(b"gone\xfe").exists());
    assert_eq!(fs::read(at(b"d\xff/f\xfe")).unwrap(), b"data");
    let ino = |name: &[u8]| fs::metadata(at(name)).unwrap().ino();
    assert_eq!(ino(b"h\xfd"), ino(b"d\xff/f\xfe"));
    let target = fs::read_link(at(b"s\xfc")).unwrap();
    assert_eq!(target.as_os_str().as_bytes(), b"to\xfb");
}

#[test]
fn fifos_are_placed_and_times_and_attributes_kept() {
    let (_dir, root) = machine();
    let mut builder = tar::Builder::new(Vec::new());
    let (uid, gid) = owner();
    let mut entry = |kind: EntryType, name: &str, mode: u32, nanos: u32, data: &[u8]| {
        let time = Mtime {
            secs: i64::try_from(MTIME).unwrap(),
            nanos,
        };
        let xattrs = match kind {
            EntryType::Regular | EntryType::Directory => {
                vec![("user.silo".to_owned(), format!("{name} attr").into_bytes())]
            }
            _ => Vec::new(),
        };
        Extras {
            mtime: time,
            xattrs,
            patch: None,
        }
        .append(&mut builder)
        .unwrap();
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mtime(time.header_secs());
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, name, data).unwrap();
    };
    entry(EntryType::Directory, "w", 0o755, 7, b"");
    entry(EntryType::Fifo, "w/pipe", 0o640, 123_456_789, b"");
    entry(EntryType::Regular, "w/file", 0o4755, 999_999_999, b"x");
    // A FIFO where a file was, too.
    entry(EntryType::Fifo, "plain", 0o600, 1, b"");
    let bytes = builder.into_inner().unwrap();
    let answer = apply(&root, &bytes).unwrap().answer(0);
    assert_eq!((answer.fifos, answer.skipped_count), (2, 0));
    let now = live(&root);
    assert_eq!(now["w/pipe"], "fifo 640");
    assert_eq!(now["plain"], "fifo 600");
    assert_eq!(now["w/file"], "file 4755 x");
    let nanos = |rel: &str| fs::symlink_metadata(root.join(rel)).unwrap().mtime_nsec();
    assert_eq!(nanos("w/pipe"), 123_456_789);
    assert_eq!(nanos("w/file"), 999_999_999);
    assert_eq!(nanos("plain"), 1);
    assert_eq!(nanos("w"), 7);
    let attr = |rel: &str| xattr::get(root.join(rel), "user.silo").unwrap();
    assert_eq!(attr("w/file").as_deref(), Some(&b"w/file attr"[..]));
    assert_eq!(attr("w").as_deref(), Some(&b"w attr"[..]));
    assert_no_staging_left(&root);
}

/// Applies `bytes`, expects a refusal naming `entry`, and checks that
/// nothing changed.
fn refused(root: &Path, bytes: &[u8], entry: &str) -> ApplyError {
    let before = live(root);
    let err = apply(root, bytes).unwrap_err();
    let message = silo_protocol::http::error_chain(&err);
    assert!(message.contains(entry), "{entry}: {message}");
    assert_eq!(live(root), before, "{message}");
    assert_no_staging_left(root);
    err
}

fn reason(err: &ApplyError) -> Reject {
    match err {
        ApplyError::Stage(ExtractError::Rejected { reason, .. }) => reason.clone(),
        other => panic!("not a rejected entry: {other:?}"),
    }
}

#[test]
fn every_hostile_entry_is_refused_and_changes_nothing() {
    let (_dir, root) = machine();
    let good = E::File("etc/fine", b"fine", 0o644);
    let cases: Vec<(Vec<E<'_>>, &str, Reject)> = vec![
        (
            vec![E::File("../escape", b"x", 0o644)],
            "../escape",
            Reject::DotDot,
        ),
        (
            vec![E::File("/etc/passwd", b"x", 0o644)],
            "/etc/passwd",
            Reject::Absolute,
        ),
        (
            vec![E::File("escape/secret", b"x", 0o644)],
            "escape",
            Reject::ParentSymlink("escape".into()),
        ),
        (
            vec![E::File("ln/a", b"x", 0o644)],
            "ln",
            Reject::ParentSymlink("ln".into()),
        ),
        (
            vec![E::File("plain/x", b"x", 0o644)],
            "plain",
            Reject::ParentNotDir("plain".into()),
        ),
        (
            vec![
                E::File(".wh.x", b"", 0o644),
                E::File("escape/.wh.secret", b"", 0o644),
            ],
            "escape",
            Reject::ParentSymlink("escape".into()),
        ),
        (
            vec![E::Symlink("l", "/proc"), E::File("l/x", b"x", 0o644)],
            "l/x",
            Reject::FileDirClash,
        ),
        (
            vec![E::File("proc/sys/kernel/x", b"x", 0o644)],
            "proc/sys/kernel/x",
            Reject::Excluded("proc".into()),
        ),
        (
            vec![E::Dir("sys", 0o755)],
            "sys",
            Reject::Excluded("sys".into()),
        ),
        (
            vec![E::File("dev/.wh.null", b"", 0o644)],
            "dev/.wh.null",
            Reject::Excluded("dev".into()),
        ),
        (
            vec![E::File(".wh..silo", b"", 0o644)],
            ".wh..silo",
            Reject::Excluded(".silo".into()),
        ),
        (
            vec![E::File(".silo/layers/x", b"", 0o644)],
            ".silo/layers/x",
            Reject::Excluded(".silo".into()),
        ),
        (vec![E::Hard("h", "etc/keep")], "\"h\"", Reject::LinkTarget),
        (
            vec![E::Hard("h", "later"), E::File("later", b"", 0o644)],
            "\"h\"",
            Reject::LinkTarget,
        ),
        (
            vec![E::Dir("d", 0o755), E::Hard("h", "d")],
            "\"h\"",
            Reject::LinkTarget,
        ),
        (
            vec![E::File("a/.wh.", b"", 0o644)],
            "a/.wh.",
            Reject::BadWhiteout,
        ),
        (
            vec![E::File(".wh..", b"", 0o644)],
            ".wh..",
            Reject::BadWhiteout,
        ),
        (
            vec![E::File(".wh...", b"", 0o644)],
            ".wh...",
            Reject::BadWhiteout,
        ),
        (
            vec![E::Symlink("nowhere", "")],
            "nowhere",
            Reject::BadName("a symlink without a target"),
        ),
    ];
    for (mut entries, entry, why) in cases {
        // A good entry first: what it staged must go too.
        entries.insert(0, E::File("etc/fine", b"fine", 0o644));
        let err = refused(&root, &layer(&entries), entry);
        assert_eq!(reason(&err), why, "{entry}");
        assert_eq!(err.kind(), ErrorKind::RejectedEntry, "{entry}");
    }
    // The good entry alone goes in.
    apply(&root, &layer(&[good])).unwrap();
    assert_eq!(live(&root)["etc/fine"], "file 644 fine");
}

#[test]
fn bad_bodies_change_nothing() {
    let (_dir, root) = machine();
    let bytes = layer(&[E::File("etc/new", b"new", 0o644), E::Dir("newdir", 0o755)]);
    let before = live(&root);

    let err = apply_signed(&root, &bytes, &"0".repeat(64)).unwrap_err();
    assert!(
        matches!(err, ApplyError::Stage(ExtractError::HashMismatch { .. })),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::HashMismatch);

    let garbage = vec![7u8; 1024];
    let err = apply(&root, &garbage).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Malformed, "{err:?}");

    // Cut inside the file's contents.
    let cut = &bytes[..512 + 2];
    let err = apply(&root, cut).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Malformed, "{err:?}");

    let few = BundleLimits {
        max_entries: 1,
        ..layer_limits()
    };
    let err = stage(
        &root,
        "t",
        &bytes[..],
        &sha(&bytes),
        &few,
        &AtomicBool::new(false),
    )
    .map(drop)
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);

    let err = stage(
        &root,
        "t",
        &bytes[..],
        &sha(&bytes),
        &layer_limits(),
        &AtomicBool::new(true),
    )
    .map(drop)
    .unwrap_err();
    assert!(
        matches!(err, ApplyError::Stage(ExtractError::Cancelled)),
        "{err:?}"
    );

    assert_eq!(live(&root), before);
    assert_no_staging_left(&root);
}

#[test]
fn placing_across_file_systems_copies() {
    // The staging directory on another file system than the root (tmpfs
    // beside the disk here), so every rename meets EXDEV.
    let (_dir, root) = machine();
    let Ok(other) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    let dev = |path: &Path| fs::metadata(path).unwrap().dev();
    if dev(other.path()) == dev(&root) {
        return;
    }
    let bytes = layer(&[
        E::File("etc/copied", b"copied", 0o4750),
        E::Symlink("etc/linked", "copied"),
    ]);
    let excluded = excluded_roots(&root).unwrap();
    let mut stager = Stager::new(&root, other.path(), &excluded, true);
    let never = AtomicBool::new(false);
    read_archive(
        Packing::Tar,
        &bytes[..],
        &layer_limits(),
        &sha(&bytes),
        &never,
        &mut stager,
    )
    .unwrap();
    let plan = stager.finish();
    let target = Target {
        root: &root,
        staging: other.path(),
        excluded: &excluded,
    };
    let placed = place::place(&plan, target, Resume::default(), || Ok(())).unwrap();
    assert_eq!((placed.files, placed.symlinks), (1, 1));
    let meta = fs::symlink_metadata(root.join("etc/copied")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o4750);
    assert_eq!(meta.mtime(), MTIME as i64);
    assert_eq!(fs::read(root.join("etc/copied")).unwrap(), b"copied");
    assert_eq!(
        fs::read_link(root.join("etc/linked")).unwrap(),
        Path::new("copied")
    );
    let stray: Vec<_> = fs::read_dir(root.join("etc"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".silo-apply"))
        .collect();
    assert!(stray.is_empty());
}

#[test]
fn a_later_boot_sweeps_staging_leftovers() {
    let (_dir, root) = machine();
    let layers = root.join(STATE_DIR).join(STAGING_DIR);
    fs::create_dir_all(layers.join("oldboot-3/sub")).unwrap();
    fs::create_dir_all(layers.join("now-1")).unwrap();
    let applier = Applier::new(root.clone(), "now".into());
    assert_eq!(applier.clean_leftovers(), 1);
    assert!(layers.join("now-1").exists() && !layers.join("oldboot-3").exists());
}

#[test]
fn a_symlinked_state_directory_is_refused() {
    let (dir, root) = machine();
    symlink(dir.path().join("outside"), root.join(STATE_DIR)).unwrap();
    let bytes = layer(&[E::File("etc/x", b"x", 0o644)]);
    let err = apply(&root, &bytes).unwrap_err();
    assert!(matches!(err, ApplyError::Io(_)), "{err:?}");
    assert!(!dir.path().join("outside/layers").exists());
}

#[test]
fn placing_errors_say_the_layer_is_incomplete() {
    let err = ApplyError::Incomplete(FsError::new(
        "rename into place",
        Path::new("/x"),
        std::io::Error::from_raw_os_error(libc::ENOSPC),
    ));
    assert_eq!(err.kind(), ErrorKind::Incomplete);
    assert_eq!(ApplyError::Busy.kind(), ErrorKind::Busy);
    assert_eq!(
        ApplyError::from(crate::body::BodyError::TooLarge {
            declared: Some(2),
            limit: 1
        })
        .kind(),
        ErrorKind::TooLarge
    );
}

#[test]
fn the_modes_of_new_directories_do_not_block_their_entries() {
    let (_dir, root) = machine();
    let bytes = layer(&[
        E::Dir("locked", 0o000),
        E::Dir("locked/inner", 0o500),
        E::File("locked/inner/f", b"f", 0o400),
    ]);
    apply(&root, &bytes).unwrap();
    let mode = |rel: &str| fs::symlink_metadata(root.join(rel)).unwrap().mode() & 0o7777;
    assert_eq!((mode("locked"), mode("locked/inner")), (0o000, 0o500));
    fs::set_permissions(root.join("locked"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::read(root.join("locked/inner/f")).unwrap(), b"f");
}

#[test]
fn a_placing_cut_half_way_is_finished_at_the_next_boot() {
    // A directory replaced (its whiteout and its new self in one layer, so
    // running the removals again would remove what was placed), files, a
    // symlink over a file, a hard link and a directory's mode.
    let bytes = layer(&[
        E::File(".wh.data", b"", 0o644),
        E::Dir("data", 0o750),
        E::File("data/a", b"new a", 0o600),
        E::File("data/z", b"z", 0o644),
        E::Hard("data/hard", "data/a"),
        E::Symlink("plain", "data/z"),
        E::Dir("etc", 0o711),
        E::File("etc/keep", b"kept anew", 0o644),
        E::File("old/.wh.sub", b"", 0o644),
    ]);
    let (_whole_dir, whole) = machine();
    apply(&whole, &bytes).unwrap();
    // Each machine's link out of its root names its own scratch directory.
    let tree = |root: &Path| {
        let mut tree = live(root);
        tree.remove("escape");
        tree
    };

    for cut in [0, 2, 4, 6] {
        let (_dir, root) = machine();
        let staged = stage(
            &root,
            "test-1",
            &bytes[..],
            &sha(&bytes),
            &layer_limits(),
            &AtomicBool::new(false),
        )
        .unwrap();
        journal::write(&staged.staging, &staged.plan).unwrap();
        // The agent dies after `cut` entries: the removals and those are done.
        let mut part = staged.plan.clone();
        part.steps.truncate(cut);
        let target = Target {
            root: &root,
            staging: &staged.staging,
            excluded: &staged.excluded,
        };
        place::place(&part, target, Resume::default(), || {
            journal::mark_removed(&staged.staging)
        })
        .unwrap();
        assert_ne!(tree(&root), tree(&whole), "cut after {cut}");
        // A leftover sweep of the next boot leaves a journaled layer alone.
        Applier::new(root.clone(), "next".into()).clean_leftovers();

        let done = journal::finish_interrupted(&root);
        assert_eq!(
            (done.finished, done.failed.len()),
            (1, 0),
            "cut after {cut}"
        );
        assert_eq!(tree(&root), tree(&whole), "cut after {cut}");
        assert_no_staging_left(&root);
        let meta = |rel: &str| fs::symlink_metadata(root.join(rel)).unwrap();
        assert_eq!(meta("data/a").ino(), meta("data/hard").ino());
        // Nothing is left to finish at the boot after.
        assert_eq!(journal::finish_interrupted(&root).finished, 0);
    }
}

#[test]
fn a_directory_tree_goes_back_where_a_file_replaced_it() {
    let (_dir, root) = machine();
    // `plain` is a file on the machine; the layer makes it a tree again,
    // and removes a path below it that the machine cannot have (as a
    // restoring layer does for what the tree it goes back from had there).
    let bytes = layer(&[
        E::Dir("plain", 0o755),
        E::Dir("plain/d3", 0o755),
        E::Dir("plain/d3/d4", 0o755),
        E::Other(b"plain/d3/d4/.wh.f", EntryType::Regular),
        E::File("plain/d3/d4/f", b"y", 0o644),
    ]);
    apply(&root, &bytes).unwrap();
    let now = live(&root);
    assert_eq!(now["plain"], "dir 755");
    assert_eq!(now["plain/d3/d4/f"], "file 644 y");
}

#[test]
fn an_empty_xattr_on_a_directory_is_put_back() {
    use crate::snapshot::walk::Sink;
    // A snapshot's layer of a directory and a file, each with an attribute
    // whose value is empty (which is not an absent one) and one whose
    // value holds newlines.
    let source = tempfile::tempdir().unwrap();
    fs::create_dir(source.path().join("etc")).unwrap();
    fs::write(source.path().join("etc/keep"), "kept").unwrap();
    let lines = b"\n19 path=/etc/passwd\n";
    for rel in ["etc", "etc/keep"] {
        xattr::set(source.path().join(rel), "user.empty", b"").unwrap();
        xattr::set(source.path().join(rel), "user.lines", lines).unwrap();
    }
    let mut bytes = Vec::new();
    let mut snapshot = crate::snapshot::layer::Layer::new(source.path(), &mut bytes);
    for rel in ["etc", "etc/keep"] {
        let meta = fs::symlink_metadata(source.path().join(rel)).unwrap();
        snapshot.entry(Path::new(rel), &meta).unwrap();
    }
    snapshot.finish().unwrap();
    // Put back in place: `etc` is there, without the empty attribute and
    // with one the snapshot lacks.
    let (_dir, root) = machine();
    xattr::set(root.join("etc"), "user.gone", b"old").unwrap();
    xattr::set(root.join("etc"), "user.lines", b"other").unwrap();
    apply(&root, &bytes).unwrap();
    for rel in ["etc", "etc/keep"] {
        let path = root.join(rel);
        let get = |name: &str| xattr::get(&path, name).unwrap();
        assert_eq!(get("user.empty").as_deref(), Some(&b""[..]), "{rel}");
        assert_eq!(get("user.lines").as_deref(), Some(&lines[..]), "{rel}");
        assert_eq!(get("user.gone"), None, "{rel}");
    }
    assert!(!root.join("etc/passwd").exists());
}

#[test]
fn a_directory_s_attributes_are_replaced_without_overflowing_the_inode_s_space() {
    use crate::snapshot::walk::Sink;
    // Each value alone fits beside an inode (about 4 KiB on ext4); the
    // old one and the new one together do not.
    let (big, small) = (vec![b'x'; 3000], b"s".to_vec());
    let source = tempfile::tempdir().unwrap();
    fs::create_dir(source.path().join("etc")).unwrap();
    xattr::set(source.path().join("etc"), "user.a", &big).unwrap();
    xattr::set(source.path().join("etc"), "user.b", &small).unwrap();
    let mut bytes = Vec::new();
    let mut snapshot = crate::snapshot::layer::Layer::new(source.path(), &mut bytes);
    let meta = fs::symlink_metadata(source.path().join("etc")).unwrap();
    snapshot.entry(Path::new("etc"), &meta).unwrap();
    snapshot.finish().unwrap();

    let (_dir, root) = machine();
    xattr::set(root.join("etc"), "user.b", &big).unwrap();
    if xattr::set(root.join("etc"), "user.a", &big).is_ok() {
        // A file system with room for both proves nothing here.
        return;
    }
    apply(&root, &bytes).unwrap();
    let get = |name: &str| xattr::get(root.join("etc"), name).unwrap();
    assert_eq!(get("user.a"), Some(big));
    assert_eq!(get("user.b"), Some(small));
}

/// A layer of one patch entry on `name`: `patch`'s ranges taken from
/// `target`, with `xattrs`.
fn patch_layer(
    name: &str,
    target: &[u8],
    patch: &Patch,
    xattrs: Vec<(String, Vec<u8>)>,
) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut data = Vec::new();
    for range in &patch.ranges {
        let at = usize::try_from(range.at).unwrap();
        data.extend_from_slice(&target[at..at + usize::try_from(range.len).unwrap()]);
    }
    Extras {
        mtime: Mtime {
            secs: 1_700_000_000,
            nanos: 123,
        },
        xattrs,
        patch: None,
    }
    .append_patch(&mut builder, patch)
    .unwrap();
    let mut header = Header::new_gnu();
    header.set_entry_type(EntryType::Regular);
    let (uid, gid) = owner();
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_mode(0o4751);
    header.set_mtime(1_700_000_000);
    header.set_size(data.len() as u64);
    builder.append_data(&mut header, name, &data[..]).unwrap();
    builder.into_inner().unwrap()
}

#[test]
fn a_patch_writes_only_the_blocks_that_differ_and_keeps_holes() {
    use silo_protocol::blocks::{BlockSums, Range};
    let (dir, root) = machine();
    // The target: data, a hole's worth of zeros, data, a partial tail.
    let block = BLOCK as usize;
    let mut target: Vec<u8> = (0..6 * block + 300).map(|i| (i % 253) as u8).collect();
    target[2 * block..3 * block].fill(0);
    // The live file: one byte changed in block 1, block 2 written with
    // data where the target has zeros, block 4 the same, and 9 KiB more.
    let mut live_data = target.clone();
    live_data[block + 17] ^= 0xff;
    live_data[2 * block..3 * block].fill(5);
    live_data.extend_from_slice(&[1u8; 9000]);
    fs::write(root.join("data/big"), &live_data).unwrap();
    xattr::set(root.join("data/big"), "user.gone", b"x").unwrap();
    let sums = BlockSums::read(&live_data[..]).unwrap();
    let wanted = BlockSums::read(&target[..]).unwrap();
    let size = target.len() as u64;
    let ranges = sums.differing(&wanted, size);
    assert_eq!(
        ranges,
        [
            Range {
                at: BLOCK,
                len: 2 * BLOCK
            },
            Range {
                at: 6 * BLOCK,
                len: 300
            }
        ]
    );
    let inode = fs::metadata(root.join("data/big")).unwrap().ino();
    let patch = Patch { size, ranges };
    let bytes = patch_layer(
        "data/big",
        &target,
        &patch,
        vec![("user.kept".into(), b"".to_vec())],
    );
    let applied = apply(&root, &bytes).unwrap();
    assert_eq!(
        applied.placed.bytes,
        2 * BLOCK + 300,
        "only the patch's bytes are written"
    );
    let placed = root.join("data/big");
    assert_eq!(fs::read(&placed).unwrap(), target);
    let meta = fs::metadata(&placed).unwrap();
    assert_eq!(meta.ino(), inode, "patched in place");
    assert_eq!(meta.mode() & 0o7777, 0o4751);
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_700_000_000, 123));
    let names: Vec<_> = xattr::list(&placed).unwrap().collect();
    assert_eq!(names, ["user.kept"], "attributes made exactly the entry's");
    // Block 2, zeros in the target, became a hole where holes are made.
    let probe = dir.path().join("probe");
    fs::File::create(&probe).unwrap().set_len(1 << 20).unwrap();
    if fs::metadata(&probe).unwrap().blocks() == 0 {
        let allocated = meta.blocks() * 512;
        assert!(allocated <= 5 * BLOCK + 8192, "{allocated} bytes allocated");
    }
    // Placed twice (an agent that died half way): the same file.
    apply(&root, &bytes).unwrap();
    assert_eq!(fs::read(&placed).unwrap(), target);
    assert_no_staging_left(&root);
}

#[test]
fn a_patch_on_anything_but_a_file_with_one_name_is_refused_and_changes_nothing() {
    let (_dir, root) = machine();
    fs::hard_link(root.join("data/a"), root.join("data/a2")).unwrap();
    let patch = Patch {
        size: 3,
        ranges: vec![silo_protocol::blocks::Range { at: 0, len: 3 }],
    };
    for name in ["ln", "data", "data/a", "missing"] {
        let bytes = patch_layer(name, b"new", &patch, Vec::new());
        assert_eq!(
            reason(&refused(&root, &bytes, name)),
            Reject::PatchTarget,
            "{name}"
        );
    }
    // A patch whose data is not its ranges' is no layer at all.
    let mut bytes = patch_layer("plain", b"new", &patch, Vec::new());
    let at = bytes.windows(7).position(|w| w == b"=3 0+3\n").unwrap();
    bytes[at + 5] = b'2';
    let before = live(&root);
    assert!(apply(&root, &bytes).is_err());
    assert_eq!(live(&root), before);
}
