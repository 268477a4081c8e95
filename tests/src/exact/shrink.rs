//! A failing plan cut down to a shorter one that fails the same way, each
//! try played on a fresh sandbox, within a time budget.
//!
//! Cuts are tried largest first: every fork at once (a fork never changes
//! the sandbox it came from), every earlier rewind at once, runs of
//! actions (halves, quarters… down to single steps, snapshots, rewinds and
//! forks), then single operations inside steps. A cut is kept when its plan still fails with the same
//! [`Class`](super::run::Class); the plan is then cut off after its new
//! failing action and the cuts start over. A cut that leaves a rewind or
//! fork without its snapshot is skipped. The last action is never cut:
//! it is the one that failed.

use std::time::{Duration, Instant};

use super::Settings;
use super::plan::{self, Action};
use super::run::{Failure, Target};

/// The shortest failing plan found, and what finding it cost.
#[derive(Debug)]
pub struct Shrunk {
    /// The plan, ending with its failing action.
    pub plan: Vec<Action>,
    /// How it fails.
    pub failure: Failure,
    /// Plans played.
    pub tries: usize,
    /// Time spent.
    pub spent: Duration,
}

/// Cuts `plan` (which failed with `failure`) down for at most
/// `settings.shrink`, playing each try on a fresh sandbox named after
/// `name`.
pub async fn shrink(
    target: &Target<'_>,
    plan: Vec<Action>,
    failure: Failure,
    settings: &Settings,
) -> Shrunk {
    let started = Instant::now();
    let mut best = Shrunk {
        plan,
        failure,
        tries: 0,
        spent: Duration::ZERO,
    };
    'cut: while started.elapsed() < settings.shrink {
        let current = best.plan.clone();
        for candidate in cuts(&current) {
            if started.elapsed() >= settings.shrink {
                break 'cut;
            }
            best.tries += 1;
            let name = format!("exact-try{}", best.tries);
            let played = target
                .play(&candidate, &name, settings.compare, false)
                .await;
            let Err(failure) = played else { continue };
            if failure.class != best.failure.class {
                continue;
            }
            let ops: usize = candidate[..=failure.at]
                .iter()
                .map(|a| match a {
                    Action::Step(ops) => ops.len(),
                    _ => 0,
                })
                .sum();
            eprintln!(
                "[exact] shrink try {}: {} actions ({ops} operations) still fail ({} s in)",
                best.tries,
                failure.at + 1,
                started.elapsed().as_secs()
            );
            best.plan = candidate[..=failure.at].to_vec();
            best.failure = failure;
            continue 'cut;
        }
        break;
    }
    best.spent = started.elapsed();
    best
}

/// One way to cut a plan.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Drop every fork before the last action.
    Forks,
    /// Drop every rewind before the last action.
    Rewinds,
    /// Drop the actions in `start..end`.
    Actions(usize, usize),
    /// Drop operation `op` of the step at `index`.
    Op { index: usize, op: usize },
}

/// Every cut of `plan` worth a try, largest first, valid ones only; made
/// one at a time, since a long plan has many.
fn cuts(plan: &[Action]) -> impl Iterator<Item = Vec<Action>> + '_ {
    let mut all = vec![Cut::Forks, Cut::Rewinds];
    // Never the last action: it is the one that failed.
    let cuttable = plan.len().saturating_sub(1);
    let mut size = cuttable.div_ceil(2).max(1);
    loop {
        for start in (0..cuttable).step_by(size) {
            all.push(Cut::Actions(start, (start + size).min(cuttable)));
        }
        if size == 1 {
            break;
        }
        size = size.div_ceil(2);
    }
    for (index, action) in plan.iter().enumerate() {
        if let Action::Step(ops) = action {
            if ops.len() > 1 {
                all.extend((0..ops.len()).map(|op| Cut::Op { index, op }));
            }
        }
    }
    all.into_iter()
        .map(|cut| apply(plan, cut))
        .filter(move |candidate| candidate != plan && plan::is_valid(candidate))
}

fn apply(plan: &[Action], cut: Cut) -> Vec<Action> {
    let last = plan.len().saturating_sub(1);
    let without = |drop: fn(&Action) -> bool| -> Vec<Action> {
        let kept = plan.iter().enumerate();
        kept.filter(|(i, a)| *i == last || !drop(a))
            .map(|(_, a)| a.clone())
            .collect()
    };
    match cut {
        Cut::Forks => without(|a| matches!(a, Action::Fork(_))),
        Cut::Rewinds => without(|a| matches!(a, Action::Rewind(_))),
        Cut::Actions(start, end) => {
            let mut candidate = plan[..start].to_vec();
            candidate.extend_from_slice(&plan[end..]);
            candidate
        }
        Cut::Op { index, op } => {
            let mut candidate = plan.to_vec();
            if let Action::Step(ops) = &mut candidate[index] {
                ops.remove(op);
            }
            candidate
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::ops::Op;

    #[test]
    fn cuts_keep_the_failing_action_and_every_snapshot_it_needs() {
        let plan = vec![
            Action::Step(vec![Op::make_work_area(), Op::make_work_area()]),
            Action::Snapshot(1),
            Action::Fork(1),
            Action::Step(vec![Op::make_work_area()]),
            Action::Rewind(1),
        ];
        let all: Vec<Vec<Action>> = cuts(&plan).collect();
        // Forks go first, all at once.
        assert!(!all[0].contains(&Action::Fork(1)), "{:?}", all[0]);
        assert_eq!(all[0].len(), plan.len() - 1);
        for candidate in &all {
            assert_eq!(candidate.last(), Some(&Action::Rewind(1)));
            assert!(candidate.contains(&Action::Snapshot(1)));
        }
        // The step's two operations are each tried alone.
        assert!(
            all.iter()
                .any(|c| matches!(&c[0], Action::Step(ops) if ops.len() == 1))
        );
    }
}
