//! A pod's whole life through the API: created (201, defaults, uid), seen
//! by a watch from Pending to Running with its conditions and container
//! state, served on its own address, selected by labels and fields,
//! logged, deleted with a grace period (listed while it terminates, SIGKILL
//! after the grace, a DELETED event, its container gone); pods that end,
//! and an image the engine lacks.

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::{containers_of, mock, pod, until_phase};

const SERVER: &str = "echo hi; nc -ll -p 8080 -e echo hello";

fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_pod_runs_serves_and_is_deleted_with_grace() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let listed = client.get("/api/v1/namespaces/default/pods").await.json();
    assert_eq!(listed["kind"], "PodList");
    let from = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut watch = client
        .watch(&format!(
            "/api/v1/namespaces/default/pods?watch=true&labelSelector=app%3Dweb&resourceVersion={from}"
        ))
        .await;

    let made = client
        .create(
            "/api/v1/namespaces/default/pods",
            pod(
                "web",
                json!({"app": "web", "tier": "front"}),
                SERVER,
                &[8080],
            ),
        )
        .await;
    assert_eq!(made["metadata"]["namespace"], "default");
    assert_eq!(made["spec"]["restartPolicy"], "Never");
    assert_eq!(made["spec"]["nodeName"], "silo-mock");
    assert_eq!(made["spec"]["containers"][0]["imagePullPolicy"], "Always");
    assert_eq!(made["status"]["phase"], "Pending");
    let uid = made["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(uid.len(), 36);
    assert!(made["metadata"]["creationTimestamp"].is_string());

    let events = watch
        .until(|e| e["object"]["status"]["phase"] == "Running")
        .await;
    assert_eq!(events[0]["type"], "ADDED");
    assert!(events[1..].iter().all(|e| e["type"] == "MODIFIED"));
    let revisions: Vec<u64> = events
        .iter()
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
    let running = &events.last().unwrap()["object"];
    let status = &running["status"];
    let ip = status["podIP"].as_str().unwrap().to_owned();
    assert!(ip.starts_with("127.77."), "{ip}");
    assert_eq!(status["podIPs"][0]["ip"], ip.as_str());
    assert_eq!(status["hostIP"], "127.0.0.1");
    assert_eq!(status["qosClass"], "BestEffort");
    let app = &status["containerStatuses"][0];
    assert_eq!(app["name"], "app");
    assert_eq!(app["ready"], true);
    assert_eq!(app["started"], true);
    assert_eq!(app["restartCount"], 0);
    assert!(app["state"]["running"]["startedAt"].is_string());
    assert!(
        app["containerID"]
            .as_str()
            .unwrap()
            .starts_with("docker://")
    );
    assert!(
        app["imageID"]
            .as_str()
            .unwrap()
            .starts_with("docker://sha256:")
    );
    let condition = |kind: &str| {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
            .map(|c| c["status"].clone())
    };
    for kind in [
        "Ready",
        "ContainersReady",
        "Initialized",
        "PodScheduled",
        "PodReadyToStartContainers",
    ] {
        assert_eq!(condition(kind), Some(json!("True")), "{kind}");
    }
    assert_eq!(containers_of(&engine, &uid).await.len(), 1);
    let listed = mock.pods();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].ip.to_string(), ip);

    // The port is published on the pod's own address, under its own number.
    let served = async {
        loop {
            if let Ok(mut tcp) = tokio::net::TcpStream::connect((ip.as_str(), 8080)).await {
                let mut text = String::new();
                if tcp.read_to_string(&mut text).await.is_ok() && !text.is_empty() {
                    return text;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let served = tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .unwrap();
    assert_eq!(served, "hello\n");

    let logs = client.get("/api/v1/namespaces/default/pods/web/log").await;
    assert_eq!(logs.status, StatusCode::OK);
    assert!(logs.text().starts_with("hi\n"), "{}", logs.text());
    let status_only = client
        .get("/api/v1/namespaces/default/pods/web/status")
        .await
        .json();
    assert_eq!(status_only["status"]["phase"], "Running");

    // Label and field selectors.
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("db", json!({"app": "db"}), "sleep 1000", &[]),
        )
        .await;
    let cases = [
        ("labelSelector=app%3Dweb", vec!["web"]),
        ("labelSelector=app%21%3Dweb", vec!["db"]),
        ("labelSelector=tier", vec!["web"]),
        ("labelSelector=app%2Ctier%3Dfront", vec!["web"]),
        ("labelSelector=app%20in%20(db%2Cweb)", vec!["db", "web"]),
        ("fieldSelector=metadata.name%3Ddb", vec!["db"]),
        (
            "fieldSelector=status.phase%3DRunning&labelSelector=app%3Dweb",
            vec!["web"],
        ),
    ];
    for (query, expected) in cases {
        let list = client
            .get(&format!("/api/v1/namespaces/default/pods?{query}"))
            .await
            .json();
        assert_eq!(names(&list), expected, "{query}");
    }
    let everywhere = client.get("/api/v1/pods?labelSelector=app").await.json();
    assert_eq!(names(&everywhere), ["db", "web"]);
    let elsewhere = client.get("/api/v1/namespaces/other/pods").await.json();
    assert!(elsewhere["items"].as_array().unwrap().is_empty());
    let refused = client
        .get("/api/v1/namespaces/default/pods?fieldSelector=spec.image%3Dx")
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        refused.json()["message"],
        "field label not supported: spec.image"
    );

    // Deletion: SIGTERM (ignored by PID 1), the grace, SIGKILL, then gone.
    let asked = std::time::Instant::now();
    let deleted = client
        .call(
            Method::DELETE,
            "/api/v1/namespaces/default/pods/web",
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 2})),
        )
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.text());
    let deleted = deleted.json();
    assert!(deleted["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(deleted["metadata"]["deletionGracePeriodSeconds"], 2);
    let terminating = client.get("/api/v1/namespaces/default/pods/web").await;
    assert_eq!(terminating.status, StatusCode::OK);
    assert!(terminating.json()["metadata"]["deletionTimestamp"].is_string());
    let events = watch.until(|e| e["type"] == "DELETED").await;
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "the grace was not waited"
    );
    let last = &events.last().unwrap()["object"];
    let ended = &last["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(ended["exitCode"], 137, "{last:#}");
    assert!(containers_of(&engine, &uid).await.is_empty());
    let gone = client.get("/api/v1/namespaces/default/pods/web").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(
        gone.json(),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"web\" not found", "reason": "NotFound",
            "details": {"name": "web", "kind": "pods"}, "code": 404,
        })
    );
    assert_eq!(mock.shutdown().await.unwrap(), 1);
}

