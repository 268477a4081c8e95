//! A run as data: a list of [`Action`]s drawn from a seed, which
//! [`super::run`] plays and [`super::shrink`] cuts down, and which
//! [`render`] prints as lines a person can paste into a shell.
//!
//! Snapshots carry a label (`s1`, `s2`…) that rewinds and forks name, so
//! dropping an action never renumbers the others. Snapshots taken after a
//! rewind make chains with branches.

use std::fmt::Write as _;

use super::kinds::OpKind;
use super::ops::{Model, Op};
use super::rng::Rng;
use super::run::Backend;

/// Operations in one step (one `sh -c` script).
const OPS_PER_STEP: (u64, u64) = (1, 6);
/// Steps between two rewinds or forks.
const STEPS_PER_ROUND: (u64, u64) = (1, 3);
/// How often a round takes a snapshot before its rewind or fork.
const SNAPSHOT_PERCENT: u64 = 60;
/// How often a rewind or fork aims at the newest snapshot rather than any.
const NEWEST_PERCENT: u64 = 40;
/// How often a round asks `silo diff` what changed since a snapshot.
const DIFF_PERCENT: u64 = 25;

/// One thing a run does to its sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Operations run as one `silo exec NAME -- sh -c SCRIPT`.
    Step(Vec<Op>),
    /// `silo snapshot NAME`, its tree recorded under this label.
    Snapshot(u32),
    /// `silo rewind NAME` to the snapshot of this label; the tree must be
    /// the one it recorded, and the rewind done in place.
    Rewind(u32),
    /// `silo fork` of the snapshot of this label; the fork's tree must be
    /// the one it recorded.
    Fork(u32),
    /// `silo stop NAME` then `silo start NAME` on a backend whose stop
    /// deletes the machine (a pod): the tree must be as it was before.
    Restart,
    /// `silo diff NAME` against the snapshot of this label: the paths it
    /// names must be exactly those at which the host's listing of the live
    /// tree differs from the one the snapshot recorded.
    Diff(u32),
}

impl Action {
    /// The snapshot label it needs taken before it, if any.
    pub fn needs(&self) -> Option<u32> {
        match self {
            Self::Rewind(label) | Self::Fork(label) | Self::Diff(label) => Some(*label),
            Self::Step(_) | Self::Snapshot(_) | Self::Restart => None,
        }
    }

    /// A few words for a progress line.
    pub fn describe(&self) -> String {
        match self {
            Self::Step(ops) => {
                let kinds: Vec<&str> = ops.iter().map(|op| op.kind.name()).collect();
                format!("step [{}]", kinds.join(" "))
            }
            Self::Snapshot(label) => format!("snapshot s{label}"),
            Self::Rewind(label) => format!("rewind to s{label}"),
            Self::Fork(label) => format!("fork of s{label}"),
            Self::Restart => "stop and start".to_owned(),
            Self::Diff(label) => format!("diff against s{label}"),
        }
    }
}

/// The step's script: each operation on its own line, none able to fail
/// it, and no complaint about a path an earlier action removed.
pub fn script(ops: &[Op]) -> String {
    let mut text = vec!["exec 2>/dev/null".to_owned()];
    text.extend(ops.iter().map(Op::guarded));
    text.push("true".to_owned());
    text.join("\n")
}

/// A plan drawn from `seed`: the work area made, then rounds of a few
/// steps, maybe a snapshot, and a rewind or a fork, until both budgets
/// are spent. Steps change the image's own files only if `touches_image`
/// (see [`Model::new`]).
pub fn generate(
    seed: u64,
    kinds: &[OpKind],
    (rewinds, forks): (usize, usize),
    touches_image: bool,
) -> Vec<Action> {
    let mut rng = Rng::new(seed);
    let mut model = Model::new(touches_image);
    let mut plan = vec![Action::Step(vec![Op::make_work_area()])];
    let (mut rewinds, mut forks) = (rewinds as u64, forks as u64);
    let mut labels = 0u32;
    while rewinds + forks > 0 {
        for _ in 0..rng.between(STEPS_PER_ROUND.0, STEPS_PER_ROUND.1) {
            let ops = (0..rng.between(OPS_PER_STEP.0, OPS_PER_STEP.1))
                .map(|_| {
                    let kind = *rng.pick(kinds);
                    model.op(&mut rng, kind)
                })
                .collect();
            plan.push(Action::Step(ops));
        }
        if labels > 0 && rng.chance(DIFF_PERCENT) {
            plan.push(Action::Diff(rng.between(1, u64::from(labels)) as u32));
        }
        if labels == 0 || rng.chance(SNAPSHOT_PERCENT) {
            labels += 1;
            plan.push(Action::Snapshot(labels));
        }
        let label = if rng.chance(NEWEST_PERCENT) {
            labels
        } else {
            rng.between(1, u64::from(labels)) as u32
        };
        if rng.below(rewinds + forks) < rewinds {
            rewinds -= 1;
            plan.push(Action::Rewind(label));
        } else {
            forks -= 1;
            plan.push(Action::Fork(label));
        }
    }
    plan
}

