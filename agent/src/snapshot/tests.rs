//! The walk and the layer together, on real files in a temporary directory.

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tar::EntryType;

use super::walk::{Baseline, Hint, WalkSpec};
use super::*;

/// One entry of a produced layer, as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    path: String,
    kind: EntryType,
    mode: u32,
    link: Option<String>,
    content: Vec<u8>,
}

/// The entries of a layer after the root's own, which every layer starts
/// with.
fn read_layer(bytes: &[u8]) -> Vec<Seen> {
    let mut seen = read_whole_layer(bytes);
    let root = seen.remove(0);
    assert_eq!(
        (root.path.as_str(), root.kind),
        ("./", EntryType::Directory)
    );
    seen
}

fn read_whole_layer(bytes: &[u8]) -> Vec<Seen> {
    // A complete layer ends with the end marker.
    assert!(bytes.len() >= 1024 && bytes.ends_with(&[0; 1024]));
    let mut archive = tar::Archive::new(bytes);
    archive
        .entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let mut content = Vec::new();
            entry.read_to_end(&mut content).unwrap();
            Seen {
                path: entry.path().unwrap().to_string_lossy().into_owned(),
                kind: entry.header().entry_type(),
                mode: entry.header().mode().unwrap(),
                link: entry
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned()),
                content,
            }
        })
        .collect()
}

fn names(seen: &[Seen]) -> Vec<&str> {
    seen.iter().map(|s| s.path.as_str()).collect()
}

fn now_ns() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_nanos()).unwrap()
}

/// File system timestamps come from a coarse clock (a tick behind at
/// most): a pause on each side of the threshold keeps "before" and "after"
/// apart.
const TICK: Duration = Duration::from_millis(30);

/// The tree as the "image" left it, then the changes the "sandbox" made.
/// Answers the root, the threshold and the baseline.
fn sandbox() -> (tempfile::TempDir, i64, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let write = |rel: &str, text: &str| fs::write(root.join(rel), text).unwrap();
    for sub in ["a/deep", "tmp", "skip", "mnt", "quiet/inner"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    write("keep.txt", "keep");
    write("gone.txt", "gone");
    write("a/deep/x", "x");
    write("tmp/edit.txt", "before");
    write("skip/old", "old");
    write("hl1", "linked");
    write("quiet/inner/same", "same");
    let baseline = [
        "a",
        "a/deep",
        "a/deep/x",
        "gone.txt",
        "hl1",
        "keep.txt",
        "mnt",
        "quiet",
        "quiet/inner",
        "quiet/inner/same",
        "skip",
        "skip/old",
        "tmp",
        "tmp/edit.txt",
    ]
    .map(String::from)
    .to_vec();

    std::thread::sleep(TICK);
    let since = now_ns();
    std::thread::sleep(TICK);

    fs::remove_file(root.join("gone.txt")).unwrap();
    fs::remove_dir_all(root.join("a/deep")).unwrap();
    // Content only: the 1777 directory itself does not change.
    write("tmp/edit.txt", "after");
    write("skip/new", "new");
    write("mnt/inside", "mounted");
    fs::hard_link(root.join("hl1"), root.join("hl2")).unwrap();
    symlink("target/../x", root.join("link")).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    let long = format!("a/{}", "n".repeat(150));
    write(&long, "long");
    (dir, since, baseline)
}

fn spec(since: i64, baseline: &[String], excluded: &[&str]) -> WalkSpec {
    WalkSpec {
        changed_since_ns: since,
        excluded: excluded.iter().map(PathBuf::from).collect::<HashSet<_>>(),
        baseline: Baseline::new(&bytes(baseline)),
        hint: None,
    }
}

/// Paths as a baseline holds them.
fn bytes(paths: &[String]) -> Vec<Vec<u8>> {
    paths.iter().map(|path| path.as_bytes().to_vec()).collect()
}

/// The baseline an agent keeps after a first snapshot of `root` against
/// `paths`, which finds nothing new but notes every inode; a tick passes
/// on each side of it.
fn kept_after_a_first_snapshot(root: &Path, paths: &[String]) -> Baseline {
    std::thread::sleep(TICK);
    let mut first = spec(now_ns(), paths, &[]);
    let (_, mut changes) = write_layer(root, &first, &mut Vec::new()).unwrap();
    let (_, kept) = Source::List(bytes(paths))
        .after(&mut changes, &mut first.baseline)
        .unwrap();
    std::thread::sleep(TICK);
    kept
}

fn layer_of(root: &Path, spec: &WalkSpec) -> Vec<Seen> {
    let mut out = Vec::new();
    write_layer(root, spec, &mut out).unwrap();
    read_layer(&out)
}

#[test]
fn every_layer_starts_with_the_root_s_own_metadata() {
    let (dir, since, baseline) = sandbox();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o751)).unwrap();
    let mut out = Vec::new();
    write_layer(dir.path(), &spec(since, &baseline, &[]), &mut out).unwrap();
    let seen = read_whole_layer(&out);
    assert_eq!(
        (seen[0].path.as_str(), seen[0].kind, seen[0].mode),
        ("./", EntryType::Directory, 0o751)
    );
    // With nothing changed since, it goes in all the same.
    std::thread::sleep(TICK);
    let mut out = Vec::new();
    write_layer(dir.path(), &spec(now_ns(), &baseline, &[]), &mut out).unwrap();
    assert_eq!(names(&read_whole_layer(&out))[0], "./");
}

