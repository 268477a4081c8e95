//! Snapshots on E2B through the mock E2B, with the real CLI: taken by the
//! agent inside the VM, rewound onto a fresh VM from the template, restored
//! by `up` when the VM is killed behind silo's back, and forked across
//! backends (E2B onto Docker, Docker onto E2B) when the image and the
//! template carry the same base id, and refused, leaving nothing behind,
//! when they do not.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::collections::BTreeMap;

use silo_mocks::containers::{LABEL_SANDBOX, labelled};
use silo_mocks::{MockE2b, MockE2bConfig};
use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, engine_with_base};

use crate::e2b::{api, vm_of};
use silo_tests::json;

/// An image with other files than the base's: its own base id.
const OTHER_IMAGE: &str = "silo-test-other-base:latest";

/// Takes a snapshot; answers its id.
fn snapshot(cli: &Cli, name: &str) -> String {
    let report = json(&cli.ok(&["snapshot", name, "--json"]));
    report["snapshot"]["id"].as_str().unwrap().to_owned()
}

/// The sandbox's files this test changes, as one line each.
fn files(cli: &Cli, name: &str) -> String {
    cli.ok(&[
        "exec",
        name,
        "--",
        "sh",
        "-c",
        "for f in /root/a /root/c /root/d /srv/x/b /etc/group; do \
           if [ -e $f ]; then echo \"$f=$(cat $f | head -c 20)\"; else echo \"$f -\"; fi; \
         done",
    ])
}

