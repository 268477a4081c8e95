//! Daytona's own features a backend may use in place of silo's: pause and
//! resume of a VM sandbox (`docker pause`: a process started before the
//! pause runs on after the resume, the preview token unchanged; a
//! container sandbox refused with `422`), and the network rules of a
//! create and of `POST /sandbox/{id}/network-settings` (checked as the API
//! checks them, recorded and reported), each with what the client asked
//! recorded in the journal.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use silo_mocks::MockDaytonaConfig;
use silo_mocks::daytona::DEFAULT_SNAPSHOT;

use super::client::{Access, Client};
use super::{containers_of, mock, mock_with, wait_state};

/// A configuration with a `vm` snapshot (`linux-vm` sandboxes) beside `base`.
fn with_vm() -> MockDaytonaConfig {
    MockDaytonaConfig {
        snapshots: BTreeMap::from([
            (DEFAULT_SNAPSHOT.0.to_owned(), DEFAULT_SNAPSHOT.1.to_owned()),
            ("vm".to_owned(), DEFAULT_SNAPSHOT.1.to_owned()),
        ]),
        vm_snapshots: BTreeSet::from(["vm".to_owned()]),
        ..MockDaytonaConfig::default()
    }
}

/// Lines in `/tmp/ticks` of a sandbox, through the toolbox.
async fn ticks(client: &Client, sandbox: &Value) -> u64 {
    let reply = client.execute(sandbox, "wc -l /tmp/ticks").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let result = reply.json()["result"].as_str().unwrap().to_owned();
    result
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn paused_in_engine(engine: &bollard::Docker, id: &str) -> bool {
    let container = containers_of(engine, id).await.pop().unwrap();
    engine
        .inspect_container(&container, None)
        .await
        .unwrap()
        .state
        .and_then(|s| s.paused)
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vm_sandboxes_pause_and_resume_with_their_processes() {
    let Some((mock, client, engine)) = mock_with(with_vm()).await else {
        return;
    };
    let key = client.key().to_owned();
    let sandbox = client
        .create(json!({"snapshot": "vm", "autoStopInterval": 0}))
        .await;
    assert_eq!(sandbox["sandboxClass"], "linux-vm");
    let id = sandbox["id"].as_str().unwrap().to_owned();
    let session = |path: &str, body: Value| {
        let (client, sandbox, key) = (&client, &sandbox, &key);
        let path = path.to_owned();
        async move {
            client
                .toolbox(
                    sandbox,
                    Access::Bearer(key),
                    Method::POST,
                    &path,
                    Some(body),
                )
                .await
        }
    };
    let made = session("/process/session", json!({"sessionId": "ticker"})).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text());
    let started = session(
        "/process/session/ticker/exec",
        json!({"command": "while :; do echo t >> /tmp/ticks; sleep 0.1; done", "runAsync": true}),
    )
    .await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.text());
    super::wait_for("the ticker to tick", Duration::from_secs(10), || async {
        ticks(&client, &sandbox).await > 0
    })
    .await;
    let (_, token) = client.preview_url(&id, 49999).await;

    let pause = |target: String| {
        let client = &client;
        async move {
            client
                .api(Method::POST, &format!("/sandbox/{target}/pause"), None)
                .await
        }
    };
    let pausing = pause(id.clone()).await;
    assert_eq!(pausing.status, StatusCode::OK, "{}", pausing.text());
    assert_eq!(
        (
            pausing.json()["state"].clone(),
            pausing.json()["desiredState"].clone()
        ),
        (json!("pausing"), json!("paused"))
    );
    let again = pause(id.clone()).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST, "{}", again.text());
    assert_eq!(
        again.json()["message"],
        "Sandbox must be in started state to pause"
    );
    wait_state(&client, &id, "paused").await;
    assert!(paused_in_engine(&engine, &id).await);
    // The toolbox cannot reach a frozen sandbox, nor can it pause again.
    let frozen = client
        .toolbox(
            &sandbox,
            Access::Bearer(&key),
            Method::GET,
            "/user-home-dir",
            None,
        )
        .await;
    assert_eq!(frozen.status, StatusCode::BAD_REQUEST, "{}", frozen.text());
    assert_eq!(pause(id.clone()).await.status, StatusCode::BAD_REQUEST);

    let resumed = client
        .api(Method::POST, &format!("/sandbox/{id}/start"), None)
        .await;
    assert_eq!(resumed.status, StatusCode::OK, "{}", resumed.text());
    assert_eq!(resumed.json()["state"], "started");
    assert!(!paused_in_engine(&engine, &id).await);
    let (_, token_after) = client.preview_url(&id, 49999).await;
    assert_eq!(token_after, token, "a resume keeps the preview token");
    let counted = ticks(&client, &sandbox).await;
    super::wait_for(
        "the ticker to tick after the resume",
        Duration::from_secs(10),
        || async { ticks(&client, &sandbox).await > counted },
    )
    .await;
    let command = client
        .toolbox(
            &sandbox,
            Access::Bearer(&key),
            Method::GET,
            "/process/session/ticker",
            None,
        )
        .await
        .json();
    assert!(
        command["commands"][0].get("exitCode").is_none(),
        "the command started before the pause still runs: {command}"
    );

    // A paused sandbox stops; the start after that is a fresh one.
    assert_eq!(pause(id.clone()).await.status, StatusCode::OK);
    wait_state(&client, &id, "paused").await;
    let stopping = client
        .api(Method::POST, &format!("/sandbox/{id}/stop"), None)
        .await;
    assert_eq!(stopping.status, StatusCode::OK, "{}", stopping.text());
    assert_eq!(stopping.json()["state"], "stopping");
    wait_state(&client, &id, "stopped").await;
    let restarted = client
        .api(Method::POST, &format!("/sandbox/{id}/start"), None)
        .await;
    assert_eq!(restarted.json()["state"], "started");
    assert_ne!(client.preview_url(&id, 49999).await.1, token);

    // A container sandbox is no VM; an unknown one is not there.
    let container = client.create(json!({"snapshot": "base"})).await;
    assert_eq!(container["sandboxClass"], "container");
    let refused = pause(container["id"].as_str().unwrap().to_owned()).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    let body = refused.json();
    assert_eq!(body["message"], "Pausing is not supported for this sandbox");
    assert_eq!(body["statusCode"], 422);
    assert_eq!(pause("nothing".into()).await.status, StatusCode::NOT_FOUND);

    let pauses = mock
        .requests()
        .into_iter()
        .filter(|a| a.path == format!("/api/sandbox/{id}/pause"))
        .count();
    assert_eq!(pauses, 4, "every pause asked is in the journal");
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_rules_are_checked_recorded_and_updated() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let blocked = client.create(json!({"networkBlockAll": true})).await;
    assert_eq!(blocked["networkBlockAll"], true);
    let rules = json!({
        "networkAllowList": "10.0.0.0/8,192.168.0.0/16",
        "domainAllowList": "*.daytona.io,pypi.org",
    });
    let allowed = client.create(rules.clone()).await;
    assert_eq!(allowed["networkAllowList"], rules["networkAllowList"]);
    assert_eq!(allowed["domainAllowList"], rules["domainAllowList"]);
    assert_eq!(mock.requests().last().unwrap().body, rules);
    let id = allowed["id"].as_str().unwrap().to_owned();
    let listed = client.api(Method::GET, "/sandbox", None).await.json();
    let item = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(item["networkAllowList"], rules["networkAllowList"]);

    let eleven = ["10.0.0.0/8"; 11].join(",");
    let refusals = [
        (
            json!({"networkAllowList": "10.0.0.0"}),
            "Invalid network format: \"10.0.0.0\". Missing CIDR prefix length (e.g., /24)",
        ),
        (
            json!({"networkAllowList": eleven}),
            "Network allow list cannot contain more than 10 networks",
        ),
        (
            json!({"domainAllowList": "bad_domain"}),
            "Invalid domain: \"bad_domain\". Must be a valid domain name",
        ),
        (
            json!({"networkBlockAll": "yes"}),
            "networkBlockAll must be a boolean value",
        ),
    ];
    for (body, expected) in refusals {
        let refused = client.api(Method::POST, "/sandbox", Some(body)).await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{}",
            refused.text()
        );
        assert_eq!(refused.json()["message"], expected);
    }

    let update = |target: String, body: Value| {
        let client = &client;
        async move {
            client
                .api(
                    Method::POST,
                    &format!("/sandbox/{target}/network-settings"),
                    Some(body),
                )
                .await
        }
    };
    let shown = |reply: super::common::Reply| {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let body = reply.json();
        (
            body["networkBlockAll"].clone(),
            body["networkAllowList"].clone(),
            body["domainAllowList"].clone(),
        )
    };
    let domains = rules["domainAllowList"].clone();
    assert_eq!(
        shown(update(id.clone(), json!({"networkBlockAll": true})).await),
        (json!(true), Value::Null, domains.clone()),
        "blocking all clears the CIDRs"
    );
    assert_eq!(
        shown(update(id.clone(), json!({"networkAllowList": "1.2.3.0/24"})).await),
        (json!(false), json!("1.2.3.0/24"), domains),
        "a CIDR list unblocks"
    );
    assert_eq!(
        shown(update(id.clone(), json!({"domainAllowList": ""})).await),
        (json!(false), json!("1.2.3.0/24"), Value::Null),
        "a blank list clears"
    );
    assert_eq!(
        shown(update(id.clone(), json!({"networkBlockAll": false})).await),
        (json!(false), Value::Null, Value::Null),
        "unblocking without a list clears the CIDRs"
    );
    let none = update(id.clone(), json!({})).await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        none.json()["message"],
        "At least one of networkBlockAll, networkAllowList or domainAllowList must be provided"
    );
    let bad = update(id.clone(), json!({"networkAllowList": "nope/8"})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        update("nothing".into(), json!({"networkBlockAll": true}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let asked = mock.requests();
    let last = asked.last().unwrap();
    assert_eq!(last.path, "/api/sandbox/nothing/network-settings");
    assert_eq!(last.body, json!({"networkBlockAll": true}));
    let journal = client.api(Method::GET, "/_mock/requests", None).await;
    assert_eq!(journal.status, StatusCode::OK);
    assert_eq!(
        journal.json().as_array().unwrap().last().unwrap()["path"],
        "/api/sandbox/nothing/network-settings"
    );
    mock.shutdown().await.unwrap();
}
