//! Hostile bundles against the real agent: every reject reason, each one
//! refused with the entry and the reason named, nothing written outside the
//! push root, and the live tree byte-identical before and after.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::path::{Path, PathBuf};

use silo_protocol::bundle::{Bundle, BundleLimits, FileSet};
use silo_protocol::push::Declared;
use silo_tests::TestAgent;
use silo_tests::push::{
    bundle_of, gzip, listing, push_claiming, push_declaring, push_raw, tar_entry, tar_file,
};

/// A named case: its tar entries and what the refusal must mention.
type Case = (&'static str, Vec<Vec<u8>>, &'static [&'static str]);

struct Setup {
    agent: TestAgent,
    /// Holds the push root and, beside it, a directory a bundle must never reach.
    base: tempfile::TempDir,
    mount: String,
}

impl Setup {
    async fn start(extra: &[&str]) -> Self {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("managed");
        std::fs::create_dir_all(base.path().join("outside")).unwrap();
        let root_flag = root.display().to_string();
        let mut flags = vec!["--push-root", root_flag.as_str()];
        flags.extend_from_slice(extra);
        let agent = TestAgent::start_with(&flags, &[]).await;
        let mount = root.join("app").display().to_string();
        let setup = Self { agent, base, mount };
        // A live tree to keep intact.
        let mut files = FileSet::new();
        files
            .insert_bytes("keep/me.txt", b"original".to_vec(), false)
            .unwrap();
        let bundle = Bundle::build(&files, &BundleLimits::default()).unwrap();
        let (status, body) = push_raw(&setup.agent.client(), &setup.mount, bundle.bytes).await;
        assert_eq!(status, 200, "{body}");
        setup
    }

    fn outside(&self) -> PathBuf {
        self.base.path().join("outside")
    }

    fn state(&self) -> (std::collections::BTreeMap<String, String>, Vec<String>) {
        let all = listing(self.base.path());
        let tmp: Vec<String> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("silo-escape"))
            .collect();
        (all, tmp)
    }

    /// Pushes `body`; checks the status, the kind, that the message names
    /// `needles`, and that nothing on disk changed.
    async fn refused(&self, case: &str, body: Vec<u8>, status: u16, kind: &str, needles: &[&str]) {
        let before = self.state();
        let (got, answer) = push_raw(&self.agent.client(), &self.mount, body).await;
        self.check(case, before, got, &answer, status, kind, needles);
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one assertion helper for every case"
    )]
    fn check(
        &self,
        case: &str,
        before: (std::collections::BTreeMap<String, String>, Vec<String>),
        got: u16,
        answer: &serde_json::Value,
        status: u16,
        kind: &str,
        needles: &[&str],
    ) {
        assert_eq!(got, status, "{case}: {answer}");
        assert_eq!(answer["kind"], kind, "{case}: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        for needle in needles {
            assert!(
                message.contains(needle),
                "{case}: {message:?} lacks {needle:?}"
            );
        }
        assert_eq!(self.state(), before, "{case}: the disk changed");
        assert_eq!(
            std::fs::read_to_string(Path::new(&self.mount).join("keep/me.txt")).unwrap(),
            "original",
            "{case}"
        );
    }
}

