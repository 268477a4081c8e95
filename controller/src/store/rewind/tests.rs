//! The restoring layer on a model of the engine: a chain of snapshots over
//! a base, a live tree that moved on from the newest, the change list its
//! agent would send, and the layer applied as an engine applies layers
//! must give exactly the tree of the snapshot gone back to.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::fs;

use silo_protocol::rewind::Change;

use super::*;
use crate::store::tests::{E, Seen, engine_apply, put, stored_layer};

type Model = BTreeMap<String, Seen>;

fn model(store: &Store, layers: &[Digest]) -> Model {
    let mut tree = Model::new();
    for layer in layers {
        engine_apply(&mut tree, store, layer);
    }
    tree
}

/// What the agent's walk reports for a machine that had `anchor` and now
/// has `live`: every path that is new or different (with its unchanged
/// parents, as the walk emits them), and every anchor path gone from a
/// directory that is still there.
fn change_list(anchor: &Model, live: &Model) -> Vec<(Change, Vec<u8>)> {
    let kind = |seen: &Seen| match seen {
        Seen::Dir(_) => Change::Dir,
        Seen::File(..) => Change::File,
        Seen::Symlink(_) => Change::Symlink,
        Seen::Marker => Change::Other,
    };
    let mut listed: BTreeMap<String, Change> = BTreeMap::new();
    for (path, seen) in live {
        if anchor.get(path) != Some(seen) {
            listed.insert(path.clone(), kind(seen));
            let mut at = path.as_str();
            while let Some((parent, _)) = at.rsplit_once('/') {
                listed.insert(parent.to_owned(), Change::Dir);
                at = parent;
            }
        }
    }
    for path in anchor.keys() {
        let parent_there = match path.rsplit_once('/') {
            Some((parent, _)) => matches!(live.get(parent), Some(Seen::Dir(_))),
            None => true,
        };
        if !live.contains_key(path) && parent_there {
            listed.insert(path.clone(), Change::Gone);
        }
    }
    listed
        .into_iter()
        .filter(|(path, _)| !path.starts_with("proc"))
        .map(|(path, kind)| (kind, path.into_bytes()))
        .collect()
}

/// `tree` without what the machine never lets a layer touch.
fn outside_excluded(tree: &Model) -> Model {
    tree.iter()
        .filter(|(path, _)| path.as_str() != "proc" && !path.starts_with("proc/"))
        .map(|(path, seen)| (path.clone(), seen.clone()))
        .collect()
}

/// Restores `live` (which moved on from `from`) to `to` through the
/// restoring layer; the tree it gives, and the layer's counts.
fn rewind(store: &Store, from: &[Digest], to: &[Digest], live: &Model) -> (Model, RestoreStats) {
    let changes = change_list(&model(store, from), live);
    let borrowed: Vec<(Change, &[u8])> = changes.iter().map(|(k, p)| (*k, p.as_slice())).collect();
    let restoring = restoring_layer(
        store,
        &Restore {
            from,
            to,
            changes: &borrowed,
            excluded: &[b"proc".to_vec()],
            unheld_base: None,
            root: true,
            sums: &HashMap::new(),
        },
    )
    .unwrap();
    let digest = put(store, &restoring.layer).digest;
    let mut tree = live.clone();
    engine_apply(&mut tree, store, &digest);
    (tree, restoring.stats)
}