/// How often a stop and start follows a rewind or a fork, in percent.
const RESTART_PERCENT: u64 = 30;

/// `plan` with a stop and start after some of its rewinds and forks, drawn
/// from `seed` apart from the plan's own draws (so a seed's plan is the
/// same on every backend but for these).
pub fn with_restarts(plan: Vec<Action>, seed: u64) -> Vec<Action> {
    let mut rng = Rng::new(seed ^ 0x5245_5354_4152_5421);
    let mut out = Vec::with_capacity(plan.len());
    for action in plan {
        let after = matches!(action, Action::Rewind(_) | Action::Fork(_));
        out.push(action);
        if after && rng.chance(RESTART_PERCENT) {
            out.push(Action::Restart);
        }
    }
    out
}

/// Whether every rewind and fork names a snapshot taken before it.
pub fn is_valid(plan: &[Action]) -> bool {
    let mut taken = std::collections::HashSet::new();
    plan.iter().all(|action| {
        if let Action::Snapshot(label) = action {
            taken.insert(*label);
        }
        action.needs().is_none_or(|label| taken.contains(&label))
    })
}

/// The plan as shell lines a person can paste (`jq` reads the ids), with
/// the sandbox called `name`; each rewind and fork says what to compare.
pub fn render(plan: &[Action], name: &str, backend: Backend) -> String {
    let mut up = vec!["silo", "up", name];
    up.extend(backend.up_args());
    let mut out = format!("{}\n", up.join(" "));
    for (index, action) in plan.iter().enumerate() {
        let _ = match action {
            // A quoted here-document: the script exactly as the step ran it.
            Action::Step(ops) => writeln!(
                out,
                "# {index}: step\nsilo exec {name} -- sh -c \"$(cat <<'STEP'\n{}\nSTEP\n)\"{}",
                script(ops),
                ops.iter()
                    .filter_map(|op| op.behind.as_ref())
                    .map(|behind| format!("\n{}", behind.command()))
                    .collect::<String>()
            ),
            Action::Snapshot(label) => writeln!(
                out,
                "# {index}: snapshot\ns{label}=$(silo snapshot {name} --json | jq -r .snapshot.id)"
            ),
            Action::Rewind(label) => writeln!(
                out,
                "# {index}: the tree must be s{label}'s again, rewound in place\n\
                 silo rewind {name} \"$s{label}\""
            ),
            Action::Fork(label) => writeln!(
                out,
                "# {index}: the fork's tree must be s{label}'s\n\
                 silo fork \"$s{label}\" --name {name}-fork{index} && silo rm {name}-fork{index}"
            ),
            Action::Restart => writeln!(
                out,
                "# {index}: the tree must be as before the stop\n\
                 silo stop {name} && silo start {name}"
            ),
            Action::Diff(label) => writeln!(
                out,
                "# {index}: it must name exactly the paths that differ from s{label}'s\n\
                 silo diff {name} \"$s{label}\""
            ),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_one_plan_and_spends_both_budgets() {
        let a = generate(42, &OpKind::ALL, (10, 3), true);
        assert_eq!(a, generate(42, &OpKind::ALL, (10, 3), true));
        assert_ne!(a, generate(43, &OpKind::ALL, (10, 3), true));
        assert_ne!(a, generate(42, &OpKind::ALL, (10, 3), false));
        // Stops and starts go after rewinds and forks, the plan's own
        // actions kept in order.
        let restarted = with_restarts(a.clone(), 42);
        assert!(restarted.len() > a.len());
        let own: Vec<&Action> = restarted
            .iter()
            .filter(|x| !matches!(x, Action::Restart))
            .collect();
        assert_eq!(own, a.iter().collect::<Vec<_>>());
        assert!(restarted.windows(2).all(|w| {
            !matches!(w[1], Action::Restart) || matches!(w[0], Action::Rewind(_) | Action::Fork(_))
        }));
        let count = |f: fn(&Action) -> bool| a.iter().filter(|x| f(x)).count();
        assert_eq!(count(|x| matches!(x, Action::Rewind(_))), 10);
        assert_eq!(count(|x| matches!(x, Action::Fork(_))), 3);
        assert!(is_valid(&a));
    }
}
