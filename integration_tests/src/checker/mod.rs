//! Checks invariants I1–I4 over the ledgers of a run.
//!
//! Evidence and how it is read:
//! * **Intervals.** Each worker ledger gives, per (worker, key), intervals
//!   from a `start` to the next `stop`. A process killed by `SIGKILL` (a
//!   driver `fault kill` line) runs nothing after the kill: its open
//!   intervals end at the kill time. A process that exited after a graceful
//!   removal (`fault remove_worker` end) likewise.
//! * **Pauses.** A `SIGSTOP`ped process runs nothing while stopped, but its
//!   ledger only shows a `stop` once it runs again, after `SIGCONT`. For a
//!   pause longer than the lease (`lease_stop_after`), its lease watchdog
//!   must stop every job as soon as it resumes; so an interval open at the
//!   pause and closed within `pause_stop_grace` after the resume is taken
//!   to end at the pause (a *stale window*), on one condition: every other
//!   interval of that key overlapping the stale window has a higher fencing
//!   token (downstream fencing rejects the stale owner). An interval still
//!   open later than that is a violation.
//! * **Time base.** On one host every process shares `CLOCK_MONOTONIC`
//!   ([`TimeBase::Monotonic`], exact). Across hosts use the Redis server
//!   time estimates ([`TimeBase::Server`]), where two events closer than
//!   the sum of their error bounds cannot be ordered; the tolerance option
//!   absorbs that.
//!
//! Invariants:
//! * **I1**: intervals of one key never overlap (beyond `tolerance`).
//! * **I2**: at the check instant, a key whose last outcome at the
//!   dispatcher was "admitted" (`Ok` or `JobExists`) runs on a live,
//!   unpaused process; a key whose last outcome was "stopped" runs nowhere.
//!   A key lost to two faults together is counted, not flagged: its
//!   process was killed, and Redis lost its data before anything could
//!   restart the key elsewhere (within `failover_within` of the kill for a
//!   key that ran until it, within `orphan_exposure` for one the process
//!   had stopped on a lease loss and held; `lost_with_killed_holder`).
//! * **I3**: no two admissions (`Ok`) of one key without a stop request
//!   between them — unless Redis lost its data in between while the only
//!   process that ran the key was cut off (a `cut-empty` or `cut-flush-join`
//!   fault), or while
//!   every process that ran it was out of reach (paused, cut, slowed or
//!   killed; one such fault after another, with gaps shorter than
//!   `notice_within`; with no run across the loss, the process whose last
//!   run stopped without a request within `orphan_exposure` before it,
//!   which holds the key to re-assert it or give it back) from at most
//!   `notice_within` after the loss until at most `notice_within` before
//!   the second admission (made when the run it led to says its
//!   admission was, `Record::Start`'s `admitted_ms`; failing that, by its
//!   first run begun since its dispatch was sent, or by its `Ok`), too
//!   soon to
//!   re-assert it: then nothing reachable knows the key, and the second admission is
//!   counted, not flagged (`readmitted_after_loss`); the same when the
//!   process that held the key stopped on a lease loss was killed and
//!   Redis lost its data soon after (`lost_with_killed_holder`). A run
//!   that finished, or failed for good, ends the pair as a stop request
//!   does; with `final_failures`, so does a final failure whose process
//!   was killed before it logged it (`final_failures_cut_short`).
//! * **Stops hold** (I2): once `stop_job` answered `Ok` or `JobNotFound`,
//!   the key runs nowhere (after `stop_grace`) until it is dispatched
//!   again: a `JobNotFound` for a key that runs, or a stop undone later in
//!   the run, is a violation ([`Violation::StopUndone`]).
//! * **Windows** (I3): a windowed dispatch does not admit a key less than
//!   a window after another windowed admission of it, unless Redis lost its
//!   data or its clock stepped in between (see `windows.rs`).
//! * **I4**: a worker stops a key on its own (no stop request, no fault or
//!   lease loss on its process nearby) only when, in its process's view of
//!   the ring around that moment, the key's owner is another worker
//!   ([`flotilla_pool::Ring`]).