#[test]
fn any_snapshot_of_a_chain_comes_back_exactly_from_a_tree_that_moved_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let base = stored_layer(
        &store,
        &[
            E::Dir("bin"),
            E::FileMode("bin/busybox", "busybox", 0o755),
            E::Symlink("bin/sh", "busybox"),
            E::Dir("etc"),
            E::File("etc/group", "root:x:0:"),
            E::File("etc/passwd", "root:x:0:0"),
            E::Dir("proc"),
            E::Dir("usr"),
            E::Dir("usr/share"),
            E::Dir("usr/share/doc"),
            E::File("usr/share/doc/a", "a"),
            E::File("usr/share/doc/b", "b"),
            E::DirMode("tmp", 0o1777),
        ],
    );
    let first = stored_layer(
        &store,
        &[
            E::Dir("etc"),
            E::Whiteout("etc/group"),
            E::Dir("work"),
            E::File("work/file", "version 1"),
            E::Dir("work/sub"),
            E::File("work/sub/a", "a"),
        ],
    );
    let second = stored_layer(
        &store,
        &[
            E::Dir("work"),
            E::File("work/file", "version 2"),
            E::File("work/new", "new"),
            E::Symlink("work/ln", "file"),
            E::DirMode("work/sub", 0o700),
            E::Dir("usr/share"),
            E::File("usr/share/doc", "a file where a directory was"),
        ],
    );
    let third = stored_layer(
        &store,
        &[
            E::Dir("work"),
            E::Whiteout("work/sub"),
            E::FileMode("work/sub", "now a file", 0o600),
            E::Dir("work/d2"),
            E::File("work/d2/x", "x"),
            E::Link("work/hard", "work/d2/x"),
            E::Whiteout("work/new"),
        ],
    );
    let chain = [base, first, second, third];

    // The machine had the newest snapshot, then a step: files made and
    // changed, base files deleted, a directory of the base gone, a
    // directory replaced by a symlink, a symlink replaced by a file, a
    // mode changed, and a change under an excluded root.
    let mut live = model(&store, &chain);
    let file = |mode, text: &str| Seen::File(mode, text.as_bytes().to_vec());
    live.insert("work/step".into(), Seen::Dir(0o755));
    live.insert("work/step/out".into(), file(0o644, "made by the step"));
    live.insert("etc/passwd".into(), file(0o644, "changed"));
    live.remove("bin/busybox");
    live.retain(|path, _| path != "usr" && !path.starts_with("usr/"));
    live.retain(|path, _| !path.starts_with("work/d2"));
    live.insert("work/d2".into(), Seen::Symlink(b"/tmp".to_vec()));
    live.insert("work/ln".into(), file(0o644, "no longer a link"));
    live.insert("etc".into(), Seen::Dir(0o700));
    live.insert("proc/1".into(), Seen::Dir(0o555));

    for depth in (1..=chain.len()).rev() {
        let target = &chain[..depth];
        let (restored, stats) = rewind(&store, &chain, target, &live);
        assert_eq!(
            outside_excluded(&restored),
            outside_excluded(&model(&store, target)),
            "back to the snapshot of {depth} layers"
        );
        assert!(stats.restored > 0 && stats.removed > 0, "{stats:?}");
        assert_eq!(restored["proc/1"], Seen::Dir(0o555), "excluded roots stay");
    }

    // Back to the newest from it: the layer holds the step's paths only.
    let (_, stats) = rewind(&store, &chain, &chain, &live);
    assert!(stats.looked_at < 25, "{stats:?}");
    // Nothing changed and nothing to go back over: an empty layer.
    let unchanged = model(&store, &chain);
    let (restored, stats) = rewind(&store, &chain, &chain, &unchanged);
    assert_eq!(restored, unchanged);
    assert_eq!((stats.restored, stats.removed), (0, 0), "{stats:?}");
}

#[test]
fn a_rewind_from_an_older_anchor_sees_what_the_chain_changed_since() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let base = stored_layer(
        &store,
        &[E::Dir("a"), E::File("a/kept", "k"), E::File("top", "t")],
    );
    let left = stored_layer(&store, &[E::Whiteout("a"), E::File("a", "a is a file")]);
    let right = stored_layer(&store, &[E::Dir("b"), E::File("b/only-right", "r")]);
    // The machine was rewound onto `left` and changed nothing since; going
    // to the sibling `right` must bring `a` back as a directory with what
    // the base had in it, and remove nothing the right branch keeps.
    let live = model(&store, &[base.clone(), left.clone()]);
    let (restored, stats) = rewind(
        &store,
        &[base.clone(), left],
        &[base.clone(), right.clone()],
        &live,
    );
    assert_eq!(restored, model(&store, &[base, right]));
    assert_eq!(restored["a/kept"], Seen::File(0o644, b"k".to_vec()));
    assert!(stats.restored >= 3, "{stats:?}");
}

