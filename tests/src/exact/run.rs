//! A plan played on a fresh sandbox through the real `silo` CLI, the
//! promise checked after each action: a snapshot changes nothing, a
//! rewind gives back exactly the tree its snapshot saw and does so in
//! place, and a fork's tree is exactly its snapshot's. Every tree is read
//! from the host ([`super::listing`]), never through silo.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use bollard::Docker;
use silo::internals::docker::container_name;

use super::behind::{remove_xattr, set_xattr};
use super::listing::{self, Compare, Listing};
use super::ops::{Behind, Op};
use super::plan::{self, Action};
use crate::Cli;
use crate::docker::{BASE_IMAGE, container};

/// The template (E2B) or image (Daytona) name a mock maps to
/// [`BASE_IMAGE`]; the test that starts the mock configures it.
pub const MOCK_BASE: &str = "base";

/// The engine a run's sandboxes are made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// silo's Docker backend.
    Docker,
    /// silo's Podman backend.
    Podman,
    /// silo's E2B backend, against the E2B mock (its VMs are containers on
    /// the Docker engine, each running the agent beside the mock's own).
    E2b,
    /// silo's Daytona backend, against the Daytona mock.
    Daytona,
    /// silo's Kubernetes backend, against the mock API server (its pods
    /// are containers on the Docker engine, the agent their PID 1, copied
    /// in by an init container from the image the test names).
    Kubernetes,
}

impl Backend {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Podman => "podman",
            Self::E2b => "e2b",
            Self::Daytona => "daytona",
            Self::Kubernetes => "kubernetes",
        }
    }

    /// What `silo up NAME` needs to make a sandbox of the base image on it.
    pub fn up_args(self) -> &'static [&'static str] {
        match self {
            Self::Docker => &["--image", BASE_IMAGE],
            Self::Podman => &["--image", BASE_IMAGE, "--backend", "podman"],
            Self::E2b => &["--backend", "e2b", "--template", MOCK_BASE],
            Self::Daytona => &["--backend", "daytona", "--image", MOCK_BASE],
            Self::Kubernetes => &["--backend", "kubernetes", "--image", BASE_IMAGE],
        }
    }

    /// Prefixes of the paths its machines make for themselves, under names
    /// of their own (see [`Compare::machine_own`]).
    pub fn machine_own(self) -> &'static [&'static [u8]] {
        match self {
            Self::Daytona => &[b"/tmp/tmp."],
            _ => &[],
        }
    }

    /// Whether a sandbox's machine is a mock's VM or pod: the template
    /// files are not in silo's store, so changing one makes a rewind to
    /// before it take a new VM (docs/snapshots.md), and the run leaves
    /// them alone.
    pub fn is_remote(self) -> bool {
        matches!(self, Self::E2b | Self::Daytona | Self::Kubernetes)
    }

    /// Whether a stop deletes its machines, so a stop and start brings the
    /// tree back from the snapshot the stop took (a promise its plans test
    /// too).
    pub fn stop_deletes_machines(self) -> bool {
        self == Self::Kubernetes
    }
}

/// Where plans are played: the CLI's home and the engine the backend's
/// containers are on (to find their init's pid).
pub struct Target<'a> {
    /// The CLI, against its scratch home.
    pub cli: &'a Cli,
    /// The engine holding the backend's containers.
    pub engine: &'a Docker,
    /// The backend sandboxes are made on.
    pub backend: Backend,
}

/// How a played plan broke the promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A tree was not the one its snapshot saw (or a snapshot changed it).
    Mismatch,
    /// A rewind made a new machine instead of rewinding in place.
    NotInPlace,
    /// A silo command failed, or a tree could not be read.
    Silo,
}

impl Class {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mismatch => "a tree differs from its snapshot's",
            Self::NotInPlace => "a rewind made a new machine",
            Self::Silo => "a silo command failed",
        }
    }
}

/// The first action of a plan that broke the promise, and how.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Its index in the plan.
    pub at: usize,
    /// How.
    pub class: Class,
    /// The action, and what differed or what failed.
    pub detail: String,
}

