//! The routes the current `e2b` SDK calls that the older spec did not
//! have: `POST /v2/sandboxes` (always secured, 300 s by default, an
//! `Idempotency-Key` answered with the same sandbox), `POST
//! /v2/sandboxes/{id}/connect` (every field optional), the pause body,
//! and envd's `filesystem.Filesystem` (`Stat`, `ListDir`, `MakeDir`,
//! `Remove`).

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::mock;

#[tokio::test]
async fn v2_creates_are_secured_idempotent_and_connect_with_defaults() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let created = client
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let sandbox = created.json();
    let id = sandbox["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(
        sandbox["envdAccessToken"].as_str().map(str::len),
        Some(64),
        "v2 sandboxes are always secured: {sandbox}"
    );
    let detail = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json();
    let lifetime = seconds(&detail["endAt"]) - seconds(&detail["startedAt"]);
    assert!((299..=301).contains(&lifetime), "{detail}");

    // `secure: false` is read as on: v2 has no way to turn it off.
    let unsecured = client
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "secure": false, "timeout": 30})),
        )
        .await
        .json();
    assert!(unsecured["envdAccessToken"].is_string(), "{unsecured}");

    let keyed = |key: &'static str| {
        let client = &client;
        async move {
            let request = json!({"templateID": "base", "metadata": {"k": key}});
            client
                .api_with(
                    Method::POST,
                    "/v2/sandboxes",
                    Some(request),
                    &[("idempotency-key", key)],
                )
                .await
        }
    };
    let first = keyed("journey-1").await.json();
    let again = keyed("journey-1").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.json()["sandboxID"], first["sandboxID"]);
    let other = keyed("journey-2").await.json();
    assert_ne!(other["sandboxID"], first["sandboxID"]);

    let connect = |path: String, body: Option<Value>| {
        let client = &client;
        async move { client.api(Method::POST, &path, body).await }
    };
    let running = connect(format!("/v2/sandboxes/{id}/connect"), None).await;
    assert_eq!(running.status, StatusCode::OK, "{}", running.text());
    assert_eq!(running.json()["sandboxID"], id.as_str());
    let v1_needs_timeout = connect(format!("/sandboxes/{id}/connect"), Some(json!({}))).await;
    assert_eq!(v1_needs_timeout.status, StatusCode::BAD_REQUEST);

    let filesystem_only = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(filesystem_only.status, StatusCode::BAD_REQUEST);
    assert!(
        filesystem_only.json()["message"]
            .as_str()
            .unwrap()
            .contains("does not model")
    );
    let paused = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            Some(json!({"requireHealthyGuest": true})),
        )
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT, "{}", paused.text());
    let resumed = connect(
        format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(resumed.status, StatusCode::CREATED, "{}", resumed.text());

    // Routes of the current client the mock does not model answer 404 saying so.
    let refresh = connect(format!("/sandboxes/{id}/refreshes"), Some(json!({}))).await;
    assert_eq!(refresh.status, StatusCode::NOT_FOUND);
    assert!(
        refresh.json()["message"]
            .as_str()
            .unwrap()
            .contains("does not model")
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn filesystem_rpcs_stat_list_make_and_remove() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let id = client.create_id(json!({"templateID": "base"})).await;
    let written = client.upload(&id, "docs/a.txt", "hello").await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text());
    let rpc = |method: &'static str, message: Value| {
        let (client, id) = (&client, &id);
        async move { client.rpc(id, method, message, None).await }
    };

    let stat = rpc("filesystem.Filesystem/Stat", json!({"path": "docs/a.txt"})).await;
    assert_eq!(stat.status, StatusCode::OK, "{}", stat.text());
    let entry = &stat.json()["entry"];
    assert_eq!(entry["name"], "a.txt");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["path"], "/home/user/docs/a.txt");
    assert_eq!(entry["size"], "5", "int64 is a string in protojson");
    assert_eq!(entry["permissions"], "-rw-r--r--");
    assert_eq!(entry["owner"], "user");
    assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));

    let missing = rpc("filesystem.Filesystem/Stat", json!({"path": "docs/none"})).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["code"], "not_found");

    let made = rpc(
        "filesystem.Filesystem/MakeDir",
        json!({"path": "docs/sub/deep"}),
    )
    .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.text());
    assert_eq!(made.json()["entry"]["type"], "FILE_TYPE_DIRECTORY");
    let again = rpc(
        "filesystem.Filesystem/MakeDir",
        json!({"path": "docs/sub/deep"}),
    )
    .await;
    assert_eq!(again.json()["code"], "already_exists");

    let listed = rpc("filesystem.Filesystem/ListDir", json!({"path": "docs"})).await;
    let paths = |reply: &super::common::Reply| -> Vec<String> {
        reply.json()["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        paths(&listed),
        ["/home/user/docs/a.txt", "/home/user/docs/sub"]
    );
    let deep = rpc(
        "filesystem.Filesystem/ListDir",
        json!({"path": "docs", "depth": 3}),
    )
    .await;
    assert_eq!(
        paths(&deep),
        [
            "/home/user/docs/a.txt",
            "/home/user/docs/sub",
            "/home/user/docs/sub/deep"
        ]
    );
    let not_dir = rpc(
        "filesystem.Filesystem/ListDir",
        json!({"path": "docs/a.txt"}),
    )
    .await;
    assert_eq!(not_dir.json()["code"], "invalid_argument");

    let removed = rpc("filesystem.Filesystem/Remove", json!({"path": "docs/sub"})).await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.text());
    let after = rpc("filesystem.Filesystem/ListDir", json!({"path": "docs"})).await;
    assert_eq!(paths(&after), ["/home/user/docs/a.txt"]);
    mock.shutdown().await.unwrap();
}

fn seconds(rfc3339: &Value) -> i64 {
    let text = rfc3339.as_str().unwrap();
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap()
        .unix_timestamp()
}

#[tokio::test]
async fn a_mock_may_serve_one_generation_of_create_and_connect() {
    if silo_tests::docker::engine_with_base().await.is_none() {
        return;
    }
    for (v1, v2) in [(true, false), (false, true)] {
        let config = silo_mocks::MockE2bConfig {
            routes: silo_mocks::e2b::Generations { v1, v2 },
            ..Default::default()
        };
        let mock = silo_mocks::MockE2b::start(config).await.unwrap();
        let client = super::client::Client::new(&mock);
        let body = || Some(json!({"templateID": "base", "timeout": 30}));
        let old = client.api(Method::POST, "/sandboxes", body()).await;
        let new = client.api(Method::POST, "/v2/sandboxes", body()).await;
        let expect = |served: bool| {
            if served {
                StatusCode::CREATED
            } else {
                StatusCode::NOT_FOUND
            }
        };
        assert_eq!((old.status, new.status), (expect(v1), expect(v2)));
        let made = if v1 { old.json() } else { new.json() };
        let id = made["sandboxID"].as_str().unwrap();
        let connect_v1 = client
            .api(
                Method::POST,
                &format!("/sandboxes/{id}/connect"),
                Some(json!({"timeout": 30})),
            )
            .await;
        let connect_v2 = client
            .api(Method::POST, &format!("/v2/sandboxes/{id}/connect"), None)
            .await;
        let running = |served: bool| {
            if served {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            }
        };
        assert_eq!(
            (connect_v1.status, connect_v2.status),
            (running(v1), running(v2))
        );
        mock.shutdown().await.unwrap();
    }
}
