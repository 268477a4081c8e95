use std::fs;

use super::*;
use crate::store::tests::layer;

/// One entry of a synthetic export.
pub(in crate::store) enum Item<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
}

/// An export tar of `items`, in order.
pub(in crate::store) fn export(items: &[Item<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for item in items {
        let mut header = tar::Header::new_ustar();
        header.set_mode(0o644);
        match item {
            Item::File(name, bytes) => {
                header.set_size(bytes.len() as u64);
                builder.append_data(&mut header, name, *bytes).unwrap();
            }
            Item::Dir(name) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, name, io::empty()).unwrap();
            }
            Item::Symlink(name, target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder.append_link(&mut header, name, target).unwrap();
            }
        }
    }
    builder.into_inner().unwrap()
}

/// An image config with these layers.
pub(in crate::store) fn config(layers: &[&[u8]]) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| Digest::of(l).prefixed()).collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

/// The two layers of the test image: the second deletes `etc/issue`.
pub(in crate::store) fn two_layers() -> (Vec<u8>, Vec<u8>) {
    let base = layer(&[
        ("bin/", 'd'),
        ("bin/sh", 'f'),
        ("etc/", 'd'),
        ("etc/issue", 'f'),
        ("etc/passwd", 'f'),
    ]);
    let top = layer(&[("etc/", 'd'), ("etc/.wh.issue", 'w'), ("usr/local/x", 'f')]);
    (base, top)
}

/// The paths of the image [`two_layers`] makes.
pub(in crate::store) const MERGED: [&str; 7] = [
    "bin",
    "bin/sh",
    "etc",
    "etc/passwd",
    "usr",
    "usr/local",
    "usr/local/x",
];

/// A legacy `docker save` of `layers` with `config`.
fn legacy(layers: &[&[u8]], config: &[u8]) -> Vec<u8> {
    let config_name = format!("{}.json", Digest::of(config));
    let ids: Vec<String> = (0..layers.len())
        .map(|i| format!("{:064x}", i + 1))
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name,
        "RepoTags": ["silo/test:1"],
        "Layers": ids.iter().map(|id| format!("{id}/layer.tar")).collect::<Vec<_>>(),
    }]))
    .unwrap();
    let names: Vec<[String; 4]> = ids
        .iter()
        .map(|id| {
            [
                format!("{id}/"),
                format!("{id}/VERSION"),
                format!("{id}/json"),
                format!("{id}/layer.tar"),
            ]
        })
        .collect();
    let mut items = Vec::new();
    for (names, bytes) in names.iter().zip(layers) {
        items.push(Item::Dir(&names[0]));
        items.push(Item::File(&names[1], b"1.0"));
        items.push(Item::File(&names[2], b"{}"));
        items.push(Item::File(&names[3], bytes));
    }
    items.push(Item::File(&config_name, config));
    items.push(Item::File("repositories", b"{}"));
    items.push(Item::File("manifest.json", &manifest));
    export(&items)
}

fn temps(store: &Store) -> usize {
    fs::read_dir(store.root().join("tmp")).unwrap().count()
}

#[test]
fn a_legacy_export_is_stored_checked_and_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (base, top) = two_layers();
    let config = config(&[&base, &top]);
    let archive = legacy(&[&base, &top], &config);

    let image = ingest(&archive[..], &store).unwrap();
    assert_eq!(image.layers, [Digest::of(&base), Digest::of(&top)]);
    assert_eq!(image.config_bytes, config);
    assert_eq!(image.config["os"], "linux");
    assert_eq!(image.repo_tags, ["silo/test:1"]);
    assert_eq!(image.index.text_paths(), MERGED);
    assert_eq!(image.bytes_stored, (base.len() + top.len()) as u64);
    for (layer, bytes) in image.layers.iter().zip([&base, &top]) {
        assert_eq!(&fs::read(store.path(layer)).unwrap(), bytes);
    }
    assert_eq!(temps(&store), 0);

    // Ingesting it again stores nothing new.
    let again = ingest(&archive[..], &store).unwrap();
    assert_eq!(again.bytes_stored, 0);
    assert_eq!(again.index, image.index);
}