/// What a plan that kept the promise did, and how long each part took.
#[derive(Debug, Default)]
pub struct Stats {
    steps: usize,
    snapshots: usize,
    rewinds: usize,
    forks: usize,
    step_time: Duration,
    snapshot_time: Duration,
    rewind_time: Duration,
    fork_time: Duration,
    listing_time: Duration,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let each = |total: Duration, n: usize| total.as_secs_f64() / n.max(1) as f64;
        write!(
            f,
            "{} steps ({:.2} s each), {} snapshots ({:.2} s), {} rewinds in place ({:.2} s), \
             {} forks ({:.2} s), host listings {:.1} s in all",
            self.steps,
            each(self.step_time, self.steps),
            self.snapshots,
            each(self.snapshot_time, self.snapshots),
            self.rewinds,
            each(self.rewind_time, self.rewinds),
            self.forks,
            each(self.fork_time, self.forks),
            self.listing_time.as_secs_f64(),
        )
    }
}

/// The host's listing of a sandbox's live tree, through its container's
/// init (`/proc/<pid>/root`).
pub async fn listing_of(engine: &Docker, sandbox_id: &str) -> Result<Listing, String> {
    let pid = pid_of(engine, sandbox_id).await?;
    listing::of_pid(pid).map_err(|e| format!("listing sandbox {sandbox_id}: {e}"))
}

/// The host pid of the init of a sandbox's container.
pub async fn pid_of(engine: &Docker, sandbox_id: &str) -> Result<u32, String> {
    init_pid(container(engine, sandbox_id).await, sandbox_id)
}

/// The host pid of the init of the container `found` (named `what` in
/// errors).
fn init_pid(
    found: Option<bollard::models::ContainerInspectResponse>,
    what: &str,
) -> Result<u32, String> {
    found
        .and_then(|c| c.state)
        .and_then(|s| s.pid)
        .and_then(|pid| u32::try_from(pid).ok())
        .filter(|pid| *pid > 0)
        .ok_or_else(|| format!("sandbox {what} has no running container"))
}

/// A snapshot taken during a play: its id and the tree it saw.
struct Taken {
    id: String,
    tree: Listing,
}

/// One play of a plan on one sandbox.
struct Player<'a> {
    target: &'a Target<'a>,
    name: String,
    compare: Compare,
    taken: HashMap<u32, Taken>,
    stats: Stats,
    /// Each sandbox's container, asked of `silo ls` once: only a rewind
    /// (onto a new machine) can change it, and a rewind forgets it.
    containers: HashMap<String, String>,
}

/// What an action did, for the progress line; or how it failed.
type Done = Result<String, (Class, String)>;

