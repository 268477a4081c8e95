//! silo's real agent in a mock sandbox, the way an E2B backend would start
//! it: uploaded through envd, made executable, started as a process that
//! outlives its stream, and reached on 49999 through the TLS proxy.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use super::{mock, wait_for};

/// Where the agent goes in the sandbox.
const AGENT: &str = "/home/user/.silo/silo-agent";

#[tokio::test]
async fn silos_agent_runs_in_a_sandbox_and_answers_through_the_proxy() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({"templateID": "base", "timeout": 60}))
        .await;
    let binary = std::fs::read(silo_tests::agent_binary()).unwrap();
    let uploaded = client.upload(&id, AGENT, binary).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{}", uploaded.text());

    // Uploads are not executable, as on E2B.
    let chmod = client
        .start(&id, &format!("chmod 755 {AGENT}"), &[])
        .await
        .finish()
        .await;
    assert_eq!(chmod.end.unwrap()["exited"], true);
    let key = "ab".repeat(32);
    let message = json!({
        "process": {
            "cmd": AGENT,
            "args": ["--listen", "tcp:0.0.0.0:49999"],
            "envs": {"SILO_AGENT_KEY": key},
        },
        "stdin": false,
    });
    let mut agent = client
        .start_message(&id, message, &[("connect-timeout-ms", "0")])
        .await;
    let pid = agent.pid().await;
    assert_ne!(pid, 1, "the agent is not PID 1 in a provider's sandbox");
    drop(agent);

    let web = client.host(49999, &id);
    wait_for(
        "the agent's health check",
        Duration::from_secs(10),
        || async { client.get(&web, "/healthz", &[]).await.status == StatusCode::OK },
    )
    .await;
    let health = client.get(&web, "/healthz", &[]).await.json();
    assert_eq!(health["pid"], pid);
    mock.shutdown().await.unwrap();
}