#[test]
fn the_layer_holds_exactly_the_changes_in_walk_order() {
    let (dir, since, baseline) = sandbox();
    let seen = layer_of(dir.path(), &spec(since, &baseline, &["skip", "mnt"]));
    let long = format!("a/{}", "n".repeat(150));
    assert_eq!(
        names(&seen),
        vec![
            ".wh.gone.txt",
            "a",
            "a/.wh.deep",
            long.as_str(),
            "fifo",
            "hl1",
            "hl2",
            "link",
            "tmp",
            "tmp/edit.txt",
        ]
    );
    let by_name = |name: &str| seen.iter().find(|s| s.path == name).unwrap().clone();

    // Deletions: empty files; only the top of a deleted tree.
    let whiteout = by_name(".wh.gone.txt");
    assert_eq!(whiteout.kind, EntryType::Regular);
    assert!(whiteout.content.is_empty());
    assert!(!names(&seen).iter().any(|n| n.contains(".wh.x")));

    // The unchanged 1777 parent of a changed file comes with its real mode.
    let tmp = by_name("tmp");
    assert_eq!(tmp.kind, EntryType::Directory);
    assert_eq!(tmp.mode, 0o1777);
    assert_eq!(by_name("tmp/edit.txt").content, b"after");

    // A second name of the same inode is a hard link to the first.
    assert_eq!(by_name("hl1").content, b"linked");
    let hl2 = by_name("hl2");
    assert_eq!(hl2.kind, EntryType::Link);
    assert_eq!(hl2.link.as_deref(), Some("hl1"));

    let link = by_name("link");
    assert_eq!(link.kind, EntryType::Symlink);
    assert_eq!(link.link.as_deref(), Some("target/../x"));
    let fifo = by_name("fifo");
    assert_eq!((fifo.kind, fifo.mode), (EntryType::Fifo, 0o640));
    assert_eq!(by_name(&long).content, b"long");
}

#[test]
fn a_moved_directory_is_captured_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("lib/sub")).unwrap();
    fs::write(root.join("lib/sub/file"), "kept").unwrap();
    let baseline = ["lib", "lib/sub", "lib/sub/file"]
        .map(String::from)
        .to_vec();
    std::thread::sleep(TICK);
    let since = now_ns();
    std::thread::sleep(TICK);
    // A rename moves the directory's own ctime, not its entries'.
    fs::rename(root.join("lib"), root.join("moved")).unwrap();
    let seen = layer_of(root, &spec(since, &baseline, &[]));
    assert_eq!(
        names(&seen),
        [".wh.lib", "moved", "moved/sub", "moved/sub/file"]
    );
}

