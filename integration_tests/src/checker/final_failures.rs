//! Final failures whose record a kill cut short (`--fail-for-good` runs).
//!
//! The pool records a final failure in Redis (the job leaves the pool) and
//! then logs `job failed too often; not restarted`, which is what writes
//! the ledger's [`Finished`](crate::ledger::Record::Finished) line. A
//! process killed between the two leaves the failure recorded and the line
//! unwritten: the job has left the pool, and a later dispatch of the key
//! is admitted as new (chaos soak seed 1587: `job-2223` failed for the
//! second time in a row, its process killed 34 ms later, the cleanup of
//! its worker found nothing of the key, and a dispatch sent 5.6 s after
//! was answered `Ok`). Such a failure ends the key's pair as a finish does;
//! counted in `final_failures_cut_short`.

use std::collections::{HashMap, HashSet};

use super::{CheckOptions, FaultSpan, Interval};
use crate::ledger::{FaultKind, Record};

/// What [`cut_short`] reads beside the run itself.
pub(super) struct Runs<'a> {
    /// Every run, by key.
    pub(super) by_key: HashMap<&'a str, Vec<&'a Interval>>,
    pub(super) faults: &'a [FaultSpan],
    /// `(key, token)` of every run that ended `failed`.
    pub(super) failed: HashSet<(&'a str, u64)>,
    /// `(key, token)` of every run whose end the pool logged as final (a
    /// `Finished` line).
    pub(super) finished: HashSet<(&'a str, u64)>,
    /// How soon after a failure its restart begins at most, ns.
    pub(super) restart_within: u64,
    /// How soon after the failure a kill keeps the process from logging
    /// the final one, ns.
    pub(super) notice: u64,
}

impl<'a> Runs<'a> {
    /// The runs, failures and logged final failures of a run's ledgers.
    pub(super) fn of(
        driver: &[(u64, &'a Record)],
        intervals: &'a [Interval],
        faults: &'a [FaultSpan],
        options: &CheckOptions,
    ) -> Runs<'a> {
        Runs {
            by_key: intervals.iter().fold(HashMap::new(), |mut by_key, iv| {
                by_key
                    .entry(iv.key.as_str())
                    .or_insert_with(Vec::new)
                    .push(iv);
                by_key
            }),
            faults,
            failed: driver
                .iter()
                .filter_map(|(_, r)| match r {
                    Record::Ended {
                        key,
                        token,
                        outcome,
                        ..
                    } if outcome == "failed" => Some((key.as_str(), *token)),
                    _ => None,
                })
                .collect(),
            finished: driver
                .iter()
                .filter_map(|(_, r)| match r {
                    Record::Finished { key, token } => Some((key.as_str(), *token)),
                    _ => None,
                })
                .collect(),
            restart_within: options.restart_within.as_nanos() as u64,
            notice: options.notice_within.as_nanos() as u64,
        }
    }
}

/// Whether run `token` of `key`, which failed at `at`, was the key's final
/// failure and its process was killed before it could log that: the key is
/// one that fails for good, the run was the restart (same worker, same
/// admission) of a run that had failed just before it (its second failure
/// in a row: [`final_failure_policy`](crate::lifecycle::final_failure_policy)),
/// no run of that admission began after it, its process was killed within
/// `notice` of the failure, and no `Finished` line of the run was written.
pub(super) fn cut_short(key: &str, token: u64, at: u64, runs: &Runs) -> bool {
    if !crate::lifecycle::fails_for_good(key) || runs.finished.contains(&(key, token)) {
        return false;
    }
    let of_key = || runs.by_key.get(key).into_iter().flatten().copied();
    let Some(run) = of_key().find(|iv| iv.token == token) else {
        return false;
    };
    let same_admission = |iv: &Interval| match (iv.admitted, run.admitted) {
        (Some(a), Some(b)) => a.abs_diff(b) <= super::losses::ADMITTED_SLACK,
        _ => true,
    };
    let restart_of_a_failure = of_key()
        .filter(|iv| iv.start < run.start)
        .max_by_key(|iv| iv.start)
        .is_some_and(|prev| {
            prev.worker == run.worker
                && runs.failed.contains(&(key, prev.token))
                && prev
                    .end
                    .is_some_and(|end| end <= run.start && run.start - end <= runs.restart_within)
                && same_admission(prev)
        });
    let restarted_since = of_key().any(|iv| iv.start > run.start && same_admission(iv));
    let killed = runs.faults.iter().any(|f| {
        f.kind == FaultKind::Kill
            && f.target == Some(run.pid)
            && at <= f.from
            && f.from <= at + runs.notice
    });
    restart_of_a_failure && !restarted_since && killed
}
