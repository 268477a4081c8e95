//! The control plane: keys, refusals with the real API's statuses and
//! bodies, and listing by metadata with pagination.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::mock;

fn error_of(reply: &super::client::Reply) -> (u64, String) {
    let body = reply.json();
    (
        body["code"].as_u64().unwrap(),
        body["message"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn keys_are_required_and_unknown_things_are_refused() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let body = Some(json!({"templateID": "base"}));

    let missing = client
        .api_as(None, Method::POST, "/sandboxes", body.clone())
        .await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        error_of(&missing),
        (401, "authorization header is missing".to_owned())
    );
    assert_eq!(
        missing.header("content-type"),
        Some("application/json; charset=utf-8")
    );

    let malformed = client
        .api_as(Some("sk_123"), Method::POST, "/sandboxes", body.clone())
        .await;
    assert_eq!(
        error_of(&malformed),
        (401, "authorization header is malformed".to_owned())
    );

    let wrong = client
        .api_as(Some("e2b_wrong"), Method::POST, "/sandboxes", body.clone())
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(
        error_of(&wrong)
            .1
            .starts_with("Invalid API key, please visit")
    );

    let unknown = client
        .api(
            Method::POST,
            "/sandboxes",
            Some(json!({"templateID": "nope"})),
        )
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        error_of(&unknown),
        (404, "template 'nope' not found".to_owned())
    );

    let tagged = client
        .api(
            Method::POST,
            "/sandboxes",
            Some(json!({"templateID": "base:v2"})),
        )
        .await;
    assert_eq!(
        error_of(&tagged),
        (
            404,
            "tag 'v2' does not exist for template 'base'".to_owned()
        )
    );

    let zero = client
        .api(
            Method::POST,
            "/sandboxes",
            Some(json!({"templateID": "base", "timeout": 0})),
        )
        .await;
    assert_eq!(
        error_of(&zero),
        (400, "Timeout must be greater than 0".to_owned())
    );

    let open_private = json!({"templateID": "base", "network": {"allowPublicTraffic": false}});
    let refused = client
        .api(Method::POST, "/sandboxes", Some(open_private))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        error_of(&refused)
            .1
            .contains("unless you enable secure envd access")
    );

    let no_template = client
        .api(Method::POST, "/sandboxes", Some(json!({})))
        .await;
    assert_eq!(no_template.status, StatusCode::BAD_REQUEST);

    for (method, path) in [
        (Method::GET, "/sandboxes/inothere"),
        (Method::DELETE, "/sandboxes/inothere"),
        (Method::POST, "/sandboxes/inothere/pause"),
    ] {
        let reply = client.api(method, path, None).await;
        assert_eq!(
            error_of(&reply),
            (
                404,
                "Sandbox \"inothere\" doesn't exist or you don't have access to it".to_owned()
            ),
            "{path}"
        );
    }
    let connect = client
        .api(
            Method::POST,
            "/sandboxes/inothere/connect",
            Some(json!({"timeout": 10})),
        )
        .await;
    assert_eq!(connect.status, StatusCode::NOT_FOUND);
    let invalid = client.api(Method::GET, "/sandboxes/a-b-c", None).await;
    assert_eq!(error_of(&invalid), (400, "Invalid sandbox ID".to_owned()));

    assert_eq!(mock.shutdown().await.unwrap(), 0, "nothing was created");
}

#[tokio::test]
async fn listing_filters_by_metadata_and_pages() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let mut ids = Vec::new();
    for n in 0..3 {
        let created = client
            .create(json!({
                "templateID": "base",
                "timeout": 60,
                "metadata": {"suite": "list & page", "n": n.to_string()},
            }))
            .await;
        let id = created["sandboxID"].as_str().unwrap().to_owned();
        assert!(id.starts_with('i') && id.len() == 21, "{id}");
        assert!(
            id[1..]
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        assert_eq!(created["clientID"], "6532622b");
        assert_eq!(created["domain"], mock.domain());
        assert_eq!(created["trafficAccessToken"], Value::Null);
        assert!(created.get("envdAccessToken").is_none());
        ids.push(id);
    }

    // As the SDKs send it: each key and value encoded, the pairs encoded
    // as search parameters, and that string encoded as the query value.
    let filter = |pairs: &[(&str, &str)]| {
        let search: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{}={}", encode(&encode(k)), encode(&encode(v))))
            .collect();
        encode(&search.join("&"))
    };
    let suite = filter(&[("suite", "list & page")]);
    let first = client
        .api(
            Method::GET,
            &format!("/v2/sandboxes?metadata={suite}&limit=2"),
            None,
        )
        .await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("x-total-running"), Some("3"));
    let token = first
        .header("x-next-token")
        .expect("a next token")
        .to_owned();
    let page: Vec<Value> = serde_json::from_value(first.json()).unwrap();
    assert_eq!(page.len(), 2);
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(page[0]["sandboxID"], newest_first[0]);
    assert_eq!(page[0]["state"], "running");
    assert_eq!(page[0]["metadata"]["suite"], "list & page");
    for field in [
        "startedAt",
        "endAt",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "envdVersion",
    ] {
        assert!(page[0].get(field).is_some(), "{field}");
    }

    let second = client
        .api(
            Method::GET,
            &format!(
                "/v2/sandboxes?metadata={suite}&limit=2&nextToken={}",
                encode(&token)
            ),
            None,
        )
        .await;
    let rest: Vec<Value> = serde_json::from_value(second.json()).unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0]["sandboxID"], newest_first[2]);
    assert!(second.header("x-next-token").is_none());

    let one = filter(&[("suite", "list & page"), ("n", "1")]);
    let only = client
        .api(Method::GET, &format!("/v2/sandboxes?metadata={one}"), None)
        .await;
    let only: Vec<Value> = serde_json::from_value(only.json()).unwrap();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["sandboxID"], ids[1].as_str());

    let paused = client
        .api(
            Method::GET,
            &format!("/v2/sandboxes?metadata={suite}&state=paused"),
            None,
        )
        .await;
    assert_eq!(paused.json(), json!([]));
    assert!(paused.header("x-total-running").is_none());

    let bad = client
        .api(Method::GET, "/v2/sandboxes?metadata=novalue", None)
        .await;
    assert_eq!(error_of(&bad), (400, "Error parsing metadata".to_owned()));
    let bad = client
        .api(Method::GET, "/v2/sandboxes?nextToken=garbage", None)
        .await;
    assert_eq!(error_of(&bad), (400, "Invalid next token".to_owned()));
    let bad = client
        .api(Method::GET, "/v2/sandboxes?state=sleeping", None)
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    assert_eq!(mock.shutdown().await.unwrap(), 3);
}

fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}
