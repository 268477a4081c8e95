//! Rewind in place on E2B and Daytona, through their mocks (real agents
//! in real containers): the VM's own agent brings its file system back to
//! each snapshot of a chain, entry by entry as it was when the snapshot
//! was taken, ends every process started before, and the provider is never
//! asked for a new VM; a template's file changed since, which silo has no
//! copy of, makes a new VM, and the report says why; a fork takes a VM
//! waiting in a pool of the template and rewinds it in place; and what
//! relays the agent's own output on Daytona is neither stopped by a
//! snapshot nor ended by a rewind.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::collections::BTreeMap;

use silo_mocks::journal::Asked;
use silo_mocks::{MockDaytona, MockDaytonaConfig, MockE2b, MockE2bConfig};
use silo_tests::Cli;
use silo_tests::docker::{BASE_IMAGE, engine_with_base};
use silo_tests::json;

use crate::rewind::{differences, entries, rewind, snapshot};
use crate::sh;

/// A `sleep` no keep-alive loop of a mock's VM runs.
const LEFT_RUNNING: &str = "sleep 7431";

/// The agent's children that an exec did not start, as `pid start state`
/// lines: on Daytona, the relays of the agent's stdout and stderr that its
/// process session forked before `exec`ing the agent.
const AGENT_CHILDREN: &str = "a=$(cut -d' ' -f4 /proc/$$/stat); \
    for p in /proc/[0-9]*; do set -- $(cat $p/stat 2>/dev/null); \
    [ \"$4\" = \"$a\" ] && [ \"$1\" != $$ ] && echo \"$1 ${22} $3\"; done; true";

/// How many sandboxes the provider was asked to create.
fn creates(asked: &[Asked]) -> usize {
    asked
        .iter()
        .filter(|asked| {
            let path = asked.path.split('?').next().unwrap_or_default();
            asked.method == "POST" && (path.ends_with("/sandboxes") || path.ends_with("/sandbox"))
        })
        .count()
}

