//! The templates a sandbox can be made from: the ones the mock was started
//! with (public, tag `default` only) and the snapshot templates
//! `POST /sandboxes/{id}/snapshots` makes, each a template of the team
//! with its builds by tag, backed by an image committed from the
//! sandbox's container.
//!
//! Names are read as the API's `id.ParseName` reads them: `alias`,
//! `namespace/alias` or either with `:tag`, trimmed and lowercased, each
//! part checked against its pattern; `:default` is no tag. A bare name is
//! a configured template, a snapshot template's id, or a snapshot's alias
//! in the team's namespace ([`TEAM_SLUG`]); a namespaced one must be the
//! team's.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use http::StatusCode;

use super::store::Refusal;

/// The one team's slug: the namespace of its snapshot names.
pub const TEAM_SLUG: &str = "silo-mock";
/// The tag a name without one means.
pub const DEFAULT_TAG: &str = "default";
/// Length of a template id (`[a-z0-9]`).
pub const TEMPLATE_ID_LEN: usize = 20;

/// A name as `id.ParseName` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    /// `namespace/alias` or `alias`, lowercased.
    pub identifier: String,
    /// The tag; `None` for none or `default`.
    pub tag: Option<String>,
}

impl Name {
    /// The tag, `default` when none was given.
    pub fn tag_or_default(&self) -> &str {
        self.tag.as_deref().unwrap_or(DEFAULT_TAG)
    }
}

/// `id.ParseName`; the error is the API's text (`invalid template ID: X`).
pub fn parse_name(input: &str) -> Result<Name, String> {
    let input = input.trim();
    let (identifier, tag) = match input.split_once(':') {
        Some((identifier, tag)) => (identifier, Some(tag)),
        None => (input, None),
    };
    let tag = match tag {
        Some(tag) => {
            let tag = clean(tag, "tag", |b| is_identifier_byte(b) || b == b'.')?;
            (!tag.eq_ignore_ascii_case(DEFAULT_TAG)).then_some(tag)
        }
        None => None,
    };
    let (namespace, alias) = match identifier.split_once('/') {
        Some((namespace, alias)) => (Some(namespace), alias),
        None => (None, identifier),
    };
    let namespace = match namespace {
        Some(namespace) => Some(clean(namespace, "namespace", is_identifier_byte)?),
        None => None,
    };
    let alias = clean(alias, "template ID", is_identifier_byte)?;
    let identifier = match namespace {
        Some(namespace) => format!("{namespace}/{alias}"),
        None => alias,
    };
    Ok(Name { identifier, tag })
}

/// `id.ValidateNamespaceMatchesTeam`.
pub fn check_namespace(identifier: &str) -> Result<(), String> {
    match identifier.split_once('/') {
        Some((namespace, _)) if namespace != TEAM_SLUG => Err(format!(
            "namespace '{namespace}' must match your team '{TEAM_SLUG}'"
        )),
        _ => Ok(()),
    }
}

fn is_identifier_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
}

fn clean(value: &str, what: &str, allowed: impl Fn(u8) -> bool) -> Result<String, String> {
    let cleaned = value.trim().to_ascii_lowercase();
    if cleaned.is_empty() || !cleaned.bytes().all(allowed) {
        return Err(format!("invalid {what}: {value}"));
    }
    Ok(cleaned)
}

/// What a name resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The template id sandboxes report.
    pub template_id: String,
    /// The template's first alias, if it has one.
    pub alias: Option<String>,
    /// The image of the build the tag names.
    pub image: String,
}

/// One build of a snapshot template.
#[derive(Debug, Clone)]
struct Build {
    image: String,
    sandbox_id: String,
    created_at: SystemTime,
}

/// A snapshot template.
#[derive(Debug, Clone)]
struct Snapshot {
    template_id: String,
    /// The alias in the team's namespace, when the snapshot was named.
    alias: Option<String>,
    builds: BTreeMap<String, Build>,
}

