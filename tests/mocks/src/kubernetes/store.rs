//! The cluster's objects and their history: pods, Secrets and
//! NetworkPolicies by namespace and name, one resource version counter
//! bumped on every change of any of them (as etcd's revision), and the
//! pods' recent events for watches (a bounded history to replay from a
//! resource version, and a broadcast of new events).
//!
//! The lock is never held across an await. A pod's record also holds the
//! signal its kubelet waits on for deletion, and the engine ids of its
//! containers (for tests).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::{broadcast, watch};

use super::model::{Key, later, now};

/// Pod events kept for watches that resume from a resource version.
pub const HISTORY: usize = 4096;
/// Events a watch may fall behind by before it is ended (the client lists again).
pub const EVENT_BUFFER: usize = 1024;

/// What happened to a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// It was created.
    Added,
    /// It changed (status, deletion mark).
    Modified,
    /// It is gone.
    Deleted,
}

/// One change of a pod, as watches see it.
#[derive(Debug)]
pub struct PodEvent {
    /// The resource version the change made.
    pub revision: u64,
    /// What happened.
    pub kind: EventType,
    /// The pod before (for a watch whose selector it leaves or enters).
    pub before: Option<Arc<Pod>>,
    /// The pod after (for `Deleted`: its last state).
    pub after: Arc<Pod>,
}

/// A deletion asked of a pod's kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deletion {
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// A pod's containers on the engine, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainers {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid (also the containers' `silo.mock.sandbox` label).
    pub uid: String,
    /// The pod's address.
    pub ip: Ipv4Addr,
    /// Engine ids of its containers so far (init containers first).
    pub containers: Vec<String>,
}

struct PodRecord {
    pod: Arc<Pod>,
    ip: Ipv4Addr,
    containers: Vec<String>,
    stop: watch::Sender<Option<Deletion>>,
}

/// What a new watch starts from.
pub struct Subscription {
    /// Events after the asked resource version (empty without one).
    pub replay: Vec<Arc<PodEvent>>,
    /// The pods now (a watch without a resource version starts with them).
    pub current: Vec<Arc<Pod>>,
    /// New events from now on.
    pub live: broadcast::Receiver<Arc<PodEvent>>,
    /// The resource version now.
    pub revision: u64,
}

/// A watch asked to resume from a resource version the history no longer holds.
#[derive(Debug, Clone, Copy)]
pub struct Expired {
    /// What was asked.
    pub asked: u64,
    /// The oldest it could resume from.
    pub oldest: u64,
}

#[derive(Default)]
struct State {
    revision: u64,
    pods: BTreeMap<Key, PodRecord>,
    secrets: BTreeMap<Key, Secret>,
    policies: BTreeMap<Key, NetworkPolicy>,
    namespaces: BTreeSet<String>,
    history: VecDeque<Arc<PodEvent>>,
    /// The newest revision dropped from `history`.
    forgotten: u64,
}

/// A table of simple objects (Secrets, NetworkPolicies) in the state.
pub type Table<T> = fn(&mut StateRef) -> &mut BTreeMap<Key, T>;

/// The state as a [`Table`] sees it.
pub struct StateRef(State);

/// The Secrets' table.
pub fn secrets(state: &mut StateRef) -> &mut BTreeMap<Key, Secret> {
    &mut state.0.secrets
}

/// The NetworkPolicies' table.
pub fn policies(state: &mut StateRef) -> &mut BTreeMap<Key, NetworkPolicy> {
    &mut state.0.policies
}

/// Every object of the mock cluster.
pub struct Store {
    state: Mutex<StateRef>,
    events: broadcast::Sender<Arc<PodEvent>>,
}