#[tokio::test]
async fn every_hostile_entry_is_refused_and_changes_nothing() {
    let s = Setup::start(&[]).await;
    let outside = s.outside().join("escaped.txt").display().to_string();
    let tmp_escape = std::env::temp_dir()
        .join("silo-escape-abs.txt")
        .display()
        .to_string();
    let cases: Vec<Case> = vec![
        (
            "dotdot",
            vec![tar_file("../outside/escaped.txt", b"x")],
            &["../outside/escaped.txt", "'..'"],
        ),
        (
            "nested dotdot",
            vec![tar_file("a/../../outside/escaped.txt", b"x")],
            &["'..'"],
        ),
        ("absolute", vec![tar_file(&tmp_escape, b"x")], &["absolute"]),
        (
            "symlink",
            vec![tar_entry(b"link", b'2', b"", outside.as_bytes())],
            &["\"link\"", "symlinks"],
        ),
        (
            "hard link",
            vec![tar_entry(b"hard", b'1', b"", b"/etc/passwd")],
            &["\"hard\"", "hard links"],
        ),
        (
            "char device",
            vec![tar_entry(b"null", b'3', b"", b"")],
            &["\"null\"", "device"],
        ),
        (
            "block device",
            vec![tar_entry(b"disk", b'4', b"", b"")],
            &["\"disk\"", "device"],
        ),
        (
            "fifo",
            vec![tar_entry(b"pipe", b'6', b"", b"")],
            &["\"pipe\"", "FIFO"],
        ),
        (
            "socket or other special type",
            vec![tar_entry(b"sock", b'Z', b"", b"")],
            &["\"sock\"", "unsupported entry type"],
        ),
        (
            "non-UTF-8 name",
            vec![tar_entry(b"bad-\xff-name", b'0', b"x", b"")],
            &["not UTF-8"],
        ),
        (
            "duplicate",
            vec![tar_file("dup.txt", b"one"), tar_file("dup.txt", b"two")],
            &["\"dup.txt\"", "duplicate"],
        ),
        (
            "file in the way of a directory",
            vec![tar_file("f", b"one"), tar_file("f/g", b"two")],
            &["\"f/g\""],
        ),
    ];
    for (case, entries, needles) in cases {
        s.refused(case, bundle_of(&entries), 400, "rejected_entry", needles)
            .await;
    }
    assert!(!Path::new(&tmp_escape).exists());

    s.refused(
        "not gzip",
        b"plain text".to_vec(),
        400,
        "malformed",
        &["tar.gz"],
    )
    .await;
    let mut trailing = bundle_of(&[tar_file("a", b"a")]);
    trailing.extend_from_slice(b"trailing");
    s.refused(
        "data after gzip",
        trailing,
        400,
        "malformed",
        &["after the end"],
    )
    .await;
    let mut corrupt = bundle_of(&[tar_file("a", &[7u8; 4096])]);
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0xff;
    s.refused("corrupt gzip", corrupt, 400, "malformed", &[])
        .await;

    // A decompression bomb: 20 MiB of zeros is under the per-file cap but
    // inflates ~1000x.
    let bomb = gzip(&[tar_file("zeros", &vec![0u8; 20 << 20]), vec![0u8; 1024]].concat());
    s.refused("bomb", bomb, 413, "too_large", &["decompression bomb"])
        .await;

    // The body is not what was signed.
    let good = bundle_of(&[tar_file("fine.txt", b"fine")]);
    let before = s.state();
    let (got, answer) = push_claiming(&s.agent.client(), &s.mount, good, &"ab".repeat(32)).await;
    s.check(
        "hash mismatch",
        before,
        got,
        &answer,
        422,
        "hash_mismatch",
        &["signed for"],
    );
}

#[tokio::test]
async fn caps_on_files_totals_entries_and_size_are_enforced() {
    let s = Setup::start(&[
        "--push-max-file-bytes",
        "1024",
        "--push-max-unpacked-bytes",
        "4096",
        "--push-max-entries",
        "8",
        "--push-max-bundle-bytes",
        "65536",
    ])
    .await;
    let big = vec![b'x'; 2048];
    s.refused(
        "per-file cap",
        bundle_of(&[tar_file("big.bin", &big)]),
        413,
        "too_large",
        &["\"big.bin\"", "per-file"],
    )
    .await;
    let five: Vec<Vec<u8>> = (0..5)
        .map(|i| tar_file(&format!("f{i}"), &[b'y'; 1000]))
        .collect();
    s.refused(
        "unpacked cap",
        bundle_of(&five),
        413,
        "too_large",
        &["unpacks to more than 4096"],
    )
    .await;
    let many: Vec<Vec<u8>> = (0..10).map(|i| tar_file(&format!("e{i}"), b"")).collect();
    s.refused(
        "entry cap",
        bundle_of(&many),
        413,
        "too_large",
        &["more than 8 entries"],
    )
    .await;
    // Incompressible bytes over the bundle cap: refused from Content-Length, unread.
    let noise: Vec<u8> = (0..70_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    s.refused(
        "bundle cap",
        noise,
        413,
        "too_large",
        &["over the limit of 65536"],
    )
    .await;
}

#[tokio::test]
async fn a_bundle_declared_over_the_entry_cap_is_refused_at_once_and_a_lie_is_caught() {
    let s = Setup::start(&[]).await;
    // 200,000 entries: extracting them to the default cap of 100,000 took
    // minutes on fuse-overlayfs before the refusal.
    let many: Vec<Vec<u8>> = (0..200_000)
        .map(|i| tar_file(&format!("d{}/f{i}", i % 100), b""))
        .collect();
    let body = bundle_of(&many);
    let before = s.state();
    let started = std::time::Instant::now();
    let declared = Declared {
        entries: Some(200_000),
        unpacked: Some(0),
    };
    let (status, answer) = push_declaring(&s.agent.client(), &s.mount, body, declared).await;
    let took = started.elapsed();
    assert_eq!(status, 413, "{answer}");
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("200000 entries") && message.contains("100000"),
        "{message}"
    );
    assert!(
        took < std::time::Duration::from_secs(1),
        "refused after {took:?}"
    );
    assert_eq!(s.state(), before, "nothing changed");

    // A bundle holding more than it declared is refused past the declaration.
    let ten: Vec<Vec<u8>> = (0..10).map(|i| tar_file(&format!("e{i}"), b"")).collect();
    let declared = Declared {
        entries: Some(3),
        unpacked: None,
    };
    let (status, answer) =
        push_declaring(&s.agent.client(), &s.mount, bundle_of(&ten), declared).await;
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or_default()
            .contains("more than 3 entries"),
        "{answer}"
    );
    assert_eq!(s.state(), before, "nothing changed");
}

