//! Snapshots and the base images under them: what each snapshot is made of
//! (its layers, named by digest in the store, and the image config the
//! engine is given), and which images' layers the store already keeps.
//!
//! A snapshot row is written only after every blob it names is in the
//! store, in the same transaction as its `snapshot` event; so a row never
//! names a missing blob, and a crash leaves at worst unnamed blobs for gc.
//! The config is kept as the exact text the engine is given: the engine's
//! image id is its SHA-256, so it must never be re-serialized.

use std::collections::BTreeSet;

use serde::Serialize;

use super::events::{EventKind, insert_event};
use super::sql::{Row, Sql, SqlError, args};
use super::{Checkpoint, StateDb, StateError, db, now_ms};
use crate::spec::SandboxSpec;

/// A base image whose layers are in the store.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredImage {
    /// The engine's id of the image (`sha256:…`).
    pub image_id: String,
    /// Its image config, as the engine exported it.
    pub config: serde_json::Value,
    /// Its layer digests (bare hex), bottom first.
    pub layers: Vec<String>,
    /// The digest of the blob listing its paths.
    pub index_blob: String,
    /// Bytes its layers and index take in the store.
    pub bytes: u64,
    /// When it was stored (unix ms).
    pub stored_at_ms: i64,
    /// The base id it carries (the `silo.base-id` label of images silo
    /// builds, the same file in templates made from them), if any.
    pub identity: Option<String>,
}

impl StoredImage {
    /// Whether it is a template's path index rather than an engine image
    /// (no layers of its own: its machines come from the provider).
    pub fn is_template(&self) -> bool {
        self.layers.is_empty()
    }
}

/// A config's text as the JSON it holds, so `--json` shows an object, not
/// a string of JSON; text that is not JSON stays a string.
fn config_as_json<S: serde::Serializer>(config: &str, out: S) -> Result<S::Ok, S::Error> {
    match serde_json::from_str::<serde_json::Value>(config) {
        Ok(value) => value.serialize(out),
        Err(_) => out.serialize_str(config),
    }
}

/// A snapshot of a sandbox's file system.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Its id (`snap-` and 12 hex digits).
    pub id: String,
    /// The sandbox it was taken of (which may since have been removed).
    pub sandbox_id: String,
    /// That sandbox's name at the time.
    pub sandbox_name: String,
    /// The snapshot whose layers it builds on: the previous snapshot of the
    /// same machine, else the snapshot the machine was made from, if any.
    pub parent: Option<String>,
    /// The sandbox's spec at the time, which a fork starts from.
    pub spec: SandboxSpec,
    /// The base image (engine id) under its layers.
    pub base_image: String,
    /// Its layer digests (bare hex), bottom first: the base image's, then
    /// one per snapshot in its chain, its own last.
    pub layers: Vec<String>,
    /// The image config the engine is given, as exact text (in JSON
    /// output, the object it holds).
    #[serde(serialize_with = "config_as_json")]
    pub config: String,
    /// What the user said about it.
    pub message: Option<String>,
    /// Size of its own layer.
    pub layer_bytes: u64,
    /// How much the store grew by taking it (base layers stored for it included).
    pub new_bytes: u64,
    /// When it was taken (unix ms).
    pub created_at_ms: i64,
}

impl Snapshot {
    /// Its own layer (the top one).
    pub fn own_layer(&self) -> Option<&str> {
        self.layers.last().map(String::as_str)
    }
}

const SNAPSHOT_COLUMNS: &str = "id, sandbox_id, sandbox_name, parent, spec, base_image, layers, \
                                config, message, layer_bytes, new_bytes, created_at";

impl StateDb {
    /// The stored base image with this engine id, if its layers are stored.
    pub fn stored_image(&self, image_id: &str) -> Result<Option<StoredImage>, StateError> {
        let what = "looking up a stored image";
        let row = self
            .sql()
            .query_opt(
                "SELECT image_id, config, layers, index_blob, bytes, stored_at, identity \
                 FROM images WHERE image_id = ?1",
                args![image_id],
            )
            .map_err(db(what))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = |row: &Row| -> Result<_, SqlError> {
            Ok((
                row.get::<String>(0)?,
                row.get::<String>(1)?,
                row.get::<String>(2)?,
                row.get::<String>(3)?,
                row.get::<i64>(4)?,
                row.get::<i64>(5)?,
                row.get::<Option<String>>(6)?,
            ))
        };
        let (image_id, config, layers, index_blob, bytes, stored_at_ms, identity) =
            read(&row).map_err(db(what))?;
        let corrupt = |what: String| StateError::Corrupt {
            id: image_id.clone(),
            what,
        };
        Ok(Some(StoredImage {
            config: serde_json::from_str(&config).map_err(|e| corrupt(format!("config: {e}")))?,
            layers: serde_json::from_str(&layers).map_err(|e| corrupt(format!("layers: {e}")))?,
            index_blob,
            bytes: u64::try_from(bytes).unwrap_or(0),
            stored_at_ms,
            image_id,
            identity,
        }))
    }

