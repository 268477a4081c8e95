#![allow(clippy::unwrap_used, reason = "tests")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use sha2::{Digest, Sha256};
use silo_protocol::ErrorKind;
use silo_protocol::bundle::BundleLimits;
use silo_protocol::files::{FileKind, FileQuery};

use super::*;

fn target(dir: &Path, path: &str, confine: Option<&Path>) -> Result<Target, FilesError> {
    let mut query = FileQuery::new(path);
    query.confine = confine.map(|c| c.display().to_string());
    Target::resolve(&query, dir)
}

fn spec(body: &[u8], mode: Option<u32>) -> WriteSpec {
    WriteSpec {
        mode,
        parents: false,
        sha256: hex::encode(Sha256::digest(body)),
        limit: 1024,
    }
}

fn kind_of(err: &FilesError) -> ErrorKind {
    err.kind()
}

#[test]
fn paths_are_checked_lexically_and_confined() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["", "a/../b", "./a", "/a/./b", "a\0b", ".."] {
        let err = target(dir.path(), bad, None).unwrap_err();
        assert_eq!(kind_of(&err), ErrorKind::Malformed, "{bad:?}");
    }
    let rel = target(dir.path(), "sub/f", None).unwrap();
    assert_eq!(rel.path, dir.path().join("sub/f"));
    let err = target(dir.path(), "/etc/hosts", Some(dir.path())).unwrap_err();
    assert_eq!(kind_of(&err), ErrorKind::OutsideConfine);
    let err = target(dir.path(), "/a", Some(Path::new("rel"))).unwrap_err();
    assert_eq!(kind_of(&err), ErrorKind::Malformed);

    // A planted link anywhere below the confining directory refuses the request.
    std::fs::create_dir(dir.path().join("real")).unwrap();
    std::os::unix::fs::symlink("/", dir.path().join("real/link")).unwrap();
    let t = target(dir.path(), "real/link/etc/x", Some(dir.path())).unwrap();
    let err = stat(&t).unwrap_err();
    assert_eq!(kind_of(&err), ErrorKind::OutsideConfine);
    assert!(err.to_string().contains("real/link"), "{err}");
    let t = target(dir.path(), "real/link", Some(dir.path())).unwrap();
    assert_eq!(kind_of(&stat(&t).unwrap_err()), ErrorKind::OutsideConfine);
    // Unconfined, stat describes the link itself.
    let t = target(dir.path(), "real/link", None).unwrap();
    let st = stat(&t).unwrap();
    assert_eq!(
        (st.kind, st.link_target.as_deref()),
        (FileKind::Symlink, Some("/"))
    );
}

#[test]
fn writes_are_atomic_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let t = target(dir.path(), "f", None).unwrap();
    let st = write_file(&t, &spec(b"one", Some(0o600)), &b"one"[..]).unwrap();
    assert_eq!((st.size, st.mode, st.kind), (3, 0o600, FileKind::File));
    // No mode: the existing file's is kept.
    write_file(&t, &spec(b"two!", None), &b"two!"[..]).unwrap();
    let meta = std::fs::metadata(&t.path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    let err = write_file(&t, &spec(b"other", None), &b"three"[..]).unwrap_err();
    assert_eq!(kind_of(&err), ErrorKind::HashMismatch);
    let err = write_file(&t, &spec(&[1; 2000], None), &[1u8; 2000][..]).unwrap_err();
    assert_eq!(kind_of(&err), ErrorKind::TooLarge);
    assert_eq!(std::fs::read(&t.path).unwrap(), b"two!");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "temporary files were left: {names:?}");

    let mut read = String::new();
    std::io::Read::read_to_string(&mut open_read(&t).unwrap(), &mut read).unwrap();
    assert_eq!(read, "two!");
    let d = target(dir.path(), ".", None);
    assert!(d.is_err());
    let d = target(dir.path(), dir.path().to_str().unwrap(), None).unwrap();
    assert_eq!(
        kind_of(&open_read(&d).unwrap_err()),
        ErrorKind::IsADirectory
    );

    // A missing parent is not found, unless asked to make it; a failed
    // write removes the parents it made.
    let deep = target(dir.path(), "a/b/f", None).unwrap();
    let err = write_file(&deep, &spec(b"x", None), &b"x"[..]).unwrap_err();
    assert_eq!(kind_of(&err), ErrorKind::NotFound);
    let mut how = spec(b"x", None);
    how.parents = true;
    write_file(&deep, &how, &b"y"[..]).unwrap_err();
    assert!(!dir.path().join("a").exists());
    let st = write_file(&deep, &how, &b"x"[..]).unwrap();
    assert_eq!(st.mode, DEFAULT_FILE_MODE);
}

#[test]
fn mkdir_list_and_remove() {
    let dir = tempfile::tempdir().unwrap();
    let t = target(dir.path(), "d/e", None).unwrap();
    assert_eq!(
        kind_of(&make_dir(&t, None, false).unwrap_err()),
        ErrorKind::NotFound
    );
    let st = make_dir(&t, Some(0o700), true).unwrap();
    assert_eq!((st.kind, st.mode), (FileKind::Dir, 0o700));
    std::fs::write(dir.path().join("d/b"), "b").unwrap();
    std::os::unix::fs::symlink("/", dir.path().join("d/a")).unwrap();
    let d = target(dir.path(), "d/", None).unwrap();
    let names: Vec<_> = list(&d)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| (e.path, e.kind))
        .collect();
    assert_eq!(
        names,
        [
            ("d/a".to_owned(), FileKind::Symlink),
            ("d/b".to_owned(), FileKind::File),
            ("d/e".to_owned(), FileKind::Dir)
        ]
    );
    let err = remove(&d, false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotEmpty);
    // The link to `/` is unlinked, never followed.
    assert_eq!(remove(&d, true).unwrap().entries, 4);
    assert!(!dir.path().join("d").exists());
    assert_eq!(kind_of(&remove(&d, true).unwrap_err()), ErrorKind::NotFound);
}

#[test]
fn trees_round_trip_through_staging() {
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("top/sub")).unwrap();
    std::fs::write(src.path().join("top/sub/f"), "deep").unwrap();
    std::fs::write(src.path().join("top/g"), "g").unwrap();
    let t = target(src.path(), "top", None).unwrap();
    let mut tar = Vec::new();
    download(&t, &mut tar).unwrap();

    let dst = tempfile::tempdir().unwrap();
    std::fs::create_dir(dst.path().join("into")).unwrap();
    std::fs::write(dst.path().join("into/kept"), "kept").unwrap();
    let t = target(dst.path(), "into", None).unwrap();
    let sha = hex::encode(Sha256::digest(&tar));
    let never = AtomicBool::new(false);
    let limits = BundleLimits::default();
    let how = Upload {
        parents: false,
        sha256: &sha,
        limits: &limits,
        cancelled: &never,
    };
    let done = upload(&t, &how, &tar[..]).unwrap();
    assert_eq!((done.files, done.bytes), (2, 5));
    let read = |p: &str| std::fs::read_to_string(dst.path().join(p)).unwrap();
    assert_eq!(read("into/top/sub/f"), "deep");
    assert_eq!(read("into/kept"), "kept");

    // A wrong hash leaves nothing, not even the staging directory.
    let bad = Upload {
        sha256: &"0".repeat(64),
        ..how
    };
    let fresh = target(dst.path(), "fresh", None).unwrap();
    assert_eq!(
        kind_of(&upload(&fresh, &bad, &tar[..]).unwrap_err()),
        ErrorKind::HashMismatch
    );
    let left: Vec<_> = std::fs::read_dir(dst.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["into"]);
}