#[test]
fn an_oci_export_with_linked_layers_in_any_order_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (base, top) = two_layers();
    let config = config(&[&base, &top]);
    let blob = |bytes: &[u8]| format!("blobs/sha256/{}", Digest::of(bytes));
    let (base_blob, top_blob, config_blob) = (blob(&base), blob(&top), blob(&config));
    let oci_manifest = br#"{"schemaVersion":2,"layers":[]}"#;
    let oci_manifest_blob = blob(oci_manifest);
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_blob,
        "RepoTags": null,
        "Layers": ["aaaa/layer.tar", top_blob],
    }]))
    .unwrap();
    let target = format!("../{base_blob}");
    let archive = export(&[
        Item::File("manifest.json", &manifest),
        Item::Symlink("aaaa/layer.tar", &target),
        Item::Dir("blobs/"),
        Item::Dir("blobs/sha256/"),
        Item::File(&top_blob, &top),
        Item::File(&oci_manifest_blob, oci_manifest),
        Item::File(&config_blob, &config),
        Item::File(&base_blob, &base),
        Item::File("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#),
    ]);
    let image = ingest(&archive[..], &store).unwrap();
    assert_eq!(image.layers, [Digest::of(&base), Digest::of(&top)]);
    assert_eq!(image.config_bytes, config);
    assert!(image.repo_tags.is_empty());
    assert_eq!(image.index.text_paths(), MERGED);
    // The OCI metadata blobs were stored as well (unrecorded, for gc).
    assert!(store.has(&Digest::of(oci_manifest)).unwrap());
}

#[test]
fn a_layer_that_does_not_match_its_diff_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (base, top) = two_layers();
    let other = layer(&[("something/else", 'f')]);
    let config = config(&[&base, &other]);
    let error = ingest(&legacy(&[&base, &top], &config)[..], &store).unwrap_err();
    match &error {
        IngestError::DiffIdMismatch {
            position,
            expected,
            actual,
            ..
        } => {
            assert_eq!(*position, 1);
            assert_eq!(*expected, Digest::of(&other));
            assert_eq!(*actual, Digest::of(&top));
        }
        other => panic!("unexpected {other}"),
    }
    assert!(error.to_string().contains("layer 1"), "{error}");
}

#[test]
fn compressed_and_non_tar_layers_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let gzip = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3];
    let error = ingest(&legacy(&[&gzip], &config(&[&gzip]))[..], &store).unwrap_err();
    assert!(
        matches!(error, IngestError::CompressedLayer { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("not supported yet"));

    let junk = [b'x'; 700];
    let error = ingest(&legacy(&[&junk], &config(&[&junk]))[..], &store).unwrap_err();
    assert!(matches!(error, IngestError::NotALayer { .. }), "{error}");
}

#[test]
fn exports_without_exactly_one_image_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    for (manifest, count) in [
        (&b"[]"[..], 0),
        (
            &br#"[{"Config":"a","Layers":[]},{"Config":"b","Layers":[]}]"#[..],
            2,
        ),
    ] {
        let archive = export(&[Item::File("manifest.json", manifest)]);
        match ingest(&archive[..], &store) {
            Err(IngestError::ImageCount { count: got }) => assert_eq!(got, count),
            other => panic!("unexpected {other:?}"),
        }
    }
    let archive = export(&[Item::File("repositories", b"{}")]);
    assert!(matches!(
        ingest(&archive[..], &store),
        Err(IngestError::Missing { .. })
    ));
}

#[test]
fn a_cut_short_export_fails_and_leaves_no_temp() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let big = layer(&[("big", 'f'); 50]);
    let archive = legacy(&[&big], &config(&[&big]));
    let cut = &archive[..archive.len() / 2];
    let error = ingest(cut, &store).unwrap_err();
    assert!(
        matches!(error, IngestError::Truncated { .. } | IngestError::Read(_)),
        "{error}"
    );
    assert_eq!(temps(&store), 0);
}