    /// The newest stored image whose id starts with `prefix`.
    pub fn newest_stored_image_like(
        &self,
        prefix: &str,
    ) -> Result<Option<StoredImage>, StateError> {
        let what = "looking up a stored image";
        let id: Option<String> = self
            .sql()
            .query_opt(
                "SELECT image_id FROM images \
                 WHERE substr(image_id, 1, length(CAST(?1 AS TEXT))) = CAST(?1 AS TEXT) \
                 ORDER BY stored_at DESC LIMIT 1",
                args![prefix],
            )
            .map_err(db(what))?
            .map(|row| row.get(0))
            .transpose()
            .map_err(db(what))?;
        match id {
            Some(id) => self.stored_image(&id),
            None => Ok(None),
        }
    }

    /// Records a base image whose blobs are all in the store. Recording one
    /// that is already recorded (by a racing process) keeps the first row.
    pub fn insert_image(&mut self, image: &StoredImage) -> Result<(), StateError> {
        let config = json_text(&image.image_id, &image.config)?;
        let layers = json_text(&image.image_id, &image.layers)?;
        self.write("recording a stored image", |tx| {
            tx.execute(
                "INSERT INTO images \
                 (image_id, config, layers, index_blob, bytes, stored_at, identity) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
                args![
                    image.image_id,
                    config,
                    layers,
                    image.index_blob,
                    image.bytes,
                    image.stored_at_ms,
                    image.identity
                ],
            )
            .map_err(db("recording a stored image"))?;
            Ok(())
        })
    }

    /// Records a snapshot whose blobs are all in the store, with its
    /// `snapshot` event (carrying `detail`), and makes `checkpoint` what the
    /// sandbox's next snapshot builds on.
    pub fn insert_snapshot(
        &mut self,
        snapshot: &Snapshot,
        checkpoint: Option<&Checkpoint>,
        detail: &serde_json::Value,
    ) -> Result<(), StateError> {
        let layers = json_text(&snapshot.id, &snapshot.layers)?;
        let spec = json_text(&snapshot.id, &snapshot.spec)?;
        let checkpoint = checkpoint.map(|c| json_text(&snapshot.id, c)).transpose()?;
        self.write("recording a snapshot", |tx| {
            tx.execute(
                &format!(
                    "INSERT INTO snapshots ({SNAPSHOT_COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
                ),
                args![
                    snapshot.id,
                    snapshot.sandbox_id,
                    snapshot.sandbox_name,
                    snapshot.parent,
                    spec,
                    snapshot.base_image,
                    layers,
                    snapshot.config,
                    snapshot.message,
                    snapshot.layer_bytes,
                    snapshot.new_bytes,
                    snapshot.created_at_ms
                ],
            )
            .map_err(db("recording a snapshot"))?;
            // The machine's next snapshot builds on this one (or, without a
            // moment to count from, on nothing it could trust).
            tx.execute(
                "UPDATE sandboxes SET checkpoint = ?2 WHERE id = ?1",
                args![snapshot.sandbox_id, checkpoint],
            )
            .map_err(db("recording a snapshot"))?;
            insert_event(
                tx,
                &snapshot.sandbox_id,
                &snapshot.sandbox_name,
                snapshot.created_at_ms,
                EventKind::Snapshot,
                detail,
            )
        })
    }

    /// The snapshot with this id (or a unique prefix of it).
    pub fn snapshot(&self, id: &str) -> Result<Snapshot, StateError> {
        let what = "looking up a snapshot";
        let rows = self
            .sql()
            .query(
                &format!(
                    "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE id = CAST(?1 AS TEXT) \
                     OR substr(id, 1, length(CAST(?1 AS TEXT))) = CAST(?1 AS TEXT) LIMIT 2"
                ),
                args![id],
            )
            .map_err(db(what))?
            .iter()
            .map(RawSnapshot::read)
            .collect::<Result<Vec<_>, _>>()
            .map_err(db(what))?;
        if let Some(exact) = rows.iter().find(|r| r.id == id) {
            return exact.clone().parse();
        }
        match <[RawSnapshot; 1]>::try_from(rows) {
            Ok([only]) => only.parse(),
            Err(rows) if rows.is_empty() => Err(StateError::UnknownSnapshot(id.to_owned())),
            Err(_) => Err(StateError::AmbiguousSnapshot(id.to_owned())),
        }
    }