#[test]
fn a_later_snapshot_finds_changes_below_directories_whose_times_did_not_move() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("work/deep")).unwrap();
    fs::write(root.join("work/deep/notes"), "image").unwrap();
    fs::write(root.join("work/old"), "image").unwrap();
    let image = ["work", "work/deep", "work/deep/notes", "work/old"]
        .map(String::from)
        .to_vec();
    std::thread::sleep(TICK);
    let start = now_ns();
    std::thread::sleep(TICK);
    fs::write(root.join("work/deep/made"), "first").unwrap();
    fs::write(root.join("work/deep/notes"), "first").unwrap();
    std::thread::sleep(TICK);
    let first = now_ns();
    std::thread::sleep(TICK);
    // After the first snapshot: a file's content, and a deletion two levels
    // below `work`, whose own times do not move (as an image directory's
    // on fuse-overlayfs, or any directory whose entries stay the same).
    fs::write(root.join("work/deep/notes"), "second").unwrap();
    fs::remove_file(root.join("work/deep/made")).unwrap();
    let mut tree = image.clone();
    tree.push("work/deep/made".into());

    let seen = layer_of(root, &spec(first, &tree, &[]));
    assert_eq!(
        names(&seen),
        ["work", "work/deep", "work/deep/.wh.made", "work/deep/notes"]
    );
    assert_eq!(seen[3].content, b"second");
    // `work/old` was left alone throughout and is in neither layer.
    let whole = layer_of(root, &spec(start, &image, &[]));
    assert!(!names(&whole).contains(&"work/old"));
}

#[test]
fn a_name_the_baseline_lacks_is_captured_whatever_its_times() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::write(root.join("usr/bin/sh"), "image").unwrap();
    fs::create_dir_all(root.join("made/sub")).unwrap();
    fs::write(root.join("made/sub/file"), "old times").unwrap();
    fs::write(root.join("usr/bin/newfile"), "new").unwrap();
    let image = ["usr", "usr/bin", "usr/bin/sh"].map(String::from).to_vec();
    // Every ctime is before the threshold: only the names say what is new.
    std::thread::sleep(TICK);
    let later = now_ns();
    let seen = layer_of(root, &spec(later, &image, &[]));
    assert_eq!(
        names(&seen),
        [
            "made",
            "made/sub",
            "made/sub/file",
            "usr",
            "usr/bin",
            "usr/bin/newfile"
        ]
    );
}

#[test]
fn every_directory_is_walked_and_nothing_is_older_than_the_threshold() {
    let (dir, since, baseline) = sandbox();
    let seen = layer_of(dir.path(), &spec(since, &baseline, &["skip", "mnt"]));
    let names = names(&seen);
    // `tmp` did not change, yet its edited file is found.
    assert!(names.contains(&"tmp") && names.contains(&"tmp/edit.txt"));
    assert!(names.contains(&"hl2") && names.contains(&".wh.gone.txt"));

    // Without exclusions the excluded trees show up, and with a threshold in
    // the future only what the baseline lacks does: no directory changed
    // after it, so none lost an entry.
    let all = layer_of(dir.path(), &spec(since, &baseline, &[]));
    let all = self::names(&all);
    assert!(all.contains(&"skip/new") && all.contains(&"mnt/inside"));
    assert!(!all.contains(&"skip/old") && !all.contains(&"keep.txt"));
    let future = layer_of(dir.path(), &spec(i64::MAX, &baseline, &[]));
    let future = self::names(&future);
    assert!(future.contains(&"fifo") && !future.contains(&".wh.gone.txt"));
    assert!(!future.contains(&"tmp/edit.txt") && !future.contains(&"keep.txt"));
    // `hl2` is new, and `hl1` is another name of its file.
    assert!(future.contains(&"hl2") && future.contains(&"hl1"));
}