/// The mock with these templates (id, image), [`OTHER_IMAGE`] built when
/// one of them needs it.
async fn mock(templates: &[(&str, &str)]) -> Option<(MockE2b, bollard::Docker)> {
    let engine = engine_with_base().await?;
    if templates.iter().any(|(_, image)| *image == OTHER_IMAGE) {
        other_image(&engine).await;
    }
    let config = MockE2bConfig {
        templates: templates
            .iter()
            .map(|(t, i)| ((*t).to_owned(), (*i).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        ..MockE2bConfig::default()
    };
    let mock = MockE2b::start(config).await.unwrap();
    Some((mock, engine))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_rewind_restore_and_move_between_e2b_and_docker() {
    let Some((mock, engine)) = mock(&[("base", BASE_IMAGE)]).await else {
        return;
    };
    let cli = crate::cli().with_env(mock.env());
    cli.ok(&["up", "box", "--backend", "e2b", "--template", "base"]);

    // A change, a new tree and a deletion of a template file.
    cli.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "echo one > /root/a && mkdir -p /srv/x && echo two > /srv/x/b && rm /etc/group",
    ]);
    let first = snapshot(&cli, "box");
    let taken = files(&cli, "box");
    assert!(
        taken.contains("/root/a=one") && taken.contains("/srv/x/b=two"),
        "{taken}"
    );
    assert!(taken.contains("/etc/group -"), "{taken}");

    // Rewind of a stopped VM (a running one rewinds in place, see
    // `remote_rewind`): a fresh VM from the template with the snapshot
    // applied.
    let vm = vm_of(&cli, "box");
    cli.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "echo broken > /root/a && rm -r /srv/x",
    ]);
    cli.ok(&["stop", "box"]);
    let rewound = json(&cli.ok(&["rewind", "box", &first, "--json"]));
    assert_eq!(rewound["image"]["applied"]["layers"], 1, "{rewound}");
    assert!(rewound["new_machine_because"].is_string(), "{rewound}");
    assert_eq!(files(&cli, "box"), taken);
    assert_ne!(vm_of(&cli, "box"), vm, "a rewind makes a fresh VM");
    assert_eq!(
        labelled(&engine, LABEL_SANDBOX, &vm).await.unwrap().len(),
        0,
        "the rewound-away VM is left"
    );

    // `cp` into the rewound VM, then a second snapshot on top of the first.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c"), "three\n").unwrap();
    cli.ok(&["cp", dir.path().join("c").to_str().unwrap(), "box:/root/c"]);
    let second = snapshot(&cli, "box");
    let listed = json(&cli.ok(&["snapshots", "box", "--json"]));
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == second.as_str())
        .unwrap()
        .clone();
    assert_eq!(row["parent"], first.as_str(), "{row}");
    let with_c = files(&cli, "box");
    assert!(with_c.contains("/root/c=three"), "{with_c}");

    // The VM killed outside silo: `up` restores the latest snapshot (tier 2).
    let vm = vm_of(&cli, "box");
    let (status, _) = api(&mock, "DELETE", &format!("/sandboxes/{vm}")).await;
    assert_eq!(status, 204);
    let up = json(&cli.ok(&["up", "box", "--json"]));
    assert_eq!(up["tier"], 2, "{up}");
    assert_eq!(files(&cli, "box"), with_c);

    // E2B onto Docker: the engine image with the template's base id, and
    // the E2B layers on top.
    let forked = json(&cli.ok(&[
        "fork",
        &second,
        "--name",
        "dock",
        "--backend",
        "docker",
        "--json",
    ]));
    assert_eq!(forked["sandbox"]["backend"], "docker", "{forked}");
    assert_eq!(forked["sandbox"]["spec"]["image"], BASE_IMAGE, "{forked}");
    assert_eq!(files(&cli, "dock"), with_c);

    // And back: a snapshot taken on Docker applied onto a fresh E2B VM.
    cli.ok(&[
        "exec",
        "dock",
        "--",
        "sh",
        "-c",
        "echo four > /root/d && rm /root/a",
    ]);
    let on_docker = snapshot(&cli, "dock");
    let expected = files(&cli, "dock");
    assert!(
        expected.contains("/root/d=four") && expected.contains("/root/a -"),
        "{expected}"
    );
    let back = json(&cli.ok(&[
        "fork",
        &on_docker,
        "--name",
        "back",
        "--backend",
        "e2b",
        "--json",
    ]));
    assert_eq!(back["sandbox"]["backend"], "e2b", "{back}");
    assert_eq!(files(&cli, "back"), expected);

    // A snapshot taken on that VM, which stands on the engine image, onto
    // Docker again without naming an image.
    let on_back = snapshot(&cli, "back");
    let again = json(&cli.ok(&[
        "fork",
        &on_back,
        "--name",
        "again",
        "--backend",
        "docker",
        "--json",
    ]));
    assert_eq!(again["sandbox"]["backend"], "docker", "{again}");
    assert_eq!(files(&cli, "again"), expected);

    cli.ok(&["rm", "box", "dock", "back", "again"]);
    let (status, listed) = api(&mock, "GET", "/v2/sandboxes").await;
    assert_eq!((status, listed.trim()), (200, "[]"), "VMs left behind");
    // The CLI's clean-up (`gc` included) talks to the mock: it goes first.
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_onto_other_files_is_refused_and_leaves_nothing() {
    let Some((mock, _engine)) = mock(&[("base", BASE_IMAGE), ("other", OTHER_IMAGE)]).await else {
        return;
    };
    let cli = crate::cli().with_env(mock.env());

    // A Docker snapshot onto a template made from other files.
    cli.ok(&["up", "dock", "--image", BASE_IMAGE]);
    cli.ok(&["exec", "dock", "--", "sh", "-c", "echo one > /root/a"]);
    let on_docker = snapshot(&cli, "dock");
    let err = cli.fails(&[
        "fork",
        &on_docker,
        "--name",
        "x",
        "--backend",
        "e2b",
        "--template",
        "other",
    ]);
    assert!(
        err.contains("base id") && err.contains("template \"other\""),
        "{err}"
    );
    let (status, listed) = api(&mock, "GET", "/v2/sandboxes").await;
    assert_eq!(
        (status, listed.trim()),
        (200, "[]"),
        "the refused fork left a VM"
    );
    let names = cli.ok(&["ls"]);
    assert!(
        !names.contains("\nx "),
        "the refused fork left a sandbox: {names}"
    );

    // An E2B snapshot onto a Docker image made from other files.
    cli.ok(&["up", "vm", "--backend", "e2b"]);
    cli.ok(&["exec", "vm", "--", "sh", "-c", "echo one > /root/a"]);
    let on_e2b = snapshot(&cli, "vm");
    let err = cli.fails(&[
        "fork",
        &on_e2b,
        "--name",
        "y",
        "--backend",
        "docker",
        "--image",
        OTHER_IMAGE,
    ]);
    assert!(
        err.contains("base id") && err.contains(OTHER_IMAGE),
        "{err}"
    );

    // The local backend has no snapshots to fork onto.
    let err = cli.fails(&["fork", &on_e2b, "--name", "z", "--backend", "local"]);
    assert!(err.contains("no snapshots"), "{err}");

    cli.ok(&["rm", "dock", "vm"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}

/// Builds [`OTHER_IMAGE`]: the base image with another base id.
async fn other_image(engine: &bollard::Docker) {
    let dockerfile = format!(
        "FROM {BASE_IMAGE}\n\
         RUN echo other > {path}\n\
         LABEL {label}=other\n",
        path = silo::internals::image::BASE_ID_PATH,
        label = silo::internals::image::BASE_ID_LABEL,
    );
    let mut context = silo::internals::image::Context::new();
    context
        .file("Dockerfile", 0o644, dockerfile.as_bytes())
        .unwrap();
    silo::internals::image::build(engine, context.finish().unwrap(), OTHER_IMAGE, &mut |_| {})
        .await
        .unwrap();
}