    /// Snapshots, oldest first: of one sandbox (by id), or all of them.
    pub fn snapshots(&self, sandbox_id: Option<&str>) -> Result<Vec<Snapshot>, StateError> {
        let what = "listing snapshots";
        let rows = self
            .sql()
            .query(
                &format!(
                    "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE CAST(?1 AS TEXT) IS NULL \
                     OR sandbox_id = CAST(?1 AS TEXT) ORDER BY created_at, rowid"
                ),
                args![sandbox_id],
            )
            .map_err(db(what))?;
        rows.iter()
            .map(|row| RawSnapshot::read(row).map_err(db(what))?.parse())
            .collect()
    }

    /// The newest snapshot of a sandbox (by id), if it has any.
    pub fn latest_snapshot(&self, sandbox_id: &str) -> Result<Option<Snapshot>, StateError> {
        Ok(self.snapshots(Some(sandbox_id))?.pop())
    }

    /// Names of the live sandboxes whose machine was made from a snapshot.
    pub fn sandboxes_made_from(&self, snapshot_id: &str) -> Result<Vec<String>, StateError> {
        let what = "finding sandboxes made from a snapshot";
        let rows = self
            .sql()
            .query(
                "SELECT name FROM sandboxes WHERE origin_snapshot = ?1 ORDER BY name",
                args![snapshot_id],
            )
            .map_err(db(what))?;
        rows.iter()
            .map(|row| row.get(0).map_err(db(what)))
            .collect()
    }

    /// Replaces a snapshot's layers and config with an equivalent shorter
    /// list (its chain squashed); what it restores to stays the same.
    pub fn replace_snapshot_layers(
        &mut self,
        snapshot: &Snapshot,
        layers: &[String],
        config: &str,
    ) -> Result<Snapshot, StateError> {
        let text = json_text(&snapshot.id, &layers)?;
        self.write("compacting a snapshot", |tx| {
            let changed = tx
                .execute(
                    "UPDATE snapshots SET layers = ?2, config = ?3 WHERE id = ?1",
                    args![snapshot.id, text, config],
                )
                .map_err(db("compacting a snapshot"))?;
            match changed {
                0 => Err(StateError::UnknownSnapshot(snapshot.id.clone())),
                _ => Ok(()),
            }
        })?;
        Ok(Snapshot {
            layers: layers.to_vec(),
            config: config.to_owned(),
            ..snapshot.clone()
        })
    }

    /// Deletes a snapshot's row and logs `snapshot_removed` on its sandbox.
    /// Its blobs stay until gc finds nothing naming them.
    pub fn delete_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StateError> {
        let now = now_ms();
        self.write("removing a snapshot", |tx| {
            let changed = tx
                .execute("DELETE FROM snapshots WHERE id = ?1", args![snapshot.id])
                .map_err(db("removing a snapshot"))?;
            if changed == 0 {
                return Err(StateError::UnknownSnapshot(snapshot.id.clone()));
            }
            insert_event(
                tx,
                &snapshot.sandbox_id,
                &snapshot.sandbox_name,
                now,
                EventKind::SnapshotRemoved,
                &serde_json::json!({ "snapshot": snapshot.id }),
            )
        })
    }

    /// Forgets the stored images no snapshot stands on and no sandbox's
    /// machine started from (a template baseline or an image's listing,
    /// which its first snapshot needs); returns their ids. Their blobs become
    /// unnamed, for gc to remove.
    pub fn forget_unused_images(&mut self) -> Result<Vec<String>, StateError> {
        let what = "forgetting unused images";
        self.write(what, |tx| {
            // `NOT IN` a list holding NULL is never true: the baselines'
            // images are taken only where there is one.
            let image = tx.dialect().json_text_field("baseline", "image");
            let rows = tx
                .query(
                    &format!(
                        "DELETE FROM images WHERE image_id NOT IN \
                         (SELECT base_image FROM snapshots) AND image_id NOT IN \
                         (SELECT {image} FROM sandboxes WHERE {image} IS NOT NULL) \
                         RETURNING image_id"
                    ),
                    &[],
                )
                .map_err(db(what))?;
            rows.iter()
                .map(|row| row.get(0).map_err(db(what)))
                .collect()
        })
    }

