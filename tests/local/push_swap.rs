//! The swap against the real agent: versions and "unchanged", ordering of
//! concurrent pushes, readers during hundreds of swaps, and an agent killed
//! with SIGKILL in the middle of an extract.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use silo::internals::push::{RetryPolicy, SharedBundle, push_to_sandbox};
use silo_protocol::bundle::{Bundle, BundleLimits, FileSet};
use silo_protocol::push::{Declared, PushResponse};
use silo_tests::TestAgent;
use silo_tests::push::{incompressible, leftovers, listing, start_partial_push};

async fn agent_with_root(root: &Path) -> TestAgent {
    let root = root.display().to_string();
    TestAgent::start_with(&["--push-root", &root], &[]).await
}

fn bundle(files: &[(&str, Vec<u8>)]) -> SharedBundle {
    let mut set = FileSet::new();
    for (path, data) in files {
        set.insert_bytes(path, data.clone(), false).unwrap();
    }
    Bundle::build(&set, &BundleLimits::default())
        .unwrap()
        .into()
}

async fn push(agent: &TestAgent, mount: &str, bundle: &SharedBundle) -> PushResponse {
    push_to_sandbox(
        &agent.client(),
        mount,
        bundle,
        &RetryPolicy::default(),
        None,
    )
    .await
    .unwrap()
    .0
}

/// A version's tree: `n` files that all say which version they belong to.
fn versioned(version: usize, n: usize) -> SharedBundle {
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                format!("d{}/f{i}", i % 4),
                format!("v{version}").into_bytes(),
            )
        })
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    bundle(&refs)
}

#[tokio::test]
async fn versions_swap_and_an_unchanged_bundle_writes_nothing() {
    let base = tempfile::tempdir().unwrap();
    let agent = agent_with_root(base.path()).await;
    let mount = base.path().join("app");
    let m = mount.display().to_string();
    let one = bundle(&[("a.txt", b"one".to_vec())]);
    let first = push(&agent, &m, &one).await;
    assert!(!first.unchanged);
    assert_eq!((first.files, first.bytes), (1, 3));
    assert_eq!(first.sha256, one.sha256);
    assert!(
        std::fs::symlink_metadata(&mount)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read_to_string(mount.join("a.txt")).unwrap(), "one");

    let before = listing(base.path());
    let again = push(&agent, &m, &one).await;
    assert!(again.unchanged);
    assert_eq!(again.version, first.version);
    assert_eq!(
        listing(base.path()),
        before,
        "an unchanged push wrote something"
    );

    let two = push(&agent, &m, &bundle(&[("b.txt", b"two".to_vec())])).await;
    assert_ne!(two.version, first.version);
    assert!(!mount.join("a.txt").exists());
    assert_eq!(std::fs::read_to_string(mount.join("b.txt")).unwrap(), "two");
    // The replaced version stays for its grace period.
    assert!(
        base.path()
            .join(".versions/app")
            .join(&first.version)
            .is_dir()
    );
}

#[tokio::test]
async fn pushes_to_one_mount_go_in_arrival_order_and_mounts_are_independent() {
    let base = tempfile::tempdir().unwrap();
    let agent = Arc::new(agent_with_root(base.path()).await);
    let m = base.path().join("app").display().to_string();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (agent, m) = (Arc::clone(&agent), m.clone());
        // Big enough to overlap, started apart so their arrival order is known.
        let b = bundle(&[
            ("data", vec![i as u8; 3 << 20]),
            ("which", i.to_string().into_bytes()),
        ]);
        tasks.push(tokio::spawn(async move { push(&agent, &m, &b).await }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut seqs = Vec::new();
    for task in tasks {
        let answer = task.await.unwrap();
        seqs.push(answer.version[..6].parse::<u64>().unwrap());
    }
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "not in arrival order: {seqs:?}"
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(&m).join("which")).unwrap(),
        "4"
    );

    let (a, b) = (
        base.path().join("one").display().to_string(),
        base.path().join("two").display().to_string(),
    );
    let (ba, bb) = (versioned(1, 8), versioned(2, 8));
    let (ra, rb) = tokio::join!(push(&agent, &a, &ba), push(&agent, &b, &bb));
    assert!(!ra.unchanged && !rb.unchanged);
    assert_eq!(
        std::fs::read_to_string(Path::new(&a).join("d0/f0")).unwrap(),
        "v1"
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(&b).join("d0/f0")).unwrap(),
        "v2"
    );
}

