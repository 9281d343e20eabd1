//! Stops hold: after `stop_job` answered `Ok` or `JobNotFound`, the key
//! runs nowhere until the dispatcher admits it again.
//!
//! This catches what the end-of-run I2 check cannot: a `JobNotFound` for a
//! job that was in fact alive (Redis had forgotten it) and a stop undone
//! later in the run, whatever the key's state at the end.
//!
//! A stop is remembered by the node that asked for it (it makes the stop
//! stand again when Redis loses data), by the worker that stopped the run
//! (its stop tombstones) and by Redis. A stop asked through a worker
//! process's node (`--requests-from-workers`) is undone without a fault
//! of the pool when Redis lost data after the answer while that process
//! and the processes of the runs it stopped were killed or out of reach
//! (see [`Holder::lost_with`]): counted (`stops_lost_with_their_holders`),
//! not flagged. A dispatching node's stop has no such excuse.

use std::collections::HashMap;

use super::finishes::Holder;
use super::{CheckOptions, FaultSpan, Interval, Report, Violation};
use crate::ledger::Record;

pub(super) fn check_stops_hold(
    driver: &[(u64, &Record)],
    intervals: &[Interval],
    faults: &[FaultSpan],
    options: &CheckOptions,
    report: &mut Report,
) {
    let holder = Holder {
        faults,
        notice: options.notice_within.as_nanos() as u64,
    };
    let grace = options.stop_grace.as_nanos() as u64;
    let mut by_key: HashMap<&str, Vec<&Interval>> = HashMap::new();
    for iv in intervals {
        by_key.entry(iv.key.as_str()).or_default().push(iv);
    }
    // Per key, when a dispatch that may (re)start it was sent: a worker
    // may start the job before the dispatcher records the answer.
    let mut admits: HashMap<&str, Vec<u64>> = HashMap::new();
    for (t, r) in driver {
        if let Record::DispatchSent { key } = r {
            admits.entry(key.as_str()).or_default().push(*t);
        }
    }
    // key → when its last stop was sent.
    let mut stop_sent: HashMap<&str, u64> = HashMap::new();
    for (t, r) in driver {
        if let Record::StopSent { key } = r {
            stop_sent.insert(key.as_str(), *t);
            continue;
        }
        let Record::StopDone { key, outcome, via } = r else {
            continue;
        };
        if outcome != "ok" && outcome != "not_found" {
            continue;
        }
        report.stops_checked += 1;
        // The window closes when the next dispatch of the key is sent.
        let until = admits
            .get(key.as_str())
            .and_then(|ts| ts.iter().find(|a| **a > *t).copied())
            .unwrap_or(u64::MAX);
        let from = t.saturating_add(grace);
        if from >= until {
            continue;
        }
        for iv in by_key.get(key.as_str()).into_iter().flatten() {
            // A run still open at the I2 check instant, with no dispatch
            // after the stop, is that check's to report (once).
            if iv.end.is_none() && options.end_ns.is_some() && until == u64::MAX {
                continue;
            }
            let ran_in_window = iv.start < until && iv.end.is_none_or(|e| e > from);
            if ran_in_window
                && let Some(via) = via
                && let sent = stop_sent.get(key.as_str()).copied().unwrap_or(*t)
                && let runs = by_key.get(key.as_str()).map_or(&[][..], Vec::as_slice)
                && lost_with_its_holders(&holder, runs, (*via, sent, *t), grace, iv)
            {
                report.stops_lost_with_their_holders += 1;
                continue;
            }
            if ran_in_window {
                report.violations.push(Violation::StopUndone {
                    outcome: outcome.clone(),
                    stopped_at: *t,
                    interval: (*iv).clone(),
                });
            }
        }
    }
}

/// Whether a stop asked through process `via`, sent at `sent` and answered
/// at `at` (`stop`), was undone by a data loss before `run` started with
/// that process and the processes of the runs it stopped (`runs`: the
/// key's runs; those open when it was sent and ended by its answer and
/// `grace`) killed or out of reach (see [`Holder::lost_with`]). Used here
/// and by the I2 check at the end (a run still open then).
pub(super) fn lost_with_its_holders(
    holder: &Holder,
    runs: &[&Interval],
    (via, sent, at): (u32, u64, u64),
    grace: u64,
    run: &Interval,
) -> bool {
    let from = at.saturating_add(grace);
    holder.lost_with(via, at, run.start)
        && runs
            .iter()
            .filter(|s| s.start <= at && s.end.is_some_and(|e| e >= sent && e <= from))
            .all(|s| holder.lost_with(s.pid, at, run.start))
}