    /// Every blob a row names: the layers of every snapshot, and the layers
    /// and index of every stored image. gc keeps exactly these.
    pub fn named_blobs(&self) -> Result<BTreeSet<String>, StateError> {
        named_blobs_in(self.sql())
    }
}

/// [`StateDb::named_blobs`], read through `sql` (a transaction's, say).
pub(super) fn named_blobs_in(sql: &dyn Sql) -> Result<BTreeSet<String>, StateError> {
    let mut named = BTreeSet::new();
    let mut add_layers = |query: &str, what: &'static str| -> Result<(), StateError> {
        for row in sql.query(query, &[]).map_err(db(what))? {
            let text: String = row.get(0).map_err(db(what))?;
            let layers: Vec<String> =
                serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
                    id: what.to_owned(),
                    what: e.to_string(),
                })?;
            named.extend(layers);
        }
        Ok(())
    };
    add_layers("SELECT layers FROM snapshots", "listing snapshot layers")?;
    add_layers("SELECT layers FROM images", "listing image layers")?;
    let what = "listing image indexes";
    for row in sql
        .query("SELECT index_blob FROM images", &[])
        .map_err(db(what))?
    {
        named.insert(row.get(0).map_err(db(what))?);
    }
    Ok(named)
}

/// A snapshot row as stored, before its JSON columns are parsed.
#[derive(Clone)]
struct RawSnapshot {
    id: String,
    sandbox_id: String,
    sandbox_name: String,
    parent: Option<String>,
    spec: String,
    base_image: String,
    layers: String,
    config: String,
    message: Option<String>,
    layer_bytes: i64,
    new_bytes: i64,
    created_at: i64,
}

impl RawSnapshot {
    fn read(row: &Row) -> Result<Self, SqlError> {
        Ok(Self {
            id: row.get(0)?,
            sandbox_id: row.get(1)?,
            sandbox_name: row.get(2)?,
            parent: row.get(3)?,
            spec: row.get(4)?,
            base_image: row.get(5)?,
            layers: row.get(6)?,
            config: row.get(7)?,
            message: row.get(8)?,
            layer_bytes: row.get(9)?,
            new_bytes: row.get(10)?,
            created_at: row.get(11)?,
        })
    }

    fn parse(self) -> Result<Snapshot, StateError> {
        let corrupt = |what: String| StateError::Corrupt {
            id: self.id.clone(),
            what,
        };
        let spec = serde_json::from_str(&self.spec).map_err(|e| corrupt(format!("spec: {e}")))?;
        let layers =
            serde_json::from_str(&self.layers).map_err(|e| corrupt(format!("layers: {e}")))?;
        Ok(Snapshot {
            spec,
            layers,
            id: self.id,
            sandbox_id: self.sandbox_id,
            sandbox_name: self.sandbox_name,
            parent: self.parent,
            base_image: self.base_image,
            config: self.config,
            message: self.message,
            layer_bytes: u64::try_from(self.layer_bytes).unwrap_or(0),
            new_bytes: u64::try_from(self.new_bytes).unwrap_or(0),
            created_at_ms: self.created_at,
        })
    }
}

