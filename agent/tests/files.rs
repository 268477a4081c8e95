//! Black-box checks of the file API on the built agent binary: signed
//! requests over its Unix socket, and the disk looked at directly.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step should abort the test with its error"
)]

mod common;

use std::os::unix::fs::PermissionsExt;

use silo_protocol::auth::body_sha256;
use silo_protocol::files::{
    FileKind, FileQuery, FileStat, Listing, PATH_FILE, PATH_LIST, PATH_MKDIR, PATH_RENAME,
    PATH_STAT, PATH_TREE, Removed, TreeWritten,
};
use silo_protocol::http::ErrorBody;

use common::Agent;

impl Agent {
    async fn ok<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        endpoint: &str,
        q: &FileQuery,
        body: &[u8],
    ) -> T {
        let (status, bytes) = self
            .call(method, &q.path_and_query(endpoint), body, true)
            .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).unwrap()
    }

    /// The status and error kind of a request that must fail.
    async fn refused(
        &self,
        method: &str,
        endpoint: &str,
        q: &FileQuery,
        body: &[u8],
    ) -> (u16, String) {
        let (status, bytes) = self
            .call(method, &q.path_and_query(endpoint), body, true)
            .await;
        let err: ErrorBody = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("{status}: {}", String::from_utf8_lossy(&bytes)));
        (status, err.kind.to_string())
    }
}

fn query(path: &str) -> FileQuery {
    FileQuery::new(path)
}

#[tokio::test]
async fn files_write_read_stat_list_mkdir_remove() {
    let agent = Agent::start("files-ops", &[]);
    let mut q = query("notes/a.txt");
    q.mode = Some(0o600);
    q.parents = true;
    let st: FileStat = agent.ok("PUT", PATH_FILE, &q, b"hello").await;
    assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 5, 0o600));
    assert_eq!(st.path, "notes/a.txt");
    let path = agent.dir.join("notes/a.txt");
    let (status, body) = agent
        .call(
            "GET",
            &query("notes/a.txt").path_and_query(PATH_FILE),
            b"",
            true,
        )
        .await;
    assert_eq!((status, &body[..]), (200, &b"hello"[..]));

    // Overwrite in place keeps the mode; a body that is not what was
    // signed changes nothing.
    let _: FileStat = agent
        .ok("PUT", PATH_FILE, &query("notes/a.txt"), b"second")
        .await;
    assert_eq!(std::fs::read(&path).unwrap(), b"second");
    let pq = query("notes/a.txt").path_and_query(PATH_FILE);
    let (status, bytes) = agent
        .send("PUT", &pq, b"tampered", Some(&body_sha256(b"other")))
        .await;
    let kind = serde_json::from_slice::<ErrorBody>(&bytes).unwrap().kind;
    assert_eq!((status, kind.as_str()), (422, "hash_mismatch"));
    assert_eq!(std::fs::read(&path).unwrap(), b"second");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);

    let st: FileStat = agent.ok("GET", PATH_STAT, &query("notes"), b"").await;
    assert_eq!(st.kind, FileKind::Dir);
    let mut mk = query("notes/sub/deeper");
    mk.parents = true;
    let _: FileStat = agent.ok("POST", PATH_MKDIR, &mk, b"").await;
    let listing: Listing = agent.ok("GET", PATH_LIST, &query("notes"), b"").await;
    let names: Vec<_> = listing.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(names, ["notes/a.txt", "notes/sub"]);
    assert_eq!(
        agent.refused("GET", PATH_FILE, &query("notes"), b"").await,
        (409, "is_a_directory".into())
    );
    assert_eq!(
        agent
            .refused("GET", PATH_STAT, &query("missing"), b"")
            .await,
        (404, "not_found".into())
    );
    assert_eq!(
        agent
            .refused("DELETE", PATH_FILE, &query("notes"), b"")
            .await,
        (409, "not_empty".into())
    );
    let mut rm = query("notes");
    rm.recursive = true;
    let removed: Removed = agent.ok("DELETE", PATH_FILE, &rm, b"").await;
    assert_eq!(removed.entries, 4);
    assert!(!agent.dir.join("notes").exists());

    // Unsigned requests are refused before anything is looked at.
    let (status, _) = agent
        .call(
            "GET",
            &query("agent.sock").path_and_query(PATH_STAT),
            b"",
            false,
        )
        .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn confine_refuses_a_planted_symlink() {
    let agent = Agent::start("files-confine", &[]);
    let outside = tempfile::tempdir().unwrap();
    let root = agent.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
    let mut q = query("root/link/planted");
    q.confine = Some(root.display().to_string());
    assert_eq!(
        agent.refused("PUT", PATH_FILE, &q, b"x").await,
        (403, "outside_confine".into())
    );
    let mut q = query(outside.path().join("f").to_str().unwrap());
    q.confine = Some(root.display().to_string());
    assert_eq!(
        agent.refused("PUT", PATH_FILE, &q, b"x").await,
        (403, "outside_confine".into())
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    let mut q = query("root/link");
    q.confine = Some(root.display().to_string());
    assert_eq!(
        agent.refused("GET", PATH_TREE, &q, b"").await,
        (403, "outside_confine".into())
    );
}

#[tokio::test]
async fn trees_round_trip_and_hostile_tars_leave_nothing() {
    let agent = Agent::start("files-tree", &[]);
    let src = agent.dir.join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("a/b/f.txt"), "deep").unwrap();
    std::fs::write(src.join("a/g"), "g").unwrap();
    let (status, tar) = agent
        .call("GET", &query("src/a").path_and_query(PATH_TREE), b"", true)
        .await;
    assert_eq!(status, 200);
    let mut names: Vec<String> = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "a/b", "a/b/f.txt", "a/g"]);

    let mut q = query("dst/copy");
    q.parents = true;
    let written: TreeWritten = agent.ok("PUT", PATH_TREE, &q, &tar).await;
    assert_eq!((written.files, written.bytes), (2, 5));
    let copy = agent.dir.join("dst/copy/a");
    assert_eq!(
        std::fs::read_to_string(copy.join("b/f.txt")).unwrap(),
        "deep"
    );
    assert_eq!(std::fs::read_to_string(copy.join("g")).unwrap(), "g");

    // A hostile entry is refused and nothing, staging included, is left.
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    let name = b"../escape";
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, &b"x"[..]).unwrap();
    let hostile = builder.into_inner().unwrap();
    let before: Vec<_> = std::fs::read_dir(agent.dir.join("dst")).unwrap().collect();
    let (status, kind) = agent
        .refused("PUT", PATH_TREE, &query("dst/evil"), &hostile)
        .await;
    assert_eq!((status, kind.as_str()), (400, "malformed"));
    let after: Vec<_> = std::fs::read_dir(agent.dir.join("dst")).unwrap().collect();
    assert_eq!(before.len(), after.len());
    assert!(!agent.dir.join("dst/escape").exists());
    assert!(!agent.dir.join("escape").exists());
}

