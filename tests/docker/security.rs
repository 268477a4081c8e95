//! What a Docker sandbox's capabilities may be, on the real engine: every
//! capability is only ever had through `--privileged` (never `--cap-add
//! ALL`), and the same capabilities given in another order or spelling open
//! the same sandbox instead of being reported as spec drift.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use silo_tests::docker::{BASE_IMAGE, engine_with_base};

#[tokio::test]
async fn cap_add_all_is_refused_before_anything_is_made() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let out = cli.run(&["up", "every", "--image", BASE_IMAGE, "--cap-add", "ALL"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--privileged"), "{stderr}");
    assert!(
        !stderr.contains("engine API"),
        "refused by silo, not left to the engine: {stderr}"
    );
    assert!(!cli.run(&["exec", "every", "--", "true"]).status.success());
}

#[tokio::test]
async fn capabilities_in_another_order_or_spelling_are_no_drift() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let up = |caps: &[&str]| {
        let mut args = vec!["up", "caps", "--image", BASE_IMAGE];
        for cap in caps {
            args.extend(["--cap-add", cap]);
        }
        cli.run(&args)
    };
    assert!(up(&["NET_RAW", "SYS_PTRACE"]).status.success());
    let again = up(&["CAP_SYS_PTRACE", "NET_RAW"]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let status = cli.ok(&["exec", "caps", "--", "grep", "CapBnd", "/proc/self/status"]);
    let caps = u64::from_str_radix(status.trim().trim_start_matches("CapBnd:").trim(), 16).unwrap();
    // NET_RAW is capability 13, SYS_PTRACE 19 (linux/capability.h).
    assert_eq!(caps & (1 << 13 | 1 << 19), 1 << 13 | 1 << 19, "{caps:x}");
}