/// Two snapshots of a chain on `name`, then rewinds in place back and
/// forth between them; `vm` names the sandbox's machine, `created` counts
/// the provider's creates.
fn rewinds_in_place_along_a_chain(
    cli: &Cli,
    name: &str,
    vm: impl Fn() -> String,
    created: impl Fn() -> usize,
) {
    sh(
        cli,
        name,
        "mkdir -p /work/sub && echo one > /work/file && echo a > /work/sub/a && \
         ln -s file /work/ln && rm /etc/group",
    );
    let first = snapshot(cli, name);
    let first_tree = entries(cli, name);
    sh(
        cli,
        name,
        "echo two > /work/file && rm -r /work/sub && mkdir /work/sub && echo b > /work/sub/b && \
         rm /work/ln && echo 'no longer a link' > /work/ln && chmod 700 /work/sub && \
         chmod 4755 /work/file",
    );
    let second = snapshot(cli, name);
    let second_tree = entries(cli, name);
    let (machine, creates_before) = (vm(), created());

    for (step, (target, want)) in [
        (&first, &first_tree),
        (&second, &second_tree),
        (&first, &first_tree),
    ]
    .into_iter()
    .enumerate()
    {
        sh(
            cli,
            name,
            &format!(
                "echo {step} > /work/step; rm -rf /work/sub; mkdir -p /usr/new/{step}; \
                 ({LEFT_RUNNING} > /dev/null 2>&1 &); true"
            ),
        );
        let report = rewind(cli, name, target);
        assert!(report["image"]["in_place"].is_object(), "{report}");
        assert!(report["new_machine_because"].is_null(), "{report}");
        let left = sh(
            cli,
            name,
            &format!("ps -o args | grep -c '^{LEFT_RUNNING}' ; true"),
        );
        assert_eq!(left.trim(), "0", "a process started before is gone");
        let differ = differences(want, &entries(cli, name));
        assert!(differ.is_empty(), "not the snapshot's tree: {differ:#?}");
    }
    assert_eq!(vm(), machine, "rewound on the same VM");
    assert_eq!(created(), creates_before, "the provider made no new VM");

    // A snapshot after a rewind in place builds on the rewound tree.
    sh(cli, name, "echo three > /work/three");
    let third = snapshot(cli, name);
    let third_tree = entries(cli, name);
    sh(cli, name, "rm /work/three");
    let report = rewind(cli, name, &third);
    assert!(report["image"]["in_place"].is_object(), "{report}");
    let differ = differences(&third_tree, &entries(cli, name));
    assert!(differ.is_empty(), "not the third's tree: {differ:#?}");

    // A template's file changed since: silo holds no copy of the
    // template's files, so a new VM is made, and the report says why.
    sh(
        cli,
        name,
        "chmod 600 /etc/passwd && echo changed >> /etc/profile",
    );
    let report = rewind(cli, name, &second);
    let why = report["new_machine_because"].as_str().unwrap_or_default();
    assert!(why.contains("/etc/"), "{report}");
    assert_eq!(created(), creates_before + 1, "{report}");
    // A new VM's session plumbing (Daytona's output FIFOs) has new names.
    let own = |tree: &BTreeMap<String, String>| {
        let mut tree = tree.clone();
        tree.retain(|path, _| !path.starts_with("/tmp/tmp."));
        tree
    };
    let differ = differences(&own(&second_tree), &own(&entries(cli, name)));
    assert!(differ.is_empty(), "not the second's tree: {differ:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_e2b_vm_rewinds_in_place_to_each_snapshot_of_a_chain() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let config = MockE2bConfig {
        templates: [("base".to_owned(), BASE_IMAGE.to_owned())].into(),
        ..MockE2bConfig::default()
    };
    let mock = MockE2b::start(config).await.unwrap();
    let cli = crate::cli().with_env(mock.env());
    cli.ok(&["up", "vm", "--backend", "e2b", "--template", "base"]);
    rewinds_in_place_along_a_chain(
        &cli,
        "vm",
        || crate::e2b::vm_of(&cli, "vm"),
        || creates(&mock.requests()),
    );

    // A fork onto a VM waiting in a pool of the template: no create asked
    // for it, the snapshot's files, its own key.
    sh(&cli, "vm", "echo forked > /work/forked");
    let snap = snapshot(&cli, "vm");
    let want = entries(&cli, "vm");
    cli.ok(&[
        "pool",
        "create",
        "vms",
        "--size",
        "1",
        "--backend",
        "e2b",
        "--template",
        "base",
    ]);
    let before = creates(&mock.requests());
    let fork = json(&cli.ok(&["fork", &snap, "--name", "branch", "--json"]));
    assert_eq!(fork["pool"], "vms", "{fork}");
    assert!(fork["image"]["in_place"].is_object(), "{fork}");
    // The refill behind the claim may create one VM, never two.
    assert!(creates(&mock.requests()) <= before + 1);
    let differ = differences(&want, &entries(&cli, "branch"));
    assert!(differ.is_empty(), "not the snapshot's tree: {differ:#?}");
    let silo = cli.silo();
    let key = |name: &str| silo.sandbox_key(&silo.get(name).unwrap());
    assert!(key("branch") != key("vm"), "the fork has its own key");
    drop(silo);
    cli.ok(&["pool", "rm", "vms"]);
    cli.ok(&["rm", "vm", "branch"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daytona_sandbox_rewinds_in_place_to_each_snapshot_of_a_chain() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let mock = MockDaytona::start(MockDaytonaConfig::default())
        .await
        .unwrap();
    let cli = crate::cli().with_env(mock.env());
    let up = json(&cli.ok(&[
        "up",
        "box",
        "--backend",
        "daytona",
        "--image",
        "base",
        "--json",
    ]));
    assert_eq!(up["tier"], 3, "{up}");
    rewinds_in_place_along_a_chain(
        &cli,
        "box",
        || crate::daytona::daytona_id(&cli, "box"),
        || creates(&mock.requests()),
    );
    cli.ok(&["rm", "box"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daytona_agent_s_output_relays_outlive_its_snapshots_and_rewinds() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let mock = MockDaytona::start(MockDaytonaConfig::default())
        .await
        .unwrap();
    let cli = crate::cli().with_env(mock.env());
    cli.ok(&["up", "box", "--backend", "daytona", "--image", "base"]);
    let vars: BTreeMap<String, String> = mock
        .env()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    let config = silo::DaytonaConfig::from_lookup(|name| vars.get(name).cloned()).unwrap();
    let id = crate::daytona::daytona_id(&cli, "box");
    let toolbox = silo::internals::daytona::Toolbox::new(&config, mock.toolbox_url(), &id).unwrap();
    let log = || async { toolbox.session_output("silo-agent").await.unwrap() };
    assert!(log().await.contains("silo-agent ready"), "{}", log().await);

    let relays = sh(&cli, "box", AGENT_CHILDREN);
    assert_eq!(relays.lines().count(), 2, "one relay a stream: {relays}");
    assert!(!relays.contains(" T"), "{relays}");

    // An idle sandbox: nothing of its own to stop, and the relays run on.
    let report = json(&cli.ok(&["snapshot", "box", "--json"]));
    assert_eq!(report["processes_stopped"], 0, "{report}");
    let snap = report["snapshot"]["id"].as_str().unwrap().to_owned();
    assert_eq!(sh(&cli, "box", AGENT_CHILDREN), relays);

    // A rewind ends what the sandbox started, never the relays, and the
    // agent's log still reaches the session's output afterwards.
    sh(
        &cli,
        "box",
        &format!("({LEFT_RUNNING} > /dev/null 2>&1 &); true"),
    );
    let report = rewind(&cli, "box", &snap);
    assert!(report["image"]["in_place"].is_object(), "{report}");
    let left = sh(
        &cli,
        "box",
        &format!("ps -o args | grep -c '^{LEFT_RUNNING}' ; true"),
    );
    assert_eq!(left.trim(), "0", "a process started before is gone");
    assert_eq!(sh(&cli, "box", AGENT_CHILDREN), relays);
    assert!(log().await.contains("rewind begun"), "{}", log().await);
    cli.ok(&["rm", "box"]);
    drop(cli);
    mock.shutdown().await.unwrap();
}
