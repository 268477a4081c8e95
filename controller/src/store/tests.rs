use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use silo_protocol::snapshot::{OPAQUE_WHITEOUT, WHITEOUT_PREFIX};
use tar::{EntryType, Header};

use super::*;

/// A layer tar of `(path, kind)` entries: `'d'` a directory, `'f'` a file
/// holding `abc`, `'w'` an empty file (a whiteout marker).
pub(super) fn layer(entries: &[(&str, char)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        let data: &[u8] = match kind {
            'd' => {
                header.set_entry_type(tar::EntryType::Directory);
                b""
            }
            'f' => b"abc",
            _ => b"",
        };
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, path, data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// Writes `bytes` as a blob.
pub(super) fn put(store: &Store, bytes: &[u8]) -> Written {
    let mut writer = store.writer().unwrap();
    writer.write_all(bytes).unwrap();
    writer.finish().unwrap()
}

fn temps(store: &Store) -> usize {
    fs::read_dir(store.root().join("tmp")).unwrap().count()
}

#[test]
fn blobs_are_named_by_their_hash_and_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(store.root()), 0o700);
    assert_eq!(mode(&store.root().join("blobs/sha256")), 0o700);

    let first = put(&store, b"hello");
    assert_eq!(first.digest, Digest::of(b"hello"));
    assert_eq!((first.size, first.new), (5, true));
    let path = store.path(&first.digest);
    assert_eq!(
        path,
        store
            .root()
            .join("blobs/sha256")
            .join(first.digest.as_str())
    );
    assert_eq!(fs::read(&path).unwrap(), b"hello");
    assert_eq!(mode(&path), 0o400);
    assert_eq!(temps(&store), 0);

    let again = put(&store, b"hello");
    assert_eq!(again.digest, first.digest);
    assert!(!again.new);
    assert_eq!(temps(&store), 0);

    let other = put(&store, b"");
    assert!(store.has(&first.digest).unwrap());
    assert_eq!(store.size(&first.digest).unwrap(), 5);
    let mut listed = vec![(first.digest.clone(), 5), (other.digest.clone(), 0)];
    listed.sort();
    assert_eq!(store.list().unwrap(), listed);
    let mut read = String::new();
    io::Read::read_to_string(&mut store.open_blob(&first.digest).unwrap(), &mut read).unwrap();
    assert_eq!(read, "hello");

    // A store opened again through another spelling is the same store.
    let reopened = Store::open(dir.path().join("store/../store")).unwrap();
    assert_eq!(reopened, store);
}

#[test]
fn an_unfinished_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut writer = store.writer().unwrap();
    writer.write_all(&[7u8; 100_000]).unwrap();
    assert_eq!(writer.size(), 100_000);
    assert_eq!(temps(&store), 1);
    drop(writer);
    assert_eq!(temps(&store), 0);
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn missing_blobs_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let absent = Digest::of(b"absent");
    assert!(!store.has(&absent).unwrap());
    for error in [
        store.size(&absent).unwrap_err(),
        store.open_blob(&absent).unwrap_err(),
    ] {
        assert!(matches!(&error, StoreError::Missing { digest, .. } if *digest == absent));
        assert!(error.to_string().contains(absent.as_str()));
    }
}

#[test]
fn gc_waits_for_writers_and_holds_them_off() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let shared = store.shared_lock().unwrap();
    let _another = store.shared_lock().unwrap();
    assert!(store.exclusive_lock(Duration::ZERO).is_err());
    let error = store
        .exclusive_lock(Duration::from_millis(120))
        .unwrap_err();
    assert!(matches!(error, StoreError::LockTimeout { .. }), "{error}");
    drop(shared);
    drop(_another);

    let exclusive = store.exclusive_lock(Duration::from_secs(5)).unwrap();
    assert!(store.exclusive_lock(Duration::ZERO).is_err());
    drop(exclusive);
    assert!(store.exclusive_lock(Duration::ZERO).is_ok());
}

#[test]
fn sweep_and_remove_need_this_stores_exclusive_lock() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("a")).unwrap();
    let other = Store::open(dir.path().join("b")).unwrap();
    let blob = put(&store, b"x");
    // A writer that died: its temp file stays until swept.
    let writer = store.writer().unwrap();
    std::mem::forget(writer);
    fs::create_dir(store.root().join("tmp/stray-dir")).unwrap();
    assert_eq!(temps(&store), 2);

    let foreign = other.exclusive_lock(Duration::from_secs(1)).unwrap();
    assert!(matches!(
        store.sweep_temps(&foreign),
        Err(StoreError::ForeignLock { .. })
    ));
    assert!(matches!(
        store.remove(&blob.digest, &foreign),
        Err(StoreError::ForeignLock { .. })
    ));

    let lock = store.exclusive_lock(Duration::from_secs(1)).unwrap();
    assert_eq!(store.sweep_temps(&lock).unwrap(), 2);
    assert_eq!(temps(&store), 0);
    assert!(store.remove(&blob.digest, &lock).unwrap());
    assert!(!store.remove(&blob.digest, &lock).unwrap());
    assert!(!store.has(&blob.digest).unwrap());
}

