//! Finishes hold (`--lifecycle` runs): once the pool recorded that a run
//! finished (the worker logged `job finished`, a [`Record::Finished`] line),
//! the job has left the pool, and no run of its key may follow until the
//! load dispatches it again — the same promise as a stop's.
//!
//! A finish is remembered by the worker that recorded it (its stop
//! tombstones) and by Redis. When Redis lost data after the finish while
//! that worker's process was killed, or out of reach (cut off, paused) from
//! the loss on, both memories are gone or mute: such a finish undone is
//! counted (`finishes_lost_with_their_holder`), not flagged. A `cut-one`
//! fault cuts one of the process's connections, which the driver does not
//! name; it puts the process out of reach when that was the connection
//! its commands go on, which the process shows by losing its lease during
//! the fault (its renewals failed; see `FaultSpan::out_of_reach`).

use std::collections::HashMap;

use super::{FaultSpan, Interval, Report, Violation};
use crate::ledger::{Line, Record};

pub(super) fn check_finishes_hold(
    ledgers: &[Vec<Line>],
    time: &impl Fn(&Line) -> u64,
    driver: &[(u64, &Record)],
    intervals: &[Interval],
    faults: &[FaultSpan],
    notice: u64,
    report: &mut Report,
) {
    let mut by_key: HashMap<&str, Vec<&Interval>> = HashMap::new();
    for iv in intervals {
        by_key.entry(iv.key.as_str()).or_default().push(iv);
    }
    // Per key, when a dispatch that may start it again was sent, and when
    // one was answered `Ok` or gave up.
    let mut sent: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut admitted: HashMap<&str, Vec<u64>> = HashMap::new();
    for (t, r) in driver {
        match r {
            Record::DispatchSent { key } => sent.entry(key.as_str()).or_default().push(*t),
            // Admitted, or maybe: a dispatch whose caller gave up (a
            // timeout) may have been admitted all the same.
            Record::Admit { key, .. } | Record::DispatchUnknown { key } => {
                admitted.entry(key.as_str()).or_default().push(*t)
            }
            _ => {}
        }
    }
    // When each run's end was reported: the pool records it after that,
    // and logs it a moment after recording it, so a dispatch sent in
    // between may be admitted as new (the job has left the pool).
    let mut reported: HashMap<(&str, u64), u64> = HashMap::new();
    for line in ledgers.iter().flatten() {
        if let Record::Ended { key, token, .. } = &line.record {
            reported.insert((key.as_str(), *token), time(line));
        }
    }
    let holder = Holder { faults, notice };
    for line in ledgers.iter().flatten() {
        let Record::Finished { key, token } = &line.record else {
            continue;
        };
        let at = time(line);
        report.finishes_checked += 1;
        let since = reported
            .get(&(key.as_str(), *token))
            .copied()
            .unwrap_or(at)
            .min(at);
        let sent_of = sent
            .get(key.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let next_sent = sent_of.iter().find(|s| **s > since).copied();
        // A dispatch sent before the finish and still in flight is admitted
        // as new once the job has left the pool: from its sending on, a run
        // may be that admission's.
        let in_flight = admitted
            .get(key.as_str())
            .and_then(|ts| ts.iter().find(|a| **a > since))
            .and_then(|a| sent_of.iter().rev().find(|s| *s <= a).copied());
        let until = next_sent
            .into_iter()
            .chain(in_flight)
            .min()
            .unwrap_or(u64::MAX);
        for iv in by_key.get(key.as_str()).into_iter().flatten() {
            // A run open across the finish is an overlap, reported as such.
            let after = iv.token != *token && iv.start >= at && iv.start < until;
            if !after || admitted_since(iv, since, sent_of) {
                continue;
            }
            if holder.lost_with(line.pid, at, iv.start) {
                report.finishes_lost_with_their_holder += 1;
                continue;
            }
            report.violations.push(Violation::FinishUndone {
                finished_at: at,
                token: *token,
                interval: (*iv).clone(),
            });
        }
    }
}

/// Whether run `iv` comes from an admission made after the finish (at
/// `since`) of a dispatch sent by then: the load dispatched the key
/// again, whatever that dispatch was answered. A dispatch sent before the
/// finish can be admitted as new after it, then lose its admission with
/// Redis's data and, retried, be answered `JobExists` for the very run it
/// started (chaos soak seed 1576: a rollback 6 ms after that start). The
/// pool never admits a key on its own, and every requeue, hand-off and
/// move of a run keeps its admission's stamp, so a run of the finished
/// admission never carries a later one.
fn admitted_since(iv: &Interval, since: u64, sent: &[u64]) -> bool {
    iv.admitted.is_some_and(|a| {
        a > since
            && sent
                .iter()
                .any(|s| *s <= a.saturating_add(super::losses::ADMITTED_SLACK))
    })
}

/// What tells whether a finish's holder (or a stop's, `stops.rs`) was out
/// of reach.
pub(super) struct Holder<'a> {
    pub(super) faults: &'a [FaultSpan],
    pub(super) notice: u64,
}

impl Holder<'_> {
    /// Whether, between the finish at `at` and the run at `before`, Redis
    /// lost data while process `pid` (which recorded the finish) was killed
    /// or out of reach, or became so within `notice` of the loss (before
    /// its next renewal could find the loss and make the finish stand
    /// again).
    pub(super) fn lost_with(&self, pid: u32, at: u64, before: u64) -> bool {
        self.faults
            .iter()
            .filter(|f| f.kind.loses_data() && at < f.from && f.from < before)
            .any(|f| {
                let lost_by = f.to.unwrap_or(f.from);
                self.faults.iter().any(|u| {
                    u.target == Some(pid)
                        && u.out_of_reach
                        && u.from <= lost_by + self.notice
                        && u.to.is_none_or(|end| end >= f.from)
                        && u.from < before
                })
            })
    }
}
