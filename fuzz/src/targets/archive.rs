//! Image archive loading: the controller's reading of an engine export
//! (`save_archive::ingest`, both the legacy and the OCI layout) into a
//! fresh store, and for what it accepts, writing the import archive back
//! (`load_archive::write`). Oracle: nothing appears outside the store's
//! directory, and an accepted image can be written back.

use std::fs;
use std::path::PathBuf;

use anyhow::Context;
use fastrand::Rng;
use silo::internals::store::{LoadPlan, Store, load_archive, save_archive};
use silo_protocol::auth::body_sha256;
use tempfile::TempDir;

use super::{Target, tar_or_mutant};

/// The image-archive target.
pub struct Archive {
    root: TempDir,
    store: PathBuf,
    seeds: Vec<Vec<u8>>,
    dict: Vec<Vec<u8>>,
}

/// A tar of `(name, bytes)` files.
fn tar_of(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in files {
        let mut header = tar::Header::new_ustar();
        header.set_mode(0o644);
        header.set_size(bytes.len() as u64);
        let _ = builder.append_data(&mut header, name, &bytes[..]);
    }
    builder.into_inner().unwrap_or_default()
}

/// A legacy (`<id>/layer.tar`) and an OCI (`blobs/sha256/`) export of one image.
fn seed_exports() -> Vec<Vec<u8>> {
    let layer = tar_of(&[("etc/issue", b"hi".to_vec()), ("bin/sh", b"x".to_vec())]);
    let diff = format!("sha256:{}", body_sha256(&layer));
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff]},
    }))
    .unwrap_or_default();
    let config_hex = body_sha256(&config);
    let layer_hex = body_sha256(&layer);
    let legacy_manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("{config_hex}.json"),
        "RepoTags": ["img:latest"],
        "Layers": ["l1/layer.tar"],
    }]))
    .unwrap_or_default();
    let oci_manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("blobs/sha256/{config_hex}"),
        "RepoTags": null,
        "Layers": [format!("blobs/sha256/{layer_hex}")],
    }]))
    .unwrap_or_default();
    vec![
        tar_of(&[
            (&format!("{config_hex}.json"), config.clone()),
            ("l1/layer.tar", layer.clone()),
            ("manifest.json", legacy_manifest),
        ]),
        tar_of(&[
            ("manifest.json", oci_manifest),
            (&format!("blobs/sha256/{layer_hex}"), layer),
            (&format!("blobs/sha256/{config_hex}"), config),
        ]),
    ]
}

impl Archive {
    /// The target, with a temporary directory holding each case's store.
    pub fn new() -> anyhow::Result<Self> {
        let root = tempfile::tempdir().context("cannot make a temporary directory")?;
        let store = root.path().join("store");
        let dict = [
            "manifest.json",
            "layer.tar",
            "blobs/sha256/",
            "\"Layers\"",
            "..",
            "sha256:",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        Ok(Self {
            root,
            store,
            seeds: seed_exports(),
            dict,
        })
    }

    fn outside(&self) -> Vec<String> {
        let mut found = Vec::new();
        if let Ok(entries) = fs::read_dir(self.root.path()) {
            for entry in entries.flatten() {
                if entry.path() != self.store {
                    found.push(entry.path().display().to_string());
                }
            }
        }
        found
    }
}

impl Target for Archive {
    fn name(&self) -> &'static str {
        "archive"
    }

    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        tar_or_mutant(rng, 1, &self.seeds, &self.dict)
    }

    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let _ = fs::remove_dir_all(&self.store);
        let store = Store::open(&self.store).map_err(|e| format!("cannot open the store: {e}"))?;
        let verdict = match save_archive::ingest(input, &store) {
            Ok(image) => {
                let plan = LoadPlan {
                    include: vec![true; image.layers.len()],
                    config_bytes: image.config_bytes,
                    layers: image.layers,
                    repo_tag: image.repo_tags.first().cloned(),
                };
                load_archive::write(std::io::sink(), &plan, &store)
                    .map(|_| ())
                    .map_err(|e| format!("an ingested image cannot be written back: {e}"))
            }
            Err(_) => Ok(()),
        };
        let outside = self.outside();
        let _ = fs::remove_dir_all(&self.store);
        if !outside.is_empty() {
            return Err(format!("written outside the store: {outside:?}"));
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_exports_are_ingested() {
        let target = Archive::new().unwrap();
        for seed in &target.seeds {
            let store = Store::open(&target.store).unwrap();
            let image = save_archive::ingest(&seed[..], &store).unwrap();
            assert_eq!(image.layers.len(), 1);
        }
    }
}