#[tokio::test]
async fn readers_never_see_a_mixed_or_missing_tree_during_swaps() {
    const SWAPS: usize = 220;
    const FILES: usize = 24;
    let base = tempfile::tempdir().unwrap();
    let agent = agent_with_root(base.path()).await;
    let mount = base.path().join("app");
    let m = mount.display().to_string();
    push(&agent, &m, &versioned(0, FILES)).await;

    let done = Arc::new(AtomicBool::new(false));
    let walks = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (done, walks, mount) = (Arc::clone(&done), Arc::clone(&walks), mount.clone());
            std::thread::spawn(move || -> Result<(), String> {
                while !done.load(Ordering::Relaxed) {
                    // A reader resolves the mount once and reads the tree it got.
                    let target =
                        std::fs::read_link(&mount).map_err(|e| format!("mount missing: {e}"))?;
                    let tree = mount.parent().unwrap().join(&target);
                    let walked = walk(&tree);
                    if let Ok((count, seen)) = &walked {
                        if seen.len() == 1 && *count == FILES {
                            walks.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                    // The agent keeps the newest retired versions only: a
                    // reader descheduled across that many swaps may lose its
                    // tree, whole or part way through. Any sooner is a broken
                    // promise.
                    let now =
                        std::fs::read_link(&mount).map_err(|e| format!("mount missing: {e}"))?;
                    let newer = version_seq(&now) - version_seq(&target);
                    let what = match walked {
                        Ok((count, seen)) => {
                            format!("torn tree: {count} files from versions {seen:?}")
                        }
                        Err(gone) => gone,
                    };
                    if newer < KEPT_VERSIONS {
                        return Err(format!("{what}, {newer} swaps later"));
                    }
                    walks.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    for version in 1..=SWAPS {
        push(&agent, &m, &versioned(version, FILES)).await;
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().unwrap().unwrap();
    }
    assert!(walks.load(Ordering::Relaxed) > SWAPS, "readers barely ran");
    assert_eq!(
        std::fs::read_to_string(mount.join("d0/f0")).unwrap(),
        format!("v{SWAPS}")
    );
    let kept = std::fs::read_dir(base.path().join(".versions/app"))
        .unwrap()
        .count();
    assert!(kept <= 1 + 8, "old versions are not pruned: {kept}");
}

/// Retired versions the agent keeps whatever their age (the agent's
/// `DEFAULT_KEEP_VERSIONS`), and one more for the live one being replaced.
const KEPT_VERSIONS: u64 = 8 + 1;

/// A pushed version's sequence number, from its directory name.
fn version_seq(target: &std::path::Path) -> u64 {
    let name = target.file_name().unwrap().to_string_lossy();
    name.split('-').next().unwrap().parse().unwrap()
}

/// Reads every file of a pushed tree: how many, and the distinct contents.
fn walk(tree: &std::path::Path) -> Result<(usize, std::collections::BTreeSet<String>), String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut count = 0;
    for d in std::fs::read_dir(tree).map_err(|e| format!("tree gone: {e}"))? {
        let d = d.map_err(|e| e.to_string())?.path();
        for f in std::fs::read_dir(&d).map_err(|e| format!("dir gone: {e}"))? {
            let f = f.map_err(|e| e.to_string())?.path();
            seen.insert(std::fs::read_to_string(&f).map_err(|e| format!("file gone: {e}"))?);
            count += 1;
        }
    }
    Ok((count, seen))
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Entries inside the `.partial-*` staging directories of `store`.
fn staged_entries(store: &Path) -> usize {
    leftovers(store)
        .iter()
        .filter(|name| name.starts_with(".partial-"))
        .map(|name| {
            std::fs::read_dir(store.join(name))
                .map(Iterator::count)
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::test]
async fn sigkill_mid_extract_keeps_the_live_tree_and_the_next_agent_sweeps_up() {
    const FILES: usize = 64;
    const FILE_BYTES: usize = 32 << 10;
    let base = tempfile::tempdir().unwrap();
    let mount = base.path().join("deep/app");
    let m = mount.display().to_string();
    let store: PathBuf = base.path().join("deep/.versions/app");
    let agent = agent_with_root(base.path()).await;
    push(&agent, &m, &versioned(1, 16)).await;
    let live = listing(&mount);

    // A bundle the agent accepts (the end of the test pushes it whole): its
    // data does not compress, so it is nowhere near the decompression-ratio
    // bound, which would refuse it part way and remove the staging directory
    // a few milliseconds after it appeared. With half of it sent and the
    // connection held open, the extractor writes what it got and then waits
    // for the rest, so the partial extract stays put until the body's idle
    // timeout: there is no window for the check below to miss.
    let big: Vec<(String, Vec<u8>)> = (0..FILES)
        .map(|i| (format!("f{i}"), incompressible(i as u64 + 1, FILE_BYTES)))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = big.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    let body = bundle(&refs);
    assert!(
        body.bytes.len() as u64 * 2 > body.unpacked_bytes,
        "the test bundle compresses: {} bytes for {} unpacked",
        body.bytes.len(),
        body.unpacked_bytes
    );
    // Declared, as silo's client does: the agent extracts as the body
    // comes instead of counting it from a spool first.
    let declared = Declared {
        entries: Some(FILES as u64),
        unpacked: Some(body.unpacked_bytes),
    };
    let _stream = start_partial_push(
        &agent.socket(),
        &agent.key,
        (&m, declared),
        &body.bytes,
        body.bytes.len() / 2,
    );
    wait_for(
        "files in a partial extract",
        Duration::from_secs(30),
        || staged_entries(&store) > 0,
    );
    silo_tests::signal(agent.pid(), nix::sys::signal::Signal::SIGKILL);
    drop(agent);
    let staged = staged_entries(&store);
    assert!(
        (1..FILES).contains(&staged),
        "the kill left {staged} of {FILES} files in staging, not a partial extract: {:?}",
        leftovers(&store)
    );
    assert_eq!(listing(&mount), live, "the live tree changed");

    let again = agent_with_root(base.path()).await;
    wait_for("the sweep", Duration::from_secs(30), || {
        leftovers(&store).is_empty()
    });
    assert_eq!(listing(&mount), live);
    let next = push(&again, &m, &body).await;
    assert!(!next.unchanged);
    assert_eq!(next.files, FILES as u64);
    assert_eq!(std::fs::read(mount.join("f0")).unwrap(), big[0].1);
}

#[tokio::test]
async fn a_refused_push_still_draining_does_not_hold_off_the_next_one() {
    use std::io::{Read, Write};

    let base = tempfile::tempdir().unwrap();
    let m = base.path().join("app").display().to_string();
    let agent = agent_with_root(base.path()).await;
    // A decompression bomb: refused once 8 MiB are unpacked, long before
    // its body ends.
    let files: Vec<(String, Vec<u8>)> = (0..400)
        .map(|i| (format!("f{i}"), vec![b'a'; 64 << 10]))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    let bomb = bundle(&refs);
    assert!(bomb.unpacked_bytes > 200 * bomb.bytes.len() as u64);
    let sent = bomb.bytes.len() * 3 / 4;
    let undeclared = (m.as_str(), Declared::default());
    let mut held = start_partial_push(&agent.socket(), &agent.key, undeclared, &bomb.bytes, sent);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The refused push keeps draining its body (the client gets a clean
    // answer when it ends), but the mount is free for the next push.
    let started = Instant::now();
    let next = push(&agent, &m, &versioned(1, 4)).await;
    assert!(!next.unchanged);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the next push waited {:?} for a refused one",
        started.elapsed()
    );
    held.write_all(&bomb.bytes[sent..]).unwrap();
    let mut answer = [0u8; 12];
    held.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 413");
}