use std::collections::HashMap;
use std::time::Duration;

use flotilla_pool::Ring;
use serde::Serialize;

use crate::ledger::{FaultKind, Line, Record};
pub use report::{Report, Violation};

mod final_failures;
mod finishes;
mod losses;
mod report;
mod stops;
mod windows;

/// Which timestamps to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBase {
    /// Host `CLOCK_MONOTONIC` (every ledger written on one host).
    Monotonic,
    /// Estimated Redis server time (ledgers from several hosts).
    Server,
}

/// Options of [`check`].
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Default: [`TimeBase::Monotonic`].
    pub time_base: TimeBase,
    /// Overlap below this is not reported (clock uncertainty). Default: 0.
    pub tolerance: Duration,
    /// The pool's `lease_stop_after`: pauses at least this long must end
    /// in the watchdog stopping the paused jobs. Default: 1333 ms.
    pub lease_stop_after: Duration,
    /// How soon after `SIGCONT` the watchdog must have stopped a paused
    /// process's jobs. Default: 1 s.
    pub pause_stop_grace: Duration,
    /// How long after a fault (or lease loss) a process's own stops are
    /// not judged by I4. Default: 6 s.
    pub settle: Duration,
    /// Ring views this close to a stop may justify it (I4). Default: 1 s.
    pub ring_window: Duration,
    /// The I2 check instant (in the chosen time base, ns); `None` skips I2.
    pub end_ns: Option<u64>,
    /// How long after `stop_job` answered a key may still show as running
    /// in the handlers' ledgers (the `stop` record is written as the
    /// handler's stop returns, just before the answer). Default: 1 s.
    pub stop_grace: Duration,
    /// How soon a worker notices that Redis lost data, or that it can
    /// reach Redis again, and re-asserts its jobs: one keep-alive renewal
    /// period (TTL / 3). A holder out of reach from within this after a
    /// loss until within this before a second admission of its key could
    /// not have re-asserted it (I3). Default: 667 ms.
    pub notice_within: Duration,
    /// How long a job that stopped on a lease loss may live only in Redis
    /// once its process is killed: until the orphan sweep or the cleanup
    /// restarts it elsewhere (the orphan grace, 2 TTLs, counted once the
    /// pool has recovered, plus a few TTLs). A data loss within this of the
    /// kill takes the last copy (I2, see `lost_with_killed_holder`).
    /// Default: 12 s (6 TTLs of 2 s).
    pub orphan_exposure: Duration,
    /// The failover bound: a killed process's running jobs start elsewhere
    /// within this (1.5 × TTL); a data loss within it of the kill takes
    /// them (I2, see `lost_with_killed_holder`). Default: 3 s.
    pub failover_within: Duration,
    /// How long after a run failed on its own (`--lifecycle`) the pool may
    /// still be waiting to restart it (its backoff): a key in that window
    /// at the I2 check instant is counted, not required to run. Default:
    /// 3 s ([`crate::lifecycle::RESTART_WITHIN`]).
    pub restart_within: Duration,
    /// Whether the load dispatched the keys that
    /// [`fails_for_good`](crate::lifecycle::fails_for_good) with
    /// [`final_failure_policy`](crate::lifecycle::final_failure_policy)
    /// (`--fail-for-good`): the second failure in a row of such a key's run
    /// is its last. Default: false.
    pub final_failures: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            time_base: TimeBase::Monotonic,
            tolerance: Duration::ZERO,
            lease_stop_after: Duration::from_millis(1333),
            pause_stop_grace: Duration::from_secs(1),
            settle: Duration::from_secs(6),
            ring_window: Duration::from_secs(1),
            end_ns: None,
            stop_grace: Duration::from_secs(1),
            notice_within: Duration::from_millis(667),
            orphan_exposure: Duration::from_secs(12),
            failover_within: Duration::from_secs(3),
            restart_within: crate::lifecycle::RESTART_WITHIN,
            final_failures: false,
        }
    }
}

