//! Black-box checks of the layer apply and path index endpoints on the
//! built agent binary: one agent (a machine agent, not PID 1, rooted in a
//! scratch directory) takes a snapshot layer of a tree, another applies it
//! onto an empty directory, and both trees and both indexes must match.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step should abort the test with its error"
)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use silo_protocol::auth::body_sha256;
use silo_protocol::http::{ErrorBody, PATH_INDEX, PATH_LAYERS, PATH_SNAPSHOT};
use silo_protocol::index::{IndexRequest, split_paths};
use silo_protocol::layers::ApplyResponse;
use silo_protocol::snapshot::{HEADER_STOPPED, SnapshotRequest};

use common::Agent;

/// Everything about each path under `root` that a layer carries, but
/// what `skip` names (relative paths).
fn tree(root: &Path, skip: &[&str]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            if skip.contains(&rel.as_str()) {
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            let head = format!(
                "{:o} {}:{} t{}",
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid(),
                meta.mtime()
            );
            let what = if meta.file_type().is_symlink() {
                format!("link -> {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {head}")
            } else {
                let data = String::from_utf8_lossy(&fs::read(&path).unwrap()).into_owned();
                format!("file {head} links={} {data}", meta.nlink())
            };
            out.insert(rel, what);
        }
    }
    out
}

/// A header with every numeric field filled, as real writers do.
fn header(size: usize) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_size(size as u64);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_600_000_000);
    header.set_entry_type(tar::EntryType::Regular);
    header
}

