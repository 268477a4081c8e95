use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

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