impl CheckOptions {
    /// The windows derived from the pool's worker TTL (the defaults are
    /// those of a 2 s TTL): lease stop 2/3 TTL, settle 3 TTLs, noticing a
    /// loss TTL/3 (a renewal period), orphan exposure 6 TTLs, failover
    /// 1.5 × TTL; the rest default.
    pub fn for_ttl(ttl: Duration) -> Self {
        CheckOptions {
            lease_stop_after: ttl * 2 / 3,
            settle: ttl * 3,
            notice_within: ttl / 3,
            orphan_exposure: ttl * 6,
            failover_within: ttl * 3 / 2,
            ..CheckOptions::default()
        }
    }
}

/// One run of a key on a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interval {
    /// Job key.
    pub key: String,
    /// Worker id.
    pub worker: String,
    /// Worker process id.
    pub pid: u32,
    /// Fencing token of the start.
    pub token: u64,
    /// When the admission this run comes from was made, ns on the same
    /// time base: the job's creation time on the server clock, placed by
    /// the start line's own server time. `None` when the ledger does not
    /// record it.
    pub admitted: Option<u64>,
    /// Start time, ns.
    pub start: u64,
    /// End time, ns; `None` while running.
    pub end: Option<u64>,
}

/// A span of a fault on one process (or on all, `target: None`).
#[derive(Debug, Clone, Copy)]
struct FaultSpan {
    kind: FaultKind,
    target: Option<u32>,
    from: u64,
    to: Option<u64>,
    /// Whether the fault put its process out of reach: by its kind, or a
    /// `cut-one` during which the process lost its lease. The driver does
    /// not name the connection a `cut-one` fails; when it is the one the
    /// process's commands go on, its renewals fail and it loses its lease
    /// during the fault, and it can neither re-assert a key nor make a stop
    /// or finish stand until the heal, as under a `cut`.
    out_of_reach: bool,
}

/// Checks I1–I4 over `ledgers` (one `Vec<Line>` per ledger file, in file
/// order; worker and driver ledgers alike).
pub fn check(ledgers: &[Vec<Line>], options: &CheckOptions) -> Report {
    let time = |l: &Line| match options.time_base {
        TimeBase::Monotonic => l.mono_ns,
        TimeBase::Server => l.server_us * 1_000,
    };
    let mut report = Report::default();
    let faults = fault_spans(ledgers, &time);
    let mut intervals = build_intervals(ledgers, &time, &faults);
    check_pauses(&mut intervals, &faults, options, &mut report);
    report.intervals = intervals.len();
    check_overlaps(&intervals, options, &mut report);
    let driver: Vec<(u64, &Record)> = {
        let mut v: Vec<(u64, &Record)> = ledgers
            .iter()
            .flatten()
            .filter(|l| {
                matches!(
                    l.record,
                    Record::Admit { .. }
                        | Record::DispatchSent { .. }
                        | Record::Exists { .. }
                        | Record::DispatchUnknown { .. }
                        | Record::Recent { .. }
                        | Record::StopSent { .. }
                        | Record::StopDone { .. }
                        | Record::Ended { .. }
                        | Record::Finished { .. }
                )
            })
            .map(|l| (time(l), &l.record))
            .collect();
        v.sort_by_key(|(t, _)| *t);
        v
    };
    losses::check_admissions(&driver, &intervals, &faults, options, &mut report);
    stops::check_stops_hold(&driver, &intervals, &faults, options, &mut report);
    windows::check_windows(&driver, &faults, &mut report);
    let notice = options.notice_within.as_nanos() as u64;
    finishes::check_finishes_hold(
        ledgers,
        &time,
        &driver,
        &intervals,
        &faults,
        notice,
        &mut report,
    );
    if let Some(end) = options.end_ns {
        losses::check_running_at(end, &driver, &intervals, &faults, options, &mut report);
    }
    check_moves(ledgers, &time, &driver, &faults, options, &mut report);
    report
}

