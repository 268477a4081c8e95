//! An image's listing: the first container made from an image the store
//! lacks lists its paths before anything of the sandbox's runs, the next
//! shares that listing, gc keeps it while a sandbox started from it, and
//! the first snapshot is captured against it and stores the image only
//! after the sandbox runs again, with deletions still found. A container of
//! an image already stored needs no listing, and one with a workload is
//! never listed; a snapshot of either still restores exactly.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use crate::sh;
use silo_tests::Cli;
use silo_tests::docker::{engine_with_base, unique_image};
use silo_tests::json;

fn snapshot(cli: &Cli, name: &str) -> serde_json::Value {
    json(&cli.ok(&["snapshot", name, "--json"]))
}

/// The listing of its image the sandbox's baseline names, if any.
fn listing(cli: &Cli, name: &str) -> Option<String> {
    let silo = cli.silo();
    let baseline = silo.get(name).unwrap().baseline?;
    assert!(
        baseline.image.starts_with("docker-listing:"),
        "{baseline:?}"
    );
    Some(baseline.image)
}

/// Milliseconds a report field holds.
fn ms(report: &serde_json::Value, field: &str) -> f64 {
    report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no {field}: {report}"))
}

#[tokio::test]
async fn a_first_snapshot_is_captured_against_the_listing_before_its_image_is_stored() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let tag = format!("silo-test-listing:{}", std::process::id());
    unique_image(&engine, &tag, "listed").await;
    cli.ok(&["up", "lister", "--image", &tag]);
    let listed = listing(&cli, "lister").expect("a container of an unstored image is listed");
    let gc = json(&cli.ok(&["gc", "--json"]));
    assert_eq!(
        gc["store"]["images_forgotten"],
        serde_json::json!([]),
        "gc keeps a live sandbox's listing"
    );
    // A second container of the image shares the listing.
    cli.ok(&["up", "twin", "--image", &tag]);
    assert_eq!(listing(&cli, "twin").as_ref(), Some(&listed));

    sh(
        &cli,
        "lister",
        "rm /etc/unique && echo kept > /root/kept && mkdir /tmp/made && echo in > /tmp/made/x",
    );
    let report = snapshot(&cli, "lister");
    let stored_ms = ms(&report["base_stored"], "ms");
    assert_eq!(report["base_stored"]["after_capture"], true, "{report}");
    assert!(
        ms(&report, "durable_ms") >= ms(&report, "captured_ms") + stored_ms,
        "the image is stored after the capture, not before: {report}"
    );
    assert!(report["deletions"].as_u64().unwrap() >= 1, "{report}");
    let snap = report["snapshot"]["id"].as_str().unwrap().to_owned();

    sh(&cli, "lister", "echo later > /root/later");
    cli.ok(&["rewind", "lister", &snap]);
    assert_eq!(
        sh(
            &cli,
            "lister",
            "cat /root/kept /tmp/made/x; for f in /etc/unique /root/later; do \
             test -e $f && echo $f; done; true"
        ),
        "kept\nin\n",
        "the rewound sandbox has the snapshot's files, and not the deleted one"
    );
    assert_eq!(
        listing(&cli, "lister"),
        None,
        "a rewound machine needs none"
    );

    // The image is stored now: the next container of it needs no listing,
    // its first snapshot stores nothing of the image again, and gc forgets
    // the listing once no sandbox started from it.
    cli.ok(&["up", "second", "--image", &tag]);
    assert_eq!(listing(&cli, "second"), None);
    let second = snapshot(&cli, "second");
    assert!(second["base_stored"].is_null(), "{second}");
    cli.ok(&["rm", "twin"]);
    let gc = json(&cli.ok(&["gc", "--json"]));
    assert_eq!(
        gc["store"]["images_forgotten"],
        serde_json::json!([listed]),
        "{gc}"
    );
}

#[tokio::test]
async fn a_container_with_a_workload_stores_its_image_before_the_capture() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    let tag = format!("silo-test-listing-workload:{}", std::process::id());
    unique_image(&engine, &tag, "worked").await;
    cli.ok(&[
        "up",
        "worker",
        "--image",
        &tag,
        "--workload",
        // Deletes once, so a rewound machine keeps whatever the snapshot has.
        "sh -c 'test -e /root/once || { rm /etc/unique; echo > /root/once; }; exec sleep 1000'",
    ]);
    // The workload has had its turn once the marker is there.
    sh(
        &cli,
        "worker",
        "for i in $(seq 100); do test -e /root/once && break; sleep 0.05; done",
    );
    assert_eq!(
        listing(&cli, "worker"),
        None,
        "its workload ran before any listing could be taken"
    );
    let report = snapshot(&cli, "worker");
    assert_eq!(report["base_stored"]["after_capture"], false, "{report}");
    assert!(
        ms(&report, "captured_ms") >= ms(&report["base_stored"], "ms"),
        "without a listing the image is stored first: {report}"
    );
    let snap = report["snapshot"]["id"].as_str().unwrap().to_owned();
    cli.ok(&["rewind", "worker", &snap]);
    assert_eq!(
        sh(&cli, "worker", "test -e /etc/unique && echo back; true"),
        "",
        "the workload's deletion is in the snapshot"
    );
}