#[test]
fn a_template_held_only_as_a_listing_is_left_where_the_machine_kept_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // The template's files are on the machine, not in the store: its
    // listing is all silo has.
    let file = |mode, text: &str| Seen::File(mode, text.as_bytes().to_vec());
    let mut template = Model::new();
    template.insert("etc".into(), Seen::Dir(0o755));
    template.insert("etc/passwd".into(), file(0o644, "root:x:0:0"));
    template.insert("usr".into(), Seen::Dir(0o755));
    template.insert("usr/bin".into(), Seen::Dir(0o755));
    let snapshot = stored_layer(&store, &[E::Dir("work"), E::File("work/a", "a")]);
    let listing: Vec<u8> = ["etc", "etc/passwd", "usr", "usr/bin", "work", "work/a"]
        .iter()
        .flat_map(|path| [path.as_bytes(), b"\0"].concat())
        .collect();
    let target_paths = Index::from_paths(&listing).unwrap();
    let mut anchor = template.clone();
    engine_apply(&mut anchor, &store, &snapshot);
    let layers = [snapshot];
    let restore = |live: &Model| {
        let changes = change_list(&anchor, live);
        let borrowed: Vec<(Change, &[u8])> =
            changes.iter().map(|(k, p)| (*k, p.as_slice())).collect();
        restoring_layer(
            &store,
            &Restore {
                from: &layers,
                to: &layers,
                changes: &borrowed,
                excluded: &[],
                unheld_base: Some(&target_paths),
                root: true,
                sums: &HashMap::new(),
            },
        )
        .map(|restoring| {
            let mut tree = live.clone();
            engine_apply(&mut tree, &store, &put(&store, &restoring.layer).digest);
            tree
        })
    };

    // New paths under the template's directories and the snapshot's go;
    // the template's directories stay, with everything of theirs.
    let mut live = anchor.clone();
    live.insert("usr/bin/new".into(), file(0o755, "made since"));
    live.insert("etc/new".into(), file(0o644, "made since"));
    live.insert("work/b".into(), file(0o644, "made since"));
    live.insert("work/a".into(), file(0o644, "changed"));
    assert_eq!(restore(&live).unwrap(), anchor);

    // A template file changed or gone since cannot be put back.
    for path in ["etc/passwd", "usr/bin"] {
        let mut live = anchor.clone();
        match path {
            "etc/passwd" => live.insert(path.into(), file(0o600, "changed")),
            _ => live.remove(path),
        };
        match restore(&live) {
            Err(RestoreError::NotHeld { path: named }) => assert_eq!(named, path),
            other => panic!("{path}: {other:?}"),
        }
    }
}

#[test]
fn a_file_with_several_names_goes_back_with_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let base = stored_layer(&store, &[E::Dir("w"), E::Dir("w/a"), E::Dir("w/b")]);
    let linked = stored_layer(
        &store,
        &[
            E::File("w/a/x", "one file"),
            E::Link("w/b/y", "w/a/x"),
            E::Link("w/0", "w/a/x"),
        ],
    );
    let to = [base, linked];
    // The live tree changed one name alone (a write through a copy, say).
    for changed in ["w/b/y", "w/a/x"] {
        let changes: Vec<(Change, &[u8])> = vec![(Change::File, changed.as_bytes())];
        let restoring = restoring_layer(
            &store,
            &Restore {
                from: &to,
                to: &to,
                changes: &changes,
                excluded: &[],
                unheld_base: None,
                root: true,
                sums: &HashMap::new(),
            },
        )
        .unwrap();
        let mut archive = tar::Archive::new(restoring.layer.as_slice());
        let entries: Vec<(String, EntryType, Option<String>)> = archive
            .entries()
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let link = entry
                    .link_name_bytes()
                    .map(|l| String::from_utf8(l.into_owned()).unwrap());
                let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
                (path, entry.header().entry_type(), link)
            })
            .collect();
        // The first name in the layer carries the data, the others link to it.
        assert_eq!(
            entries,
            [
                ("w/0".to_owned(), EntryType::Regular, None),
                ("w/a/x".to_owned(), EntryType::Link, Some("w/0".to_owned())),
                ("w/b/y".to_owned(), EntryType::Link, Some("w/0".to_owned())),
            ],
            "changed {changed}"
        );
    }
}

