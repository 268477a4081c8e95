//! E2B's own features a backend may use in place of silo's: fork
//! (`POST /sandboxes/{id}/fork`: new sandboxes with the original's files,
//! not its processes, the original untouched), snapshots (a template made
//! from a sandbox, listed, created from and deleted), and egress rules
//! (checked on create and `PUT /sandboxes/{id}/network`, recorded and
//! reported), each with what the client asked recorded in the journal.

use http::{Method, StatusCode};
use serde_json::{Value, json};
use silo_mocks::containers::LABEL_SANDBOX;

use super::client::Client;
use super::{containers_of, mock};

/// The text of a file in a sandbox, read through envd (with the
/// sandbox's access token when it has one).
async fn read(client: &Client, id: &str, path: &str) -> (StatusCode, String) {
    read_as(client, id, path, None).await
}

async fn read_as(
    client: &Client,
    id: &str,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, String) {
    let headers: Vec<(&str, &str)> = token.map(|t| ("x-access-token", t)).into_iter().collect();
    let reply = client
        .get(
            &client.host(49983, id),
            &format!("/files?path={path}"),
            &headers,
        )
        .await;
    (reply.status, reply.text())
}

/// Whether a process whose command line is exactly `command` runs in the sandbox.
async fn runs(client: &Client, id: &str, command: &str) -> bool {
    let script = format!(
        "for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = '{command} ' ] && echo found; done; true"
    );
    let run = client.start(id, &script, &[]).await.finish().await;
    run.stdout.contains("found")
}

/// Images committed from `sandbox_id`'s container (an image another was
/// committed on top of is listed only with `all`).
async fn images_of(engine: &bollard::Docker, sandbox_id: &str) -> usize {
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![format!("{LABEL_SANDBOX}={sandbox_id}")],
    )]);
    let options = bollard::query_parameters::ListImagesOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    engine.list_images(Some(options)).await.unwrap().len()
}

