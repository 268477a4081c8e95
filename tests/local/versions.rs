//! Protocol versions across builds: an agent keeps serving a controller
//! that speaks an older version, and a controller facing an older agent
//! speaks that agent's version and refuses at once, saying why, what the
//! version lacks. Both older sides are the real binaries held back: a
//! client pinned with `AgentClient::with_max_protocol`, and an agent
//! started with `--max-protocol`.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use silo::client::ClientError;
use silo::{FileError, Files};
use silo_protocol::auth::{EMPTY_BODY_SHA256, sign};
use silo_protocol::exec::ExecSpec;
use silo_protocol::files::{FileQuery, PATH_STAT};
use silo_protocol::http::{HEADER_PROTOCOL, HEADER_PROTOCOL_MIN};
use silo_protocol::snapshot::SnapshotRequest;
use silo_protocol::{Feature, PROTOCOL_VERSION, Versions};
use silo_tests::{TestAgent, sh, text};

/// An agent capped at protocol `max`.
async fn agent_on(max: u32) -> TestAgent {
    TestAgent::start_with(&["--max-protocol", &max.to_string()], &[]).await
}

/// Sends a signed `GET target` announcing `protocol`, on a raw socket so the
/// announced version is exactly what the test says; returns the whole answer.
fn get_announcing(agent: &TestAgent, target: &str, protocol: &str) -> String {
    let signed = sign(&agent.key, "GET", target, EMPTY_BODY_SHA256).unwrap();
    let mut request = format!(
        "GET {target} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n{HEADER_PROTOCOL}: {protocol}\r\n"
    );
    for (name, value) in signed.pairs() {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut stream = UnixStream::connect(agent.socket()).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// The value of header `name` in a raw answer.
fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then_some(value.trim())
    })
}

#[tokio::test]
async fn an_agent_serves_a_controller_that_speaks_an_older_version() {
    let agent = TestAgent::start().await;
    let client = agent.client().with_max_protocol(1).unwrap();
    let spoken = client.protocol().await.unwrap();
    assert_eq!((spoken.version, spoken.theirs), (1, Versions::OURS));

    // Exec works in version 1 ...
    let conn = client.connect().await.unwrap();
    assert_eq!(conn.protocol().version, 1);
    let out = conn.run(sh("echo served")).await.unwrap();
    assert_eq!(text(&out.stdout), "served\n");

    // ... and what version 1 lacks is refused by the client, which names
    // itself as the limit; nothing reaches the agent.
    let err = Files::new(client.clone()).stat("/").await.unwrap_err();
    assert!(
        matches!(
            err,
            FileError::Client(ClientError::ClientPinned {
                speaks: 1,
                feature: Feature::Files
            })
        ),
        "{err}"
    );
    let err = conn.list_sessions().await.unwrap_err();
    assert!(matches!(err, ClientError::ClientPinned { .. }), "{err}");
    let tty = ExecSpec {
        tty: true,
        ..ExecSpec::default()
    };
    let err = conn.exec(tty).await.err().unwrap();
    assert!(err.to_string().contains("no terminal (tty) execs"), "{err}");

    // On the wire: a request announcing version 1 is admitted and served
    // as it is (changes are additive), and every answer carries the
    // agent's range.
    let target = FileQuery::new("/").path_and_query(PATH_STAT);
    let answer = get_announcing(&agent, &target, "1");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let newest = PROTOCOL_VERSION.to_string();
    assert_eq!(header(&answer, HEADER_PROTOCOL), Some(newest.as_str()));
    assert_eq!(header(&answer, HEADER_PROTOCOL_MIN), Some("1"));
}

#[tokio::test]
async fn a_controller_speaks_an_older_agents_version_and_refuses_what_it_lacks() {
    let agent = TestAgent::start_with(&["--max-protocol", "1"], &[]).await;
    let health = agent.client().healthz().await.unwrap();
    assert_eq!((health.protocol_version, health.protocol_min), (1, Some(1)));

    let client = agent.client().for_sandbox("old-image");
    let conn = client.connect().await.unwrap();
    assert_eq!(conn.protocol().version, 1);
    let out = conn.run(sh("echo still-works")).await.unwrap();
    assert_eq!(text(&out.stdout), "still-works\n");

    // The file API is refused at once with what is missing and what to do,
    // and nothing is written.
    let err = Files::new(client.clone())
        .write("written", "x", None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            FileError::Client(ClientError::AgentTooOld {
                speaks: 1,
                feature: Feature::Files,
                ..
            })
        ),
        "{err}"
    );
    let message = err.to_string();
    for part in [
        "the agent in sandbox old-image speaks protocol 1, which has no file API",
        "(needs protocol 2)",
        "silo image bake",
        "mounted agent",
    ] {
        assert!(message.contains(part), "{message}");
    }
    assert!(!agent.workdir().join("written").exists());

    // So are snapshots, sessions and terminals.
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
    let err = client.snapshot(&request).await.err().unwrap();
    assert!(
        matches!(
            err,
            ClientError::AgentTooOld {
                feature: Feature::Snapshot,
                ..
            }
        ),
        "{err}"
    );
    let err = conn.list_sessions().await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::AgentTooOld {
                feature: Feature::Sessions,
                ..
            }
        ),
        "{err}"
    );

    // An in-place rewind needs protocol 3: refused before anything ends.
    let rewinding = agent_on(2).await;
    let err = rewinding.client().begin_rewind(&request).await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::AgentTooOld {
                speaks: 2,
                feature: Feature::Rewind,
                ..
            }
        ),
        "{err}"
    );

    // On the wire: the capped agent refuses a newer version, naming its
    // range in the message and in the answer's headers.
    let target = FileQuery::new("/").path_and_query(PATH_STAT);
    let answer = get_announcing(&agent, &target, &PROTOCOL_VERSION.to_string());
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("version_mismatch") && answer.contains("speaks 1"),
        "{answer}"
    );
    assert_eq!(header(&answer, HEADER_PROTOCOL), Some("1"));
    assert_eq!(header(&answer, HEADER_PROTOCOL_MIN), Some("1"));
}