#[test]
fn a_machine_on_the_target_with_nothing_changed_gets_an_empty_layer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let base = stored_layer(
        &store,
        &[
            E::Dir("etc"),
            E::File("etc/passwd", "root:x:0:0"),
            E::Dir("proc"),
        ],
    );
    let work = stored_layer(&store, &[E::Dir("work"), E::File("work/a", "a")]);
    let chain = [base, work];
    let live = model(&store, &chain);
    let (tree, stats) = rewind(&store, &chain, &chain, &live);
    assert_eq!(outside_excluded(&tree), outside_excluded(&live));
    assert_eq!(stats, RestoreStats::default());
    // One path changed on the same chain: no shortcut, it comes back.
    let mut moved = live.clone();
    moved.remove("work/a");
    let (tree, stats) = rewind(&store, &chain, &chain, &moved);
    assert_eq!(outside_excluded(&tree), outside_excluded(&live));
    assert_eq!(stats.restored, 1, "{stats:?}");
}

#[test]
fn a_directory_the_target_removed_and_made_again_loses_what_the_shared_layers_had_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let base = stored_layer(&store, &[E::Dir("top")]);
    // The anchor's snapshot made a deep tree; the target's chain then
    // removed the directory holding it and made it again, empty but for
    // one new entry.
    let made = stored_layer(
        &store,
        &[
            E::Dir("top/d"),
            E::Dir("top/d/old"),
            E::Dir("top/d/old/deeper"),
            E::File("top/d/old/deeper/f", "old"),
            E::File("top/d/kept-name", "old"),
        ],
    );
    let removed = stored_layer(&store, &[E::Whiteout("top/d")]);
    let again = stored_layer(&store, &[E::Dir("top/d"), E::File("top/d/new", "new")]);
    // The machine was rewound to the first snapshot (the layers both share)
    // and changed nothing since; the target is the chain's newest.
    let anchor = [base.clone(), made.clone()];
    let target = [base, made, removed, again];
    let live = model(&store, &anchor);
    let (restored, _) = rewind(&store, &anchor, &target, &live);
    assert_eq!(restored, model(&store, &target));
    assert!(!restored.contains_key("top/d/old/deeper/f"));
    assert!(!restored.contains_key("top/d/kept-name"));
    assert!(restored.contains_key("top/d/new"));
}

#[test]
fn symlink_targets_come_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let base = stored_layer(&store, &[E::Dir("w")]);
    let long = format!("/{}//end/", "x".repeat(150));
    let targets = ["/", "//", ".", "..", "a//b", "dir/", long.as_str()];
    let links: Vec<(String, &str)> = targets
        .iter()
        .enumerate()
        .map(|(i, target)| (format!("w/l{i}"), *target))
        .collect();
    let entries: Vec<E<'_>> = std::iter::once(E::Dir("w"))
        .chain(links.iter().map(|(path, target)| E::Symlink(path, target)))
        .collect();
    let with_links = stored_layer(&store, &entries);
    let chain = [base, with_links];
    let snapshot = model(&store, &chain);
    for (path, target) in &links {
        assert_eq!(snapshot[path], Seen::Symlink(target.as_bytes().to_vec()));
    }
    // The step removed every link; the rewind puts each back as it was.
    let mut live = snapshot.clone();
    live.retain(|path, _| !path.starts_with("w/l"));
    let (restored, _) = rewind(&store, &chain, &chain, &live);
    assert_eq!(restored, snapshot);
}