#[test]
fn excluding_the_root_gives_an_empty_layer_and_bad_exclusions_are_refused() {
    let (dir, since, baseline) = sandbox();
    let mut out = Vec::new();
    write_layer(dir.path(), &spec(since, &baseline, &[""]), &mut out).unwrap();
    assert!(read_whole_layer(&out).is_empty());
    let ok = excluded(&["/etc/hosts".into(), "/.silo/".into(), "/".into()]).unwrap();
    assert!(ok.contains(Path::new("etc/hosts")) && ok.contains(Path::new(".silo")));
    assert!(ok.contains(Path::new("")));
    for bad in ["relative", "/a/../b", ""] {
        let err = excluded(&[bad.into()]).unwrap_err();
        assert!(err.contains("must be absolute"), "{err}");
    }
}

#[test]
fn errors_map_to_the_protocol_kinds() {
    let cases = [
        (SnapshotError::Unsupported, ErrorKind::Unsupported, 501),
        (SnapshotError::Busy, ErrorKind::Busy, 409),
        (
            SnapshotError::from(crate::body::BodyError::over(1)),
            ErrorKind::TooLarge,
            413,
        ),
        (
            SnapshotError::Internal("x".into()),
            ErrorKind::Internal,
            500,
        ),
    ];
    for (err, kind, status) in cases {
        assert_eq!(err.kind(), kind);
        assert_eq!(kind.status(), Some(status));
    }
}

#[tokio::test]
async fn outside_pid_1_a_snapshot_is_unsupported() {
    let request = SnapshotRequest {
        changed_since_ns: 0,
        prune_unchanged_dirs: true,
        descend_since_ns: None,
        exclude: Vec::new(),
        baseline: Vec::new(),
        baseline_raw: Vec::new(),
        baseline_digest: None,
        walk_hint: None,
        rewind_to: None,
        block_sums: false,
    };
    let unused = async { Err(SnapshotError::Internal("not reached".into())) };
    let ops = Arc::new(crate::process::System::default());
    let snapshots = Snapshotter::new(PathBuf::from("/"), None, ops);
    let refused = snapshots.start(request, unused).await;
    assert!(matches!(refused, Err(SnapshotError::Unsupported)));
}