#[tokio::test]
async fn rename_moves_a_path_atomically_and_refuses_what_it_cannot() {
    let agent = Agent::start("files-rename", &[]);
    let _: FileStat = agent.ok("PUT", PATH_FILE, &query("a.txt"), b"one").await;
    let mut q = query("a.txt");
    q.to = Some("deep/b.txt".into());
    let (_, kind) = agent.refused("POST", PATH_RENAME, &q, b"").await;
    assert_eq!(kind, "not_found", "the new name's parent is missing");
    assert!(
        agent.dir.join("a.txt").exists(),
        "a refused rename moves nothing"
    );
    q.parents = true;
    let st: FileStat = agent.ok("POST", PATH_RENAME, &q, b"").await;
    assert_eq!(
        (st.kind, st.size, st.path.as_str()),
        (FileKind::File, 3, "deep/b.txt")
    );
    assert!(!agent.dir.join("a.txt").exists());
    assert_eq!(std::fs::read(agent.dir.join("deep/b.txt")).unwrap(), b"one");

    // A file at the new name is replaced; a directory moves whole.
    let _: FileStat = agent.ok("PUT", PATH_FILE, &query("c.txt"), b"two").await;
    let mut q = query("c.txt");
    q.to = Some("deep/b.txt".into());
    let _: FileStat = agent.ok("POST", PATH_RENAME, &q, b"").await;
    assert_eq!(std::fs::read(agent.dir.join("deep/b.txt")).unwrap(), b"two");
    let mut q = query("deep");
    q.to = Some("moved".into());
    let st: FileStat = agent.ok("POST", PATH_RENAME, &q, b"").await;
    assert_eq!(st.kind, FileKind::Dir);
    assert!(agent.dir.join("moved/b.txt").exists());

    // No `to`, a missing source, a directory into itself, a non-empty
    // directory in the way, and a confined rename out of its confine.
    let (status, _) = agent
        .refused("POST", PATH_RENAME, &query("moved"), b"")
        .await;
    assert_eq!(status, 400);
    let mut q = query("nothing");
    q.to = Some("else".into());
    assert_eq!(
        agent.refused("POST", PATH_RENAME, &q, b"").await.1,
        "not_found"
    );
    let mut q = query("moved");
    q.to = Some("moved/inside".into());
    assert_eq!(agent.refused("POST", PATH_RENAME, &q, b"").await.0, 400);
    std::fs::create_dir_all(agent.dir.join("full/x")).unwrap();
    std::fs::create_dir_all(agent.dir.join("other")).unwrap();
    let mut q = query("other");
    q.to = Some("full".into());
    assert_eq!(
        agent.refused("POST", PATH_RENAME, &q, b"").await.1,
        "not_empty"
    );
    let inside = agent.dir.join("moved/b.txt").display().to_string();
    let mut q = query(&inside);
    q.confine = Some(agent.dir.join("moved").display().to_string());
    q.to = Some(agent.dir.join("escaped.txt").display().to_string());
    assert_eq!(
        agent.refused("POST", PATH_RENAME, &q, b"").await.1,
        "outside_confine"
    );
    assert!(agent.dir.join("moved/b.txt").exists());
}