/// Relays connections from `path` to the agent at `upstream`, counting them.
fn counting_relay(
    path: &std::path::Path,
    upstream: std::path::PathBuf,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let counted = std::sync::Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let mut agent = tokio::net::UnixStream::connect(upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut agent).await;
            });
        }
    });
    count
}

#[tokio::test]
async fn a_first_exec_connection_learns_the_versions_without_a_health_check() {
    use std::sync::atomic::Ordering;
    let agent = TestAgent::start().await;
    let relay = agent.dir.path().join("relay.sock");
    let connections = counting_relay(&relay, agent.socket());
    let endpoint = silo::client::Endpoint::Unix(relay);
    let client = silo::client::AgentClient::new(endpoint, agent.key.clone());

    // One connection: the upgrade itself tells the client the agent's range.
    let conn = client.connect().await.unwrap();
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    assert_eq!(conn.protocol().version, PROTOCOL_VERSION);
    assert_eq!(conn.protocol().theirs, Versions::OURS);
    let out = conn.run(sh("echo direct")).await.unwrap();
    assert_eq!(text(&out.stdout), "direct\n");
    // What was learned serves the client's later requests too.
    let spoken = client.protocol().await.unwrap();
    assert_eq!(spoken.theirs, Versions::OURS);
    assert_eq!(connections.load(Ordering::SeqCst), 1);

    // An older agent refuses the newest version: the client falls back to
    // the health check and speaks the agent's version.
    let old = TestAgent::start_with(&["--max-protocol", "1"], &[]).await;
    let relay = old.dir.path().join("relay.sock");
    let connections = counting_relay(&relay, old.socket());
    let client =
        silo::client::AgentClient::new(silo::client::Endpoint::Unix(relay), old.key.clone());
    let conn = client.connect().await.unwrap();
    assert_eq!(conn.protocol().version, 1);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        3,
        "refused upgrade, health check, upgrade"
    );
    let out = conn.run(sh("echo fallback")).await.unwrap();
    assert_eq!(text(&out.stdout), "fallback\n");
}

/// A `sleep` duration no other run of these tests uses, so its process is
/// known by its command line.
fn unique_sleep() -> String {
    (200_000 + u64::from(std::process::id())).to_string()
}

#[tokio::test]
async fn incremental_snapshots_need_protocol_4_and_are_refused_before_anything_stops() {
    let root = tempfile::tempdir().unwrap();
    let flags = |max: &'static str| {
        [
            "--machine-agent",
            "--apply-root",
            root.path().to_str().unwrap(),
            "--max-protocol",
            max,
        ]
        .map(str::to_owned)
    };
    let old = flags("3");
    let old: Vec<&str> = old.iter().map(String::as_str).collect();
    let agent = TestAgent::start_with(&old, &[]).await;
    let client = agent.client().for_sandbox("before-4");
    let conn = client.connect().await.unwrap();
    let sleeper = unique_sleep();
    let _running = conn
        .exec(sh(&format!("exec sleep {sleeper}")))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while silo_tests::pids_running(&["sleep", &sleeper]).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // A snapshot or rewind that builds on an earlier one: refused by the
    // controller, naming the feature and the version, before the agent
    // stops (or ends) a single process.
    let incremental = SnapshotRequest {
        changed_since_ns: 1,
        prune_unchanged_dirs: true,
        descend_since_ns: Some(0),
        exclude: Vec::new(),
        baseline: Vec::new(),
        baseline_raw: Vec::new(),
        baseline_digest: None,
        walk_hint: None,
        rewind_to: None,
        block_sums: false,
    };
    let refused = |err: ClientError| {
        assert!(
            matches!(
                err,
                ClientError::AgentTooOld {
                    speaks: 3,
                    feature: Feature::IncrementalSnapshot,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("speaks protocol 3, which has no incremental snapshots"),
            "{err}"
        );
    };
    refused(client.snapshot(&incremental).await.err().unwrap());
    refused(client.begin_rewind(&incremental).await.unwrap_err());
    assert!(
        !silo_tests::pids_running(&["sleep", &sleeper]).is_empty(),
        "a refused request stopped the sandbox's processes"
    );
    // The same agent still serves what protocol 3 has: a whole snapshot
    // passes the version check (whatever the agent then answers).
    let whole = SnapshotRequest {
        descend_since_ns: None,
        ..incremental.clone()
    };
    if let Err(err) = client.snapshot(&whole).await {
        assert!(!matches!(err, ClientError::AgentTooOld { .. }), "{err}");
    }

    // The other way: a controller pinned at 3 facing an agent of 4 names
    // itself as the limit, and still speaks 3 with it.
    let new = flags("4");
    let new: Vec<&str> = new.iter().map(String::as_str).collect();
    let agent = TestAgent::start_with(&new, &[]).await;
    let pinned = agent.client().with_max_protocol(3).unwrap();
    assert_eq!(pinned.protocol().await.unwrap().version, 3);
    let err = pinned.snapshot(&incremental).await.err().unwrap();
    assert!(
        matches!(
            err,
            ClientError::ClientPinned {
                speaks: 3,
                feature: Feature::IncrementalSnapshot
            }
        ),
        "{err}"
    );
    let out = pinned
        .connect()
        .await
        .unwrap()
        .run(sh("echo served"))
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "served\n");
}

