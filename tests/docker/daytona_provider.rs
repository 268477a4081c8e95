//! Daytona's own features and faults, met by the Daytona backend through
//! the real CLI: `silo stop` of a VM sandbox as Daytona's pause (the agent
//! and its processes kept), a preview token that lapses (fetched again
//! once, the sandbox answering on), the control plane rate-limiting with
//! `Retry-After`, and the network option reaching the create call.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_mocks::{MockDaytona, MockDaytonaConfig};
use silo_tests::docker::engine_with_base;

/// A mock Daytona and the CLI pointed at it, when the engine is there.
async fn mock(config: MockDaytonaConfig) -> Option<(MockDaytona, silo_tests::Cli)> {
    engine_with_base().await?;
    let mock = MockDaytona::start(config).await.unwrap();
    let cli = crate::cli().with_env(mock.env());
    Some((mock, cli))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_sandbox_pauses_with_its_processes() {
    let mut config = MockDaytonaConfig::default();
    config
        .snapshots
        .insert("vm".into(), silo_tests::docker::BASE_IMAGE.into());
    config.vm_snapshots.insert("vm".into());
    let Some((mock, cli)) = mock(config).await else {
        return;
    };
    cli.ok(&["up", "box", "--backend", "daytona", "--image", "vm"]);
    let agent = crate::sh(&cli, "box", "pidof silo-agent");
    // A process started before the pause runs on after it.
    crate::sh(&cli, "box", "setsid sleep 1003 >/dev/null 2>&1 &");
    let paused = silo_tests::json(&cli.ok(&["pause", "box", "--json"]));
    assert_eq!(paused["paused"], true, "{paused}");
    assert_eq!(paused["was_running"], true, "{paused}");
    let paused: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|asked| asked.method == "POST" && asked.path.ends_with("/pause"))
        .collect();
    assert_eq!(paused.len(), 1, "{:?}", mock.requests());
    assert!(
        !mock
            .requests()
            .iter()
            .any(|asked| asked.path.ends_with("/stop")),
        "a VM sandbox was stopped, not paused"
    );
    cli.ok(&["up", "box"]);
    // The same agent answers: the pause kept it, and the process.
    assert_eq!(crate::sh(&cli, "box", "pidof silo-agent"), agent);
    assert_eq!(
        crate::sh(&cli, "box", "ps | grep -c '[s]leep 1003'").trim(),
        "1",
        "the process did not survive the pause"
    );
    // `silo stop` says it paused as well.
    let stopped = silo_tests::json(&cli.ok(&["stop", "box", "--json"]));
    assert_eq!(stopped["paused"], true, "{stopped}");
    cli.ok(&["rm", "box"]);

    // A container sandbox's stop ends its processes: pause is refused,
    // saying why, and the sandbox runs on.
    cli.ok(&["up", "tub", "--backend", "daytona", "--image", "base"]);
    let refused = cli.fails(&["pause", "tub"]);
    assert!(refused.contains("a stop ends its processes"), "{refused}");
    assert_eq!(crate::sh(&cli, "tub", "echo on"), "on\n");
    cli.ok(&["rm", "tub"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lapsed_preview_token_is_fetched_again_once() {
    let Some((mock, cli)) = mock(MockDaytonaConfig::default()).await else {
        return;
    };
    // Uploads go through the toolbox's bulk route; the agent then runs.
    cli.ok(&["up", "box", "--backend", "daytona", "--image", "base"]);
    assert_eq!(crate::sh(&cli, "box", "echo before"), "before\n");
    // The preview URL is kept whole: its port (the mock's proxy is not on
    // 443) goes in the Host header the proxy routes on.
    let listed = silo_tests::json(&cli.ok(&["ls", "--json"]));
    let row = &listed[0];
    let backend_ref = if row["backend_ref"].is_object() {
        &row["backend_ref"]
    } else {
        &row["sandbox"]["backend_ref"]
    };
    let url = backend_ref["preview_url"].as_str().unwrap_or_default();
    assert!(
        url.starts_with("https://49999-")
            && url.ends_with(&format!(":{}", mock.proxy_addr().port())),
        "{backend_ref}"
    );

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
    let Some((mock, cli)) = mock(MockDaytonaConfig::default()).await else {
        return;
    };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allow_list_reaches_the_create_as_daytonas_network_rules() {
    let Some((mock, cli)) = mock(MockDaytonaConfig::default()).await else {
        return;
    };
    cli.ok(&[
        "up",
        "box",
        "--backend",
        "daytona",
        "--image",
        "base",
        "--allow-out",
        "1.1.1.1",
        "--allow-out",
        "*.pypi.org",
        "--allow-out",
        "10.1.0.0/16",
    ]);
    let creates = |mock: &MockDaytona| -> Vec<serde_json::Value> {
        mock.requests()
            .into_iter()
            .filter(|asked| {
                asked.method == "POST" && asked.path.trim_end_matches('/').ends_with("/sandbox")
            })
            .map(|asked| asked.body)
            .collect()
    };
    let body = creates(&mock).pop().unwrap();
    assert_eq!(body["networkAllowList"], "1.1.1.1/32,10.1.0.0/16", "{body}");
    assert_eq!(body["domainAllowList"], "*.pypi.org", "{body}");
    assert_eq!(body["networkBlockAll"], false, "{body}");
    assert_eq!(crate::sh(&cli, "box", "echo on"), "on\n");

    // The lists change in place through `network-settings`, every field
    // sent (a blank one clears its rule); a deny list is refused unsent.
    let changed =
        silo_tests::json(&cli.ok(&["network", "box", "--allow-out", "8.8.8.8", "--json"]));
    assert_eq!(
        changed["spec"]["allow_out"],
        serde_json::json!(["8.8.8.8/32"])
    );
    let settings: Vec<serde_json::Value> = mock
        .requests()
        .into_iter()
        .filter(|asked| asked.method == "POST" && asked.path.ends_with("/network-settings"))
        .map(|asked| asked.body)
        .collect();
    assert_eq!(
        settings,
        [serde_json::json!({
            "networkBlockAll": false,
            "networkAllowList": "8.8.8.8/32",
            "domainAllowList": ""
        })]
    );
    let asked = mock.requests().len();
    let refused = cli.fails(&["network", "box", "--deny-out", "10.0.0.0/8"]);
    assert!(
        refused.contains("daytona backend has no deny list"),
        "{refused}"
    );
    assert_eq!(mock.requests().len(), asked);
    assert_eq!(crate::sh(&cli, "box", "echo still"), "still\n");
    cli.ok(&["rm", "box"]);

    // More than Daytona takes is refused before anything is made.
    let made = creates(&mock).len();
    let mut argv = vec!["up", "wide", "--backend", "daytona"];
    let blocks: Vec<String> = (1..=11).map(|i| format!("10.0.{i}.0/24")).collect();
    for block in &blocks {
        argv.extend(["--allow-out", block.as_str()]);
    }
    let refused = cli.fails(&argv);
    assert!(refused.contains("Daytona allows at most 10"), "{refused}");
    // Daytona has no deny list: one is refused by name, before any call.
    let asked = mock.requests().len();
    let refused = cli.fails(&[
        "up",
        "denied",
        "--backend",
        "daytona",
        "--deny-out",
        "10.0.0.0/8",
    ]);
    assert!(
        refused.contains("bad deny-out") && refused.contains("daytona backend has no deny list"),
        "{refused}"
    );
    assert_eq!(mock.requests().len(), asked);
    assert_eq!(creates(&mock).len(), made);
    assert!(!cli.ok(&["ls"]).contains("denied"));
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_toolbox_without_bulk_upload_gets_the_agent_through_files_upload() {
    let Some((mock, cli)) = mock(MockDaytonaConfig::default()).await else {
        return;
    };
    // A daemon from before `files/bulk-upload`: the agent and its key can
    // only go through `files/upload`, and the sandbox works all the same.
    mock.faults().set_no_bulk_upload(true);
    cli.ok(&["up", "old", "--backend", "daytona", "--image", "base"]);
    assert_eq!(crate::sh(&cli, "old", "echo fell back"), "fell back\n");
    // A stop ends the agent; the start hands over a fresh key the same way.
    cli.ok(&["stop", "old"]);
    cli.ok(&["up", "old"]);
    assert_eq!(crate::sh(&cli, "old", "echo again"), "again\n");
    cli.ok(&["rm", "old"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}