impl Target<'_> {
    /// Plays `plan` on a fresh sandbox called `name` (removed afterwards,
    /// with its snapshots), checking the promise after each action; with
    /// `progress`, a line per action goes to stderr.
    pub async fn play(
        &self,
        plan: &[Action],
        name: &str,
        compare: Compare,
        progress: bool,
    ) -> Result<Stats, Failure> {
        let mut args = vec!["up", name, "--json"];
        args.extend(self.backend.up_args());
        self.cli.ok(&args);
        let compare = Compare {
            machine_own: self.backend.machine_own(),
            ..compare
        };
        let mut player = Player {
            target: self,
            name: name.to_owned(),
            compare,
            taken: HashMap::new(),
            stats: Stats::default(),
            containers: HashMap::new(),
        };
        let result = player.play(plan, progress).await;
        player.clean_up();
        result.map(|()| player.stats)
    }

    /// `silo ARGS…`: stdout, or the failure with stderr.
    fn silo(&self, args: &[&str]) -> Result<String, (Class, String)> {
        let out = self.cli.run(args);
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err((
            Class::Silo,
            format!(
                "silo {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ))
    }

    /// The container holding the live tree of sandbox `name`: silo's own
    /// on Docker and Podman, the mock's VM (`silo-mock-KIND-PROVIDER_ID`)
    /// on E2B and Daytona, and the pod's `sandbox` container (found by the
    /// labels the mock gives it) on Kubernetes, as `silo ls` names them.
    async fn container_of(&self, name: &str) -> Result<String, (Class, String)> {
        let rows = self.silo_json(&["ls", "--json"])?;
        let row = rows
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["name"] == name))
            .ok_or_else(|| (Class::Silo, format!("{name} is not listed")))?;
        if self.backend == Backend::Kubernetes {
            let pod = row["backend_ref"]["pod"].as_str().unwrap_or_default();
            let pod = pod.split_once('/').map_or(pod, |(_, name)| name);
            return pod_container(self.engine, pod).await.ok_or_else(|| {
                (
                    Class::Silo,
                    format!("pod {pod} of {name} has no running container"),
                )
            });
        }
        Ok(if self.backend.is_remote() {
            let vm = row["backend_ref"]["sandbox_id"]
                .as_str()
                .unwrap_or_default();
            format!("silo-mock-{}-{vm}", self.backend.name())
        } else {
            container_name(row["id"].as_str().unwrap_or_default())
        })
    }

    /// The host's listing of the live tree in `container` (for sandbox
    /// `name`, in errors).
    async fn listing_in(&self, container: &str, name: &str) -> Result<Listing, (Class, String)> {
        let pid = self.pid_in(container, name).await?;
        listing::of_pid(pid).map_err(|e| (Class::Silo, format!("listing sandbox {name}: {e}")))
    }

    /// The host pid of `container`'s init (for sandbox `name`, in errors).
    async fn pid_in(&self, container: &str, name: &str) -> Result<u32, (Class, String)> {
        let found = self.engine.inspect_container(container, None).await.ok();
        init_pid(found, name).map_err(|e| (Class::Silo, e))
    }

    /// `silo ARGS… --json`, parsed.
    fn silo_json(&self, args: &[&str]) -> Result<serde_json::Value, (Class, String)> {
        let text = self.silo(args)?;
        serde_json::from_str(&text).map_err(|e| (Class::Silo, format!("not JSON ({e}): {text}")))
    }
}