/// A small machine's changes: nested directories with odd modes, a setuid
/// file, a hard link pair, symlinks (one dangling, one absolute), names
/// whose order tests the index (`a`, `a.b`, `a/x`), and a FIFO.
fn source_tree(root: &Path) {
    for dir in ["a/x", "a.b", "usr/bin", "tmp", "home/u/.cache"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    fs::write(root.join("a/x/f"), "deep").unwrap();
    fs::write(root.join("a-c"), "dash").unwrap();
    fs::write(root.join("usr/bin/tool"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(
        root.join("usr/bin/tool"),
        fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool-again")).unwrap();
    symlink("tool", root.join("usr/bin/t")).unwrap();
    symlink("/nowhere/at/all", root.join("home/u/dangling")).unwrap();
    fs::write(root.join("home/u/.cache/é ü"), "unicode").unwrap();
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::set_permissions(root.join("home/u"), fs::Permissions::from_mode(0o700)).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
}

async fn index(agent: &Agent, exclude: &[&str]) -> Vec<String> {
    let request = IndexRequest {
        exclude: exclude.iter().map(|s| s.to_string()).collect(),
    };
    let body = serde_json::to_vec(&request).unwrap();
    let (status, bytes) = agent.call("POST", PATH_INDEX, &body, true).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    split_paths(&bytes)
        .unwrap()
        .into_iter()
        .map(|p| String::from_utf8(p.to_vec()).unwrap())
        .collect()
}

async fn refused(agent: &Agent, body: &[u8], sha: Option<&str>) -> (u16, ErrorBody) {
    let (status, bytes) = agent.send("POST", PATH_LAYERS, body, sha).await;
    let err = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{status}: {}", String::from_utf8_lossy(&bytes)));
    (status, err)
}

#[tokio::test]
async fn a_snapshot_layer_applies_onto_another_machine() {
    let scratch = tempfile::tempdir().unwrap();
    let (src, dst) = (scratch.path().join("src"), scratch.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();
    source_tree(&src);
    let (src_arg, dst_arg) = (src.to_str().unwrap(), dst.to_str().unwrap());

    // The source agent is not PID 1: as a machine agent it may stop its
    // own descendants (here its workload) and nothing else.
    let mut source = Agent::start(
        "layers-src",
        &[
            "--apply-root",
            src_arg,
            "--machine-agent",
            "--",
            "sleep",
            "30",
        ],
    );
    let request = SnapshotRequest {
        changed_since_ns: 0,
        prune_unchanged_dirs: false,
        descend_since_ns: None,
        exclude: Vec::new(),
        baseline: Vec::new(),
        baseline_raw: Vec::new(),
        baseline_digest: None,
        walk_hint: None,
        rewind_to: None,
        block_sums: false,
    };
    let body = serde_json::to_vec(&request).unwrap();
    let sha = body_sha256(&body);
    let (status, headers, layer) = source
        .exchange("POST", PATH_SNAPSHOT, &body, Some(&sha))
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&layer));
    assert_eq!(headers[HEADER_STOPPED], "1");

    let target = Agent::start("layers-dst", &["--apply-root", dst_arg]);
    let (status, bytes) = target.call("POST", PATH_LAYERS, &layer, true).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let applied: ApplyResponse = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(applied.sha256, body_sha256(&layer));
    assert_eq!(
        (applied.files, applied.hard_links, applied.symlinks),
        (4, 1, 2)
    );
    // The FIFO is made like any entry (its bytes are not read: it has none).
    assert_eq!((applied.fifos, applied.skipped_count), (1, 0));
    let fifo = fs::symlink_metadata(dst.join("fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(
        fifo.permissions().mode() & 0o7777,
        fs::symlink_metadata(src.join("fifo"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    );

    let skip = ["fifo", ".silo"];
    assert_eq!(tree(&dst, &skip), tree(&src, &skip));
    let ino = |root: &Path, rel: &str| fs::metadata(root.join(rel)).unwrap().ino();
    assert_eq!(ino(&dst, "usr/bin/tool"), ino(&dst, "usr/bin/tool-again"));

    // The index of both machines is the same, sorted, and whole.
    let exclude = ["/fifo", "/.silo"];
    let of_source = index(&source, &exclude).await;
    let of_target = index(&target, &exclude).await;
    assert_eq!(of_source, of_target);
    let mut sorted = of_source.clone();
    sorted.sort();
    assert_eq!(of_source, sorted);
    assert_eq!(of_source.len(), tree(&src, &skip).len());
    assert_eq!(&of_source[..4], ["a", "a-c", "a.b", "a/x"]);
    // A clean stop also stops the workload the snapshot froze and thawed.
    assert!(source.terminate().code().is_some());
}

#[tokio::test]
async fn whiteouts_apply_and_hostile_layers_are_refused_over_the_wire() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    for dir in ["etc/conf.d", "var/cache/apt"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    fs::write(root.join("etc/conf.d/old"), "old").unwrap();
    fs::write(root.join("var/cache/apt/pkg"), "pkg").unwrap();
    let agent = Agent::start("layers-wire", &["--apply-root", root.to_str().unwrap()]);

    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut header = header(data.len());
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_cksum();
        builder.append(&header, data).unwrap();
    };
    add("etc/conf.d/.wh.old", b"");
    add("var/cache/.wh..wh..opq", b"");
    add("var/cache/new", b"new");
    let good = builder.into_inner().unwrap();
    let (status, bytes) = agent.call("POST", PATH_LAYERS, &good, true).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let applied: ApplyResponse = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((applied.whiteouts, applied.files), (2, 1));
    assert!(!root.join("etc/conf.d/old").exists());
    assert!(!root.join("var/cache/apt").exists());
    assert_eq!(fs::read(root.join("var/cache/new")).unwrap(), b"new");

    let before = tree(&root, &[".silo"]);
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = header(1);
    header.as_old_mut().name[..6].copy_from_slice(b"../top");
    header.set_cksum();
    builder.append(&header, &b"x"[..]).unwrap();
    let hostile = builder.into_inner().unwrap();
    let (status, err) = refused(&agent, &hostile, Some(&body_sha256(&hostile))).await;
    assert_eq!((status, err.kind.as_str()), (400, "rejected_entry"));
    assert!(err.message.contains("../top"), "{}", err.message);

    let (status, err) = refused(&agent, &good, Some(&body_sha256(b"other"))).await;
    assert_eq!((status, err.kind.as_str()), (422, "hash_mismatch"));
    let (status, err) = refused(&agent, &good, Some("not-a-hash")).await;
    assert_eq!((status, err.kind.as_str()), (400, "malformed"));
    let (status, err) = refused(&agent, &good, None).await;
    assert_eq!((status, err.kind.as_str()), (401, "unauthorized"));
    assert_eq!(tree(&root, &[".silo"]), before);
    assert!(!scratch.path().join("top").exists());
    let staging = root.join(".silo/layers");
    assert_eq!(fs::read_dir(staging).unwrap().count(), 0);

    // A snapshot is refused on an agent that is neither PID 1 nor a
    // machine agent; an index is not.
    let body = serde_json::to_vec(&SnapshotRequest {
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
    })
    .unwrap();
    let (status, bytes) = agent.call("POST", PATH_SNAPSHOT, &body, true).await;
    assert_eq!(status, 501, "{}", String::from_utf8_lossy(&bytes));
    assert!(
        index(&agent, &["/.silo"])
            .await
            .contains(&"var/cache/new".to_owned())
    );
    let (status, _) = agent
        .call("POST", PATH_INDEX, b"{\"exclude\":[\"rel\"]}", true)
        .await;
    assert_eq!(status, 400);
}
