//! Which of E2B's routes the E2B backend takes, read from the mock's
//! request journal: v2 create and connect where they are served, v1 where
//! only that is (an older E2B), a clear error where neither is; what a
//! real E2B does that a mock only shows when asked: rate limits with
//! `Retry-After`, and a proxy answering `502` while a sandbox resumes; and
//! `--network none` as E2B's egress rules; a command whose stream a
//! pause cut re-attaching after the resume with every byte.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_mocks::e2b::Generations;
use silo_mocks::{MockE2b, MockE2bConfig};
use silo_tests::docker::{BASE_IMAGE, engine_with_base};

/// A mock serving `routes`, when the engine is there.
async fn serving(routes: Generations) -> Option<MockE2b> {
    engine_with_base().await?;
    let config = MockE2bConfig {
        routes,
        ..MockE2bConfig::default()
    };
    Some(MockE2b::start(config).await.unwrap())
}

/// What the mock was asked, as `METHOD /path` without the query, with the
/// sandbox ids made `{id}`.
fn asked(mock: &MockE2b) -> Vec<String> {
    mock.requests()
        .into_iter()
        .map(|asked| {
            let path = asked.path.split('?').next().unwrap_or_default();
            let path: Vec<&str> = path
                .split('/')
                .map(|part| if is_sandbox_id(part) { "{id}" } else { part })
                .collect();
            format!("{} {}", asked.method, path.join("/"))
        })
        .collect()
}

fn is_sandbox_id(part: &str) -> bool {
    part.len() == 21 && part.starts_with('i')
}

/// The bodies of the requests to `method path` (ids as `{id}`).
fn bodies(mock: &MockE2b, route: &str) -> Vec<serde_json::Value> {
    asked(mock)
        .into_iter()
        .zip(mock.requests())
        .filter(|(asked, _)| asked == route)
        .map(|(_, request)| request.body)
        .collect()
}

