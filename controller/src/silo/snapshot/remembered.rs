//! What one process remembers between rewinds, so that a harness going
//! back again and again pays for neither twice: a container's facts (they
//! never change for a container; a sandbox whose machine is replaced has a
//! new backend handle, so a new key) and the path indexes of recent
//! anchors. An anchor's index is built from the longest remembered index
//! whose layers begin its own, with only the layers above applied: a
//! checkpoint taken after the last rewind costs one small layer, not the
//! base image's index again. Each index is kept with its digest, by which a
//! snapshot or rewind names it to an agent that keeps the same tree
//! ([`crate::client::BaselinePaths`]).

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use silo_protocol::snapshot::tree_digest;

use super::base::image_index;
use super::{SnapshotError, blocking, parse_digest};
use crate::backend::ContainerFacts;
use crate::client::BaselinePaths;
use crate::state::{SandboxRecord, StoredImage};
use crate::store::{Index, Store};

/// Containers whose facts one process remembers.
pub const REMEMBERED_FACTS: usize = 64;
/// Anchors whose path index one process remembers (a big image's index is
/// megabytes).
pub const REMEMBERED_INDEXES: usize = 8;

/// Recent values by key, the oldest forgotten past `limit`.
struct Recent<K, V> {
    limit: usize,
    entries: Mutex<VecDeque<(K, Arc<V>)>>,
}

impl<K: PartialEq, V> Recent<K, V> {
    const fn new(limit: usize) -> Self {
        Self {
            limit,
            entries: Mutex::new(VecDeque::new()),
        }
    }

    fn get(&self, key: &K) -> Option<Arc<V>> {
        self.lock()
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| Arc::clone(v))
    }

    /// The value whose key `choose` ranks highest (`None`: not usable).
    fn best(&self, choose: impl Fn(&K) -> Option<usize>) -> Option<(usize, Arc<V>)> {
        self.lock()
            .iter()
            .filter_map(|(k, v)| Some((choose(k)?, Arc::clone(v))))
            .max_by_key(|(rank, _)| *rank)
    }

    fn put(&self, key: K, value: Arc<V>) {
        let mut entries = self.lock();
        entries.retain(|(k, _)| *k != key);
        entries.push_back((key, value));
        while entries.len() > self.limit {
            entries.pop_front();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(K, Arc<V>)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

static FACTS: Recent<String, ContainerFacts> = Recent::new(REMEMBERED_FACTS);
static INDEXES: Recent<(String, Vec<String>), KnownTree> = Recent::new(REMEMBERED_INDEXES);

/// A tree's paths with their digest.
#[derive(Debug)]
pub(super) struct KnownTree {
    /// The paths.
    pub(super) index: Index,
    digest: String,
}

impl KnownTree {
    /// `index` with its digest (blocking: it hashes every path).
    pub(super) fn new(index: Index) -> Self {
        let digest = tree_digest(index.paths());
        Self { index, digest }
    }
}

impl BaselinePaths for KnownTree {
    fn digest(&self) -> &str {
        &self.digest
    }

    fn paths(&self) -> Vec<Vec<u8>> {
        self.index.to_vec()
    }
}

/// The facts of `sandbox`'s current machine, if remembered.
pub(super) fn facts(sandbox: &SandboxRecord) -> Option<Arc<ContainerFacts>> {
    FACTS.get(&facts_key(sandbox))
}

/// Remembers the facts of `sandbox`'s current machine.
pub(super) fn remember_facts(
    sandbox: &SandboxRecord,
    facts: ContainerFacts,
) -> Arc<ContainerFacts> {
    let facts = Arc::new(facts);
    FACTS.put(facts_key(sandbox), Arc::clone(&facts));
    facts
}

fn facts_key(sandbox: &SandboxRecord) -> String {
    format!("{}\n{}", sandbox.id, sandbox.backend_ref)
}

/// The paths of the tree `layers` make over `base` (see the module docs).
pub(super) async fn index(
    store: &Store,
    base: &StoredImage,
    layers: &[String],
) -> Result<Arc<KnownTree>, SnapshotError> {
    let key = (base.index_blob.clone(), layers.to_vec());
    if let Some(index) = INDEXES.get(&key) {
        return Ok(index);
    }
    let below = INDEXES.best(|(blob, known)| {
        (*blob == base.index_blob && layers.starts_with(known) && known.len() >= base.layers.len())
            .then_some(known.len())
    });
    let (store, base, layers) = (store.clone(), base.clone(), layers.to_vec());
    let index = blocking(move || match below {
        Some((known, tree)) => {
            let mut index = tree.index.clone();
            for layer in &layers[known..] {
                let file = store.open_blob(&parse_digest(layer)?)?;
                index.apply_layer(io::BufReader::new(file))?;
            }
            Ok(KnownTree::new(index))
        }
        None => Ok(KnownTree::new(image_index(&store, &base, &layers)?)),
    })
    .await?;
    let index = Arc::new(index);
    INDEXES.put(key, Arc::clone(&index));
    Ok(index)
}