/// One snapshot build as `GET /snapshots` lists it.
#[derive(Debug, Clone)]
pub struct Listed {
    /// `{id or namespace/alias}:{tag}`.
    pub snapshot_id: String,
    /// `namespace/alias` when named.
    pub names: Vec<String>,
    /// The sandbox it was taken from.
    pub sandbox_id: String,
    /// When.
    pub created_at: SystemTime,
    /// The template's id (the list's tie-breaker).
    pub template_id: String,
}

/// Every template of one mock instance.
pub struct Templates {
    configured: BTreeMap<String, String>,
    snapshots: Mutex<Vec<Snapshot>>,
}

impl Templates {
    /// The configured templates (id → image) and no snapshots yet.
    pub fn new(configured: BTreeMap<String, String>) -> Self {
        Self {
            configured,
            snapshots: Mutex::new(Vec::new()),
        }
    }

    fn snapshots(&self) -> std::sync::MutexGuard<'_, Vec<Snapshot>> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `template_id` names a template (the list's filter).
    pub fn exists(&self, template_id: &str) -> bool {
        self.configured.contains_key(template_id)
            || self
                .snapshots()
                .iter()
                .any(|s| s.template_id == template_id)
    }

    /// The template and build `reference` (a create's `templateID`) names;
    /// `404` as the API answers an unknown template or tag.
    pub fn resolve(&self, reference: &str) -> Result<Resolved, Refusal> {
        let name = parse_name(reference).map_err(|e| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("Invalid template reference: {e}"),
            )
        })?;
        let missing_tag = |tag: &str| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                format!(
                    "tag '{tag}' does not exist for template '{}'",
                    name.identifier
                ),
            )
        };
        if let Some(image) = self.configured.get(&name.identifier) {
            if let Some(tag) = &name.tag {
                return Err(missing_tag(tag));
            }
            return Ok(Resolved {
                template_id: name.identifier.clone(),
                alias: Some(name.identifier.clone()),
                image: image.clone(),
            });
        }
        let snapshots = self.snapshots();
        let snapshot = find(&snapshots, &name.identifier).ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                format!("template '{}' not found", name.identifier),
            )
        })?;
        let build = snapshot
            .builds
            .get(name.tag_or_default())
            .ok_or_else(|| missing_tag(name.tag_or_default()))?;
        Ok(Resolved {
            template_id: snapshot.template_id.clone(),
            alias: snapshot.alias.clone(),
            image: build.image.clone(),
        })
    }

    /// The template id a snapshot named `name` goes to: the team's template
    /// with that alias, if there is one.
    pub fn snapshot_template(&self, name: &Name) -> Option<String> {
        let alias = name.identifier.rsplit('/').next().unwrap_or_default();
        self.snapshots()
            .iter()
            .find(|s| s.alias.as_deref() == Some(alias))
            .map(|s| s.template_id.clone())
    }

    /// Records a snapshot build; returns the images it replaced (a build
    /// of the same template and tag), which nothing uses any more.
    pub fn add_snapshot(
        &self,
        template_id: &str,
        alias: Option<&str>,
        tag: &str,
        image: &str,
        sandbox_id: &str,
    ) -> Option<String> {
        let build = Build {
            image: image.to_owned(),
            sandbox_id: sandbox_id.to_owned(),
            created_at: SystemTime::now(),
        };
        let mut snapshots = self.snapshots();
        match snapshots.iter_mut().find(|s| s.template_id == template_id) {
            Some(snapshot) => snapshot
                .builds
                .insert(tag.to_owned(), build)
                .map(|old| old.image),
            None => {
                snapshots.push(Snapshot {
                    template_id: template_id.to_owned(),
                    alias: alias.map(str::to_owned),
                    builds: BTreeMap::from([(tag.to_owned(), build)]),
                });
                None
            }
        }
    }

    /// Every snapshot build, newest first (then by template id, descending).
    pub fn list(&self) -> Vec<Listed> {
        let mut listed: Vec<Listed> = self
            .snapshots()
            .iter()
            .flat_map(|s| {
                s.builds.iter().map(|(tag, build)| {
                    let name = s.alias.as_ref().map(|a| format!("{TEAM_SLUG}/{a}"));
                    Listed {
                        snapshot_id: format!("{}:{tag}", name.as_deref().unwrap_or(&s.template_id)),
                        names: name.into_iter().collect(),
                        sandbox_id: build.sandbox_id.clone(),
                        created_at: build.created_at,
                        template_id: s.template_id.clone(),
                    }
                })
            })
            .collect();
        listed.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| b.template_id.cmp(&a.template_id))
        });
        listed
    }

    /// The snapshot template `identifier` names, with its builds' images.
    pub fn find_snapshot(&self, identifier: &str) -> Option<(String, Vec<String>)> {
        let snapshots = self.snapshots();
        find(&snapshots, identifier).map(|s| {
            (
                s.template_id.clone(),
                s.builds.values().map(|b| b.image.clone()).collect(),
            )
        })
    }

    /// Whether `identifier` is one of the configured templates.
    pub fn is_configured(&self, identifier: &str) -> bool {
        self.configured.contains_key(identifier)
    }

    /// Forgets a snapshot template.
    pub fn remove_snapshot(&self, template_id: &str) {
        self.snapshots().retain(|s| s.template_id != template_id);
    }
}