impl Default for Store {
    fn default() -> Self {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Self {
            state: Mutex::new(StateRef(State::default())),
            events,
        }
    }
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, StateRef> {
        // A panic while holding the lock leaves plain data; carry on with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The resource version now.
    pub fn revision(&self) -> u64 {
        self.lock().0.revision
    }

    /// Namespaces objects were made in.
    pub fn namespaces(&self) -> Vec<String> {
        self.lock().0.namespaces.iter().cloned().collect()
    }

    /// Adds `pod` (uid, times and namespace already set) at address `ip`;
    /// `None` when the name is taken. Returns it with its resource version
    /// and the signal its kubelet waits on.
    pub fn create_pod(
        &self,
        mut pod: Pod,
        ip: Ipv4Addr,
    ) -> Option<(Arc<Pod>, watch::Receiver<Option<Deletion>>)> {
        let key = key_of(pod.metadata());
        let mut guard = self.lock();
        let state = &mut guard.0;
        if state.pods.contains_key(&key) {
            return None;
        }
        state.revision += 1;
        pod.metadata.resource_version = Some(state.revision.to_string());
        let pod = Arc::new(pod);
        let (stop, stopped) = watch::channel(None);
        state.namespaces.insert(key.namespace.clone());
        state.pods.insert(
            key,
            PodRecord {
                pod: pod.clone(),
                ip,
                containers: Vec::new(),
                stop,
            },
        );
        self.record(state, EventType::Added, None, pod.clone());
        Some((pod, stopped))
    }

    /// The pod under `key`.
    pub fn pod(&self, key: &Key) -> Option<Arc<Pod>> {
        self.lock().0.pods.get(key).map(|r| r.pod.clone())
    }

    /// Pods in `namespace` (all namespaces for `None`), and the resource version.
    pub fn pods(&self, namespace: Option<&str>) -> (Vec<Arc<Pod>>, u64) {
        let guard = self.lock();
        let pods = guard
            .0
            .pods
            .iter()
            .filter(|(k, _)| namespace.is_none_or(|n| k.namespace == n))
            .map(|(_, r)| r.pod.clone())
            .collect();
        (pods, guard.0.revision)
    }

    /// Changes the pod under `key` if it is still the one with `uid`; a
    /// change bumps the resource version and is a `MODIFIED` event.
    pub fn update_pod(
        &self,
        key: &Key,
        uid: &str,
        change: impl FnOnce(&mut Pod),
    ) -> Option<Arc<Pod>> {
        let mut guard = self.lock();
        let state = &mut guard.0;
        let record = state.pods.get_mut(key)?;
        if record.pod.metadata.uid.as_deref() != Some(uid) {
            return None;
        }
        let before = record.pod.clone();
        let mut pod = (*before).clone();
        change(&mut pod);
        if pod == *before {
            return Some(before);
        }
        state.revision += 1;
        pod.metadata.resource_version = Some(state.revision.to_string());
        let pod = Arc::new(pod);
        record.pod = pod.clone();
        self.record(state, EventType::Modified, Some(before), pod.clone());
        Some(pod)
    }

    /// Records the engine ids of a pod's containers.
    pub fn add_container(&self, key: &Key, uid: &str, id: &str) {
        let mut guard = self.lock();
        if let Some(record) = guard.0.pods.get_mut(key) {
            if record.pod.metadata.uid.as_deref() == Some(uid) {
                record.containers.push(id.to_owned());
            }
        }
    }

    /// Marks the pod under `key` for deletion after `grace` (its kubelet
    /// stops it and then removes it); a zero grace removes it at once.
    /// A pod already marked keeps its mark. The pod as answered, or `None`.
    pub fn delete_pod(&self, key: &Key, grace: Duration) -> Option<Arc<Pod>> {
        let mut guard = self.lock();
        let state = &mut guard.0;
        let record = state.pods.get(key)?;
        if record.pod.metadata.deletion_timestamp.is_some() && !grace.is_zero() {
            return Some(record.pod.clone());
        }
        record.stop.send_replace(Some(Deletion { grace }));
        let before = record.pod.clone();
        let mut pod = (*before).clone();
        let at = now();
        pod.metadata.deletion_timestamp = Some(later(&at, grace));
        pod.metadata.deletion_grace_period_seconds =
            Some(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX));
        state.revision += 1;
        pod.metadata.resource_version = Some(state.revision.to_string());
        let pod = Arc::new(pod);
        if grace.is_zero() {
            state.pods.remove(key);
            self.record(state, EventType::Deleted, Some(before), pod.clone());
        } else if let Some(record) = state.pods.get_mut(key) {
            record.pod = pod.clone();
            self.record(state, EventType::Modified, Some(before), pod.clone());
        }
        Some(pod)
    }