/// The entries of a layer written in memory, in order: path, kind, mode,
/// link target and extended attributes.
type Listed = Vec<(
    String,
    EntryType,
    u32,
    Option<String>,
    Vec<(String, Vec<u8>)>,
)>;

fn listed(layer: &[u8]) -> Listed {
    let mut archive = tar::Archive::new(std::io::Cursor::new(layer));
    let members = silo_protocol::members::Members::new(archive.entries_with_seek().unwrap());
    members
        .map(|member| {
            let member = member.unwrap();
            (
                String::from_utf8(member.path).unwrap(),
                member.header.entry_type(),
                member.header.mode().unwrap(),
                member.link.map(|t| String::from_utf8(t).unwrap()),
                member.extras.xattrs,
            )
        })
        .collect()
}

#[test]
fn the_root_goes_back_first_with_its_own_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let root = E::DirMode("./", 0o1777);
    let snap = stored_layer(
        &store,
        &[E::Xattrs(&root, &[("user.r", b"v")]), E::Dir("w")],
    );
    let chain = [snap];
    // Only the root's own metadata changed (chmod /): listed under "".
    let changes = [(Change::Dir, &b""[..])];
    let restoring = restoring_layer(
        &store,
        &Restore {
            from: &chain,
            to: &chain,
            changes: &changes,
            excluded: &[],
            unheld_base: None,
            root: true,
            sums: &HashMap::new(),
        },
    )
    .unwrap();
    let entries = listed(&restoring.layer);
    assert_eq!(entries.len(), 1, "{entries:?}");
    let (path, kind, mode, _, xattrs) = &entries[0];
    assert_eq!(
        (path.as_str(), *kind, *mode),
        ("./", EntryType::Directory, 0o1777)
    );
    assert_eq!(xattrs, &[("user.r".to_owned(), b"v".to_vec())]);
}

#[test]
fn engine_gaps_hold_the_root_and_every_empty_xattr_with_its_file_s_other_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let empty: &[(&str, &[u8])] = &[("user.e", b"")];
    let (d, f) = (E::Dir("d"), E::File("d/f", "data"));
    let below = E::File("s/x", "x");
    let base = stored_layer(
        &store,
        &[
            E::Xattrs(&d, empty),
            E::Xattrs(&f, empty),
            E::Link("d/g", "d/f"),
            E::File("d/plain", "p"),
            E::File("gone", "x"),
            // Its directory has no such value, but setgid bits an
            // overlay's copy-up may drop: it goes in too.
            E::DirMode("s", 0o6755),
            E::Xattrs(&below, empty),
        ],
    );
    // Nothing an engine leaves out: no layer to send.
    let plain = stored_layer(&store, &[E::Dir("d"), E::File("d/plain", "p")]);
    assert!(engine_gaps(&store, &[plain], true).unwrap().is_none());

    let (root, gone) = (E::DirMode("./", 0o700), E::File("gone", "y"));
    let top = stored_layer(&store, &[E::Xattrs(&root, &[("user.r", b"")]), gone]);
    let gaps = engine_gaps(&store, &[base, top], true).unwrap().unwrap();
    let shown: Vec<(String, EntryType, Option<String>)> = listed(&gaps.layer)
        .into_iter()
        .map(|(path, kind, _, link, _)| (path, kind, link))
        .collect();
    assert_eq!(
        shown,
        [
            ("./".to_owned(), EntryType::Directory, None),
            ("d".to_owned(), EntryType::Directory, None),
            ("d/f".to_owned(), EntryType::Regular, None),
            ("d/g".to_owned(), EntryType::Link, Some("d/f".to_owned())),
            ("s".to_owned(), EntryType::Directory, None),
            ("s/x".to_owned(), EntryType::Regular, None),
        ],
        "the root, the entries with an empty value, the file's other name and \
         the directories above them; nothing else"
    );
    assert_eq!(
        listed(&gaps.layer)[1].4,
        [("user.e".to_owned(), Vec::new())]
    );
}

