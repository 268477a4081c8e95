//! Containers of this home that no sandbox owns any more: left behind when a
//! `silo` process died between making a container and recording it, or when
//! a state database was deleted. `silo gc` removes them. Containers of other
//! homes are never listed, whatever their names.

use std::collections::{HashMap, HashSet};

use bollard::query_parameters::ListContainersOptionsBuilder;

use super::error::{DockerError, api};
use super::{DockerBackend, remove_container};
use crate::backend::labels::{LABEL_HOME, LABEL_SANDBOX_ID};

impl DockerBackend {
    /// Removes this home's containers whose sandbox id is not in `live`
    /// (only lists them when `dry_run`); returns their names.
    pub(super) async fn sweep(
        &self,
        live: &HashSet<String>,
        dry_run: bool,
    ) -> Result<Vec<String>, DockerError> {
        let engine = self.engine().await?;
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_HOME}={}", self.home_id()?)],
        )]);
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
        let containers = engine
            .list_containers(Some(options))
            .await
            .map_err(api("list this home's containers"))?;
        let mut removed = Vec::new();
        for container in containers {
            let owner = container
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SANDBOX_ID))
                .cloned()
                .unwrap_or_default();
            if live.contains(&owner) {
                continue;
            }
            let Some(id) = container.id else { continue };
            let name = container
                .names
                .and_then(|n| n.into_iter().next())
                .map(|n| n.trim_start_matches('/').to_owned())
                .unwrap_or_else(|| id.clone());
            if !dry_run {
                remove_container(engine, &id).await?;
            }
            removed.push(name);
        }
        Ok(removed)
    }
}