    /// Removes the pod under `key` if it is still the one with `uid` (its
    /// kubelet is done with it): a `DELETED` event.
    pub fn remove_pod(&self, key: &Key, uid: &str) -> Option<Arc<Pod>> {
        let mut guard = self.lock();
        let state = &mut guard.0;
        let record = state.pods.get(key)?;
        if record.pod.metadata.uid.as_deref() != Some(uid) {
            return None;
        }
        let record = state.pods.remove(key)?;
        state.revision += 1;
        let mut pod = (*record.pod).clone();
        pod.metadata.resource_version = Some(state.revision.to_string());
        let pod = Arc::new(pod);
        self.record(state, EventType::Deleted, Some(record.pod), pod.clone());
        Some(pod)
    }

    /// Every pod's containers, for tests.
    pub fn pod_containers(&self) -> Vec<PodContainers> {
        self.lock()
            .0
            .pods
            .iter()
            .map(|(key, record)| PodContainers {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                uid: record.pod.metadata.uid.clone().unwrap_or_default(),
                ip: record.ip,
                containers: record.containers.clone(),
            })
            .collect()
    }

    /// Starts a watch: events after `from` (when given) and new ones.
    pub fn subscribe(&self, from: Option<u64>) -> Result<Subscription, Expired> {
        let guard = self.lock();
        let state = &guard.0;
        let replay = match from {
            Some(asked) if asked < state.forgotten => {
                return Err(Expired {
                    asked,
                    oldest: state.forgotten,
                });
            }
            Some(asked) => state
                .history
                .iter()
                .filter(|e| e.revision > asked)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        Ok(Subscription {
            replay,
            current: state.pods.values().map(|r| r.pod.clone()).collect(),
            live: self.events.subscribe(),
            revision: state.revision,
        })
    }

    fn record(
        &self,
        state: &mut State,
        kind: EventType,
        before: Option<Arc<Pod>>,
        after: Arc<Pod>,
    ) {
        let event = Arc::new(PodEvent {
            revision: state.revision,
            kind,
            before,
            after,
        });
        if state.history.len() >= HISTORY {
            if let Some(old) = state.history.pop_front() {
                state.forgotten = old.revision;
            }
        }
        state.history.push_back(event.clone());
        // Nobody watching is fine.
        let _ = self.events.send(event);
    }

    /// Adds a simple object (metadata already filled); `None` when the name is taken.
    pub fn create<T: Metadata<Ty = ObjectMeta> + Clone>(
        &self,
        table: Table<T>,
        mut object: T,
    ) -> Option<T> {
        let key = key_of(object.metadata());
        let mut guard = self.lock();
        if table(&mut guard).contains_key(&key) {
            return None;
        }
        guard.0.revision += 1;
        object.metadata_mut().resource_version = Some(guard.0.revision.to_string());
        guard.0.namespaces.insert(key.namespace.clone());
        table(&mut guard).insert(key, object.clone());
        Some(object)
    }

    /// The simple object under `key`.
    pub fn get<T: Clone>(&self, table: Table<T>, key: &Key) -> Option<T> {
        table(&mut self.lock()).get(key).cloned()
    }

    /// Simple objects in `namespace` (all for `None`), and the resource version.
    pub fn list<T: Clone>(&self, table: Table<T>, namespace: Option<&str>) -> (Vec<T>, u64) {
        let mut guard = self.lock();
        let revision = guard.0.revision;
        let items = table(&mut guard)
            .iter()
            .filter(|(k, _)| namespace.is_none_or(|n| k.namespace == n))
            .map(|(_, o)| o.clone())
            .collect();
        (items, revision)
    }

    /// Replaces the simple object under `key` with what `change` makes of
    /// it (the error is the caller's answer); `None` when there is none.
    pub fn update<T: Metadata<Ty = ObjectMeta> + Clone, E>(
        &self,
        table: Table<T>,
        key: &Key,
        change: impl FnOnce(&T) -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        let mut guard = self.lock();
        let old = table(&mut guard).get(key)?.clone();
        let mut new = match change(&old) {
            Ok(new) => new,
            Err(error) => return Some(Err(error)),
        };
        guard.0.revision += 1;
        new.metadata_mut().resource_version = Some(guard.0.revision.to_string());
        table(&mut guard).insert(key.clone(), new.clone());
        Some(Ok(new))
    }

    /// Removes the simple object under `key`, returning it.
    pub fn delete<T: Metadata<Ty = ObjectMeta> + Clone>(
        &self,
        table: Table<T>,
        key: &Key,
    ) -> Option<T> {
        let mut guard = self.lock();
        let mut object = table(&mut guard).remove(key)?;
        guard.0.revision += 1;
        object.metadata_mut().resource_version = Some(guard.0.revision.to_string());
        Some(object)
    }
}

/// The key of an object's metadata.
pub fn key_of(meta: &ObjectMeta) -> Key {
    Key::new(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn every_change_bumps_one_counter() {
        let store = Store::default();
        let ip = Ipv4Addr::new(127, 77, 1, 2);
        let (made, _) = store.create_pod(pod("a", "u1"), ip).unwrap();
        assert_eq!(made.metadata.resource_version.as_deref(), Some("1"));
        assert!(store.create_pod(pod("a", "u2"), ip).is_none());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let secret = store.create(secrets, secret).unwrap();
        assert_eq!(secret.metadata.resource_version.as_deref(), Some("2"));
        let key = Key::new("default", "a");
        let changed = store
            .update_pod(&key, "u1", |p| {
                p.metadata.labels = Some([("k".into(), "v".into())].into())
            })
            .unwrap();
        assert_eq!(changed.metadata.resource_version.as_deref(), Some("3"));
        // The same change again is no change.
        store.update_pod(&key, "u1", |p| {
            p.metadata.labels = Some([("k".into(), "v".into())].into())
        });
        assert_eq!(store.revision(), 3);
        // Another pod's uid changes nothing.
        assert!(store.update_pod(&key, "u2", |_| {}).is_none());
    }

    #[test]
    fn watches_resume_from_a_revision() {
        let store = Store::default();
        let ip = Ipv4Addr::new(127, 77, 1, 2);
        store.create_pod(pod("a", "u1"), ip).unwrap();
        store.create_pod(pod("b", "u2"), ip).unwrap();
        let key = Key::new("default", "a");
        let marked = store.delete_pod(&key, Duration::from_secs(5)).unwrap();
        assert!(marked.metadata.deletion_timestamp.is_some());
        assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(5));
        store.remove_pod(&key, "u1").unwrap();
        let from_one = store.subscribe(Some(1)).unwrap();
        let kinds: Vec<_> = from_one
            .replay
            .iter()
            .map(|e| (e.revision, e.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                (2, EventType::Added),
                (3, EventType::Modified),
                (4, EventType::Deleted)
            ]
        );
        assert_eq!(from_one.current.len(), 1);
        let immediate = store
            .delete_pod(&Key::new("default", "b"), Duration::ZERO)
            .unwrap();
        assert!(immediate.metadata.deletion_timestamp.is_some());
        assert!(store.pod(&Key::new("default", "b")).is_none());
    }
}
