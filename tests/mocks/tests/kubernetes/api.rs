//! The API's shapes without a running container: authentication,
//! discovery, refusals as `Status` objects (401, 404, 405, 409, 422, 400),
//! `generateName`, Secrets and NetworkPolicies with selectors, tables,
//! namespaces, and watches that resume from a resource version.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{mock, pod};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

fn status(reply: &super::client::Reply, code: u16, reason: &str) -> Value {
    assert_eq!(reply.status.as_u16(), code, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["apiVersion"], "v1");
    assert_eq!(body["status"], "Failure");
    assert_eq!(body["code"], code);
    assert_eq!(body["reason"], reason);
    body
}

#[tokio::test]
async fn refusals_are_status_objects() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    status(
        &client
            .unauthenticated("/api/v1/namespaces/default/pods", None)
            .await,
        401,
        "Unauthorized",
    );
    status(
        &client
            .unauthenticated("/version", Some("Bearer wrong"))
            .await,
        401,
        "Unauthorized",
    );
    let token = format!("Bearer {}", mock.token());
    assert_eq!(
        client
            .unauthenticated("/version", Some(&token))
            .await
            .status,
        StatusCode::OK
    );

    let unknown = status(&client.get("/api/v1/configmaps").await, 404, "NotFound");
    assert_eq!(
        unknown["message"],
        "the server could not find the requested resource"
    );
    let secret = status(
        &client.get("/api/v1/namespaces/default/secrets/nope").await,
        404,
        "NotFound",
    );
    assert_eq!(
        secret["details"],
        json!({"name": "nope", "kind": "secrets"})
    );
    let policy = status(
        &client
            .get("/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/nope")
            .await,
        404,
        "NotFound",
    );
    assert_eq!(
        policy["details"],
        json!({"name": "nope", "group": "networking.k8s.io", "kind": "networkpolicies"})
    );
    let delete = client
        .call(Method::DELETE, "/api/v1/namespaces/default/pods/nope", None)
        .await;
    status(&delete, 404, "NotFound");
    status(
        &client
            .call(
                Method::PUT,
                "/api/v1/namespaces/default/pods/x",
                Some(json!({})),
            )
            .await,
        405,
        "MethodNotAllowed",
    );

    // 422: what the mock does not model is refused by field.
    let mut two = pod("two", json!({}), "true", &[]);
    let second = two["spec"]["containers"][0].clone();
    two["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "b", "image": second["image"]}));
    two["spec"]["containers"][0]["env"] =
        json!([{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]);
    let refused = client
        .call(Method::POST, "/api/v1/namespaces/default/pods", Some(two))
        .await;
    let body = status(&refused, 422, "Invalid");
    assert_eq!(body["details"]["kind"], "Pod");
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["spec.containers", "spec.containers[0].env[0].valueFrom"]
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Pod \"two\" is invalid: [")
    );
    let bad_name = client
        .call(
            Method::POST,
            "/api/v1/namespaces/default/pods",
            Some(pod("Bad_Name", json!({}), "true", &[])),
        )
        .await;
    status(&bad_name, 422, "Invalid");
    let nameless = client
        .call(
            Method::POST,
            "/api/v1/namespaces/default/pods",
            Some(json!({"spec": {"containers": []}})),
        )
        .await;
    status(&nameless, 422, "Invalid");
    let elsewhere = json!({"metadata": {"name": "x", "namespace": "other"}});
    status(
        &client
            .call(
                Method::POST,
                "/api/v1/namespaces/default/secrets",
                Some(elsewhere),
            )
            .await,
        400,
        "BadRequest",
    );
    let wrong_kind = json!({"kind": "Secret", "apiVersion": "v1", "metadata": {"name": "x"}});
    status(
        &client
            .call(
                Method::POST,
                "/api/v1/namespaces/default/pods",
                Some(wrong_kind),
            )
            .await,
        400,
        "BadRequest",
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn discovery_secrets_policies_and_tables() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let version = client.get("/version").await;
    assert_eq!(version.header("content-type"), Some("application/json"));
    let version = version.json();
    assert_eq!(
        (version["major"].as_str(), version["minor"].as_str()),
        (Some("1"), Some("33"))
    );
    assert_eq!(client.get("/api").await.json()["versions"], json!(["v1"]));
    let core = client.get("/api/v1").await.json();
    assert_eq!(core["kind"], "APIResourceList");
    let resources: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for wanted in [
        "pods",
        "pods/portforward",
        "pods/status",
        "secrets",
        "namespaces",
    ] {
        assert!(resources.contains(&wanted), "{wanted}");
    }
    let groups = client.get("/apis").await.json();
    assert_eq!(
        groups["groups"][0]["preferredVersion"]["groupVersion"],
        "networking.k8s.io/v1"
    );
    let networking = client.get("/apis/networking.k8s.io/v1").await.json();
    assert_eq!(networking["resources"][0]["kind"], "NetworkPolicy");
    status(&client.get("/openapi/v3").await, 404, "NotFound");
    let namespace = client.get("/api/v1/namespaces/anything").await.json();
    assert_eq!(namespace["status"]["phase"], "Active");

    // Secrets: created, taken names refused, selected by label, deleted.
    let made = client
        .create(
            "/api/v1/namespaces/team/secrets",
            json!({"metadata": {"generateName": "key-", "labels": {"silo": "yes"}}, "stringData": {"k": "v"}}),
        )
        .await;
    let name = made["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("key-") && name.len() == 9, "{name}");
    let again = json!({"metadata": {"name": name}});
    let conflict = client
        .call(Method::POST, "/api/v1/namespaces/team/secrets", Some(again))
        .await;
    let body = status(&conflict, 409, "AlreadyExists");
    assert_eq!(body["message"], format!("secrets {name:?} already exists"));
    client
        .create(
            "/api/v1/namespaces/team/secrets",
            json!({"metadata": {"name": "other"}}),
        )
        .await;
    let selected = client
        .get("/api/v1/namespaces/team/secrets?labelSelector=silo%3Dyes")
        .await
        .json();
    assert_eq!(selected["kind"], "SecretList");
    assert_eq!(selected["items"].as_array().unwrap().len(), 1);
    let everywhere = client
        .get("/api/v1/secrets?labelSelector=silo")
        .await
        .json();
    assert_eq!(everywhere["items"][0]["metadata"]["name"], name.as_str());
    let deleted = client
        .call(
            Method::DELETE,
            &format!("/api/v1/namespaces/team/secrets/{name}"),
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.json()["metadata"]["name"], name.as_str());
    let namespaces = client.get("/api/v1/namespaces").await.json();
    assert!(
        namespaces["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["metadata"]["name"] == "team")
    );

    // NetworkPolicies: recorded and answered.
    let policy = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-egress", "labels": {"silo": "yes"}},
        "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}}, "policyTypes": ["Egress"]},
    });
    let path = "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies";
    let made = client.create(path, policy).await;
    assert_eq!(made["kind"], "NetworkPolicy");
    assert_eq!(made["spec"]["policyTypes"], json!(["Egress"]));
    let listed = client
        .get(&format!("{path}?labelSelector=silo%3Dyes"))
        .await
        .json();
    assert_eq!(listed["kind"], "NetworkPolicyList");
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    let table = client
        .call_with(Method::GET, path, None, &[("accept", TABLE)])
        .await
        .json();
    assert_eq!(
        table["rows"][0]["cells"],
        json!(["deny-egress", "app=sandbox", table["rows"][0]["cells"][2]])
    );
    let bad = json!({"metadata": {"name": "bad"}, "spec": {"policyTypes": ["Sideways"]}});
    status(
        &client.call(Method::POST, path, Some(bad)).await,
        422,
        "Invalid",
    );
    let deleted = client
        .call(Method::DELETE, &format!("{path}/deny-egress"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::OK);
    status(
        &client.get(&format!("{path}/deny-egress")).await,
        404,
        "NotFound",
    );

    // Pods print as kubectl's table.
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("printed", json!({"app": "p"}), "sleep 1000", &[]),
        )
        .await;
    let table = client
        .call_with(
            Method::GET,
            "/api/v1/namespaces/default/pods?labelSelector=app%3Dp",
            None,
            &[("accept", TABLE)],
        )
        .await
        .json();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns[..5], ["Name", "Ready", "Status", "Restarts", "Age"]);
    assert_eq!(table["rows"][0]["cells"][0], "printed");
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn watches_resume_from_a_resource_version() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("first", json!({"w": "1"}), "sleep 1000", &[]),
        )
        .await;
    let list = client.get("/api/v1/namespaces/default/pods").await.json();
    let after_first: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    client
        .create(
            "/api/v1/namespaces/default/pods",
            pod("second", json!({"w": "1"}), "sleep 1000", &[]),
        )
        .await;

    // From a version: only what came after it, here `second`'s creation first.
    let mut resumed = client
        .watch(&format!(
            "/api/v1/namespaces/default/pods?watch=1&labelSelector=w&resourceVersion={after_first}"
        ))
        .await;
    let event = resumed.next().await.unwrap();
    let first_name = event["object"]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let revision: u64 = event["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(revision > after_first);
    assert!(
        first_name == "second" || event["type"] == "MODIFIED",
        "{event:#}"
    );

    // Without one: every selected pod as ADDED, then the initial-events bookmark.
    let mut fresh = client
        .watch("/api/v1/namespaces/default/pods?watch=true&labelSelector=w%3D1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
        .await;
    let mut added = Vec::new();
    loop {
        let event = fresh.next().await.unwrap();
        if event["type"] == "BOOKMARK" {
            assert_eq!(
                event["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
                "true"
            );
            assert_eq!(event["object"]["kind"], "Pod");
            break;
        }
        assert_eq!(event["type"], "ADDED");
        added.push(
            event["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    added.sort();
    assert_eq!(added, ["first", "second"]);

    // A watch with a timeout ends by itself.
    let mut timed = client
        .watch("/api/v1/namespaces/default/pods?watch=true&fieldSelector=metadata.name%3Dnone&timeoutSeconds=1")
        .await;
    assert!(timed.next().await.is_none());
    mock.shutdown().await.unwrap();
}