/// The file `path` of a restoring layer applied to `live` as the agent
/// applies it: a patch written into it, or the entry's data.
fn applied_file(layer: &[u8], path: &str, live: &[u8]) -> Vec<u8> {
    use std::io::Read as _;
    let mut archive = tar::Archive::new(std::io::Cursor::new(layer));
    for member in silo_protocol::members::Members::new(archive.entries_with_seek().unwrap()) {
        let mut member = member.unwrap();
        if member.path != path.as_bytes() {
            continue;
        }
        let mut data = Vec::new();
        member.data.read_to_end(&mut data).unwrap();
        let Some(patch) = member.extras.patch else {
            return data;
        };
        let mut file = live.to_vec();
        let mut from = 0;
        for range in &patch.ranges {
            let (at, len) = (range.at as usize, range.len as usize);
            if file.len() < at + len {
                file.resize(at + len, 0);
            }
            file[at..at + len].copy_from_slice(&data[from..from + len]);
            from += len;
        }
        file.resize(patch.size as usize, 0);
        return file;
    }
    panic!("{path} is not in the layer");
}

#[test]
fn a_file_sent_with_block_sums_goes_back_as_the_blocks_that_differ() {
    use silo_protocol::blocks::{BLOCK_BYTES, BlockSums};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let block = BLOCK_BYTES as usize;
    let big: String = (0..20 * block + 77)
        .map(|i| char::from(b'a' + (i % 23) as u8))
        .collect();
    let snap = stored_layer(
        &store,
        &[
            E::Dir("w"),
            E::File("w/big", &big),
            E::File("w/twice", &big),
            E::Link("w/twice2", "w/twice"),
        ],
    );
    let chain = [snap.clone()];
    // The live file: one byte changed in block 3, and 5 KiB appended.
    let mut live = big.clone().into_bytes();
    live[3 * block + 9] = b'#';
    live.extend_from_slice(&[b'z'; 5000]);
    let sums_of_live = BlockSums::read(&live[..]).unwrap();
    let changes = [
        (Change::Dir, &b"w"[..]),
        (Change::File, b"w/big"),
        (Change::File, b"w/twice"),
    ];
    let sums: HashMap<&[u8], BlockSums> = [
        (&b"w/big"[..], sums_of_live.clone()),
        (b"w/twice", sums_of_live.clone()),
    ]
    .into_iter()
    .collect();
    let restore = Restore {
        from: &chain,
        to: &chain,
        changes: &changes,
        excluded: &[],
        unheld_base: None,
        root: true,
        sums: &sums,
    };
    let restoring = restoring_layer(&store, &restore).unwrap();
    assert_eq!(
        applied_file(&restoring.layer, "w/big", &live),
        big.as_bytes(),
        "the patched file is the snapshot's"
    );
    // A file with two names goes back whole, with its other name.
    assert_eq!(
        applied_file(&restoring.layer, "w/twice", &live),
        big.as_bytes()
    );
    assert_eq!(restoring.stats.patched, 1);
    let whole = big.len() as u64;
    // The changed block, the tail block the appended bytes moved, and the
    // file with two names.
    assert_eq!(restoring.stats.bytes, BLOCK_BYTES + 77 + whole);
    // The target's sums are kept beside the store, and go with its layer.
    let kept = dir.path().join("sums").join(snap.to_string());
    assert_eq!(fs::read_dir(&kept).unwrap().count(), 1);
    let again = restoring_layer(&store, &restore).unwrap();
    assert_eq!(again.layer, restoring.layer, "read back from the kept sums");
    // A torn cache is read again from the layer.
    for file in fs::read_dir(&kept).unwrap() {
        fs::write(file.unwrap().path(), b"torn").unwrap();
    }
    assert_eq!(
        restoring_layer(&store, &restore).unwrap().layer,
        restoring.layer
    );
    let lock = store
        .exclusive_lock(std::time::Duration::from_secs(5))
        .unwrap();
    store.remove(&snap, &lock).unwrap();
    assert!(!kept.exists(), "the layer's sums went with it");
}
