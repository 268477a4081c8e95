//! silo's real agent in a mock sandbox, the way a Daytona backend would
//! start it: uploaded through the toolbox, made executable, started by a
//! `runAsync` command of a session (so its life is not the HTTP
//! exchange's), and reached on 49999 through the preview proxy with the
//! sandbox's token. Without the token, or with the one from before a
//! restart, the proxy sends the client to sign in.

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{Access, Client};
use super::{mock, wait_for, wait_state};

/// Where the agent goes in the sandbox.
const AGENT: &str = "/home/daytona/.silo/silo-agent";

/// Uploads the agent, makes it executable and starts it in session `agent`.
async fn start_agent(client: &Client, sandbox: &Value) {
    let key = client.key().to_owned();
    let binary = std::fs::read(silo_tests::agent_binary()).unwrap();
    let uploaded = client.upload(sandbox, AGENT, &binary).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{}", uploaded.text());
    let chmod = client
        .toolbox(
            sandbox,
            Access::Bearer(&key),
            Method::POST,
            &format!("/files/permissions?path={AGENT}&mode=755"),
            None,
        )
        .await;
    assert_eq!(chmod.status, StatusCode::OK);
    let session = client
        .toolbox(
            sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/session",
            Some(json!({"sessionId": "agent"})),
        )
        .await;
    assert_eq!(session.status, StatusCode::CREATED, "{}", session.text());
    let command = format!(
        "SILO_AGENT_KEY={} {AGENT} --listen tcp:0.0.0.0:49999",
        "ab".repeat(32)
    );
    let started = client
        .toolbox(
            sandbox,
            Access::Bearer(&key),
            Method::POST,
            "/process/session/agent/exec",
            Some(json!({"command": command, "runAsync": true})),
        )
        .await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.text());
}

/// The preview URL and token of port 49999.
async fn preview(client: &Client, id: &str) -> (String, String) {
    let reply = client
        .api(
            Method::GET,
            &format!("/sandbox/{id}/ports/49999/preview-url"),
            None,
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["sandboxId"], id);
    (
        body["url"].as_str().unwrap().to_owned(),
        body["token"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silos_agent_runs_in_a_session_and_answers_through_the_preview_proxy() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({"autoStopInterval": 0})).await;
    let id = sandbox["id"].as_str().unwrap().to_owned();
    start_agent(&client, &sandbox).await;
    let (url, token) = preview(&client, &id).await;
    assert_eq!(
        url,
        format!(
            "https://49999-{id}.{}:{}",
            mock.proxy_domain(),
            mock.proxy_addr().port()
        )
    );
    assert_eq!(token.len(), 32);

    wait_for(
        "the agent's health check",
        Duration::from_secs(10),
        || async {
            client
                .preview(&url, "/healthz", Access::Token(&token))
                .await
                .status
                == StatusCode::OK
        },
    )
    .await;
    let health = client
        .preview(&url, "/healthz", Access::Token(&token))
        .await
        .json();
    assert_ne!(
        health["pid"], 1,
        "the agent is not PID 1 in a provider's sandbox"
    );
    let key = client.key().to_owned();
    let by_key = client.preview(&url, "/healthz", Access::Bearer(&key)).await;
    assert_eq!(by_key.status, StatusCode::OK);

    // Without the token (or with a wrong one) the proxy sends the client to sign in.
    for access in [Access::None, Access::Token("not-the-token")] {
        let refused = client.preview(&url, "/healthz", access).await;
        assert_eq!(refused.status, StatusCode::TEMPORARY_REDIRECT);
        let location = refused.header("location").unwrap();
        assert!(
            location.starts_with(&format!("https://auth.{}/authorize?", mock.proxy_domain())),
            "{location}"
        );
    }

    // Deleting the session that started the agent kills the agent.
    let deleted = client
        .toolbox(
            &sandbox,
            Access::Bearer(&key),
            Method::DELETE,
            "/process/session/agent",
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    wait_for("the agent to be gone", Duration::from_secs(10), || async {
        client
            .preview(&url, "/healthz", Access::Token(&token))
            .await
            .status
            == StatusCode::BAD_GATEWAY
    })
    .await;
    let closed = client
        .preview(&url, "/healthz", Access::Token(&token))
        .await;
    assert!(closed.body.is_empty());

    // A stop ends every process; the token lasts until the next start.
    start_agent(&client, &sandbox).await;
    wait_for("the agent again", Duration::from_secs(10), || async {
        client
            .preview(&url, "/healthz", Access::Token(&token))
            .await
            .status
            == StatusCode::OK
    })
    .await;
    client
        .api(Method::POST, &format!("/sandbox/{id}/stop"), None)
        .await;
    wait_state(&client, &id, "stopped").await;
    let stopped = client
        .preview(&url, "/healthz", Access::Token(&token))
        .await;
    assert_eq!(stopped.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        stopped.json()["path"],
        format!("/sandboxes/{id}/toolbox/proxy/49999/healthz")
    );
    let started = client
        .api(Method::POST, &format!("/sandbox/{id}/start"), None)
        .await;
    assert_eq!(started.json()["state"], "started");
    let old = client
        .preview(&url, "/healthz", Access::Token(&token))
        .await;
    assert_eq!(
        old.status,
        StatusCode::TEMPORARY_REDIRECT,
        "the old token is refused"
    );
    let (_, fresh) = preview(&client, &id).await;
    assert_ne!(fresh, token);
    let nothing = client
        .preview(&url, "/healthz", Access::Token(&fresh))
        .await;
    assert_eq!(
        nothing.status,
        StatusCode::BAD_GATEWAY,
        "no agent after a restart"
    );
    start_agent(&client, &sandbox).await;
    wait_for(
        "the agent after the restart",
        Duration::from_secs(10),
        || async {
            client
                .preview(&url, "/healthz", Access::Token(&fresh))
                .await
                .status
                == StatusCode::OK
        },
    )
    .await;
    mock.shutdown().await.unwrap();
}
