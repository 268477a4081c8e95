//! `silo cp`, `silo cat` and `silo ls-files` against a container made from
//! the silo-base image (busybox, `FROM scratch`): the sample tree in and
//! out, compared by digest, with the sandbox's own `sha256sum` as a witness.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use silo_tests::docker::{BASE_IMAGE, engine_with_base};
use silo_tests::json;
use silo_tests::tree;

#[tokio::test]
async fn cp_round_trips_a_tree_through_a_base_image_sandbox() {
    let Some(_engine) = engine_with_base().await else {
        return;
    };
    let cli = crate::cli();
    cli.ok(&["up", "cpd", "--image", BASE_IMAGE]);
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("tree");
    tree::sample(&src);
    let want = tree::digest(&src);
    let src_text = src.display().to_string();

    // Into an existing directory of the image: the tree lands inside it.
    let copied = json(&cli.ok(&["cp", &src_text, "cpd:/tmp", "--json"]));
    assert_eq!(copied["to"], "cpd:/tmp/tree", "{copied}");
    let big = std::fs::read(src.join("big.bin")).unwrap();
    let sum = cli.ok(&["exec", "cpd", "--", "sha256sum", "/tmp/tree/big.bin"]);
    assert!(sum.starts_with(&tree::sha256_hex(&big)), "{sum}");
    let modes = cli.ok(&[
        "exec",
        "cpd",
        "--",
        "stat",
        "-c",
        "%a %n",
        "/tmp/tree/run.sh",
        "/tmp/tree/nested/private.key",
    ]);
    assert_eq!(
        modes,
        "755 /tmp/tree/run.sh\n600 /tmp/tree/nested/private.key\n"
    );
    assert_eq!(
        cli.ok(&["cat", "cpd", "/tmp/tree/nested/deeper/deepest/leaf.txt"]),
        "leaf\n"
    );
    let listed = json(&cli.ok(&["ls-files", "cpd", "/tmp/tree", "-o", "json"]));
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["big.bin", "binary.bin", "empty", "nested", "run.sh"]
    );

    // Back out to a new host path: the same tree, byte for byte and mode for mode.
    let back = host.path().join("back");
    cli.ok(&["cp", "cpd:/tmp/tree", &back.display().to_string()]);
    assert_eq!(tree::digest(&back), want);

    // A symlink made in the sandbox comes out as a symlink.
    cli.ok(&["exec", "cpd", "--", "ln", "-s", "run.sh", "/tmp/tree/alias"]);
    let linked = host.path().join("linked");
    cli.ok(&["cp", "cpd:/tmp/tree/alias", &linked.display().to_string()]);
    assert_eq!(
        std::fs::read_link(&linked).unwrap().to_str(),
        Some("run.sh")
    );
}