#[tokio::test]
async fn pods_end_as_their_command_does() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    for (name, script) in [("done", "echo done"), ("broken", "echo broken >&2; exit 3")] {
        client
            .create(
                "/api/v1/namespaces/default/pods",
                pod(name, json!({}), script, &[]),
            )
            .await;
    }
    let done = until_phase(&client, "default", "done", "Succeeded").await;
    let ended = &done["status"]["containerStatuses"][0];
    assert_eq!(ended["state"]["terminated"]["exitCode"], 0);
    assert_eq!(ended["state"]["terminated"]["reason"], "Completed");
    assert_eq!(ended["ready"], false);
    let broken = until_phase(&client, "default", "broken", "Failed").await;
    let ended = &broken["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(ended["exitCode"], 3);
    assert_eq!(ended["reason"], "Error");
    assert!(ended["finishedAt"].is_string());
    let ready = broken["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "PodCompleted");
    let logs = client
        .get("/api/v1/namespaces/default/pods/broken/log")
        .await;
    assert_eq!(logs.text(), "broken\n");
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_image_the_engine_lacks_is_never_pulled() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let mut manifest = pod("absent", json!({}), "true", &[]);
    manifest["spec"]["containers"][0]["image"] = json!("silo-mock-test/absent:1");
    client
        .create("/api/v1/namespaces/default/pods", manifest)
        .await;
    let waiting = || async {
        let pod = client
            .get("/api/v1/namespaces/default/pods/absent")
            .await
            .json();
        pod["status"]["containerStatuses"][0]["state"]["waiting"].clone()
    };
    super::wait_for("ErrImageNeverPull", super::PHASE_TIMEOUT, || async {
        waiting().await["reason"] == "ErrImageNeverPull"
    })
    .await;
    let waiting = waiting().await;
    assert_eq!(
        waiting["message"],
        "Container image \"silo-mock-test/absent:1\" is not present with pull policy of Never"
    );
    let pod = client
        .get("/api/v1/namespaces/default/pods/absent")
        .await
        .json();
    assert_eq!(pod["status"]["phase"], "Pending");
    // A pod that never started goes at once on deletion.
    let deleted = client
        .call(
            Method::DELETE,
            "/api/v1/namespaces/default/pods/absent?gracePeriodSeconds=30",
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::OK);
    super::wait_for("the pod to go", Duration::from_secs(10), || async {
        client
            .get("/api/v1/namespaces/default/pods/absent")
            .await
            .status
            == StatusCode::NOT_FOUND
    })
    .await;
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_gvisor_runtime_class_runs_under_runsc_when_the_engine_has_it() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let mut manifest = pod("guarded", json!({}), "sleep 1000", &[]);
    manifest["spec"]["runtimeClassName"] = json!("gvisor");
    let made = client
        .create("/api/v1/namespaces/default/pods", manifest)
        .await;
    assert_eq!(made["spec"]["runtimeClassName"], "gvisor");
    until_phase(&client, "default", "guarded", "Running").await;
    let uid = made["metadata"]["uid"].as_str().unwrap();
    let id = containers_of(&engine, uid).await.pop().unwrap();
    let inspected = engine.inspect_container(&id, None).await.unwrap();
    let runtime = inspected.host_config.unwrap().runtime.unwrap_or_default();
    let expected = if mock.runs_gvisor() { "runsc" } else { "runc" };
    assert_eq!(runtime, expected);
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failing_container_is_restarted_after_a_back_off() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let mut manifest = pod("flaky", json!({}), "echo attempt; exit 1", &[]);
    manifest["spec"]["restartPolicy"] = json!("OnFailure");
    client
        .create("/api/v1/namespaces/default/pods", manifest)
        .await;
    let status = || async {
        client
            .get("/api/v1/namespaces/default/pods/flaky")
            .await
            .json()["status"]["containerStatuses"][0]
            .clone()
    };
    super::wait_for("CrashLoopBackOff", super::PHASE_TIMEOUT, || async {
        status().await["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    })
    .await;
    let waiting = status().await;
    assert_eq!(waiting["restartCount"], 1);
    assert_eq!(waiting["lastState"]["terminated"]["exitCode"], 1);
    // The first back-off is ten seconds; then the container runs again.
    super::wait_for("a second run", Duration::from_secs(30), || async {
        status().await["lastState"]["terminated"]["exitCode"] == 1
            && status().await["restartCount"] == 2
    })
    .await;
    let pod = client
        .get("/api/v1/namespaces/default/pods/flaky")
        .await
        .json();
    assert_ne!(pod["status"]["phase"], "Failed");
    assert_eq!(mock.pods()[0].containers.len(), 2);
    mock.shutdown().await.unwrap();
}
