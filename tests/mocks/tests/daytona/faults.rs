//! The switches for what a real Daytona does that the mock otherwise does
//! not show: rate limits (`429` with `Retry-After`), preview tokens that
//! lapse (refused until a new preview URL is fetched), and previews that
//! answer `502` for a while after a start.

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;

use super::client::Access;
use super::{mock, wait_for, wait_state};

#[tokio::test]
async fn rate_limits_answer_429_with_retry_after() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    mock.faults().rate_limit(1, Duration::from_secs(2));
    let limited = client.api(Method::GET, "/sandbox", None).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.header("retry-after"), Some("2"));
    assert_eq!(limited.json()["statusCode"], 429);
    assert_eq!(
        client.api(Method::GET, "/sandbox", None).await.status,
        StatusCode::OK
    );
    let set = client
        .api(
            Method::POST,
            "/_mock/faults",
            Some(json!({"rateLimitedRequests": 1, "retryAfterSecs": 5})),
        )
        .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text());
    let limited = client.api(Method::GET, "/sandbox", None).await;
    assert_eq!(limited.header("retry-after"), Some("5"));
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn lapsed_preview_tokens_are_refused_until_a_new_url_is_fetched() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({})).await;
    let id = sandbox["id"].as_str().unwrap().to_owned();
    serve(&client, &sandbox).await;
    let (url, token) = client.preview_url(&id, 49999).await;
    let before = client.preview(&url, "/", Access::Token(&token)).await;
    assert_eq!(before.status, StatusCode::OK, "{}", before.text());

    let lapsed = client
        .api(
            Method::POST,
            "/_mock/faults",
            Some(json!({"lapsePreviewTokens": true})),
        )
        .await;
    assert_eq!(lapsed.status, StatusCode::OK, "{}", lapsed.text());
    let refused = client.preview(&url, "/", Access::Token(&token)).await;
    assert_eq!(refused.status, StatusCode::TEMPORARY_REDIRECT);
    let (_, fresh) = client.preview_url(&id, 49999).await;
    assert_ne!(fresh, token);
    let after = client.preview(&url, "/", Access::Token(&fresh)).await;
    assert_eq!(after.status, StatusCode::OK);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_started_sandbox_previews_502_while_unready() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let sandbox = client.create(json!({"autoStopInterval": 0})).await;
    let id = sandbox["id"].as_str().unwrap().to_owned();
    mock.faults().set_unready(Duration::from_millis(1500));
    let stopped = client
        .api(Method::POST, &format!("/sandbox/{id}/stop"), None)
        .await;
    assert_eq!(stopped.status, StatusCode::OK);
    wait_state(&client, &id, "stopped").await;
    let started = client
        .api(Method::POST, &format!("/sandbox/{id}/start"), None)
        .await;
    assert_eq!(started.status, StatusCode::OK, "{}", started.text());
    serve(&client, &sandbox).await;
    let (url, token) = client.preview_url(&id, 49999).await;
    let unready = client.preview(&url, "/", Access::Token(&token)).await;
    assert_eq!(unready.status, StatusCode::BAD_GATEWAY);
    wait_for("the preview to answer", Duration::from_secs(10), || async {
        client
            .preview(&url, "/", Access::Token(&token))
            .await
            .status
            == StatusCode::OK
    })
    .await;
    mock.shutdown().await.unwrap();
}

/// A one-line web server on the agent's port (49999), in the background.
async fn serve(client: &super::client::Client, sandbox: &serde_json::Value) {
    let command =
        "mkdir -p /tmp/www && echo up > /tmp/www/index.html && busybox httpd -p 49999 -h /tmp/www";
    let reply = client.execute(sandbox, command).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}