fn json_text(id: &str, value: &impl Serialize) -> Result<String, StateError> {
    serde_json::to_string(value).map_err(|e| StateError::Corrupt {
        id: id.to_owned(),
        what: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::BackendKind;
    use crate::state::test_support::temp_dbs;
    use crate::state::{Baseline, NewSandbox};

    #[test]
    fn a_config_shows_as_the_object_it_holds() {
        #[derive(Serialize)]
        struct Shown {
            #[serde(serialize_with = "config_as_json")]
            config: String,
        }
        let shown = |config: &str| {
            serde_json::to_value(Shown {
                config: config.to_owned(),
            })
            .unwrap()
        };
        assert_eq!(
            shown(r#"{"Env":["A=1"]}"#)["config"]["Env"][0],
            serde_json::json!("A=1")
        );
        assert_eq!(shown("not json")["config"], serde_json::json!("not json"));
    }

    fn snapshot(id: &str, layers: &[&str], at: i64) -> Snapshot {
        Snapshot {
            id: id.into(),
            sandbox_id: "sbx-00000000000a".into(),
            sandbox_name: "a".into(),
            parent: None,
            spec: SandboxSpec::new(BackendKind::Docker),
            base_image: "sha256:base".into(),
            layers: layers.iter().map(|l| (*l).to_owned()).collect(),
            config: "{}".into(),
            message: Some("first".into()),
            layer_bytes: 10,
            new_bytes: 10,
            created_at_ms: at,
        }
    }

    #[test]
    fn snapshots_are_found_listed_named_and_removed() {
        for (_scratch, mut db) in temp_dbs() {
            db.insert_image(&StoredImage {
                image_id: "sha256:base".into(),
                config: serde_json::json!({ "os": "linux" }),
                layers: vec!["b1".into()],
                index_blob: "i1".into(),
                bytes: 5,
                stored_at_ms: 1,
                identity: Some("base-1".into()),
            })
            .unwrap();
            let first = snapshot("snap-000000000001", &["b1", "l1"], 10);
            let second = snapshot("snap-000000000002", &["b1", "l1", "l2"], 20);
            db.insert_snapshot(&first, None, &serde_json::json!({}))
                .unwrap();
            db.insert_snapshot(&second, None, &serde_json::json!({}))
                .unwrap();

            assert_eq!(db.snapshot("snap-000000000001").unwrap(), first);
            assert!(matches!(
                db.snapshot("snap-0"),
                Err(StateError::AmbiguousSnapshot(_))
            ));
            assert!(matches!(
                db.snapshot("snap-9"),
                Err(StateError::UnknownSnapshot(_))
            ));
            assert_eq!(
                db.latest_snapshot("sbx-00000000000a").unwrap(),
                Some(second.clone())
            );
            assert_eq!(db.snapshots(None).unwrap().len(), 2);
            let named = db.named_blobs().unwrap();
            assert_eq!(
                named.into_iter().collect::<Vec<_>>(),
                ["b1", "i1", "l1", "l2"]
            );

            let sandbox = db
                .insert_sandbox(&NewSandbox {
                    id: "sbx-00000000000b".into(),
                    name: "b".into(),
                    spec: SandboxSpec::new(BackendKind::Docker),
                    origin_snapshot: Some(first.id.clone()),
                    host: "test-host".into(),
                })
                .unwrap();
            assert_eq!(db.sandboxes_made_from(&first.id).unwrap(), ["b"]);
            assert_eq!(sandbox.origin_snapshot.as_deref(), Some(first.id.as_str()));

            // The base image stays while a snapshot stands on it.
            db.delete_snapshot(&first).unwrap();
            assert!(db.forget_unused_images().unwrap().is_empty());
            db.delete_snapshot(&second).unwrap();
            assert_eq!(db.forget_unused_images().unwrap(), ["sha256:base"]);
            assert!(db.named_blobs().unwrap().is_empty());
            let kinds: Vec<String> = db
                .events_of("a")
                .unwrap()
                .into_iter()
                .map(|e| e.kind)
                .collect();
            assert_eq!(
                kinds,
                [
                    "snapshot",
                    "snapshot",
                    "snapshot_removed",
                    "snapshot_removed"
                ]
            );
        }
    }

    #[test]
    fn an_image_a_live_sandbox_started_from_is_kept() {
        for (_scratch, mut db) in temp_dbs() {
            let image = |id: &str, index: &str| StoredImage {
                image_id: id.into(),
                config: serde_json::json!({}),
                layers: Vec::new(),
                index_blob: index.into(),
                bytes: 5,
                stored_at_ms: 1,
                identity: None,
            };
            db.insert_image(&image("e2b-template:t@base", "i1"))
                .unwrap();
            db.insert_image(&image("e2b-template:old@base", "i2"))
                .unwrap();
            let sandbox = db
                .insert_sandbox(&NewSandbox {
                    id: "sbx-00000000000c".into(),
                    name: "c".into(),
                    spec: SandboxSpec::new(BackendKind::E2b),
                    origin_snapshot: None,
                    host: "test-host".into(),
                })
                .unwrap();
            let baseline = Baseline {
                image: "e2b-template:t@base".into(),
                changed_since_ns: 1,
            };
            db.set_baseline(&sandbox, &baseline).unwrap();
            // A sandbox with no baseline names nothing, and stops nothing going.
            db.insert_sandbox(&NewSandbox {
                id: "sbx-00000000000d".into(),
                name: "d".into(),
                spec: SandboxSpec::new(BackendKind::Docker),
                origin_snapshot: None,
                host: "test-host".into(),
            })
            .unwrap();

            assert_eq!(
                db.forget_unused_images().unwrap(),
                ["e2b-template:old@base"]
            );
            assert_eq!(
                db.named_blobs().unwrap().into_iter().collect::<Vec<_>>(),
                ["i1"]
            );
        }
    }
}
