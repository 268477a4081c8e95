//! Volumes: a Secret's keys as files in the app container (read-only,
//! with their modes), an `emptyDir` an init container writes and the app
//! container reads, a pod waiting for its Secret, and a failing init
//! container ending a pod as `Init:Error`.

use http::StatusCode;
use serde_json::{Value, json};

use super::{mock, until_phase};

fn with_volumes(name: &str, script: &str, init: Option<&str>, secret: &str) -> Value {
    let mut inits = Vec::new();
    if let Some(init) = init {
        inits.push(json!({
            "name": "prepare",
            "image": "silo-base:latest",
            "command": ["sh", "-c", init],
            "volumeMounts": [{"name": "work", "mountPath": "/work"}],
        }));
    }
    json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "initContainers": inits,
            "containers": [{
                "name": "app",
                "image": "silo-base:latest",
                "command": ["sh", "-c", script],
                "volumeMounts": [
                    {"name": "creds", "mountPath": "/etc/creds"},
                    {"name": "work", "mountPath": "/work"},
                ],
            }],
            "volumes": [
                {"name": "creds", "secret": {
                    "secretName": secret,
                    "defaultMode": 0o440,
                    "items": [
                        {"key": "token", "path": "token"},
                        {"key": "config", "path": "conf/app.conf", "mode": 0o400},
                    ],
                }},
                {"name": "work", "emptyDir": {}},
            ],
        },
    })
}

const READER: &str = "cat /etc/creds/token; echo; cat /etc/creds/conf/app.conf; echo; \
    stat -c %a /etc/creds/token /etc/creds/conf/app.conf; ls /etc/creds; \
    cat /work/from-init.txt; touch /etc/creds/new 2>/dev/null || echo read-only";

#[tokio::test]
async fn secret_files_and_an_init_containers_output_reach_the_app() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let secret = client
        .create(
            "/api/v1/namespaces/default/secrets",
            json!({
                "metadata": {"name": "creds", "labels": {"use": "test"}},
                "data": {"token": "czNjcmV0"},
                "stringData": {"config": "mode=test", "unused": "x"},
            }),
        )
        .await;
    assert_eq!(secret["type"], "Opaque");
    assert_eq!(secret["data"]["config"], "bW9kZT10ZXN0");
    assert!(secret.get("stringData").is_none());
    client
        .create(
            "/api/v1/namespaces/default/pods",
            with_volumes(
                "reader",
                READER,
                Some("echo written-by-init > /work/from-init.txt"),
                "creds",
            ),
        )
        .await;
    let ended = until_phase(&client, "default", "reader", "Succeeded").await;
    let init = &ended["status"]["initContainerStatuses"][0];
    assert_eq!(init["name"], "prepare");
    assert_eq!(init["state"]["terminated"]["reason"], "Completed");
    let logs = client
        .get("/api/v1/namespaces/default/pods/reader/log")
        .await
        .text();
    assert_eq!(
        logs,
        "s3cret\nmode=test\n440\n400\nconf\ntoken\nwritten-by-init\nread-only\n"
    );
    let init_logs = client
        .get("/api/v1/namespaces/default/pods/reader/log?container=prepare")
        .await;
    assert_eq!(init_logs.status, StatusCode::OK);
    assert_eq!(mock.pods()[0].containers.len(), 2);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_pod_waits_for_its_secret_and_a_failing_init_ends_it() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    client
        .create(
            "/api/v1/namespaces/default/pods",
            with_volumes("patient", "cat /etc/creds/token; sleep 1000", None, "later"),
        )
        .await;
    super::wait_for(
        "the pod to wait for its Secret",
        super::PHASE_TIMEOUT,
        || async {
            let pod = client
                .get("/api/v1/namespaces/default/pods/patient")
                .await
                .json();
            let waiting = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
            waiting["reason"] == "ContainerCreating"
                && waiting["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("secret \"later\" not found"))
        },
    )
    .await;
    client
        .create(
            "/api/v1/namespaces/default/secrets",
            json!({"metadata": {"name": "later"}, "stringData": {"token": "t", "config": "c"}}),
        )
        .await;
    until_phase(&client, "default", "patient", "Running").await;

    client
        .create(
            "/api/v1/namespaces/default/pods",
            with_volumes("doomed", "echo never", Some("exit 7"), "later"),
        )
        .await;
    let failed = until_phase(&client, "default", "doomed", "Failed").await;
    let init = &failed["status"]["initContainerStatuses"][0]["state"]["terminated"];
    assert_eq!(init["exitCode"], 7);
    assert_eq!(init["reason"], "Error");
    let app = &failed["status"]["containerStatuses"][0]["state"]["waiting"];
    assert_eq!(app["reason"], "PodInitializing");
    let table = client
        .call_with(
            http::Method::GET,
            "/api/v1/namespaces/default/pods/doomed",
            None,
            &[(
                "accept",
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            )],
        )
        .await
        .json();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"][0]["cells"][2], "Init:Error");
    mock.shutdown().await.unwrap();
}
