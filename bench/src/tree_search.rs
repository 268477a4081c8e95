//! `tree-search`: the loop silo is for, end to end. A search of branching
//! factor 4 and depth 5 (1,364 nodes; 2 and 3, 14 nodes, with `--quick`)
//! over a repository of 3,000 files made at the start with the same script
//! both ways. Each node is a step (three files edited, one added, one
//! deleted, then a short command reading a directory of the repository),
//! then a checkpoint; the first child of a node goes on from it, each later
//! sibling starts by going back to their parent. Depth-first, so a parent's
//! checkpoint is always behind the sandbox's latest.
//!
//! silo: each depth-1 branch is a fork of the root's snapshot (a sandbox of
//! its own, the previous branch's removed as it is made); inside a branch a
//! checkpoint is a snapshot and going back is a rewind in place. The plain
//! alternative does the same search with `docker commit -p` as the
//! checkpoint and, to go back, the current container removed and a new one
//! made and started from the parent's committed image (from the root's for
//! a depth-1 branch, its "fork"). Both run in turn in one run; the table
//! gives the search's wall time, the speed-up, and p50/p99 of each
//! operation. Removing what the search made afterwards is not timed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use silo::client::ExecConnection;
use silo::{ForkTarget, ImageSource, Silo, SnapshotProgressFn, no_progress};
use silo_tests::docker::{BASE_IMAGE, remove_image};

use crate::docker_common::{DockerBench, engine_exec, remove};
use crate::report::Row;
use crate::snapshot::{commit_image, create_plain_from};
use crate::stats::Samples;

/// How many times faster than the commit-per-branch search, end to end.
const TARGET_SPEEDUP: f64 = 5.0;
/// The repository: this many directories of [`FILES_PER_DIR`] files.
const DIRS: usize = 30;
const FILES_PER_DIR: usize = 100;
/// The root sandbox (silo) and the prefix of everything the search names.
const ROOT: &str = "bench-tree";

/// A node: the branch taken at each depth from the root.
type Path = Vec<usize>;

