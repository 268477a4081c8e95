//! Warm pools on the real engine, through the real CLI: a claimed sandbox
//! is a sandbox like a fresh one (its own id, key and files, listed and
//! logged as usual), the pool refills itself behind the claim, members are
//! never listed nor collected as orphans, and removing a pool removes its
//! waiting machines.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::{Duration, Instant};

use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, containers_of, engine_with_base, is_running};
use silo_tests::json;

fn ready(cli: &Cli, pool: &str) -> u64 {
    let pools = json(&cli.ok(&["pool", "ls", "--json"]));
    let found = pools.as_array().unwrap().iter().find(|p| p["name"] == pool);
    found.map_or(0, |p| p["ready"].as_u64().unwrap())
}

/// The members waiting in a pool, by id.
fn members(cli: &Cli, pool: &str) -> Vec<String> {
    let pools = json(&cli.ok(&["pool", "ls", "--json"]));
    let found = pools.as_array().unwrap().iter().find(|p| p["name"] == pool);
    let ids = found.unwrap()["members"].as_array().unwrap();
    ids.iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_claimed_sandbox_is_its_own_and_the_pool_refills_behind_it() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let made = cli.ok(&[
        "pool", "create", "warm", "--size", "2", "--image", BASE_IMAGE,
    ]);
    assert!(made.contains("made 2"), "{made}");
    assert_eq!(ready(&cli, "warm"), 2);
    let waiting = members(&cli, "warm");
    assert_eq!(waiting.len(), 2);
    for id in &waiting {
        assert!(is_running(&engine, id).await, "member {id} runs");
    }
    // Members are no sandboxes yet: not listed, not collected.
    assert_eq!(json(&cli.ok(&["ls", "--json"])), serde_json::json!([]));
    cli.ok(&["gc"]);
    assert_eq!(members(&cli, "warm"), waiting, "gc left the members alone");

    let a = json(&cli.ok(&["up", "a", "--pool", "warm", "--json"]));
    assert_eq!(a["action"], "claimed", "{a}");
    assert_eq!(a["tier"], 3);
    let a_id = a["sandbox"]["id"].as_str().unwrap().to_owned();
    assert!(waiting.contains(&a_id));
    cli.ok(&["exec", "a", "--", "sh", "-c", "echo mine > /root/secret"]);

    let b = json(&cli.ok(&["up", "b", "--pool", "warm", "--json"]));
    assert_eq!(b["action"], "claimed", "{b}");
    let b_id = b["sandbox"]["id"].as_str().unwrap().to_owned();
    assert_ne!(a_id, b_id);
    let silo = cli.silo();
    let (sa, sb) = (silo.get("a").unwrap(), silo.get("b").unwrap());
    assert!(
        silo.sandbox_key(&sa) != silo.sandbox_key(&sb),
        "each claimed sandbox has its own key"
    );
    let out = cli.run(&["exec", "b", "--", "test", "-e", "/root/secret"]);
    assert!(!out.status.success(), "b sees nothing of a's files");

    // Listed and logged like any other sandbox.
    let listed = json(&cli.ok(&["ls", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert!(cli.ok(&["events", "a"]).contains("claimed"));
    // An existing name opens the sandbox; it takes nothing from the pool.
    let again = json(&cli.ok(&["up", "a", "--pool", "warm", "--json"]));
    assert_eq!(again["action"], "attached", "{again}");

    // Each claim started a refill in the background.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready(&cli, "warm") < 2 {
        assert!(Instant::now() < deadline, "the pool did not refill");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refilled = members(&cli, "warm");
    assert!(refilled.iter().all(|id| *id != a_id && *id != b_id));

    // Bad requests are named and change nothing.
    let err = cli.fails(&["up", "c", "--pool", "nope"]);
    assert!(err.contains("unknown pool \"nope\""), "{err}");
    let err = cli.fails(&[
        "pool", "create", "warm", "--size", "1", "--image", BASE_IMAGE,
    ]);
    assert!(err.contains("already exists"), "{err}");
    let err = cli.fails(&[
        "pool", "create", "zero", "--size", "0", "--image", BASE_IMAGE,
    ]);
    assert!(err.contains("1 to 256"), "{err}");
    let err = cli.fails(&["up", "c", "--pool", "warm", "--image", BASE_IMAGE]);
    assert!(err.contains("--pool takes the pool's spec"), "{err}");
    assert_eq!(ready(&cli, "warm"), 2);

    // Removing the pool removes its waiting machines, not claimed ones.
    cli.ok(&["pool", "rm", "warm"]);
    for id in &refilled {
        assert!(containers_of(&engine, id).await.is_empty(), "{id} removed");
    }
    assert!(is_running(&engine, &a_id).await);
    let err = cli.fails(&["pool", "rm", "warm"]);
    assert!(err.contains("unknown pool"), "{err}");
    // An empty pool still gives a sandbox, made fresh with its spec.
    let spec = silo::SandboxSpec {
        image: Some(BASE_IMAGE.into()),
        ..silo::SandboxSpec::new(silo::BackendKind::Docker)
    };
    silo.create_pool("empty", spec, 1).unwrap();
    let fresh = silo.up_from_pool("c", "empty").await.unwrap();
    assert_eq!(fresh.action, silo::UpAction::Created);
    assert!(fresh.notes.iter().any(|n| n.contains("no sandbox ready")));
    assert_eq!(cli.ok(&["exec", "c", "--", "echo", "hi"]), "hi\n");
    drop(silo);
    cli.ok(&["pool", "rm", "empty"]);
    cli.ok(&["rm", "a", "b", "c"]);
}
