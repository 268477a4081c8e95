//! Snapshot layer reading: how the controller parses a layer from a sandbox
//! as it stores it (`LayerDelta::read`, then applied to an `Index`), and
//! the index file format (`Index::read_from`). Oracle: an index that was
//! read or built writes out and reads back to itself.

use fastrand::Rng;
use silo::internals::store::{Index, LayerDelta};

use super::{Target, tar_or_mutant};

/// The layer-reading target.
pub struct Layer {
    seeds: Vec<Vec<u8>>,
    dict: Vec<Vec<u8>>,
}

impl Layer {
    /// The target with its seed layers.
    pub fn new() -> Self {
        let mut seeds = Vec::new();
        for entries in [
            &[("bin/", true), ("bin/sh", false), ("etc/issue", false)][..],
            &[
                ("etc/", true),
                ("etc/.wh.issue", false),
                ("usr/local/x", false),
            ][..],
            &[("a/", true), ("a/.wh..wh..opq", false), ("a/b", false)][..],
        ] {
            let mut builder = tar::Builder::new(Vec::new());
            for (path, dir) in entries {
                let mut header = tar::Header::new_gnu();
                header.set_mode(0o755);
                header.set_entry_type(if *dir {
                    tar::EntryType::Directory
                } else {
                    tar::EntryType::Regular
                });
                let data: &[u8] = if *dir { b"" } else { b"abc" };
                header.set_size(data.len() as u64);
                let _ = builder.append_data(&mut header, path, data);
            }
            seeds.push(builder.into_inner().unwrap_or_default());
        }
        let dict = [".wh.", ".wh..wh..opq", "/", "..", "./", "\n"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        Self { seeds, dict }
    }
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for Layer {
    fn name(&self) -> &'static str {
        "layer"
    }

    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        tar_or_mutant(rng, 2, &self.seeds, &self.dict)
    }

    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        if let Ok(delta) = LayerDelta::read(input) {
            let _ = delta.stats();
            let mut index = Index::new();
            index.apply(&delta);
            index.apply(&delta);
            round_trip(&index)?;
        }
        if let Ok(index) = Index::read_from(input) {
            round_trip(&index)?;
        }
        Ok(())
    }
}

/// An index must write out and read back to the same paths.
fn round_trip(index: &Index) -> Result<(), String> {
    let mut text = Vec::new();
    index
        .write_to(&mut text)
        .map_err(|e| format!("an index cannot be written: {e}"))?;
    match Index::read_from(&text[..]) {
        Ok(again) if again.to_vec() == index.to_vec() => Ok(()),
        Ok(_) => Err("an index does not read back to itself".into()),
        Err(e) => Err(format!("an index it wrote does not read back: {e}")),
    }
}