/// The snapshot template a bare id or alias, or `namespace/alias`, names.
fn find<'a>(snapshots: &'a [Snapshot], identifier: &str) -> Option<&'a Snapshot> {
    let (namespace, alias) = match identifier.split_once('/') {
        Some((namespace, alias)) => (Some(namespace), alias),
        None => (None, identifier),
    };
    if namespace.is_some_and(|n| n != TEAM_SLUG) {
        return None;
    }
    snapshots.iter().find(|s| {
        s.alias.as_deref() == Some(alias) || (namespace.is_none() && s.template_id == alias)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_the_api_parses_them() {
        let name = parse_name(" Team/My_Snap:V1 ").unwrap();
        assert_eq!(name.identifier, "team/my_snap");
        assert_eq!(name.tag.as_deref(), Some("v1"));
        assert_eq!(parse_name("snap:default").unwrap().tag, None);
        assert_eq!(
            parse_name("bad name").unwrap_err(),
            "invalid template ID: bad name"
        );
        assert_eq!(parse_name("a:b c").unwrap_err(), "invalid tag: b c");
        assert_eq!(parse_name("").unwrap_err(), "invalid template ID: ");
        assert!(check_namespace("other/snap").is_err());
        assert!(check_namespace(&format!("{TEAM_SLUG}/snap")).is_ok());
    }

    #[test]
    fn snapshots_resolve_by_id_alias_and_name_with_their_tags() {
        let templates = Templates::new(BTreeMap::from([("base".into(), "img".into())]));
        assert_eq!(templates.resolve("base").unwrap().image, "img");
        assert_eq!(templates.resolve("base:v2").unwrap_err().status, 404);
        assert_eq!(
            templates.add_snapshot("t1", Some("snap"), "default", "i1", "s"),
            None
        );
        assert_eq!(
            templates.add_snapshot("t1", Some("snap"), "default", "i2", "s"),
            Some("i1".to_owned())
        );
        let by_name = templates.resolve(&format!("{TEAM_SLUG}/snap")).unwrap();
        assert_eq!(
            (by_name.template_id.as_str(), by_name.image.as_str()),
            ("t1", "i2")
        );
        assert_eq!(templates.resolve("t1:default").unwrap().image, "i2");
        assert_eq!(templates.resolve("snap:v1").unwrap_err().status, 404);
        assert_eq!(templates.resolve("other/snap").unwrap_err().status, 404);
        let listed = templates.list();
        assert_eq!(listed[0].snapshot_id, format!("{TEAM_SLUG}/snap:default"));
        assert!(templates.exists("t1"));
        templates.remove_snapshot("t1");
        assert!(!templates.exists("t1"));
    }
}
