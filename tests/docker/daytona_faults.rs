//! What a real Daytona does that the mock shows only when asked, met by
//! the Daytona backend through the real CLI: a preview token that lapses
//! (fetched again once, the sandbox answering on), the control plane
//! rate-limiting with `Retry-After`, and the network option reaching the
//! create call.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_mocks::{MockDaytona, MockDaytonaConfig};
use silo_tests::docker::engine_with_base;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lapsed_preview_token_is_fetched_again_once() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let mock = MockDaytona::start(MockDaytonaConfig::default())
        .await
        .unwrap();
    let cli = crate::cli().with_env(mock.env());
    // Uploads go through the toolbox's bulk route; the agent then runs.
    cli.ok(&["up", "box", "--backend", "daytona", "--image", "base"]);
    assert_eq!(crate::sh(&cli, "box", "echo before"), "before\n");

    mock.lapse_preview_tokens().unwrap();
    let out = cli.run(&["exec", "box", "--", "echo", "lapsed"]);
    assert!(!out.status.success(), "a lapsed token still worked");
    let previews = |mock: &MockDaytona| {
        mock.requests()
            .iter()
            .filter(|asked| asked.path.contains("/ports/49999/preview-url"))
            .count()
    };
    let before = previews(&mock);
    // A start finds the agent behind a refused token, fetches a new one
    // once, and the sandbox answers again without a restart.
    cli.ok(&["up", "box"]);
    assert_eq!(previews(&mock), before + 1, "{:?}", mock.requests());
    assert_eq!(crate::sh(&cli, "box", "echo after"), "after\n");
    cli.ok(&["rm", "box"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limits_are_waited_out_and_no_network_reaches_the_create() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let mock = MockDaytona::start(MockDaytonaConfig::default())
        .await
        .unwrap();
    let cli = crate::cli().with_env(mock.env());
    mock.faults().rate_limit(2, Duration::from_secs(1));
    let started = Instant::now();
    cli.ok(&[
        "up",
        "box",
        "--backend",
        "daytona",
        "--image",
        "base",
        "--network",
        "none",
    ]);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "Retry-After was not honoured: {:?}",
        started.elapsed()
    );
    let creates: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|asked| {
            asked.method == "POST" && asked.path.trim_end_matches('/').ends_with("/sandbox")
        })
        .collect();
    let body = &creates.last().unwrap().body;
    assert_eq!(body["networkBlockAll"], true, "{body}");
    cli.ok(&["rm", "box"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}