fn message(reply: &super::client::Reply) -> String {
    reply.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn forks_copy_the_files_not_the_processes_and_leave_the_original_running() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let id = client
        .create_id(json!({
            "templateID": "base",
            "timeout": 120,
            "metadata": {"suite": "fork"},
            "envVars": {"FROM_CREATE": "original"},
            "network": {"denyOut": ["10.0.0.0/8"]},
        }))
        .await;
    let written = client.upload(&id, "data/a.txt", "original").await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text());
    let mut sleeper = client.start(&id, "exec sleep 6543", &[]).await;
    sleeper.pid().await;
    drop(sleeper);
    let before = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json();

    let forked = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/fork"),
            Some(json!({"count": 2, "timeout": 60})),
        )
        .await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", forked.text());
    let results = forked.json();
    let forks: Vec<String> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r.get("error").is_none(), "{r}");
            assert_eq!(r["sandbox"]["templateID"], "base", "{r}");
            r["sandbox"]["sandboxID"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(forks.len(), 2);
    assert!(forks.iter().all(|f| f != &id) && forks[0] != forks[1]);
    assert_eq!(
        mock.requests()
            .last()
            .map(|a| (&a.method, &a.path, &a.body)),
        Some((
            &"POST".to_owned(),
            &format!("/sandboxes/{id}/fork"),
            &json!({"count": 2, "timeout": 60})
        )),
        "the journal has the fork as asked"
    );

    for fork in &forks {
        assert_eq!(containers_of(&engine, fork).await.len(), 1);
        assert_eq!(read(&client, fork, "data/a.txt").await.1, "original");
        assert!(
            !runs(&client, fork, "sleep 6543").await,
            "a fork has no processes"
        );
        let detail = client
            .api(Method::GET, &format!("/sandboxes/{fork}"), None)
            .await
            .json();
        assert_eq!(detail["metadata"], json!({"suite": "fork"}));
        assert_eq!(detail["network"], json!({"denyOut": ["10.0.0.0/8"]}));
        assert_eq!(detail["state"], "running");
        let env = client
            .start(fork, "echo $FROM_CREATE", &[])
            .await
            .finish()
            .await;
        assert_eq!(env.stdout, "original\n");
    }
    // The forks are independent of the original and of each other.
    client.upload(&forks[0], "data/a.txt", "changed").await;
    assert_eq!(read(&client, &id, "data/a.txt").await.1, "original");
    assert_eq!(read(&client, &forks[1], "data/a.txt").await.1, "original");
    // The original runs on, its processes and end untouched.
    assert!(runs(&client, &id, "sleep 6543").await);
    let after = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json();
    assert_eq!(after["endAt"], before["endAt"]);
    assert_eq!(after["state"], "running");

    // Refusals, with the API's statuses and messages.
    let fork = |target: String, body: Option<Value>| {
        let client = &client;
        async move {
            client
                .api(Method::POST, &format!("/sandboxes/{target}/fork"), body)
                .await
        }
    };
    let refusals = [
        (json!({"count": 0}), "Count must be at least 1"),
        (json!({"count": 101}), "Count cannot be greater than 100"),
        (json!({"timeout": 0}), "Timeout must be greater than 0"),
        (
            json!({"timeout": 90_000}),
            "Timeout cannot be greater than 24 hours",
        ),
    ];
    for (body, expected) in refusals {
        let refused = fork(id.clone(), Some(body)).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert_eq!(message(&refused), expected);
    }
    let unknown = fork("inothere".into(), None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        unknown.json(),
        json!({"code": 404, "message": "Sandbox \"inothere\" doesn't exist or you don't have access to it"})
    );
    assert_eq!(
        fork("BAD".into(), None).await.status,
        StatusCode::BAD_REQUEST
    );
    let paused = client
        .api(
            Method::POST,
            &format!("/sandboxes/{}/pause", forks[1]),
            None,
        )
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
    let of_paused = fork(forks[1].clone(), None).await;
    assert_eq!(of_paused.status, StatusCode::CONFLICT);
    assert_eq!(
        message(&of_paused),
        format!(
            "Sandbox '{}' is paused and cannot be forked; resume it first",
            forks[1]
        )
    );
    // A body left out forks once, for 15 s.
    let single = fork(forks[0].clone(), None).await.json();
    let single_id = single[0]["sandbox"]["sandboxID"].as_str().unwrap();
    let detail = client
        .api(Method::GET, &format!("/sandboxes/{single_id}"), None)
        .await
        .json();
    assert_eq!(read(&client, single_id, "data/a.txt").await.1, "changed");
    assert_eq!(detail["state"], "running");

    assert!(images_of(&engine, &id).await >= 1);
    mock.shutdown().await.unwrap();
    assert_eq!(
        images_of(&engine, &id).await,
        0,
        "the mock removes its images"
    );
    assert_eq!(images_of(&engine, &forks[0]).await, 0);
}