impl Player<'_> {
    async fn play(&mut self, plan: &[Action], progress: bool) -> Result<(), Failure> {
        for (at, action) in plan.iter().enumerate() {
            let started = Instant::now();
            let done = match action {
                Action::Step(ops) => self.step(ops).await,
                Action::Snapshot(label) => self.snapshot(*label).await,
                Action::Rewind(label) => self.rewind(*label).await,
                Action::Fork(label) => self.fork(*label, at).await,
                Action::Restart => self.restart().await,
                Action::Diff(label) => self.diff(*label).await,
            };
            let took = started.elapsed();
            match done {
                Ok(note) if progress => eprintln!(
                    "[exact] {at}/{}: {} ok in {:.2} s{note}",
                    plan.len(),
                    action.describe(),
                    took.as_secs_f64()
                ),
                Ok(_) => {}
                Err((class, detail)) => {
                    return Err(Failure {
                        at,
                        class,
                        detail: format!("action {at}, {}: {detail}", action.describe()),
                    });
                }
            }
        }
        Ok(())
    }

    /// The step's lines in the sandbox, then what it does from the host.
    async fn step(&mut self, ops: &[Op]) -> Done {
        let started = Instant::now();
        let script = plan::script(ops);
        self.target
            .silo(&["exec", &self.name, "--", "sh", "-c", &script])?;
        let behind: Vec<&Behind> = ops.iter().filter_map(|op| op.behind.as_ref()).collect();
        if !behind.is_empty() {
            let name = self.name.clone();
            let container = self.container(&name).await?;
            let pid = self.target.pid_in(&container, &name).await?;
            for change in behind {
                // Refused (too large, a symlink, gone): nothing done, as a
                // step's line that fails.
                let _ = match change {
                    Behind::SetXattr { path, name, value } => set_xattr(pid, path, name, value),
                    Behind::RemoveXattr { path, name } => remove_xattr(pid, path, name),
                };
            }
        }
        self.stats.steps += 1;
        self.stats.step_time += started.elapsed();
        Ok(String::new())
    }

    async fn snapshot(&mut self, label: u32) -> Done {
        let before = self.listing(&self.name.clone()).await?;
        let started = Instant::now();
        let report = self.target.silo_json(&["snapshot", &self.name, "--json"])?;
        self.stats.snapshot_time += started.elapsed();
        self.stats.snapshots += 1;
        let id = report["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let tree = self.listing(&self.name.clone()).await?;
        self.differ(&before, &tree, "the snapshot changed the live tree")?;
        let note = format!(
            " ({} entries in its layer, {} deletions, baseline by {})",
            report["entries"], report["deletions"], report["baseline_sent"]
        );
        self.taken.insert(label, Taken { id, tree });
        Ok(note)
    }

    async fn rewind(&mut self, label: u32) -> Done {
        let snapshot = self.snapshot_id(label)?;
        let started = Instant::now();
        let report = self
            .target
            .silo_json(&["rewind", &self.name, &snapshot, "--json"])?;
        self.stats.rewind_time += started.elapsed();
        self.stats.rewinds += 1;
        // A rewind onto a new machine replaced the container: ask again.
        self.containers.remove(&self.name);
        let live = self.listing(&self.name.clone()).await?;
        let in_place = &report["image"]["in_place"];
        let why = report["new_machine_because"].as_str();
        let fell_back = why.map(|why| format!(" (it made a new machine, since {why})"));
        self.differ(
            &self.taken[&label].tree,
            &live,
            &format!(
                "after the rewind, the live tree is not s{label}'s{}",
                fell_back.as_deref().unwrap_or_default()
            ),
        )?;
        if let Some(why) = why {
            return Err((Class::NotInPlace, format!("a new machine, since {why}")));
        }
        if !in_place.is_object() {
            return Err((Class::NotInPlace, format!("not done in place: {report}")));
        }
        Ok(format!(
            " (in place: {} changed, {} put back ({} patched), {} removed, baseline by {})",
            in_place["changed"],
            in_place["restored"],
            in_place["patched"],
            in_place["removed"],
            in_place["baseline_sent"]
        ))
    }

    /// A stop and a start: on a backend whose stop deletes the machine, a
    /// new one from the snapshot the stop took, whose tree must be the
    /// one before.
    async fn restart(&mut self) -> Done {
        let name = self.name.clone();
        let before = self.listing(&name).await?;
        self.target.silo(&["stop", &name])?;
        self.target.silo(&["start", &name])?;
        self.containers.remove(&name);
        let after = self.listing(&name).await?;
        self.differ(
            &before,
            &after,
            "after a stop and start, the tree is not as before",
        )?;
        Ok(String::new())
    }

    async fn fork(&mut self, label: u32, at: usize) -> Done {
        let snapshot = self.snapshot_id(label)?;
        let fork = format!("{}-fork{at}", self.name);
        let started = Instant::now();
        let report = self
            .target
            .silo_json(&["fork", &snapshot, "--name", &fork, "--json"])?;
        self.stats.fork_time += started.elapsed();
        self.stats.forks += 1;
        let tree = self.listing(&fork).await;
        // Removed whatever its tree, so a failure leaves nothing running.
        let _ = self.target.silo(&["rm", &fork]);
        self.differ(
            &self.taken[&label].tree,
            &tree?,
            &format!("the fork's tree is not s{label}'s"),
        )?;
        Ok(format!(" ({})", report["image"]))
    }

    /// `silo diff` against snapshot `label` must name exactly the paths
    /// at which the host's listing differs from the snapshot's, both ways
    /// (times to the nanosecond, as silo compares them).
    async fn diff(&mut self, label: u32) -> Done {
        let snapshot = self.snapshot_id(label)?;
        let name = self.name.clone();
        let live = self.listing(&name).await?;
        let report = self
            .target
            .silo_json(&["diff", &name, &snapshot, "--json"])?;
        let said: BTreeSet<Vec<u8>> = report["paths"]
            .as_array()
            .map(|paths| paths.iter().map(path_of).collect())
            .unwrap_or_default();
        let compare = Compare {
            nanoseconds: true,
            ..self.compare
        };
        // Taking the diff's own snapshot must not change the tree either.
        let after = self.listing(&name).await?;
        self.differ(&live, &after, "silo diff changed the live tree")?;
        let expected = &self.taken[&label].tree;
        let seen: BTreeSet<Vec<u8>> = listing::differing_paths(expected, &live, compare)
            .into_iter()
            .collect();
        if said == seen {
            return Ok(format!(" ({} paths differ)", said.len()));
        }
        let shown = |paths: BTreeSet<&Vec<u8>>| -> Vec<String> {
            paths.into_iter().map(|p| listing::escape(p)).collect()
        };
        // What silo says of each path it names that does not differ.
        let only_said: Vec<String> = report["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|found| !seen.contains(&path_of(found)))
            .map(|found| format!("{} {} {}", found["path"], found["change"], found["what"]))
            .collect();
        let only_seen = shown(seen.difference(&said).collect());
        Err((
            Class::Mismatch,
            format!(
                "silo diff disagrees with the listing: it names {only_said:?}, which do not \
                 differ, and misses {only_seen:?}, which do; the listing says:\n  {}",
                listing::diff(expected, &live, compare).join("\n  ")
            ),
        ))
    }

    fn snapshot_id(&self, label: u32) -> Result<String, (Class, String)> {
        self.taken.get(&label).map(|t| t.id.clone()).ok_or_else(|| {
            (
                Class::Silo,
                format!("the plan names s{label} before taking it"),
            )
        })
    }

    /// The container of sandbox `name`, asked once.
    async fn container(&mut self, name: &str) -> Result<String, (Class, String)> {
        if let Some(container) = self.containers.get(name) {
            return Ok(container.clone());
        }
        let container = self.target.container_of(name).await?;
        self.containers.insert(name.to_owned(), container.clone());
        Ok(container)
    }

    async fn listing(&mut self, name: &str) -> Result<Listing, (Class, String)> {
        let started = Instant::now();
        let container = self.container(name).await?;
        let listing = self.target.listing_in(&container, name).await;
        self.stats.listing_time += started.elapsed();
        listing
    }

    /// A mismatch naming `what`, with the differences, unless the trees agree.
    fn differ(
        &self,
        expected: &Listing,
        actual: &Listing,
        what: &str,
    ) -> Result<(), (Class, String)> {
        let lines = listing::diff(expected, actual, self.compare);
        if lines.is_empty() {
            return Ok(());
        }
        Err((
            Class::Mismatch,
            format!(
                "{what} (- only in the snapshot's, + only in the live one, ~ differs):\n  {}",
                lines.join("\n  ")
            ),
        ))
    }

    /// Removes the sandbox and the play's snapshots; a failure here is no
    /// part of the promise (the CLI's home is removed at the end anyway).
    fn clean_up(&self) {
        let _ = self.target.silo(&["rm", &self.name]);
        let ids: Vec<&str> = self.taken.values().map(|t| t.id.as_str()).collect();
        if !ids.is_empty() {
            let mut args = vec!["snapshot", "rm"];
            args.extend(ids);
            let _ = self.target.silo(&args);
        }
    }
}

/// A path `silo diff --json` names, as its bytes (`path_raw` where it is
/// not UTF-8).
fn path_of(found: &serde_json::Value) -> Vec<u8> {
    match found["path_raw"].as_array() {
        Some(raw) => raw
            .iter()
            .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect(),
        None => found["path"]
            .as_str()
            .unwrap_or_default()
            .as_bytes()
            .to_vec(),
    }
}

/// The running `sandbox` container of pod `pod` on the mock API server's
/// engine.
async fn pod_container(engine: &Docker, pod: &str) -> Option<String> {
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![
            format!("io.kubernetes.pod.name={pod}"),
            "io.kubernetes.container.name=sandbox".to_owned(),
        ],
    )]);
    let options = bollard::query_parameters::ListContainersOptionsBuilder::new()
        .filters(&filters)
        .build();
    let found = engine.list_containers(Some(options)).await.ok()?;
    found.into_iter().find_map(|c| {
        c.names?
            .first()
            .map(|n| n.trim_start_matches('/').to_owned())
    })
}