/// Every node of the tree in depth-first order (the root, depth 0, left
/// out: it is the starting point).
fn preorder(branching: usize, depth: usize) -> Vec<Path> {
    fn visit(path: &mut Path, branching: usize, depth: usize, out: &mut Vec<Path>) {
        if path.len() == depth {
            return;
        }
        for branch in 0..branching {
            path.push(branch);
            out.push(path.clone());
            visit(path, branching, depth, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    visit(&mut Vec::new(), branching, depth, &mut out);
    out
}

/// The script that makes the repository, deterministic: `DIRS`
/// directories of `FILES_PER_DIR` small text files, with the shell's
/// builtins only (so a few hundred milliseconds in any image).
fn make_repository() -> String {
    format!(
        "set -e; mkdir -p /repo/notes; cd /repo; \
         for d in $(seq 0 {last_dir}); do mkdir m$d; \
         for f in $(seq 0 {last_file}); do \
         printf 'module %s file %s\\nfn f%s() -> u32 {{ %s }}\\n' $d $f $f $d > m$d/f$f.txt; \
         done; done; sleep 0.1",
        last_dir = DIRS - 1,
        last_file = FILES_PER_DIR - 1,
    )
}

/// The step of node number `n` (its place in depth-first order): three
/// files edited, one made, one deleted, then a short command that reads
/// one directory. Each node touches files of its own choosing, so
/// siblings differ and going back has something to put back.
fn step_script(n: usize, path: &Path) -> String {
    let pick = |salt: usize| (n * 7 + salt * 13) % DIRS;
    let file = |salt: usize| (n * 11 + salt * 17) % FILES_PER_DIR;
    format!(
        "set -e; cd /repo; \
         echo 'node {path:?} a' >> m{d0}/f{f0}.txt; \
         echo 'node {path:?} b' >> m{d1}/f{f1}.txt; \
         echo 'node {path:?} c' >> m{d2}/f{f2}.txt; \
         echo 'node {n}' > notes/n{n}.txt; \
         rm -f m{d3}/f{f3}.txt; \
         cat m{d0}/* | md5sum > /dev/null",
        d0 = pick(0),
        f0 = file(0),
        d1 = pick(1),
        f1 = file(1),
        d2 = pick(2),
        f2 = file(2),
        d3 = pick(3),
        f3 = file(3),
    )
}

/// Times of one search, by operation.
#[derive(Default)]
struct Search {
    wall: Duration,
    step: Samples,
    checkpoint: Samples,
    rewind: Samples,
    fork: Samples,
}

/// How a search goes forward and back: silo or the plain alternative.
trait Searcher {
    /// What a checkpoint leaves to go back to.
    type Checkpoint: Clone;
    /// The starting point: the repository made and checkpointed (untimed).
    async fn root(&mut self) -> anyhow::Result<Self::Checkpoint>;
    /// A new branch from `from`, for a depth-1 node number `branch`.
    async fn fork(&mut self, from: &Self::Checkpoint, branch: usize) -> anyhow::Result<()>;
    async fn step(&mut self, script: &str) -> anyhow::Result<()>;
    async fn checkpoint(&mut self, tag: &str) -> anyhow::Result<Self::Checkpoint>;
    async fn rewind(&mut self, to: &Self::Checkpoint) -> anyhow::Result<()>;
    /// Removes what the search made (untimed).
    async fn clean(&mut self);
}

/// Runs the search depth first, timing each operation and the whole.
async fn search<S: Searcher>(
    searcher: &mut S,
    branching: usize,
    depth: usize,
) -> anyhow::Result<Search> {
    let root = searcher.root().await?;
    let mut times = Search::default();
    let mut checkpoints: HashMap<Path, S::Checkpoint> = HashMap::new();
    let start = Instant::now();
    for (n, path) in preorder(branching, depth).iter().enumerate() {
        let (branch, parent) = path.split_last().expect("a node has a branch");
        if parent.is_empty() {
            let t = Instant::now();
            searcher.fork(&root, n).await?;
            times.fork.push(t.elapsed());
        } else if *branch > 0 {
            let t = Instant::now();
            searcher.rewind(&checkpoints[parent]).await?;
            times.rewind.push(t.elapsed());
        }
        let t = Instant::now();
        searcher.step(&step_script(n, path)).await?;
        times.step.push(t.elapsed());
        let t = Instant::now();
        let tag = path
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("-");
        let checkpoint = searcher.checkpoint(&tag).await?;
        times.checkpoint.push(t.elapsed());
        checkpoints.insert(path.clone(), checkpoint);
    }
    times.wall = start.elapsed();
    Ok(times)
}

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (branching, depth) = if quick { (2, 3) } else { (4, 5) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let mut on_silo = OnSilo {
        silo: bench.silo.clone(),
        progress: no_progress(),
        current: ROOT.to_owned(),
        conn: None,
        made_new_machine: Vec::new(),
    };
    let silo_search = search(&mut on_silo, branching, depth).await;
    on_silo.clean().await;
    let silo_search = silo_search?;
    if let Some(why) = on_silo.made_new_machine.first() {
        eprintln!(
            "tree-search: {} rewinds made a new machine, the first because: {why}",
            on_silo.made_new_machine.len()
        );
    }

    let mut on_docker = OnDocker {
        engine: bench.engine.clone(),
        prefix: format!("silo-bench-tree-{}", std::process::id()),
        container: None,
        containers: 0,
        images: Vec::new(),
    };
    let docker_search = search(&mut on_docker, branching, depth).await;
    on_docker.clean().await;
    let docker_search = docker_search?;

    let mut rows = rows(branching, depth, &silo_search, &docker_search);
    rows.push(Row {
        scenario: "tree-search",
        metric: format!("b{branching} d{depth}, rewinds onto a new machine"),
        unit: "rewinds",
        silo: on_silo.made_new_machine.len() as f64,
        baseline: None,
        baseline_name: "-",
        target: "0 (all in place)".into(),
        met: on_silo.made_new_machine.is_empty(),
    });
    Ok(rows)
}

fn rows(branching: usize, depth: usize, silo: &Search, docker: &Search) -> Vec<Row> {
    let nodes = preorder(branching, depth).len();
    let tree = format!("b{branching} d{depth}");
    let (silo_s, docker_s) = (silo.wall.as_secs_f64(), docker.wall.as_secs_f64());
    let speedup = docker_s / silo_s;
    let mut rows = vec![
        Row::untargeted(
            "tree-search",
            format!(
                "{tree}, {nodes} nodes, {} files: wall",
                DIRS * FILES_PER_DIR
            ),
            "s",
            silo_s,
            Some((docker_s, "commit + run per branch")),
        ),
        Row {
            scenario: "tree-search",
            metric: format!("{tree}, speed-up end to end"),
            unit: "x",
            silo: speedup,
            baseline: None,
            baseline_name: "-",
            target: format!(">= {TARGET_SPEEDUP}x faster"),
            met: speedup >= TARGET_SPEEDUP,
        },
    ];
    let ops: [(&str, &Samples, &Samples, &'static str); 4] = [
        (
            "checkpoint",
            &silo.checkpoint,
            &docker.checkpoint,
            "commit -p",
        ),
        (
            "rewind",
            &silo.rewind,
            &docker.rewind,
            "rm + run parent image",
        ),
        (
            "fork (depth 1)",
            &silo.fork,
            &docker.fork,
            "rm + run root image",
        ),
        ("step", &silo.step, &docker.step, "docker exec"),
    ];
    for (op, ours, theirs, baseline_name) in ops {
        for p in [50.0, 99.0] {
            rows.push(Row::untargeted(
                "tree-search",
                format!("{tree}, {op} p{p} of {}", ours.len()),
                "ms",
                ours.percentile(p),
                Some((theirs.percentile(p), baseline_name)),
            ));
        }
    }
    rows
}

/// The search on silo: snapshots, rewinds in place, a fork per depth-1
/// branch.
struct OnSilo {
    silo: Silo,
    progress: SnapshotProgressFn,
    /// The sandbox the search is in.
    current: String,
    /// An open connection to it, made again after a fork or rewind.
    conn: Option<ExecConnection>,
    /// Why any rewind made a new machine (the search wants none; the
    /// report counts them).
    made_new_machine: Vec<String>,
}

impl OnSilo {
    async fn reconnect(&mut self) -> anyhow::Result<()> {
        let sandbox = self.silo.get(&self.current)?;
        self.conn = Some(self.silo.connect(&sandbox).await?);
        Ok(())
    }
}

impl Searcher for OnSilo {
    type Checkpoint = String;

    async fn root(&mut self) -> anyhow::Result<String> {
        self.silo.create(DockerBench::request(ROOT)).await?;
        self.reconnect().await?;
        self.step(&make_repository()).await?;
        let snapshots = self
            .silo
            .snapshots_of(ROOT)?
            .with_progress(Arc::clone(&self.progress));
        Ok(snapshots.take(None).await?.snapshot.id)
    }

    async fn fork(&mut self, from: &String, branch: usize) -> anyhow::Result<()> {
        self.conn = None;
        self.silo.remove(&self.current).await?;
        self.current = format!("{ROOT}-{branch}");
        self.silo
            .fork(from, &self.current, &ForkTarget::default(), &self.progress)
            .await?;
        self.reconnect().await
    }

    async fn step(&mut self, script: &str) -> anyhow::Result<()> {
        let conn = self.conn.as_ref().expect("connected");
        let out = conn.run(silo_tests::sh(script)).await?;
        anyhow::ensure!(
            out.exit.code == Some(0),
            "{script:?} failed: {:?}",
            out.exit
        );
        Ok(())
    }

    async fn checkpoint(&mut self, _tag: &str) -> anyhow::Result<String> {
        let snapshots = self
            .silo
            .snapshots_of(&self.current)?
            .with_progress(Arc::clone(&self.progress));
        Ok(snapshots.take(None).await?.snapshot.id)
    }

    async fn rewind(&mut self, to: &String) -> anyhow::Result<()> {
        let snapshots = self
            .silo
            .snapshots_of(&self.current)?
            .with_progress(Arc::clone(&self.progress));
        let report = snapshots.rewind(to).await?;
        if !matches!(report.image, ImageSource::InPlace(_)) {
            self.made_new_machine
                .push(report.new_machine_because.unwrap_or_default());
        }
        self.reconnect().await
    }

    async fn clean(&mut self) {
        self.conn = None;
        if let Ok(sandboxes) = self.silo.list() {
            for sandbox in sandboxes {
                let _ = self.silo.remove(&sandbox.id).await;
            }
        }
        if let Ok(snapshots) = self.silo.snapshots(None) {
            for listed in snapshots {
                let _ = self.silo.remove_snapshot(&listed.id).await;
            }
        }
        let _ = self.silo.gc_store(false).await;
    }
}

/// The search with the Engine API as the docker CLI drives it: `docker
/// exec` for a step, `docker commit -p` for a checkpoint, and a new
/// container (`docker rm -f` of the current one, `docker run -d` of the
/// checkpoint's image) to go back.
struct OnDocker {
    engine: Docker,
    /// What this run's containers and images are named after.
    prefix: String,
    /// The container the search is in.
    container: Option<String>,
    /// How many containers were made, for their names.
    containers: usize,
    /// Every committed image, oldest first.
    images: Vec<String>,
}

impl OnDocker {
    /// Removes the current container and runs a new one of `image`.
    async fn run_from(&mut self, image: &str) -> anyhow::Result<()> {
        if let Some(old) = self.container.take() {
            remove(&self.engine, &old).await?;
        }
        let name = format!("{}-{}", self.prefix, self.containers);
        self.containers += 1;
        create_plain_from(&self.engine, &name, image, &["sleep", "100000"]).await?;
        self.engine.start_container(&name, None).await?;
        self.container = Some(name);
        Ok(())
    }
}

impl Searcher for OnDocker {
    type Checkpoint = String;

    async fn root(&mut self) -> anyhow::Result<String> {
        self.run_from(BASE_IMAGE).await?;
        self.step(&make_repository()).await?;
        self.checkpoint("root").await
    }

    async fn fork(&mut self, from: &String, _branch: usize) -> anyhow::Result<()> {
        self.run_from(from).await
    }

    async fn step(&mut self, script: &str) -> anyhow::Result<()> {
        let container = self.container.as_deref().expect("a container runs");
        engine_exec(&self.engine, container, &["sh", "-c", script]).await
    }

    async fn checkpoint(&mut self, tag: &str) -> anyhow::Result<String> {
        let container = self.container.as_deref().expect("a container runs");
        let image = format!("{}:{tag}", self.prefix);
        commit_image(&self.engine, container, &image).await?;
        self.images.push(image.clone());
        Ok(image)
    }

    async fn rewind(&mut self, to: &String) -> anyhow::Result<()> {
        self.run_from(to).await
    }

    async fn clean(&mut self) {
        if let Some(container) = self.container.take() {
            let _ = remove(&self.engine, &container).await;
        }
        // Newest first: an image's children go before it.
        for image in self.images.drain(..).rev() {
            remove_image(&self.engine, &image).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preorder_visits_every_node_once_parents_first() {
        let nodes = preorder(4, 5);
        assert_eq!(nodes.len(), 4 + 16 + 64 + 256 + 1024);
        assert_eq!(nodes[0], vec![0]);
        assert_eq!(nodes[1], vec![0, 0]);
        for (i, node) in nodes.iter().enumerate() {
            let parent = &node[..node.len() - 1];
            assert!(
                parent.is_empty() || nodes[..i].iter().any(|n| n == parent),
                "{node:?} before its parent"
            );
        }
        assert_eq!(preorder(2, 3).len(), 14);
    }
}
