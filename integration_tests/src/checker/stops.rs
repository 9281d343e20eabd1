//! Stops hold: after `stop_job` answered `Ok` or `JobNotFound`, the key
//! runs nowhere until the dispatcher admits it again.
//!
//! This catches what the end-of-run I2 check cannot: a `JobNotFound` for a
//! job that was in fact alive (Redis had forgotten it) and a stop undone
//! later in the run, whatever the key's state at the end.

use std::collections::HashMap;

use super::{CheckOptions, Interval, Report, Violation};
use crate::ledger::Record;

pub(super) fn check_stops_hold(
    driver: &[(u64, &Record)],
    intervals: &[Interval],
    options: &CheckOptions,
    report: &mut Report,
) {
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
    for (t, r) in driver {
        let Record::StopDone { key, outcome } = r else {
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