#[test]
fn a_kept_tree_walks_as_the_paths_it_stands_for() {
    let (dir, since, baseline) = sandbox();
    let root = dir.path();
    let mut first = spec(since, &baseline, &["mnt"]);
    let mut out = Vec::new();
    let (_, mut changes) = write_layer(root, &first, &mut out).unwrap();
    let (tree, kept) = Source::List(bytes(&baseline))
        .after(&mut changes, &mut first.baseline)
        .unwrap();
    let paths: Vec<String> = read_layer(&out)
        .iter()
        .map(|seen| seen.path.trim_end_matches('/').to_owned())
        .collect();
    assert!(paths.contains(&".wh.gone.txt".to_owned()), "{paths:?}");
    assert!(paths.contains(&"skip/new".to_owned()), "{paths:?}");

    // What the tree holds, rebuilt from the layer by the index's rules:
    // the deleted paths are gone, the new ones there with their parents.
    let listed: Vec<String> = {
        let mut all = vec![
            "a",
            "fifo",
            "hl1",
            "hl2",
            "keep.txt",
            "link",
            "mnt",
            "quiet",
            "quiet/inner",
            "quiet/inner/same",
            "skip",
            "skip/new",
            "skip/old",
            "tmp",
            "tmp/edit.txt",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        all.push(format!("a/{}", "n".repeat(150)));
        all.sort();
        all
    };
    assert_eq!(
        tree.digest(),
        silo_protocol::snapshot::tree_digest(listed.iter().map(String::as_bytes))
    );
    assert_eq!(
        kept.clone().without_inodes(),
        Baseline::new(&bytes(&listed))
    );

    // A second round of changes walks the same against the kept index as
    // against the paths a request would carry.
    std::thread::sleep(TICK);
    let again = now_ns();
    std::thread::sleep(TICK);
    fs::remove_file(root.join("skip/old")).unwrap();
    fs::write(root.join("quiet/inner/new"), "n").unwrap();
    let by_kept = WalkSpec {
        baseline: kept,
        ..spec(again, &[], &["mnt"])
    };
    let by_paths = spec(again, &listed, &["mnt"]);
    let layer = layer_of(root, &by_kept);
    assert_eq!(layer, layer_of(root, &by_paths));
    assert!(
        names(&layer).contains(&"skip/.wh.old"),
        "{:?}",
        names(&layer)
    );
}

#[tokio::test]
async fn a_digest_of_no_kept_tree_is_refused_before_anything_stops() {
    let request = SnapshotRequest {
        changed_since_ns: 0,
        prune_unchanged_dirs: true,
        descend_since_ns: None,
        exclude: Vec::new(),
        baseline: Vec::new(),
        baseline_raw: Vec::new(),
        baseline_digest: Some(silo_protocol::snapshot::tree_digest([&b"etc"[..]])),
        walk_hint: None,
        rewind_to: None,
        block_sums: false,
    };
    let pushes = Arc::new(Semaphore::new(1));
    let hold = async move {
        pushes
            .try_acquire_owned()
            .map_err(|e| SnapshotError::Internal(e.to_string()))
    };
    // A scope whose freeze would stop nothing of this test's: refused first.
    let ops = Arc::new(crate::process::System::default());
    let snapshots = Snapshotter::new(PathBuf::from("/"), Some(FreezeScope::Descendants), ops);
    let refused = snapshots.start(request, hold).await;
    let Err(err) = refused else {
        panic!("a digest of no kept tree was walked against");
    };
    assert_eq!(err.kind(), ErrorKind::UnknownBaseline);
    assert_eq!(err.kind().status(), Some(412));
    assert!(err.to_string().contains("keeps no tree"), "{err}");
}

#[test]
fn a_directory_moved_onto_a_path_the_baseline_has_is_found_by_its_inodes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (sub, text) in [("w/x/sub", "A"), ("w/y/sub", "B")] {
        fs::create_dir_all(root.join(sub)).unwrap();
        fs::write(root.join(sub).join("f"), text).unwrap();
    }
    let paths = [
        "w",
        "w/x",
        "w/x/sub",
        "w/x/sub/f",
        "w/y",
        "w/y/sub",
        "w/y/sub/f",
    ]
    .map(String::from)
    .to_vec();
    let kept = kept_after_a_first_snapshot(root, &paths);
    let since = now_ns();
    std::thread::sleep(TICK);
    // `y` replaces `x`: its entries keep their old ctimes and the names
    // the baseline has under `x`.
    fs::remove_dir_all(root.join("w/x")).unwrap();
    fs::rename(root.join("w/y"), root.join("w/x")).unwrap();

    let by_kept = WalkSpec {
        baseline: kept,
        ..spec(since, &[], &[])
    };
    let seen = layer_of(root, &by_kept);
    assert_eq!(
        names(&seen),
        ["w", "w/.wh.y", "w/x", "w/x/sub", "w/x/sub/f"]
    );
    assert_eq!(seen[4].content, b"B");
    // Sent as paths, the baseline knows no inodes: only the times speak,
    // and they say nothing of `f` (see docs/snapshots.md).
    let by_paths = layer_of(root, &spec(since, &paths, &[]));
    assert!(!names(&by_paths).contains(&"w/x/sub/f"));
}