#[tokio::test]
async fn snapshots_become_templates_to_create_from_list_and_delete() {
    let Some((mock, client, engine)) = mock().await else {
        return;
    };
    let id = client.create_id(json!({"templateID": "base"})).await;
    client.upload(&id, "data/kept.txt", "kept").await;
    let snapshot = |body: Value| {
        let (client, id) = (&client, &id);
        async move {
            client
                .api(
                    Method::POST,
                    &format!("/sandboxes/{id}/snapshots"),
                    Some(body),
                )
                .await
        }
    };
    let anonymous = snapshot(json!({})).await;
    assert_eq!(
        anonymous.status,
        StatusCode::CREATED,
        "{}",
        anonymous.text()
    );
    let anonymous = anonymous.json();
    let snapshot_id = anonymous["snapshotID"].as_str().unwrap().to_owned();
    let template_id = snapshot_id.strip_suffix(":default").unwrap().to_owned();
    assert_eq!(template_id.len(), 20, "{anonymous}");
    assert_eq!(anonymous["names"], json!([]));
    let named = snapshot(json!({"name": "Journey-Snap", "memory": false}))
        .await
        .json();
    assert_eq!(
        named,
        json!({"snapshotID": "silo-mock/journey-snap:default", "names": ["silo-mock/journey-snap"]})
    );
    let refused = snapshot(json!({"name": "bad name"})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        message(&refused),
        "Invalid name: invalid template ID: bad name"
    );
    let elsewhere = snapshot(json!({"name": "other/snap"})).await;
    assert_eq!(
        message(&elsewhere),
        "namespace 'other' must match your team 'silo-mock'"
    );

    // A sandbox made from a snapshot has its files; so does one from the id.
    let created = client
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "silo-mock/journey-snap", "timeout": 60})),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let created = created.json();
    let named_template = created["templateID"].as_str().unwrap();
    assert!(
        named_template.len() == 20 && named_template != template_id,
        "{created}"
    );
    let from_name = created["sandboxID"].as_str().unwrap().to_owned();
    let token = created["envdAccessToken"].as_str();
    assert_eq!(
        read_as(&client, &from_name, "data/kept.txt", token).await.1,
        "kept"
    );
    let from_id = client
        .create(json!({"templateID": snapshot_id, "timeout": 60}))
        .await;
    assert_eq!(from_id["templateID"], template_id.as_str());
    let from_id = from_id["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(read(&client, &from_id, "data/kept.txt").await.1, "kept");
    let missing_tag = client
        .api(
            Method::POST,
            "/sandboxes",
            Some(json!({"templateID": "journey-snap:v9"})),
        )
        .await;
    assert_eq!(missing_tag.status, StatusCode::NOT_FOUND);

    // Listing: newest first, by sandbox and by name, a page at a time.
    let list = |query: &str| {
        let client = &client;
        let path = format!("/snapshots{query}");
        async move { client.api(Method::GET, &path, None).await }
    };
    let all = list(&format!("?sandboxID={id}")).await.json();
    assert_eq!(
        all,
        json!([named.clone(), {"snapshotID": snapshot_id, "names": []}])
    );
    let first = list("?limit=1").await;
    assert_eq!(first.json(), json!([named.clone()]));
    let token = first.header("x-next-token").unwrap().to_owned();
    let second = list(&format!("?limit=1&nextToken={token}")).await;
    assert_eq!(second.json()[0]["snapshotID"], snapshot_id.as_str());
    let by_name = list("?name=journey-snap").await.json();
    assert_eq!(by_name, json!([named.clone()]));
    assert_eq!(list("?name=nothing").await.json(), json!([]));
    assert_eq!(
        list("?nextToken=garbage").await.status,
        StatusCode::BAD_REQUEST
    );

    // Deleting: refused while a sandbox made from it lives.
    let delete = |reference: &str| {
        let client = &client;
        let path = format!("/templates/{reference}");
        async move { client.api(Method::DELETE, &path, None).await }
    };
    let encoded = "silo-mock%2Fjourney-snap%3Adefault";
    let busy = delete(encoded).await;
    assert_eq!(busy.status, StatusCode::BAD_REQUEST);
    assert!(
        message(&busy).contains("running sandboxes using it"),
        "{}",
        busy.text()
    );
    let killed = client
        .api(Method::DELETE, &format!("/sandboxes/{from_name}"), None)
        .await;
    assert_eq!(killed.status, StatusCode::NO_CONTENT);
    assert_eq!(delete(encoded).await.status, StatusCode::NO_CONTENT);
    assert_eq!(delete(encoded).await.status, StatusCode::NOT_FOUND);
    assert_eq!(delete("base").await.status, StatusCode::BAD_REQUEST);
    let gone = client
        .api(
            Method::POST,
            "/sandboxes",
            Some(json!({"templateID": "silo-mock/journey-snap"})),
        )
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(
        message(&gone),
        "template 'silo-mock/journey-snap' not found"
    );
    assert_eq!(
        list("").await.json(),
        json!([{"snapshotID": snapshot_id, "names": []}])
    );

    // A paused sandbox is not among the running ones to snapshot.
    client
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(snapshot(json!({})).await.status, StatusCode::NOT_FOUND);
    mock.shutdown().await.unwrap();
    assert_eq!(images_of(&engine, &id).await, 0);
}

