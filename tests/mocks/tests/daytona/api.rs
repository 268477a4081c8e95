//! The control plane's refusals and listing: Bearer authentication, routes
//! matched before it, the create checks with their real messages, and the
//! listing's labels as one JSON parameter with cursor pages.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{containers_of, mock};

/// Checks the exception filter's body and returns its message.
fn api_error(reply: &super::client::Reply, status: StatusCode, path: &str) -> String {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    let body = reply.json();
    assert_eq!(body["path"], path);
    assert_eq!(body["statusCode"], status.as_u16());
    assert_eq!(body["error"], status.canonical_reason().unwrap());
    let timestamp = body["timestamp"].as_str().unwrap();
    assert!(
        timestamp.ends_with('Z') && timestamp.len() == 24,
        "{timestamp}"
    );
    body["message"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_without_the_key_are_refused_and_routes_are_matched_first() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    for authorization in [
        None,
        Some("Bearer dtn_wrong"),
        Some("Token x"),
        Some("Bearer"),
    ] {
        let reply = client
            .api_raw(Method::GET, "/api/sandbox", authorization, None)
            .await;
        let message = api_error(&reply, StatusCode::UNAUTHORIZED, "/api/sandbox");
        assert_eq!(message, "Invalid credentials", "{authorization:?}");
    }
    let bearer = format!("Bearer {}", client.key());
    let lowercase = format!("bearer {}", client.key());
    let ok = client
        .api_raw(Method::GET, "/api/sandbox", Some(&lowercase), None)
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    assert_eq!(ok.json(), json!({"items": [], "nextCursor": null}));

    // Unknown routes are 404 with or without a key, toolbox paths included.
    for (path, key) in [
        ("/api/nothing?x=1", None),
        ("/api/nothing?x=1", Some(bearer.as_str())),
        ("/api/0b1e/process/execute", Some(bearer.as_str())),
        ("/api/toolbox/0b1e/process/execute", Some(bearer.as_str())),
    ] {
        let reply = client.api_raw(Method::POST, path, key, None).await;
        let message = api_error(&reply, StatusCode::NOT_FOUND, path);
        assert_eq!(message, format!("Cannot POST {path}"));
    }
    // Routes of the real API the mock does not serve say so, after the key.
    let archive = client
        .api_raw(
            Method::POST,
            "/api/sandbox/0b1e/archive",
            Some(&bearer),
            None,
        )
        .await;
    let message = api_error(
        &archive,
        StatusCode::NOT_IMPLEMENTED,
        "/api/sandbox/0b1e/archive",
    );
    assert_eq!(
        message,
        "the mock does not model POST /api/sandbox/0b1e/archive"
    );
    let keyless = client
        .api_raw(Method::GET, "/api/sandbox/paginated", None, None)
        .await;
    assert_eq!(keyless.status, StatusCode::UNAUTHORIZED);
    let outside = client
        .api_raw(
            Method::POST,
            "/toolbox/0b1e/process/execute",
            Some(&bearer),
            None,
        )
        .await;
    assert_eq!(outside.status, StatusCode::NOT_FOUND);
    let unknown = client.get("no-such-sandbox").await;
    let message = api_error(
        &unknown,
        StatusCode::NOT_FOUND,
        "/api/sandbox/no-such-sandbox",
    );
    assert_eq!(message, "Sandbox with ID or name no-such-sandbox not found");
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_are_refused_as_the_api_refuses_them() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let cases: [(Value, StatusCode, &str); 8] = [
        (
            json!({"snapshot": "nope"}),
            StatusCode::BAD_REQUEST,
            "Snapshot nope not found. Did you add it through the Daytona Dashboard?",
        ),
        (
            json!({"snapshot": 3, "public": "yes", "gpu": 2}),
            StatusCode::BAD_REQUEST,
            "snapshot must be a string, public must be a boolean value, gpu must not be greater than 1",
        ),
        (
            json!({"cpu": 2}),
            StatusCode::BAD_REQUEST,
            "Cannot specify Sandbox resources when using a snapshot",
        ),
        (
            json!({"gpuType": ["H100"]}),
            StatusCode::BAD_REQUEST,
            "Cannot specify GPU type when creating sandbox from snapshot. GPU type is inherited from snapshot.",
        ),
        (
            json!({"target": "mars"}),
            StatusCode::NOT_FOUND,
            "Region not found",
        ),
        (
            json!({"autoStopInterval": -1}),
            StatusCode::BAD_REQUEST,
            "Auto-stop interval must be non-negative",
        ),
        (
            json!({"networkAllowList": "10.0.0.0"}),
            StatusCode::BAD_REQUEST,
            "Invalid network format: \"10.0.0.0\". Missing CIDR prefix length (e.g., /24)",
        ),
        (
            json!({"volumes": [{"volumeId": "v", "mountPath": "/data"}]}),
            StatusCode::BAD_REQUEST,
            "the mock does not model volumes",
        ),
    ];
    for (body, status, expected) in cases {
        let reply = client
            .api(Method::POST, "/sandbox", Some(body.clone()))
            .await;
        let message = api_error(&reply, status, "/api/sandbox");
        assert_eq!(message, expected, "{body}");
    }
    let listed = client.api(Method::GET, "/sandbox", None).await;
    assert_eq!(listed.json()["items"], json!([]));

    let first = client.create(json!({"name": "taken"})).await;
    let again = client
        .api(Method::POST, "/sandbox", Some(json!({"name": "taken"})))
        .await;
    let message = api_error(&again, StatusCode::CONFLICT, "/api/sandbox");
    assert_eq!(message, "Sandbox with name taken already exists");
    assert_eq!(
        containers_of(&engine, first["id"].as_str().unwrap())
            .await
            .len(),
        1
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listing_takes_labels_as_one_json_parameter_and_pages_by_cursor() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let one = client
        .create(json!({"labels": {"suite": "list", "n": "1"}}))
        .await;
    let two = client
        .create(json!({"labels": {"suite": "list", "n": "2"}}))
        .await;
    let other = client.create(json!({"labels": {"suite": "other"}})).await;

    let query = |labels: Value| {
        let encoded: String =
            form_urlencoded::byte_serialize(labels.to_string().as_bytes()).collect();
        format!("/sandbox?labels={encoded}")
    };
    let both = client
        .api(Method::GET, &query(json!({"suite": "list"})), None)
        .await;
    assert_eq!(both.status, StatusCode::OK, "{}", both.text());
    let page = both.json();
    let mut ids: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut expected = vec![one["id"].as_str().unwrap(), two["id"].as_str().unwrap()];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    assert_eq!(page["nextCursor"], Value::Null);
    let item = &page["items"][0];
    for field in [
        "toolboxProxyUrl",
        "organizationId",
        "state",
        "desiredState",
        "runnerId",
        "createdAt",
        "lastActivityAt",
    ] {
        assert!(item[field].is_string(), "{field} in {item}");
    }
    assert_eq!(item["state"], "started");
    assert_eq!(item["sandboxClass"], "container");
    assert!(item.get("env").is_none(), "list items carry no env");

    let exact = client
        .api(
            Method::GET,
            &query(json!({"suite": "list", "n": "2"})),
            None,
        )
        .await;
    assert_eq!(exact.json()["items"][0]["id"], two["id"]);
    assert_eq!(exact.json()["items"].as_array().unwrap().len(), 1);

    // Repeated key=value parameters are not what the API takes.
    let repeated = client
        .api(
            Method::GET,
            "/sandbox?labels=suite%3Dlist&labels=n%3D2",
            None,
        )
        .await;
    assert_eq!(repeated.status, StatusCode::BAD_REQUEST);
    assert_eq!(repeated.json()["message"], "labels must be a string");
    let not_json = client
        .api(Method::GET, "/sandbox?labels=suite%3Dlist", None)
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.json()["message"], "Invalid labels JSON format");

    // Pages of one, oldest first, until the cursor runs out.
    let mut seen = Vec::new();
    let mut path = "/sandbox?limit=1&sort=createdAt&order=asc".to_owned();
    loop {
        let reply = client.api(Method::GET, &path, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let page = reply.json();
        assert_eq!(page["items"].as_array().unwrap().len(), 1);
        seen.push(page["items"][0]["id"].as_str().unwrap().to_owned());
        match page["nextCursor"].as_str() {
            Some(cursor) => {
                let cursor: String = form_urlencoded::byte_serialize(cursor.as_bytes()).collect();
                path = format!("/sandbox?limit=1&sort=createdAt&order=asc&cursor={cursor}");
            }
            None => break,
        }
    }
    assert_eq!(
        seen,
        [&one["id"], &two["id"], &other["id"]].map(|v| v.as_str().unwrap().to_owned())
    );
    let bad_limit = client.api(Method::GET, "/sandbox?limit=500", None).await;
    assert_eq!(
        bad_limit.json()["message"],
        "limit must not be greater than 200"
    );
    mock.shutdown().await.unwrap();
}