/// Up, pause, resume from a fresh process, exec and rm through `mock`;
/// answers what it asked.
fn journey(mock: &MockE2b) -> Vec<String> {
    let e2b = crate::cli().with_env(mock.env());
    e2b.ok(&["up", "box", "--backend", "e2b", "--template", "base"]);
    e2b.ok(&["stop", "box"]);
    e2b.ok(&["up", "box"]);
    assert_eq!(e2b.ok(&["exec", "box", "--", "echo", "back"]), "back\n");
    e2b.ok(&["rm", "box"]);
    asked(mock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_current_routes_are_taken_where_served() {
    let Some(mock) = serving(Generations::default()).await else {
        return;
    };
    let asked = journey(&mock);
    assert!(
        asked.contains(&"POST /v2/sandboxes".to_owned()),
        "{asked:?}"
    );
    assert!(
        asked.contains(&"POST /v2/sandboxes/{id}/connect".to_owned()),
        "{asked:?}"
    );
    assert!(
        !asked
            .iter()
            .any(|a| a == "POST /sandboxes" || a == "POST /sandboxes/{id}/connect"),
        "an older route was asked: {asked:?}"
    );
    let create = &bodies(&mock, "POST /v2/sandboxes")[0];
    assert!(create.get("secure").is_none(), "v2 has no secure: {create}");
    assert_eq!(create["templateID"], "base", "{create}");
    assert_eq!(create["autoPause"], true, "{create}");
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_e2b_serving_only_v1_is_followed_there() {
    let Some(mock) = serving(Generations {
        v1: true,
        v2: false,
    })
    .await
    else {
        return;
    };
    let asked = journey(&mock);
    let creates: Vec<&String> = asked
        .iter()
        .filter(|a| a.ends_with("/sandboxes") && a.starts_with("POST"))
        .collect();
    // v2 once (404), then v1; the resume goes straight to v1's connect.
    assert_eq!(
        creates,
        ["POST /v2/sandboxes", "POST /sandboxes"],
        "{asked:?}"
    );
    assert!(
        asked.contains(&"POST /sandboxes/{id}/connect".to_owned()),
        "{asked:?}"
    );
    assert!(
        !asked.contains(&"POST /v2/sandboxes/{id}/connect".to_owned()),
        "the sandbox was made through v1, yet v2 connect was asked: {asked:?}"
    );
    let create = &bodies(&mock, "POST /sandboxes")[0];
    assert_eq!(
        create["secure"], true,
        "v1 must ask for envd's token: {create}"
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_e2b_serving_only_v2_is_never_asked_v1() {
    let Some(mock) = serving(Generations {
        v1: false,
        v2: true,
    })
    .await
    else {
        return;
    };
    let asked = journey(&mock);
    assert!(
        !asked
            .iter()
            .any(|a| a == "POST /sandboxes" || a == "POST /sandboxes/{id}/connect"),
        "{asked:?}"
    );
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_e2b_serving_neither_route_is_named_and_nothing_is_left() {
    let Some(mock) = serving(Generations {
        v1: false,
        v2: false,
    })
    .await
    else {
        return;
    };
    let e2b = crate::cli().with_env(mock.env());
    let err = e2b.fails(&["up", "box", "--backend", "e2b", "--template", "base"]);
    assert!(
        err.contains("POST /v2/sandboxes") && err.contains("POST /sandboxes"),
        "both routes should be named: {err}"
    );
    // An unknown template is still an unknown template, not a missing route.
    let known = serving(Generations::default()).await.unwrap();
    let other = crate::cli().with_env(known.env());
    let err = other.fails(&["up", "box", "--backend", "e2b", "--template", "nope"]);
    assert!(
        err.contains("404") && err.contains("template 'nope'"),
        "{err}"
    );
    assert!(!err.contains("none of the routes"), "{err}");
    let (status, listed) = crate::e2b::api(&mock, "GET", "/v2/sandboxes").await;
    assert_eq!((status, listed.trim()), (200, "[]"), "VMs left behind");
    drop((e2b, other));
    known.shutdown().await.unwrap();
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limits_and_a_resuming_proxy_are_waited_out() {
    let Some(mock) = serving(Generations::default()).await else {
        return;
    };
    let e2b = crate::cli().with_env(mock.env());
    // The next two control-plane calls answer 429 with Retry-After: 1.
    mock.faults().rate_limit(2, Duration::from_secs(1));
    let started = Instant::now();
    e2b.ok(&["up", "box", "--backend", "e2b", "--template", "base"]);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "Retry-After was not honoured: {:?}",
        started.elapsed()
    );
    // Every create carried the same idempotency key, so one sandbox.
    let (_, listed) = crate::e2b::api(&mock, "GET", "/v2/sandboxes").await;
    let listed = silo_tests::json(&listed);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    // After a resume the proxy answers 502 for a while: the resume and
    // the next command wait it out.
    e2b.ok(&["stop", "box"]);
    mock.faults().set_unready(Duration::from_millis(1500));
    e2b.ok(&["up", "box"]);
    assert_eq!(e2b.ok(&["exec", "box", "--", "echo", "ok"]), "ok\n");
    mock.faults().set_unready(Duration::ZERO);
    e2b.ok(&["rm", "box"]);

    // No network reaches the create as E2B's own egress rules.
    e2b.ok(&["up", "off", "--backend", "e2b", "--network", "none"]);
    let create = bodies(&mock, "POST /v2/sandboxes").pop().unwrap();
    assert_eq!(create["allow_internet_access"], false, "{create}");
    assert_eq!(create["network"]["denyOut"][0], "0.0.0.0/0", "{create}");
    e2b.ok(&["rm", "off"]);
    drop(e2b);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_cut_by_a_pause_reattaches_after_the_resume() {
    let Some(mock) = serving(Generations::default()).await else {
        return;
    };
    let e2b = crate::cli().with_env(mock.env());
    e2b.ok(&["up", "box", "--backend", "e2b", "--template", "base"]);
    // A pause cuts every connection, as E2B's does.
    mock.faults().set_drop_on_pause(true);
    let script = "i=0; while [ $i -lt 40 ]; do echo line$i; i=$((i+1)); sleep 0.05; done";
    let running = e2b
        .command(&["exec", "box", "--", "sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    e2b.ok(&["stop", "box"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    e2b.ok(&["up", "box"]);
    let out = tokio::task::spawn_blocking(move || running.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: String = (0..40).map(|i| format!("line{i}\n")).collect();
    assert_eq!(stdout, expected, "every byte, once, in order");
    e2b.ok(&["rm", "box"]);
    drop(e2b);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_fork_goes_through_e2bs_snapshot_and_gets_its_own_identity() {
    let Some(mock) = serving(Generations::default()).await else {
        return;
    };
    let e2b = crate::cli().with_env(mock.env());
    let made = silo_tests::json(&e2b.ok(&[
        "up",
        "box",
        "--backend",
        "e2b",
        "--template",
        "base",
        "--json",
    ]));
    let box_id = made["sandbox"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    e2b.ok(&["exec", "box", "--", "sh", "-c", "echo kept > /root/marker"]);

    let twin = silo_tests::json(&e2b.ok(&["fork", "box", "--memory", "--name", "twin", "--json"]));
    let twin_id = twin["id"].as_str().unwrap().to_owned();
    assert_ne!(twin_id, box_id);

    // E2B's snapshot with memory, named for the new sandbox, then a create
    // from it carrying the new sandbox's own metadata.
    let snapshot = bodies(&mock, "POST /sandboxes/{id}/snapshots");
    assert_eq!(snapshot.len(), 1, "{:?}", asked(&mock));
    assert_eq!(snapshot[0]["memory"], true, "{}", snapshot[0]);
    assert_eq!(snapshot[0]["name"], format!("silo-fork-{twin_id}"));
    let create = bodies(&mock, "POST /v2/sandboxes").pop().unwrap();
    let template = create["templateID"].as_str().unwrap().to_owned();
    assert!(
        template.contains(&format!("silo-fork-{twin_id}")),
        "{create}"
    );
    assert_eq!(create["metadata"]["silo.sandbox.id"], twin_id.as_str());

    // The original's files, an agent of its own (answering the new key),
    // and the original untouched.
    assert_eq!(
        e2b.ok(&["exec", "twin", "--", "cat", "/root/marker"]),
        "kept\n"
    );
    assert_eq!(
        e2b.ok(&[
            "exec",
            "twin",
            "--",
            "sh",
            "-c",
            "test -e /.silo/key || echo gone"
        ]),
        "gone\n"
    );
    e2b.ok(&["exec", "twin", "--", "sh", "-c", "echo twin > /root/marker"]);
    assert_eq!(
        e2b.ok(&["exec", "box", "--", "cat", "/root/marker"]),
        "kept\n"
    );

    // The capture lives as long as the fork; removing the fork removes
    // its snapshot's template, and the original lives on.
    assert_eq!(captures(&mock).await.len(), 1);
    e2b.ok(&["rm", "twin"]);
    let deleted = asked(&mock);
    assert!(
        deleted.iter().any(|a| a.starts_with("DELETE /templates/")),
        "{deleted:?}"
    );
    assert_eq!(captures(&mock).await, Vec::<serde_json::Value>::new());
    assert_eq!(e2b.ok(&["exec", "box", "--", "echo", "alive"]), "alive\n");

    // A create from the capture that fails leaves neither a sandbox nor
    // the capture behind.
    mock.faults().fail_creates(1);
    let refused = e2b.fails(&["fork", "box", "--memory", "--name", "broken"]);
    assert!(refused.contains("Failed to place sandbox"), "{refused}");
    assert_eq!(bodies(&mock, "POST /sandboxes/{id}/snapshots").len(), 2);
    assert_eq!(captures(&mock).await, Vec::<serde_json::Value>::new());
    assert!(!e2b.ok(&["ls"]).contains("broken"));

    // A paused sandbox cannot be captured: the error says so, and no
    // sandbox is left half made.
    e2b.ok(&["stop", "box"]);
    let refused = e2b.fails(&["fork", "box", "--memory", "--name", "late"]);
    assert!(refused.contains("not running"), "{refused}");
    assert!(!e2b.ok(&["ls"]).contains("late"));
    e2b.ok(&["rm", "box"]);
    drop(e2b);
    mock.shutdown().await.unwrap();
}

/// The snapshots the mock's E2B holds (`GET /snapshots`).
async fn captures(mock: &MockE2b) -> Vec<serde_json::Value> {
    let (status, listed) = crate::e2b::api(mock, "GET", "/snapshots").await;
    assert_eq!(status, 200, "{listed}");
    serde_json::from_str(&listed).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_fork_is_refused_where_the_backend_cannot_capture_memory() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "dock", "--backend", "docker", "--image", BASE_IMAGE]);
    let refused = cli.fails(&["fork", "dock", "--memory", "--name", "twin"]);
    assert!(
        refused.contains("cannot fork a sandbox with its memory"),
        "{refused}"
    );
    assert!(!cli.ok(&["ls"]).contains("twin"));
    cli.ok(&["rm", "dock"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allow_list_reaches_the_create_as_e2bs_egress_rules() {
    let Some(mock) = serving(Generations::default()).await else {
        return;
    };
    let e2b = crate::cli().with_env(mock.env());
    e2b.ok(&[
        "up",
        "open",
        "--backend",
        "e2b",
        "--allow-out",
        "1.1.1.1",
        "--allow-out",
        "*.PyPI.org",
        "--allow-out",
        "8.8.8.0/24",
    ]);
    let create = bodies(&mock, "POST /v2/sandboxes").pop().unwrap();
    assert_eq!(
        create["network"]["allowOut"],
        serde_json::json!(["*.pypi.org", "1.1.1.1/32", "8.8.8.0/24"]),
        "{create}"
    );
    assert_eq!(
        create["network"]["denyOut"],
        serde_json::json!(["0.0.0.0/0"])
    );
    assert_eq!(create["allow_internet_access"], true, "{create}");
    // The mock took the rules as E2B's checks take them, and reports them.
    let vm = crate::e2b::vm_of(&e2b, "open");
    let (status, detail) = crate::e2b::api(&mock, "GET", &format!("/sandboxes/{vm}")).await;
    assert_eq!(status, 200, "{detail}");
    let detail = silo_tests::json(&detail);
    assert_eq!(
        detail["network"]["allowOut"],
        serde_json::json!(["*.pypi.org", "1.1.1.1/32", "8.8.8.0/24"]),
        "{detail}"
    );
    e2b.ok(&["rm", "open"]);

    // Bad entries and contradictions are named, and nothing is made.
    let creates = bodies(&mock, "POST /v2/sandboxes").len();
    for (args, says) in [
        (&["--allow-out", "10.0.0.1/8"][..], "past the /8"),
        (&["--allow-out", "::1"][..], "IPv6"),
        (&["--allow-out", "no_such"][..], "not a host name"),
        (
            &["--allow-out", "1.1.1.1", "--network", "none"][..],
            "--network none blocks every destination",
        ),
    ] {
        let mut argv = vec!["up", "bad", "--backend", "e2b"];
        argv.extend_from_slice(args);
        let refused = e2b.fails(&argv);
        assert!(
            refused.contains("bad allow-out") && refused.contains(says),
            "{refused}"
        );
    }
    assert_eq!(bodies(&mock, "POST /v2/sandboxes").len(), creates);
    assert!(!e2b.ok(&["ls"]).contains("bad"));

    // A deny list is E2B's `denyOut` as given, with --allow-out naming
    // exceptions to it (E2B's allowed entries win over denied ones).
    let made = silo_tests::json(&e2b.ok(&[
        "up",
        "closed",
        "--backend",
        "e2b",
        "--deny-out",
        "10.0.0.0/8",
        "--deny-out",
        "192.168.1.1",
        "--allow-out",
        "10.1.0.0/16",
        "--json",
    ]));
    let create = bodies(&mock, "POST /v2/sandboxes").pop().unwrap();
    assert_eq!(
        create["network"],
        serde_json::json!({"allowOut": ["10.1.0.0/16"], "denyOut": ["10.0.0.0/8", "192.168.1.1/32"]}),
        "{create}"
    );
    assert_eq!(
        made["sandbox"]["spec"]["deny_out"],
        serde_json::json!(["10.0.0.0/8", "192.168.1.1/32"]),
        "{made}"
    );

    // The rules change in place through E2B's network update, which
    // replaces them whole, and the sandbox's spec says so.
    let changed =
        silo_tests::json(&e2b.ok(&["network", "closed", "--allow-out", "1.1.1.1", "--json"]));
    let update = bodies(&mock, "PUT /sandboxes/{id}/network").pop().unwrap();
    assert_eq!(
        update,
        serde_json::json!({"allowOut": ["1.1.1.1/32"], "denyOut": ["0.0.0.0/0"]})
    );
    assert_eq!(
        changed["spec"]["allow_out"],
        serde_json::json!(["1.1.1.1/32"])
    );
    assert!(changed["spec"].get("deny_out").is_none(), "{changed}");
    let vm = crate::e2b::vm_of(&e2b, "closed");
    let (_, detail) = crate::e2b::api(&mock, "GET", &format!("/sandboxes/{vm}")).await;
    let detail = silo_tests::json(&detail);
    assert_eq!(
        detail["network"]["allowOut"],
        serde_json::json!(["1.1.1.1/32"]),
        "{detail}"
    );
    let shown = e2b.ok(&["network", "closed"]);
    assert!(shown.contains("allow-out: 1.1.1.1/32"), "{shown}");
    assert!(e2b.ok(&["events", "closed"]).contains("network_changed"));
    // --open clears every rule; the sandbox is the one made before.
    e2b.ok(&["network", "closed", "--open"]);
    let update = bodies(&mock, "PUT /sandboxes/{id}/network").pop().unwrap();
    assert_eq!(update, serde_json::json!({}));
    assert_eq!(crate::e2b::vm_of(&e2b, "closed"), vm);
    let refused = e2b.fails(&["network", "closed", "--deny-out", "example.com"]);
    assert!(refused.contains("bad deny-out"), "{refused}");
    assert_eq!(bodies(&mock, "PUT /sandboxes/{id}/network").len(), 2);
    e2b.ok(&["rm", "closed"]);
    let creates = bodies(&mock, "POST /v2/sandboxes").len();
    for (args, says) in [
        (
            &["--deny-out", "example.com"][..],
            "host name cannot be denied",
        ),
        (
            &["--deny-out", "10.0.0.0/8", "--allow-out", "pypi.org"][..],
            "allowed only over --deny-out 0.0.0.0/0",
        ),
        (
            &["--deny-out", "10.0.0.0/8", "--network", "none"][..],
            "--network none blocks every destination",
        ),
    ] {
        let mut argv = vec!["up", "bad", "--backend", "e2b"];
        argv.extend_from_slice(args);
        let refused = e2b.fails(&argv);
        assert!(refused.contains(says), "{refused}");
    }
    assert_eq!(bodies(&mock, "POST /v2/sandboxes").len(), creates);
    drop(e2b);
    mock.shutdown().await.unwrap();

    // Docker and local cannot enforce one, and say so.
    let cli = crate::cli();
    let refused = cli.fails(&[
        "up",
        "dock",
        "--backend",
        "docker",
        "--image",
        BASE_IMAGE,
        "--allow-out",
        "1.1.1.1",
    ]);
    assert!(
        refused.contains("cannot enforce an allow-list"),
        "{refused}"
    );
    let refused = cli.fails(&["up", "here", "--backend", "local", "--allow-out", "1.1.1.1"]);
    assert!(
        refused.contains("cannot enforce an allow-list"),
        "{refused}"
    );
    let refused = cli.fails(&["up", "here", "--backend", "local", "--deny-out", "1.1.1.1"]);
    assert!(refused.contains("cannot enforce a deny list"), "{refused}");
    // Nor take one after create; having none, they have nothing to clear.
    cli.ok(&["up", "here", "--backend", "local"]);
    let refused = cli.fails(&["network", "here", "--allow-out", "1.1.1.1"]);
    assert!(
        refused.contains("cannot enforce an allow-list"),
        "{refused}"
    );
    let shown = cli.ok(&["network", "here", "--open"]);
    assert!(shown.contains("allow-out: none"), "{shown}");
    cli.ok(&["rm", "here"]);
}