#[tokio::test]
async fn egress_rules_are_checked_recorded_and_replaced() {
    let Some((mock, client, _engine)) = mock().await else {
        return;
    };
    let create = |body: Value| {
        let client = &client;
        async move { client.api(Method::POST, "/v2/sandboxes", Some(body)).await }
    };
    let network = json!({"allowOut": ["1.1.1.1", "example.com"], "denyOut": ["0.0.0.0/0"]});
    let made = create(json!({
        "templateID": "base",
        "timeout": 60,
        "network": network,
        "allow_internet_access": false,
    }))
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text());
    let id = made.json()["sandboxID"].as_str().unwrap().to_owned();
    let asked = mock.requests().last().unwrap().clone();
    assert_eq!(
        (asked.method.as_str(), asked.path.as_str()),
        ("POST", "/v2/sandboxes")
    );
    assert_eq!(asked.body["network"], network);
    assert_eq!(asked.body["allow_internet_access"], false);
    let detail = |id: String| {
        let client = &client;
        async move {
            client
                .api(Method::GET, &format!("/sandboxes/{id}"), None)
                .await
                .json()
        }
    };
    let shown = detail(id.clone()).await;
    assert_eq!(shown["network"], network);
    assert_eq!(shown["allowInternetAccess"], false);

    let refusals = [
        (
            json!({"denyOut": ["example.com"]}),
            400,
            "invalid denied CIDR example.com",
        ),
        (
            json!({"allowOut": ["0.0.0.0"]}),
            400,
            "invalid allowed address 0.0.0.0",
        ),
        (
            json!({"allowOut": ["example.com"]}),
            400,
            "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.",
        ),
        (
            json!({"rules": {"api.example.com": [{"transform": {"headers": {"X": "y"}}}]}}),
            400,
            "Network transform rules are not available for your team.",
        ),
        (
            json!({"egressProxy": {"address": "proxy.example.com:1080"}}),
            403,
            "Egress proxy (network.egressProxy) is not enabled for this team.",
        ),
    ];
    for (network, status, expected) in refusals {
        let refused = create(json!({"templateID": "base", "network": network})).await;
        assert_eq!(refused.status.as_u16(), status, "{}", refused.text());
        assert_eq!(message(&refused), expected);
    }

    let update = |target: String, body: Value| {
        let client = &client;
        async move {
            client
                .api(
                    Method::PUT,
                    &format!("/sandboxes/{target}/network"),
                    Some(body),
                )
                .await
        }
    };
    let replaced = update(id.clone(), json!({"denyOut": ["10.0.0.0/8"]})).await;
    assert_eq!(
        replaced.status,
        StatusCode::NO_CONTENT,
        "{}",
        replaced.text()
    );
    let shown = detail(id.clone()).await;
    assert_eq!(
        shown["network"],
        json!({"denyOut": ["10.0.0.0/8"]}),
        "replaced whole"
    );
    assert_eq!(shown["allowInternetAccess"], false, "kept when not sent");
    let opened = update(id.clone(), json!({"allow_internet_access": true})).await;
    assert_eq!(opened.status, StatusCode::NO_CONTENT);
    assert_eq!(detail(id.clone()).await["allowInternetAccess"], true);
    let puts: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|a| a.method == "PUT")
        .map(|a| (a.path, a.body))
        .collect();
    assert_eq!(
        puts,
        [
            (
                format!("/sandboxes/{id}/network"),
                json!({"denyOut": ["10.0.0.0/8"]})
            ),
            (
                format!("/sandboxes/{id}/network"),
                json!({"allow_internet_access": true})
            ),
        ]
    );

    let bad = update(id.clone(), json!({"denyOut": ["nowhere"]})).await;
    assert_eq!(
        (bad.status, message(&bad).as_str()),
        (StatusCode::BAD_REQUEST, "invalid denied CIDR nowhere")
    );
    let proxy = update(id.clone(), json!({"egressProxy": {"address": "p:1"}})).await;
    assert_eq!(proxy.status, StatusCode::FORBIDDEN);
    let rules = json!({"rules": {"a.example.com": []}});
    assert_eq!(
        update(id.clone(), rules.clone()).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        update("inothere".into(), rules).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        update("inothere".into(), json!({})).await.status,
        StatusCode::NOT_FOUND
    );
    client
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(
        update(id.clone(), json!({})).await.status,
        StatusCode::NOT_FOUND
    );

    // The journal over HTTP, with the key: itself not recorded.
    let journal = client.api(Method::GET, "/_mock/requests", None).await;
    assert_eq!(journal.status, StatusCode::OK);
    let entries = journal.json();
    let last = entries.as_array().unwrap().last().unwrap();
    assert_eq!(last["path"], format!("/sandboxes/{id}/network"));
    assert_eq!(last["method"], "PUT");
    let without_key = client
        .api_as(None, Method::GET, "/_mock/requests", None)
        .await;
    assert_eq!(without_key.status, StatusCode::UNAUTHORIZED);
    mock.shutdown().await.unwrap();
}