fn fault_spans(ledgers: &[Vec<Line>], time: &impl Fn(&Line) -> u64) -> Vec<FaultSpan> {
    let mut spans: Vec<FaultSpan> = Vec::new();
    let mut lines: Vec<&Line> = ledgers
        .iter()
        .flatten()
        .filter(|l| matches!(l.record, Record::Fault { .. }))
        .collect();
    lines.sort_by_key(|l| time(l));
    for l in lines {
        let Record::Fault { kind, target, end } = l.record else {
            continue;
        };
        if end {
            if let Some(open) = spans
                .iter_mut()
                .rev()
                .find(|s| s.kind == kind && s.target == target && s.to.is_none())
            {
                open.to = Some(time(l));
            }
        } else {
            spans.push(FaultSpan {
                kind,
                target,
                from: time(l),
                to: None,
                out_of_reach: kind.puts_process_out_of_reach(),
            });
        }
    }
    let mut lease_losses: HashMap<u32, Vec<u64>> = HashMap::new();
    for l in ledgers.iter().flatten() {
        if matches!(l.record, Record::LeaseLost) {
            lease_losses.entry(l.pid).or_default().push(time(l));
        }
    }
    for span in spans.iter_mut().filter(|s| s.kind == FaultKind::CutOne) {
        span.out_of_reach = span.target.is_some_and(|pid| {
            lease_losses.get(&pid).is_some_and(|losses| {
                losses
                    .iter()
                    .any(|t| *t >= span.from && span.to.is_none_or(|end| *t <= end))
            })
        });
    }
    spans
}

/// When a process stopped running anything for good: killed, or exited
/// after a graceful removal.
fn gone_at(faults: &[FaultSpan], pid: u32) -> Option<u64> {
    faults
        .iter()
        .filter(|f| f.target == Some(pid))
        .filter_map(|f| match f.kind {
            FaultKind::Kill => Some(f.from),
            FaultKind::RemoveWorker => f.to,
            _ => None,
        })
        .min()
}

/// When the admission of a run that started at `t` (the start `line`'s
/// instant) was made: `t` less the time, on the server clock, from the
/// admission (`admitted_ms`) to the start line. `None` when either server
/// time is unknown.
fn admitted_at(line: &Line, t: u64, admitted_ms: Option<u64>) -> Option<u64> {
    let admitted_us = admitted_ms.filter(|ms| *ms > 0)?.saturating_mul(1_000);
    if line.server_us == 0 {
        return None;
    }
    let before = line
        .server_us
        .saturating_sub(admitted_us)
        .saturating_mul(1_000);
    Some(t.saturating_sub(before))
}

fn build_intervals(
    ledgers: &[Vec<Line>],
    time: &impl Fn(&Line) -> u64,
    faults: &[FaultSpan],
) -> Vec<Interval> {
    let mut out = Vec::new();
    for ledger in ledgers {
        let mut open: HashMap<(String, String), Interval> = HashMap::new();
        for line in ledger {
            let t = time(line);
            match &line.record {
                Record::Start {
                    key,
                    token,
                    worker,
                    admitted_ms,
                } => {
                    let id = (worker.clone(), key.clone());
                    if let Some(mut prev) = open.remove(&id) {
                        prev.end = Some(t);
                        out.push(prev);
                    }
                    open.insert(
                        id,
                        Interval {
                            key: key.clone(),
                            worker: worker.clone(),
                            pid: line.pid,
                            token: *token,
                            admitted: admitted_at(line, t, *admitted_ms),
                            start: t,
                            end: None,
                        },
                    );
                }
                Record::Stop { key, worker } | Record::Ended { key, worker, .. } => {
                    if let Some(mut prev) = open.remove(&(worker.clone(), key.clone())) {
                        prev.end = Some(t);
                        out.push(prev);
                    }
                }
                _ => {}
            }
        }
        for (_, mut iv) in open {
            if let Some(gone) = gone_at(faults, iv.pid) {
                iv.end = Some(gone.max(iv.start));
            }
            out.push(iv);
        }
    }
    out.sort_by(|a, b| (&a.key, a.start).cmp(&(&b.key, b.start)));
    out
}

