//! A sandbox's whole life through the public shapes: create (the
//! `Sandbox` object field for field), find by id and by name, stop (at
//! once `stopping`, then `stopped` with the container stopped), start,
//! delete (`destroying`, then gone with its container), and the automatic
//! stop and delete.

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;
use silo_mocks::MockDaytonaConfig;

use super::{containers_of, mock, mock_with, running, wait_gone, wait_state};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_is_created_stopped_started_and_deleted() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let sandbox = client
        .create(json!({
            "name": "life",
            "env": {"GREETING": "hello"},
            "labels": {"suite": "lifecycle"},
            "autoStopInterval": 0,
        }))
        .await;
    let id = sandbox["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(sandbox["organizationId"], mock.organization_id());
    let expected = json!({
        "id": id,
        "organizationId": mock.organization_id(),
        "name": "life",
        "snapshot": "base",
        "user": "daytona",
        "env": {"GREETING": "hello"},
        "labels": {"suite": "lifecycle"},
        "public": false,
        "networkBlockAll": false,
        "kvm": false,
        "networkAllowList": null,
        "domainAllowList": null,
        "target": mock.target(),
        "cpu": 1,
        "gpu": 0,
        "memory": 1,
        "disk": 3,
        "state": "creating",
        "desiredState": "started",
        "errorReason": null,
        "recoverable": false,
        "backupState": "None",
        "autoStopInterval": 0,
        "autoPauseInterval": 0,
        "autoArchiveInterval": 10080,
        "autoDeleteInterval": -1,
        "volumes": [],
        "createdAt": sandbox["createdAt"],
        "updatedAt": sandbox["updatedAt"],
        "lastActivityAt": sandbox["lastActivityAt"],
        "sandboxClass": "container",
        "daemonVersion": null,
        "runnerId": sandbox["runnerId"],
        "toolboxProxyUrl": mock.toolbox_url(),
    });
    assert_eq!(sandbox, expected);
    assert!(sandbox["createdAt"].as_str().unwrap().ends_with('Z'));
    // The answer says `creating` as the real one does, but it came once the
    // sandbox ran.
    assert!(running(&engine, &id).await);
    assert_eq!(client.get(&id).await.json()["state"], "started");

    let by_name = client.get("life").await;
    assert_eq!(by_name.json()["id"], id.as_str());
    let proxy_url = client
        .api(
            Method::GET,
            &format!("/sandbox/{id}/toolbox-proxy-url"),
            None,
        )
        .await;
    assert_eq!(proxy_url.json(), json!({"url": mock.toolbox_url()}));

    let stopping = client
        .api(Method::POST, &format!("/sandbox/{id}/stop"), None)
        .await;
    assert_eq!(stopping.status, StatusCode::OK, "{}", stopping.text());
    assert_eq!(stopping.json()["state"], "stopping");
    assert_eq!(stopping.json()["desiredState"], "stopped");
    let stopped = wait_state(&client, &id, "stopped").await;
    assert_eq!(stopped["desiredState"], "stopped");
    assert!(!running(&engine, &id).await);
    let again = client
        .api(Method::POST, &format!("/sandbox/{id}/stop"), None)
        .await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        again.json()["message"],
        "Sandbox is not in a stoppable state"
    );

    let started = client.api(Method::POST, "/sandbox/life/start", None).await;
    assert_eq!(started.status, StatusCode::OK, "{}", started.text());
    assert_eq!(started.json()["state"], "started");
    assert!(running(&engine, &id).await);
    let idempotent = client
        .api(Method::POST, &format!("/sandbox/{id}/start"), None)
        .await;
    assert_eq!(idempotent.json()["state"], "started");

    let labels = client
        .api(
            Method::PUT,
            &format!("/sandbox/{id}/labels"),
            Some(json!({"labels": {"suite": "relabelled"}})),
        )
        .await;
    assert_eq!(labels.json()["labels"], json!({"suite": "relabelled"}));

    let deleting = client
        .api(Method::DELETE, &format!("/sandbox/{id}"), None)
        .await;
    assert_eq!(deleting.status, StatusCode::OK, "{}", deleting.text());
    let deleting = deleting.json();
    assert_eq!(deleting["state"], "destroying");
    assert_eq!(deleting["desiredState"], "destroyed");
    assert!(
        deleting["name"]
            .as_str()
            .unwrap()
            .starts_with("DESTROYED_life_")
    );
    let gone = wait_gone(&client, &id).await;
    assert_eq!(
        gone["message"],
        format!("Sandbox with ID or name {id} not found")
    );
    assert!(containers_of(&engine, &id).await.is_empty());
    // The name is free again.
    client.create(json!({"name": "life"})).await;
    assert_eq!(mock.shutdown().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_sandboxes_stop_and_stopped_ones_are_deleted_on_their_intervals() {
    let config = MockDaytonaConfig {
        minute: Duration::from_millis(300),
        ..MockDaytonaConfig::default()
    };
    let Some((mock, client, engine)) = mock_with(config).await else {
        return;
    };
    let idle = client.create(json!({"autoStopInterval": 1})).await;
    let idle_id = idle["id"].as_str().unwrap();
    let expiring = client
        .create(json!({"autoStopInterval": 1, "autoDeleteInterval": 2}))
        .await;
    let expiring_id = expiring["id"].as_str().unwrap();
    let ephemeral = client.create(json!({"autoDeleteInterval": 0})).await;
    let ephemeral_id = ephemeral["id"].as_str().unwrap();
    let kept = client.create(json!({"autoStopInterval": 0})).await;

    wait_state(&client, idle_id, "stopped").await;
    assert!(!running(&engine, idle_id).await);
    wait_gone(&client, expiring_id).await;
    assert!(containers_of(&engine, expiring_id).await.is_empty());

    // autoDeleteInterval = 0: a stop deletes.
    let stopped = client
        .api(Method::POST, &format!("/sandbox/{ephemeral_id}/stop"), None)
        .await;
    assert_eq!(stopped.json()["state"], "destroying");
    wait_gone(&client, ephemeral_id).await;

    let kept = client.get(kept["id"].as_str().unwrap()).await.json();
    assert_eq!(kept["state"], "started");
    // The idle one stays stopped: nothing deletes it.
    assert_eq!(client.get(idle_id).await.json()["state"], "stopped");
    mock.shutdown().await.unwrap();
}