/// A baseline as a controller would hand it: sorted paths and their digest.
struct Listed(Vec<Vec<u8>>, String);

impl Listed {
    fn of(paths: &[&str]) -> Self {
        let mut paths: Vec<Vec<u8>> = paths.iter().map(|p| p.as_bytes().to_vec()).collect();
        paths.sort();
        let digest = silo_protocol::snapshot::tree_digest(paths.iter().map(Vec::as_slice));
        Self(paths, digest)
    }
}

impl silo::client::BaselinePaths for Listed {
    fn digest(&self) -> &str {
        &self.1
    }

    fn paths(&self) -> Vec<Vec<u8>> {
        self.0.clone()
    }
}

#[tokio::test]
async fn a_baseline_goes_by_digest_only_to_an_agent_of_5_and_its_paths_follow_an_unknown_one() {
    use silo::client::BaselineSent;

    let root = tempfile::tempdir().unwrap();
    for file in ["keep", "gone"] {
        std::fs::write(root.path().join(file), file).unwrap();
    }
    std::fs::create_dir(root.path().join("dir")).unwrap();
    // File times come from a coarse clock: a pause on each side.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let since = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::remove_file(root.path().join("gone")).unwrap();
    std::fs::write(root.path().join("made"), "made").unwrap();
    let request = SnapshotRequest {
        changed_since_ns: since,
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
    let flags = |max: &str| {
        [
            "--machine-agent",
            "--apply-root",
            root.path().to_str().unwrap(),
            "--max-protocol",
            max,
        ]
        .map(str::to_owned)
    };
    let changes = |begun: &silo::client::RewindBegun| -> Vec<String> {
        let mut listed: Vec<String> = begun
            .changes()
            .into_iter()
            .map(|(kind, path)| format!("{kind:?} {}", String::from_utf8_lossy(path)))
            .collect();
        listed.sort();
        listed
    };
    // An empty layer ends each rewind, so the tree the agent keeps is the
    // one it measured against.
    let empty = || bytes::Bytes::from(vec![0u8; 1024]);
    let first = Listed::of(&["dir", "gone", "keep"]);

    // An agent of protocol 4 never sees a digest.
    let old = flags("4");
    let old: Vec<&str> = old.iter().map(String::as_str).collect();
    let agent = TestAgent::start_with(&old, &[]).await;
    let client = agent.client().for_sandbox("before-5");
    let (begun, sent) = client
        .begin_rewind_against(request.clone(), &first)
        .await
        .unwrap();
    assert_eq!(sent, BaselineSent::Paths);
    let by_paths = changes(&begun);
    // No root record for a client before `RootEntry`.
    assert_eq!(by_paths, ["File made", "Gone gone"]);
    client.finish_rewind(&begun.token, empty()).await.unwrap();
    drop(agent);

    // An agent of 5 keeps no tree at first: the digest, then the paths;
    // then the digest of the tree it kept, and the same answer.
    let new = flags("5");
    let new: Vec<&str> = new.iter().map(String::as_str).collect();
    let agent = TestAgent::start_with(&new, &[]).await;
    let client = agent.client().for_sandbox("keeps");
    for want in [BaselineSent::DigestThenPaths, BaselineSent::Digest] {
        let (begun, sent) = client
            .begin_rewind_against(request.clone(), &first)
            .await
            .unwrap();
        assert_eq!(sent, want);
        assert_eq!(changes(&begun), by_paths, "{want:?}");
        client.finish_rewind(&begun.token, empty()).await.unwrap();
    }
    // Another tree than the one kept: its paths go after the digest, and
    // the deletion it cannot know of is not reported.
    let other = Listed::of(&["dir", "keep"]);
    let (begun, sent) = client
        .begin_rewind_against(request.clone(), &other)
        .await
        .unwrap();
    assert_eq!(sent, BaselineSent::DigestThenPaths);
    assert_eq!(changes(&begun), ["File made"]);
    client.finish_rewind(&begun.token, empty()).await.unwrap();
}