#[tokio::test]
async fn mounts_outside_the_root_or_in_the_way_are_refused() {
    let s = Setup::start(&[]).await;
    let body = bundle_of(&[tar_file("a", b"a")]);
    let before = s.state();
    let outside = s.outside().join("app").display().to_string();
    let (got, answer) = push_raw(&s.agent.client(), &outside, body.clone()).await;
    s.check(
        "outside the root",
        before.clone(),
        got,
        &answer,
        403,
        "mount_not_allowed",
        &["not under an allowed push root"],
    );
    let sneaky = format!("{}/../outside/app", s.mount);
    let (got, answer) = push_raw(&s.agent.client(), &sneaky, body.clone()).await;
    s.check(
        "dotdot in the mount",
        before,
        got,
        &answer,
        400,
        "malformed",
        &["'..'"],
    );

    // A real directory (user data) where a mount would go is never replaced.
    let user = s.base.path().join("managed/user");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("precious.txt"), "mine").unwrap();
    let before = s.state();
    let (got, answer) =
        push_raw(&s.agent.client(), &user.display().to_string(), body.clone()).await;
    s.check(
        "real directory at the mount",
        before,
        got,
        &answer,
        409,
        "mount_conflict",
        &["not managed by silo"],
    );

    // A symlink on the way to the mount is not followed.
    std::os::unix::fs::symlink(s.outside(), s.base.path().join("managed/via")).unwrap();
    let before = s.state();
    let via = s.base.path().join("managed/via/app").display().to_string();
    let (got, answer) = push_raw(&s.agent.client(), &via, body).await;
    s.check(
        "symlink on the way",
        before,
        got,
        &answer,
        409,
        "mount_conflict",
        &["symlink"],
    );
}

#[tokio::test]
async fn a_symlink_then_a_write_through_it_escapes_nowhere() {
    let s = Setup::start(&[]).await;
    let outside = s.outside().display().to_string();
    // The classic: a link to a directory outside, then a file "inside" the link.
    let escape = bundle_of(&[
        tar_entry(b"out", b'2', b"", outside.as_bytes()),
        tar_file("out/pwned.txt", b"gotcha"),
    ]);
    s.refused(
        "symlink then write",
        escape,
        400,
        "rejected_entry",
        &["\"out\"", "symlinks"],
    )
    .await;
    // The same through a hard link to a file outside, then overwriting it.
    let target = s.outside().join("victim.txt");
    std::fs::write(&target, "untouched").unwrap();
    let hard = bundle_of(&[
        tar_entry(
            b"victim",
            b'1',
            b"",
            target.display().to_string().as_bytes(),
        ),
        tar_file("victim", b"overwritten"),
    ]);
    s.refused(
        "hard link then write",
        hard,
        400,
        "rejected_entry",
        &["hard links"],
    )
    .await;
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
    assert!(!s.outside().join("pwned.txt").exists());
}