/// The pauses of each process, as `(SIGSTOP, SIGCONT)` spans, with a pause
/// that starts within `grace` of the last one's `SIGCONT` merged into it
/// (faults during recoveries: a pause, then a pause with a rollback 2 ms
/// later): the watchdog gets its `grace` after the last `SIGCONT`.
fn merged_pauses(faults: &[FaultSpan], grace: u64) -> HashMap<u32, Vec<(u64, u64)>> {
    let mut spans: Vec<(u32, u64, u64)> = faults
        .iter()
        .filter(|f| f.kind.pauses_process())
        .filter_map(|f| Some((f.target?, f.from, f.to?)))
        .collect();
    spans.sort_unstable();
    let mut merged: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for (pid, from, to) in spans {
        let list = merged.entry(pid).or_default();
        match list.last_mut() {
            Some(last) if from <= last.1.saturating_add(grace) => last.1 = last.1.max(to),
            _ => list.push((from, to)),
        }
    }
    merged
}

fn check_pauses(
    intervals: &mut [Interval],
    faults: &[FaultSpan],
    options: &CheckOptions,
    report: &mut Report,
) {
    let lease = options.lease_stop_after.as_nanos() as u64;
    let grace = options.pause_stop_grace.as_nanos() as u64;
    let mut stale: Vec<(usize, u64, u64)> = Vec::new(); // (index, pause start, recorded end)
    let pauses = merged_pauses(faults, grace);
    for (i, iv) in intervals.iter_mut().enumerate() {
        for &(from, resumed) in pauses.get(&iv.pid).into_iter().flatten() {
            // `kill(SIGSTOP)` returns before every thread of the target has
            // stopped: a start the paused process itself recorded after the
            // fault record (seen: 0.8 ms after) still happened before the
            // pause took effect, since a stopped process records nothing.
            if resumed.saturating_sub(from) < lease
                || iv.start >= resumed
                || iv.end.is_some_and(|e| e <= from)
            {
                continue;
            }
            let paused_from = from.max(iv.start);
            match iv.end {
                Some(end) if end <= resumed + grace => {
                    report.stale_windows += 1;
                    report.worst_stale_window_ns = report
                        .worst_stale_window_ns
                        .max(end.saturating_sub(resumed));
                    stale.push((i, paused_from, end));
                    iv.end = Some(paused_from);
                }
                _ => report.violations.push(Violation::PausedOwnerNotFenced {
                    stale: iv.clone(),
                    reason: format!(
                        "still running {} ms after SIGCONT (lease watchdog should have stopped it)",
                        grace / 1_000_000
                    ),
                }),
            }
        }
    }
    for (i, from, end) in stale {
        let s = &intervals[i];
        for other in intervals.iter() {
            let overlaps = other.start < end && other.end.is_none_or(|e| e > from);
            if other.key == s.key && other.worker != s.worker && overlaps && other.token <= s.token
            {
                report.violations.push(Violation::PausedOwnerNotFenced {
                    stale: Interval {
                        end: Some(end),
                        ..s.clone()
                    },
                    reason: format!(
                        "overlaps {} (token {}) without a higher fencing token",
                        other.worker, other.token
                    ),
                });
            }
        }
    }
}

