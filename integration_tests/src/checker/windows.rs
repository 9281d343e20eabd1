//! Idempotency windows: a key admitted by a dispatch with a window is not
//! admitted again by one less than a window later, even once its run has
//! finished or been stopped — wherever Redis kept its data and its clock
//! in between (a loss forgets the marker, as the pool documents; a clock
//! step forward expires it early).
//!
//! The driver knows each admission only by when its dispatch was sent and
//! when its `Ok` came back. The first admission was made no earlier than
//! the earliest send of the key still unanswered when that `Ok` came, the
//! second no later than its own `Ok`: two admissions closer than that
//! span, by less than the window (minus [`SLACK`]), broke the window.

use std::collections::HashMap;

use super::{FaultSpan, Report, Violation};
use crate::ledger::{FaultKind, Record};

/// What the two clocks may disagree by over a window: Redis's wall clock
/// against the host's monotonic one, with no step between them.
const SLACK: u64 = 100_000_000;

/// A windowed admission: its earliest possible time and its window (ns).
#[derive(Clone, Copy)]
struct Admission {
    earliest: u64,
    window: u64,
}

pub(super) fn check_windows(driver: &[(u64, &Record)], faults: &[FaultSpan], report: &mut Report) {
    // Per key, the sends not answered yet. An answer takes out the latest
    // of them: whichever dispatch it answers, those left are then no later
    // than the dispatches still in flight, one for one.
    let mut in_flight: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut last: HashMap<&str, Admission> = HashMap::new();
    let forgets = |f: &FaultSpan, from: u64, to: u64| {
        (f.kind.loses_data() || f.kind == FaultKind::ClockStep)
            && f.from <= to
            && f.to.is_none_or(|end| end >= from)
    };
    for (t, r) in driver {
        let key = match r {
            Record::DispatchSent { key } => {
                in_flight.entry(key).or_default().push(*t);
                continue;
            }
            Record::Recent { key } => {
                report.window_refusals += 1;
                key
            }
            Record::Admit { key, .. }
            | Record::Exists { key }
            | Record::DispatchUnknown { key } => key,
            _ => continue,
        };
        let sends = in_flight.entry(key).or_default();
        let earliest = sends.iter().copied().min().unwrap_or(*t);
        if let Some(i) = (0..sends.len()).max_by_key(|&i| sends[i]) {
            sends.swap_remove(i);
        }
        let Record::Admit {
            window_ms: Some(window_ms),
            ..
        } = r
        else {
            continue;
        };
        report.windowed_admissions += 1;
        if let Some(first) = last.get(key.as_str())
            && t.saturating_sub(first.earliest) + SLACK < first.window
        {
            if faults.iter().any(|f| forgets(f, first.earliest, *t)) {
                report.window_readmissions_excused += 1;
            } else {
                report.violations.push(Violation::WindowBroken {
                    key: key.clone(),
                    first_earliest: first.earliest,
                    second: *t,
                    window_ms: first.window / 1_000_000,
                });
            }
        }
        last.insert(
            key,
            Admission {
                earliest,
                window: window_ms * 1_000_000,
            },
        );
    }
}