/// One entry of a test layer.
pub(super) enum E<'a> {
    Dir(&'a str),
    /// A directory with its own mode.
    DirMode(&'a str, u32),
    File(&'a str, &'a str),
    /// A file with its own mode.
    FileMode(&'a str, &'a str, u32),
    Link(&'a str, &'a str),
    Symlink(&'a str, &'a str),
    Whiteout(&'a str),
    Opaque(&'a str),
    /// An entry with these extended attributes.
    Xattrs(&'a E<'a>, &'a [(&'a str, &'a [u8])]),
}

pub(super) fn stored_layer(store: &Store, entries: &[E<'_>]) -> Digest {
    let mut builder = tar::Builder::new(store.writer().unwrap());
    for entry in entries {
        append_entry(&mut builder, entry);
    }
    builder.into_inner().unwrap().finish().unwrap().digest
}

fn append_entry(builder: &mut tar::Builder<impl io::Write>, entry: &E<'_>) {
    let mut header = Header::new_gnu();
    header.set_mode(0o644);
    header.set_size(0);
    match entry {
        E::Dir(path) | E::DirMode(path, _) => {
            header.set_entry_type(EntryType::Directory);
            header.set_mode(match entry {
                E::DirMode(_, mode) => *mode,
                _ => 0o755,
            });
            builder.append_data(&mut header, path, io::empty()).unwrap();
        }
        E::File(path, text) | E::FileMode(path, text, _) => {
            if let E::FileMode(_, _, mode) = entry {
                header.set_mode(*mode);
            }
            header.set_size(text.len() as u64);
            builder
                .append_data(&mut header, path, text.as_bytes())
                .unwrap();
        }
        E::Link(path, target) => {
            header.set_entry_type(EntryType::Link);
            builder.append_link(&mut header, path, target).unwrap();
        }
        E::Symlink(path, target) => {
            silo_protocol::link::append_symlink(
                builder,
                &mut header,
                Path::new(path),
                target.as_bytes(),
            )
            .unwrap();
        }
        E::Whiteout(path) => {
            let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
            let marker = format!("{parent}/{WHITEOUT_PREFIX}{name}");
            let marker = marker.trim_start_matches('/');
            builder
                .append_data(&mut header, marker, io::empty())
                .unwrap();
        }
        E::Opaque(dir) => {
            let marker = format!("{dir}/{OPAQUE_WHITEOUT}");
            builder
                .append_data(&mut header, marker, io::empty())
                .unwrap();
        }
        E::Xattrs(inner, xattrs) => {
            silo_protocol::extras::Extras {
                mtime: silo_protocol::extras::Mtime::default(),
                xattrs: xattrs
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), value.to_vec()))
                    .collect(),
                patch: None,
            }
            .append(builder)
            .unwrap();
            append_entry(builder, inner);
        }
    }
}

/// What a reader of the file system sees at a path (with the permission
/// bits of directories and files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seen {
    Dir(u32),
    File(u32, Vec<u8>),
    Symlink(Vec<u8>),
    /// A whiteout left in the tree: the engine turns it into a device;
    /// none may survive an apply.
    Marker,
}

/// Applies a layer the way an engine does, onto a tree of paths.
pub(super) fn engine_apply(tree: &mut BTreeMap<String, Seen>, store: &Store, digest: &Digest) {
    let mut archive = tar::Archive::new(store.open_blob(digest).unwrap());
    let mut adds = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let path = path.trim_end_matches('/').to_owned();
        if path == "." {
            // A container's root is the engine's own directory.
            continue;
        }
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", &path));
        let under = |dir: &str| format!("{dir}/").trim_start_matches('/').to_owned();
        if name == OPAQUE_WHITEOUT {
            let prefix = under(parent);
            tree.retain(|p, _| !p.starts_with(&prefix) || prefix.is_empty());
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            let hidden = format!("{}{hidden}", under(parent));
            let prefix = format!("{hidden}/");
            tree.retain(|p, _| *p != hidden && !p.starts_with(&prefix));
            continue;
        }
        let mode = entry.header().mode().unwrap() & 0o7777;
        let seen = match entry.header().entry_type() {
            EntryType::Directory => Seen::Dir(mode),
            EntryType::Symlink => Seen::Symlink(entry.link_name_bytes().unwrap().into_owned()),
            EntryType::Link => {
                let target = entry.link_name_bytes().unwrap().into_owned();
                Seen::File(0, target) // resolved below, in order
            }
            _ => {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                Seen::File(mode, data)
            }
        };
        let hard = entry.header().entry_type() == EntryType::Link;
        adds.push((path, seen, hard));
    }
    for (path, seen, hard) in adds {
        let seen = match (hard, seen) {
            (true, Seen::File(_, target)) => tree[&String::from_utf8(target).unwrap()].clone(),
            (_, seen) => seen,
        };
        let keeps_children =
            matches!(seen, Seen::Dir(_)) && matches!(tree.get(&path), Some(Seen::Dir(_)));
        if !keeps_children {
            let prefix = format!("{path}/");
            tree.retain(|p, _| !p.starts_with(&prefix));
        }
        tree.insert(path, seen);
    }
}