fn check_overlaps(intervals: &[Interval], options: &CheckOptions, report: &mut Report) {
    let tol = options.tolerance.as_nanos() as u64;
    let mut i = 0;
    while i < intervals.len() {
        let key = &intervals[i].key;
        let mut latest: Option<&Interval> = None; // the one ending last so far
        while i < intervals.len() && &intervals[i].key == key {
            let iv = &intervals[i];
            if let Some(prev) = latest {
                let prev_end = prev.end.unwrap_or(u64::MAX);
                if iv.start.saturating_add(tol) < prev_end {
                    report.violations.push(Violation::Overlap {
                        first: prev.clone(),
                        second: iv.clone(),
                    });
                }
                if iv.end.unwrap_or(u64::MAX) > prev_end {
                    latest = Some(iv);
                }
            } else {
                latest = Some(iv);
            }
            i += 1;
        }
    }
}

fn check_moves(
    ledgers: &[Vec<Line>],
    time: &impl Fn(&Line) -> u64,
    driver: &[(u64, &Record)],
    faults: &[FaultSpan],
    options: &CheckOptions,
    report: &mut Report,
) {
    let settle = options.settle.as_nanos() as u64;
    let window = options.ring_window.as_nanos() as u64;
    const SLACK: u64 = 100_000_000;
    // Stop requests per key: [sent, done] spans. A stop whose outcome is
    // unknown (its caller gave up) may still be carried out later, e.g.
    // behind a slow start of the key: its span lasts until the key's next
    // admission, a run the stop does not name.
    let mut requests: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for (t, r) in driver {
        let (key, closes_unknown) = match r {
            Record::StopSent { key } => {
                requests.entry(key).or_default().push((*t, u64::MAX));
                continue;
            }
            Record::StopDone { key, outcome, .. } => (key, outcome != "unknown"),
            Record::Admit { key, .. } => (key, true),
            _ => continue,
        };
        if let Some(last) = requests.get_mut(key.as_str()).and_then(|v| v.last_mut())
            && last.1 == u64::MAX
            && closes_unknown
        {
            last.1 = *t;
        }
    }
    for ledger in ledgers {
        let Some(pid) = ledger.first().map(|l| l.pid) else {
            continue;
        };
        let lease_losses: Vec<u64> = ledger
            .iter()
            .filter(|l| l.record == Record::LeaseLost)
            .map(time)
            .collect();
        let rings: Vec<(u64, Ring)> = ledger
            .iter()
            .filter_map(|l| match &l.record {
                Record::Ring { workers } => Some((time(l), Ring::new(workers.iter().cloned()))),
                _ => None,
            })
            .collect();
        if rings.is_empty() {
            continue;
        }
        for line in ledger {
            let Record::Stop { key, worker } = &line.record else {
                continue;
            };
            let t = time(line);
            let requested = requests.get(key.as_str()).is_some_and(|spans| {
                spans
                    .iter()
                    .any(|(a, d)| t + SLACK >= *a && t <= d.saturating_add(SLACK))
            });
            // A loss of Redis's data disturbs every process, whichever
            // process the fault also paused or cut off.
            let disturbed = faults.iter().any(|f| {
                (f.target.is_none() || f.target == Some(pid) || f.kind.loses_data())
                    && t + SLACK >= f.from
                    && t <= f.to.unwrap_or(u64::MAX).saturating_add(settle)
            }) || lease_losses
                .iter()
                .any(|l| t + SLACK >= *l && t <= l + settle);
            if requested || disturbed {
                continue;
            }
            report.moves_checked += 1;
            // The view in force at t - window, and every view until t + window.
            let first = rings
                .iter()
                .rposition(|(rt, _)| *rt <= t.saturating_sub(window))
                .unwrap_or(0);
            let justified = rings[first..]
                .iter()
                .take_while(|(rt, _)| *rt <= t + window)
                .any(|(_, ring)| ring.owner(key).is_some_and(|o| o != worker));
            if !justified {
                report.violations.push(Violation::NeedlessMove {
                    key: key.clone(),
                    worker: worker.clone(),
                    at: t,
                });
            }
        }
    }
}

#[cfg(test)]
mod cut_loss_tests;
#[cfg(test)]
mod tests;
