use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::store::save_archive::{ingest, tests as save};
use crate::store::tests::put;

/// The entries of a tar: name → (kind, bytes), in order.
fn entries(archive: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>)> {
    let mut reader = tar::Archive::new(archive);
    reader
        .entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let kind = entry.header().entry_type();
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            (name, kind, bytes)
        })
        .collect()
}

fn stored_image(store: &Store) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<Digest>) {
    let (base, top) = save::two_layers();
    let config = save::config(&[&base, &top]);
    let layers = vec![put(store, &base).digest, put(store, &top).digest];
    (base, top, config, layers)
}

#[test]
fn the_archive_lists_every_layer_but_holds_only_the_included_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (_, top, config, layers) = stored_image(&store);
    let plan = LoadPlan {
        config_bytes: config.clone(),
        layers: layers.clone(),
        include: vec![false, true],
        repo_tag: Some("silo/snap:1".into()),
    };
    let mut out = Vec::new();
    let length = write(&mut out, &plan, &store).unwrap();
    assert_eq!(length, out.len() as u64);

    let config_name = format!("{}.json", Digest::of(&config));
    let entries = entries(&out);
    let names: Vec<&str> = entries.iter().map(|(name, ..)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            config_name.clone(),
            format!("{}/", layers[1]),
            format!("{}/layer.tar", layers[1]),
            "manifest.json".into(),
        ]
    );
    let by_name: BTreeMap<&str, &Vec<u8>> =
        entries.iter().map(|(n, _, b)| (n.as_str(), b)).collect();
    assert_eq!(by_name[config_name.as_str()], &config);
    assert_eq!(by_name[format!("{}/layer.tar", layers[1]).as_str()], &top);
    let manifest: serde_json::Value = serde_json::from_slice(by_name["manifest.json"]).unwrap();
    assert_eq!(
        manifest,
        serde_json::json!([{
            "Config": config_name,
            "RepoTags": ["silo/snap:1"],
            "Layers": [format!("{}/layer.tar", layers[0]), format!("{}/layer.tar", layers[1])],
        }])
    );

    // Deterministic.
    let mut again = Vec::new();
    write(&mut again, &plan, &store).unwrap();
    assert_eq!(again, out);
    assert_eq!(image_id(&config), format!("sha256:{}", Digest::of(&config)));
}

#[test]
fn a_full_archive_ingests_back_to_the_same_image() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("one")).unwrap();
    let (_, _, config, layers) = stored_image(&store);
    let plan = LoadPlan {
        config_bytes: config.clone(),
        layers: layers.clone(),
        include: vec![true, true],
        repo_tag: None,
    };
    let mut out = Vec::new();
    write(&mut out, &plan, &store).unwrap();

    let fresh = Store::open(dir.path().join("two")).unwrap();
    let image = ingest(&out[..], &fresh).unwrap();
    assert_eq!(image.layers, layers);
    assert_eq!(image.config_bytes, config);
    assert!(image.repo_tags.is_empty());
    assert_eq!(image.index.text_paths(), save::MERGED);
}

#[test]
fn plans_that_disagree_with_their_config_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (_, _, config, layers) = stored_image(&store);
    let plan = |layers: Vec<Digest>, include: Vec<bool>, config: &[u8]| LoadPlan {
        config_bytes: config.to_vec(),
        layers,
        include,
        repo_tag: None,
    };
    let mut out = Vec::new();
    let reversed: Vec<Digest> = layers.iter().rev().cloned().collect();
    for (bad, want) in [
        (plan(layers.clone(), vec![true], &config), "include flags"),
        (plan(reversed, vec![true, true], &config), "do not match"),
        (plan(layers.clone(), vec![true, true], b"{}"), "diff_ids"),
    ] {
        let error = write(&mut out, &bad, &store).unwrap_err();
        assert!(error.to_string().contains(want), "{error}");
    }
    assert!(out.is_empty());
}

#[test]
fn a_corrupt_blob_stops_the_archive_before_its_manifest_and_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (_, top, config, layers) = stored_image(&store);
    let path = store.path(&layers[1]);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let mut tampered = top.clone();
    tampered[600] ^= 1;
    fs::write(&path, &tampered).unwrap();
    let plan = LoadPlan {
        config_bytes: config,
        layers: layers.clone(),
        include: vec![true, true],
        repo_tag: None,
    };
    let mut out = Vec::new();
    let error = write(&mut out, &plan, &store).unwrap_err();
    assert!(
        matches!(&error, LoadArchiveError::CorruptBlob { digest, .. } if *digest == layers[1]),
        "{error}"
    );
    // No manifest and no end marker: the engine sees a truncated stream.
    assert!(!out.windows(13).any(|w| w == b"manifest.json"));
    let mut reader = tar::Archive::new(&out[..]);
    let last = reader.entries().unwrap().last().unwrap().unwrap();
    assert_eq!(
        last.path().unwrap().to_str(),
        Some(format!("{}/layer.tar", layers[1]).as_str())
    );
    let end = last.raw_file_position() + last.size().div_ceil(512) * 512;
    assert_eq!(end, out.len() as u64);

    fs::remove_file(&path).unwrap();
    let error = write(&mut Vec::new(), &plan, &store).unwrap_err();
    assert!(matches!(
        error,
        LoadArchiveError::Store(StoreError::Missing { .. })
    ));
}
