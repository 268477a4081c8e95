//! Safe extract: the agent's streaming extractor over structured bundles
//! (hostile tar entries, gzip shapes) and mutated valid ones. Oracle: after
//! each case nothing outside the target directory changed (a sentinel tree
//! around it and a probe directory for absolute names are compared with
//! their state before), and nothing under it is a symlink, a device, a FIFO
//! or a hard link.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use fastrand::Rng;
use silo_agent::push::extract::extract;
use silo_protocol::auth::body_sha256;
use silo_protocol::bundle::{BundleLimits, FileSet, write_bundle};
use tempfile::TempDir;

use super::{TAR_SHAPE_BYTES, Target, shape};

/// Every fuzz case runs to its end: nobody goes away mid-request here.
static NOT_CANCELLED: AtomicBool = AtomicBool::new(false);
use crate::mutate::mutate;
use crate::tarspec::{GzipSpec, TarSpec, gunzip, gzip};

/// Directories between the sentinel root and the target: `..` chains up to
/// this deep still land inside the watched tree.
const DEPTH: usize = 6;
/// Small caps, so cases stay fast and the caps themselves get exercised.
const LIMITS: BundleLimits = BundleLimits {
    max_file_bytes: 64 * 1024,
    max_bundle_bytes: 1024 * 1024,
    max_unpacked_bytes: 1024 * 1024,
    max_entries: 256,
    max_ratio: 200,
};

/// The safe-extract target.
pub struct Extract {
    _root: TempDir,
    sentinel: PathBuf,
    dest: PathBuf,
    probe: PathBuf,
    baseline: BTreeMap<PathBuf, String>,
    seeds: Vec<Vec<u8>>,
    dict: Vec<Vec<u8>>,
}

impl Extract {
    /// A sentinel tree in a fresh temporary directory, and the seeds.
    pub fn new() -> anyhow::Result<Self> {
        let root = tempfile::tempdir().context("cannot make a temporary directory")?;
        let sentinel = root.path().join("sentinel");
        let mut parent = sentinel.clone();
        for level in 0..DEPTH {
            parent = parent.join(format!("l{level}"));
            fs::create_dir_all(&parent)?;
            fs::write(parent.join("f.txt"), b"sentinel")?;
        }
        let dest = parent.join("dest");
        let probe = root.path().join("probe");
        let baseline = listing(&sentinel, &dest);
        fs::create_dir(&dest)?;
        let mut seeds = Vec::new();
        for files in [
            vec![("a.txt", &b"hello"[..], false)],
            vec![
                ("dir/b.sh", &b"#!/bin/sh\n"[..], true),
                ("dir/c/d", &b""[..], false),
            ],
            vec![("x", &[7u8; 3000][..], false), ("y/z", &b"zz"[..], false)],
        ] {
            let mut set = FileSet::new();
            for (path, bytes, exec) in files {
                set.insert_bytes(path, bytes.to_vec(), exec)?;
            }
            let mut bundle = Vec::new();
            write_bundle(&set, &LIMITS, &mut bundle)?;
            seeds.push(bundle);
        }
        let dict = [
            "..",
            "/",
            "\0",
            "ustar",
            "././@LongLink",
            "path=",
            "0000777",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain(std::iter::once(
            probe.as_os_str().as_encoded_bytes().to_vec(),
        ))
        .collect();
        Ok(Self {
            _root: root,
            sentinel,
            dest,
            probe,
            baseline,
            seeds,
            dict,
        })
    }

    fn check(&self) -> Result<(), String> {
        let now = listing(&self.sentinel, &self.dest);
        if now != self.baseline {
            let changed: Vec<_> = now
                .iter()
                .filter(|(path, kind)| self.baseline.get(*path) != Some(kind))
                .map(|(path, _)| path.display().to_string())
                .chain(
                    self.baseline
                        .keys()
                        .filter(|path| !now.contains_key(*path))
                        .map(|path| path.display().to_string()),
                )
                .collect();
            return Err(format!("the tree around the target changed: {changed:?}"));
        }
        if fs::symlink_metadata(&self.probe).is_ok() {
            return Err(format!("{} was created", self.probe.display()));
        }
        for (path, kind) in listing(&self.dest, Path::new("")) {
            if !(kind.starts_with("dir") || kind == "file 1") {
                return Err(format!("{} is {kind}", path.display()));
            }
        }
        Ok(())
    }

    fn reset(&self) {
        let _ = fs::remove_dir_all(&self.dest);
        let _ = fs::remove_dir_all(&self.probe);
        let _ = fs::create_dir(&self.dest);
    }
}

/// Every path under `dir` but `skip`, with its kind (and link count for files).
fn listing(dir: &Path, skip: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path == skip {
                continue;
            }
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let kind = if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {:o}", meta.mode() & 0o7777)
            } else if meta.is_file() {
                format!("file {}", meta.nlink())
            } else if meta.file_type().is_symlink() {
                "a symlink".to_owned()
            } else {
                format!("a special file (mode {:o})", meta.mode())
            };
            out.insert(path, kind);
        }
    }
    out
}

impl Target for Extract {
    fn name(&self) -> &'static str {
        "extract"
    }

    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let probe = self.probe.display().to_string();
        match rng.u8(0..4) {
            0 | 1 => {
                let tar = shape::<TarSpec>(rng, TAR_SHAPE_BYTES)
                    .map(|spec| spec.build(&probe))
                    .unwrap_or_default();
                match shape::<GzipSpec>(rng, 32) {
                    Some(spec) => spec.wrap(&tar),
                    None => gzip(&tar, 1),
                }
            }
            2 => {
                let seed = &self.seeds[rng.usize(..self.seeds.len())];
                let tars: Vec<Vec<u8>> = self.seeds.iter().map(|s| gunzip(s)).collect();
                gzip(&mutate(rng, &gunzip(seed), &tars, &self.dict), 1)
            }
            _ => {
                let seed = &self.seeds[rng.usize(..self.seeds.len())];
                mutate(rng, seed, &self.seeds, &self.dict)
            }
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        self.reset();
        let _ = extract(
            input,
            &self.dest,
            &LIMITS,
            &body_sha256(input),
            &NOT_CANCELLED,
        );
        let verdict = self.check();
        self.reset();
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_bundles_reach_every_verdict() {
        let mut target = Extract::new().unwrap();
        let (mut accepted, mut refused) = (0, 0);
        for seed in 0..400 {
            let input = target.generate(&mut Rng::with_seed(seed));
            target.reset();
            match extract(
                &input[..],
                &target.dest,
                &LIMITS,
                &body_sha256(&input),
                &NOT_CANCELLED,
            ) {
                Ok(_) => accepted += 1,
                Err(_) => refused += 1,
            }
            target.reset();
        }
        eprintln!("accepted {accepted}, refused {refused}");
        assert!(
            accepted > 0 && refused > 0,
            "accepted {accepted}, refused {refused}"
        );
    }

    #[test]
    fn the_oracle_sees_a_write_beside_the_target() {
        let target = Extract::new().unwrap();
        assert!(target.check().is_ok());
        let beside = target.dest.parent().unwrap().join("escaped");
        fs::write(&beside, b"x").unwrap();
        assert!(target.check().is_err());
        fs::remove_file(&beside).unwrap();
        std::os::unix::fs::symlink("/", target.dest.join("link")).unwrap();
        assert!(target.check().is_err());
        target.reset();
        fs::create_dir_all(&target.probe).unwrap();
        assert!(target.check().is_err());
    }
}