#[tokio::test]
async fn writes_wait_for_a_snapshot_and_are_refused_after_a_rewind() {
    let gate = WriteGate::default();
    // A snapshot's close: a write waits, then goes ahead.
    let closed = gate.close().await;
    let waiting = tokio::spawn({
        let gate = gate.clone();
        async move { gate.pass().await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !waiting.is_finished(),
        "a write went ahead while a snapshot read"
    );
    drop(closed);
    assert!(waiting.await.unwrap());

    // A rewind's: the write that waited is refused, a later one is not.
    let pass = gate.pass().await.unwrap();
    let rewind = tokio::spawn({
        let gate = gate.clone();
        async move {
            let closed = gate.close_to_replace().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(closed);
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !rewind.is_finished(),
        "a rewind went ahead of a write under way"
    );
    let waiting = tokio::spawn({
        let gate = gate.clone();
        async move { gate.pass().await.is_err() }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    drop(pass);
    rewind.await.unwrap();
    assert!(
        waiting.await.unwrap(),
        "a write that waited out a rewind was made"
    );
    assert!(gate.pass().await.is_ok());
}

#[test]
fn every_name_of_a_file_goes_in_with_the_first_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for sub in ["w/a", "w/b", "w/d"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    fs::write(root.join("w/a/x"), "one file").unwrap();
    fs::hard_link(root.join("w/a/x"), root.join("w/b/y")).unwrap();
    fs::hard_link(root.join("w/a/x"), root.join("w/d/z")).unwrap();
    let paths = ["w", "w/a", "w/a/x", "w/b", "w/b/y", "w/d", "w/d/z"]
        .map(String::from)
        .to_vec();
    std::thread::sleep(TICK);
    let since = now_ns();
    std::thread::sleep(TICK);
    // The rename touches the directory, not the file: only `w/c/x` is
    // new, yet the layer must hold the file's other names beside it.
    fs::rename(root.join("w/a"), root.join("w/c")).unwrap();
    let seen = layer_of(root, &spec(since, &paths, &[]));
    assert_eq!(
        names(&seen),
        ["w", "w/.wh.a", "w/c", "w/c/x", "w/b/y", "w/d", "w/d/z"]
    );
    assert_eq!(seen[3].kind, EntryType::Regular);
    for link in [&seen[4], &seen[6]] {
        assert_eq!(link.kind, EntryType::Link);
        assert_eq!(link.link.as_deref(), Some("w/c/x"));
    }
}

#[test]
fn a_hint_spares_directories_the_upper_layer_lacks_once_inodes_are_known() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for sub in ["a", "b", "c"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    fs::write(root.join("a/x"), "image").unwrap();
    fs::write(root.join("b/y"), "image").unwrap();
    let paths = ["a", "a/x", "b", "b/y", "c"].map(String::from).to_vec();
    let kept = kept_after_a_first_snapshot(root, &paths);
    let since = now_ns();
    std::thread::sleep(TICK);
    fs::write(root.join("b/y2"), "new").unwrap();
    fs::create_dir_all(root.join("c/new")).unwrap();
    fs::write(root.join("c/new/z"), "new").unwrap();
    // Behind the hint's back: `a` is not in it and its times did not move,
    // so a walk that trusts the hint never reads it.
    fs::write(root.join("a/x"), "changed").unwrap();
    let hint = || {
        Some(Hint {
            dirs: [PathBuf::new(), PathBuf::from("b")].into_iter().collect(),
            since_ns: since,
        })
    };
    let hinted = WalkSpec {
        baseline: kept,
        hint: hint(),
        ..spec(since, &[], &[])
    };
    assert_eq!(
        names(&layer_of(root, &hinted)),
        ["b", "b/y2", "c", "c/new", "c/new/z"]
    );
    // Against paths alone (no inodes known) the hint is not taken.
    let by_paths = WalkSpec {
        hint: hint(),
        ..spec(since, &paths, &[])
    };
    assert!(names(&layer_of(root, &by_paths)).contains(&"a/x"));
}

#[test]
fn a_layer_carries_times_to_the_nanosecond_and_extended_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("d/f"), "x").unwrap();
    xattr::set(root.join("d/f"), "user.silo", b"value\0bytes").unwrap();
    xattr::set(root.join("d"), "user.dir", b"d").unwrap();
    // An empty value is carried (it is not an absent one), and a value
    // with newlines byte for byte.
    xattr::set(root.join("d"), "user.empty", b"").unwrap();
    xattr::set(root.join("d"), "user.lines", b"\n19 path=/etc/passwd\n").unwrap();
    let mut out = Vec::new();
    write_layer(root, &spec(0, &[], &[]), &mut out).unwrap();
    let mut archive = tar::Archive::new(out.as_slice());
    let found: Vec<(String, silo_protocol::extras::Extras)> =
        silo_protocol::members::Members::new(archive.entries().unwrap())
            .map(|member| {
                let member = member.unwrap();
                let path = String::from_utf8(member.path).unwrap();
                (path, member.extras)
            })
            .collect();
    let of = |name: &str| {
        &found
            .iter()
            .find(|(p, _)| p.trim_end_matches('/') == name)
            .unwrap()
            .1
    };
    assert_eq!(
        of("d/f").xattrs,
        [("user.silo".to_owned(), b"value\0bytes".to_vec())]
    );
    assert_eq!(
        of("d").xattrs,
        [
            ("user.dir".to_owned(), b"d".to_vec()),
            ("user.empty".to_owned(), Vec::new()),
            ("user.lines".to_owned(), b"\n19 path=/etc/passwd\n".to_vec()),
        ]
    );
    let on_disk = fs::symlink_metadata(root.join("d/f")).unwrap();
    assert_eq!(
        of("d/f").mtime.nanos,
        u32::try_from(std::os::unix::fs::MetadataExt::mtime_nsec(&on_disk)).unwrap()
    );
}

/// One snapshot of `root` against `kept`: its layer's names, and the
/// baseline kept after it; a tick passes after it.
fn snapshot_against(root: &Path, kept: Baseline, since: i64) -> (Vec<String>, Baseline) {
    let mut spec = WalkSpec {
        baseline: kept,
        ..spec(since, &[], &[])
    };
    let mut out = Vec::new();
    let (_, mut changes) = write_layer(root, &spec, &mut out).unwrap();
    let tree = tree::Tree::of_list(Vec::new()).unwrap();
    let (_, kept) = Source::Tree(tree)
        .after(&mut changes, &mut spec.baseline)
        .unwrap();
    std::thread::sleep(TICK);
    let names = read_layer(&out).into_iter().map(|seen| seen.path).collect();
    (names, kept)
}

#[test]
fn a_directory_swapped_for_a_symlink_and_back_is_captured_whole() {
    // s1 holds w/d with entries; s2 has a symlink at w/d (hiding them);
    // s3 has the directory back, so its layer must hold every entry again:
    // below s2's symlink, nothing of s1's w/d shows.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("w/d/sub")).unwrap();
    fs::write(root.join("w/d/sub/f"), "a").unwrap();
    symlink("x", root.join("w/d/sub/l")).unwrap();
    fs::write(root.join("w/d/t"), "top").unwrap();
    std::thread::sleep(TICK);
    let (s1, kept) = snapshot_against(root, Baseline::new(&[]), now_ns() - 1_000_000_000_000);
    assert!(s1.contains(&"w/d/sub/f".to_owned()), "{s1:?}");

    let since = now_ns();
    std::thread::sleep(TICK);
    fs::rename(root.join("w/d"), root.join("w/held")).unwrap();
    symlink("/etc", root.join("w/d")).unwrap();
    let (s2, kept) = snapshot_against(root, kept, since);
    assert!(s2.contains(&"w/d".to_owned()), "{s2:?}");

    let since = now_ns();
    std::thread::sleep(TICK);
    fs::remove_file(root.join("w/d")).unwrap();
    fs::rename(root.join("w/held"), root.join("w/d")).unwrap();
    let (s3, _) = snapshot_against(root, kept, since);
    for path in ["w/d", "w/d/sub", "w/d/sub/f", "w/d/sub/l", "w/d/t"] {
        assert!(
            s3.iter().any(|seen| seen.trim_end_matches('/') == path),
            "{path} missing from {s3:?}"
        );
    }
}
