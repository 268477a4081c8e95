//! The switches for what a real E2B does that the mock otherwise does not
//! show: rate limits (`429` with `Retry-After`, set in process and through
//! the test-only route), creates failing inside E2B (`500`), connections cut
//! when a sandbox pauses, and a proxy that answers `502` for a while after a
//! resume.

use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::json;

use super::client::Client;
use super::{mock, wait_for};

#[tokio::test]
async fn rate_limits_answer_429_with_retry_after_until_they_run_out() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    mock.faults().rate_limit(2, Duration::from_secs(3));
    for _ in 0..2 {
        let limited = client.api(Method::GET, "/v2/sandboxes", None).await;
        assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited.header("retry-after"), Some("3"));
        assert_eq!(limited.json()["code"], 429);
    }
    assert_eq!(
        client.api(Method::GET, "/v2/sandboxes", None).await.status,
        StatusCode::OK
    );

    // The same through the test-only route, which needs the key.
    let switch = json!({"rateLimitedRequests": 1, "retryAfterSecs": 1});
    let refused = client
        .api_as(None, Method::POST, "/_mock/faults", Some(switch.clone()))
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let set = client
        .api(Method::POST, "/_mock/faults", Some(switch))
        .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text());
    assert_eq!(set.json()["rateLimitedRequests"], 1);
    let limited = client
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.header("retry-after"), Some("1"));
    let typo = client
        .api(
            Method::POST,
            "/_mock/faults",
            Some(json!({"dropOnPuase": true})),
        )
        .await;
    assert_eq!(typo.status, StatusCode::BAD_REQUEST);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failed_create_answers_500_once_and_the_next_is_served() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let set = client
        .api(
            Method::POST,
            "/_mock/faults",
            Some(json!({"failedCreates": 1})),
        )
        .await;
    assert_eq!(set.json()["failedCreates"], 1, "{}", set.text());
    let create = || {
        client.api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
    };
    let failed = create().await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.json()["message"], "Failed to place sandbox");
    let made = create().await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text());
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_pause_cuts_open_streams_only_when_asked_to() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({"templateID": "base", "timeout": 120}))
        .await;
    let script = "while :; do echo tick; sleep 0.1; done";

    // Off: a paused sandbox's stream stays open (frozen), and goes on after the resume.
    let mut kept = client.start(&id, script, &[]).await;
    let _ = kept.pid().await;
    pause_and_resume(&client, &id).await;
    let tick = kept
        .next()
        .await
        .expect("the stream goes on after a resume");
    assert!(tick.message["event"].is_object());

    // On: the pause breaks it off, as the VM's network goes away.
    mock.faults().set_drop_on_pause(true);
    let mut cut = client.start(&id, script, &[]).await;
    let pid = cut.pid().await;
    pause(&client, &id).await;
    assert!(
        cut.broken().await,
        "the stream ended cleanly instead of breaking off"
    );
    resume(&client, &id).await;
    // The process itself lives on: only the connection went.
    let listed = client
        .rpc(&id, "process.Process/List", json!({}), None)
        .await
        .json();
    let pids: Vec<u64> = listed["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(pids.contains(&pid), "{listed}");
    drop(kept);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_resumed_sandbox_answers_502_while_unready() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({"templateID": "base", "timeout": 120}))
        .await;
    let host = client.host(49983, &id);
    mock.faults().set_unready(Duration::from_millis(1500));
    pause_and_resume(&client, &id).await;
    let resumed_at = Instant::now();
    let unready = client.get(&host, "/health", &[]).await;
    assert_eq!(unready.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        unready.json()["message"],
        "The sandbox is running but port is not open"
    );
    wait_for(
        "the proxy to answer again",
        Duration::from_secs(10),
        || async { client.get(&host, "/health", &[]).await.status == StatusCode::NO_CONTENT },
    )
    .await;
    assert!(resumed_at.elapsed() >= Duration::from_millis(1000));
    mock.shutdown().await.unwrap();
}

async fn pause_and_resume(client: &Client, id: &str) {
    pause(client, id).await;
    resume(client, id).await;
}

async fn pause(client: &Client, id: &str) {
    let paused = client
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT, "{}", paused.text());
}

async fn resume(client: &Client, id: &str) {
    let resumed = client
        .api(
            Method::POST,
            &format!("/v2/sandboxes/{id}/connect"),
            Some(json!({})),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::CREATED, "{}", resumed.text());
}
