//! What `silo pool` prints.

use silo::{FillReport, PoolStatus};

use super::{Output, print_json, print_lines, render, row};

impl Output {
    /// Pools as a table.
    pub fn pools(&self, pools: &[PoolStatus]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&pools);
        }
        if pools.is_empty() {
            return print_lines(
                "no pools (`silo pool create NAME --size N --image IMG` makes one)",
            );
        }
        let mut table = vec![row([
            "NAME", "READY", "SIZE", "BACKEND", "IMAGE", "SNAPSHOT",
        ])];
        for status in pools {
            let spec = &status.pool.spec;
            table.push(vec![
                status.pool.name.clone(),
                status.ready.to_string(),
                status.pool.size.to_string(),
                spec.backend.to_string(),
                spec.image.clone().unwrap_or_else(|| "-".into()),
                status.pool.snapshot.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        print_lines(&render(&table))
    }

    /// What a fill did.
    pub fn filled(&self, pool: &str, report: &FillReport) -> anyhow::Result<()> {
        if self.json {
            return print_json(report);
        }
        let mut lines = vec![format!("pool {pool}: made {} sandboxes", report.made)];
        lines.extend(report.failed.iter().map(|why| format!("  failed: {why}")));
        print_lines(&lines.join("\n"))
    }

    /// A pool removed.
    pub fn pool_removed(&self, pool: &str, members: usize) -> anyhow::Result<()> {
        if self.json {
            return print_json(&serde_json::json!({ "pool": pool, "removed": members }));
        }
        print_lines(&format!(
            "removed pool {pool} and its {members} waiting sandboxes"
        ))
    }
}
