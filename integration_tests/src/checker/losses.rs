//! I2 and I3 at the dispatcher: what a key's admissions and its state at
//! the end of the run may be, and the data losses that excuse a second
//! admission or a key running nowhere (nothing reachable knew the key, or
//! two faults together took every copy).

use std::collections::{BTreeMap, HashMap};

use super::{CheckOptions, FaultSpan, Interval, Report, Violation, final_failures};
use crate::ledger::{FaultKind, Record};

/// I3: no two admissions of one key without a stop request between them,
/// but for those a data loss excuses (counted in `readmitted_after_loss`).
pub(super) fn check_admissions(
    driver: &[(u64, &Record)],
    intervals: &[Interval],
    faults: &[FaultSpan],
    options: &CheckOptions,
    report: &mut Report,
) {
    // Redis lost its data between the two admissions while the key ran
    // only on the process cut off then: no reachable process or Redis
    // could know the key any more.
    let forgotten_between = |key: &str, prev: u64, t: u64| {
        faults.iter().any(|f| {
            matches!(f.kind, FaultKind::CutRestartEmpty | FaultKind::CutFlushJoin)
                && prev < f.from
                && f.from < t
                && intervals.iter().any(|iv| {
                    iv.key == key
                        && Some(iv.pid) == f.target
                        && iv.start <= f.from
                        && iv.end.is_none_or(|e| e > f.from)
                })
        })
    };
    // The same for any loss, when every process that ran the key across it
    // was out of reach from too soon after it to re-assert the key until
    // too late before the second admission to have done so since.
    let notice = options.notice_within.as_nanos() as u64;
    let windows = killed_holder_windows(options);
    // Out of reach over [from, until]: faults on the process cover it, one
    // after the other, with no gap in between long enough to re-assert (a
    // pause, then at once a cut). A frozen Redis answers no process, so it
    // covers every one (`chaos_short_scheduled_jobs`, seed 45: the
    // holder's cut healed 0.1 ms before Redis was frozen, and a dispatch
    // sent during the freeze was the first call Redis took on waking).
    let out_of_reach = |pid: u32, from: u64, until: u64| {
        let mut spans: Vec<(u64, u64)> = faults
            .iter()
            .filter(|u| {
                (u.target == Some(pid) && u.out_of_reach)
                    || (u.target.is_none() && u.kind.answers_no_process())
            })
            .map(|u| (u.from, u.to.unwrap_or(u64::MAX)))
            .collect();
        spans.sort_unstable();
        let mut covered: Option<u64> = None;
        for (a, b) in spans {
            covered = match covered {
                None if a <= from && b >= from => Some(b),
                Some(c) if a <= c.saturating_add(notice) => Some(c.max(b)),
                other => other,
            };
        }
        covered.is_some_and(|c| c >= until)
    };
    let (_, exposure, _) = windows;
    let lost_out_of_reach = |key: &str, prev: u64, t: u64| {
        faults.iter().any(|f| {
            let lost_by = f.to.unwrap_or(f.from);
            let mut holders: Vec<&Interval> = intervals
                .iter()
                .filter(|iv| {
                    iv.key == key && iv.start <= lost_by && iv.end.is_none_or(|e| e > f.from)
                })
                .collect();
            if holders.is_empty() {
                // No run across the loss: the last run before it ended
                // without a request (an admission answered `Ok` started a
                // run, and a stop request after it ends the pair), so on a
                // lease loss; its process holds the key, to re-assert it
                // or give it back to Redis (an orphan it remembers), for
                // `exposure`.
                holders.extend(
                    intervals
                        .iter()
                        .filter(|iv| iv.key == key && iv.start < f.from)
                        .max_by_key(|iv| iv.start)
                        .filter(|iv| {
                            iv.end
                                .is_some_and(|e| e <= f.from && f.from - e <= exposure)
                        }),
                );
            }
            f.kind.loses_data()
                && prev < f.from
                && lost_by < t
                && !holders.is_empty()
                && holders
                    .iter()
                    .all(|iv| out_of_reach(iv.pid, lost_by + notice, t.saturating_sub(notice)))
        })
    };
    let runs = final_failures::Runs::of(driver, intervals, faults, options);
    // key → when a dispatch of it was last sent, and when a run of it
    // last finished on its own.
    let mut last_sent: HashMap<&str, u64> = HashMap::new();
    let mut last_finish: HashMap<&str, u64> = HashMap::new();
    let mut last_admit: HashMap<&str, u64> = HashMap::new();
    // key → when its last pair ended (a stop request, a finish).
    let mut pair_ended: HashMap<&str, u64> = HashMap::new();
    // key → dispatches sent and not answered yet.
    let mut in_flight: HashMap<&str, usize> = HashMap::new();
    // key → when its last run failed (restarted by the pool after a backoff).
    let mut last_failed: HashMap<&str, u64> = HashMap::new();
    for (t, r) in driver {
        match r {
            Record::DispatchSent { key } => {
                last_sent.insert(key, *t);
                *in_flight.entry(key).or_default() += 1;
            }
            Record::Exists { key } | Record::DispatchUnknown { key } | Record::Recent { key } => {
                if let Some(n) = in_flight.get_mut(key.as_str()) {
                    *n = n.saturating_sub(1);
                }
            }
            Record::Ended {
                key,
                token,
                outcome,
                ..
            } if outcome == "failed" => {
                last_failed.insert(key, *t);
                if options.final_failures && final_failures::cut_short(key, *token, *t, &runs) {
                    report.final_failures_cut_short += 1;
                    last_admit.remove(key.as_str());
                    pair_ended.insert(key, *t);
                }
            }
            Record::Admit { key, .. } => {
                report.admissions += 1;
                // This admission's run already finished on its own before
                // its `Ok` reached its caller (a run that finished at once,
                // the reply slowed by a fault): a run began after the
                // dispatch was sent and finished since, and none began
                // after that finish. Its pair has ended.
                let sent = last_sent.get(key.as_str()).copied().unwrap_or(0);
                let finish = last_finish.get(key.as_str()).copied();
                let others = in_flight.get_mut(key.as_str()).map_or(0, |n| {
                    *n = n.saturating_sub(1);
                    *n
                });
                if finished_before_its_answer(key, sent, finish, *t, intervals, others > 0) {
                    last_admit.remove(key.as_str());
                    continue;
                }
                if let Some(answered) = last_admit.insert(key, *t) {
                    // The first admission was made in Redis by the time its
                    // `Ok` came back, or by the start of the run it led to,
                    // if sooner: an answer can reach its caller after a
                    // loss the admission itself came before.
                    let since = pair_ended.get(key.as_str()).copied().unwrap_or(0);
                    let prev = intervals
                        .iter()
                        .filter(|iv| iv.key == *key && iv.start > since && iv.start < answered)
                        .map(|iv| iv.start)
                        .min()
                        .unwrap_or(answered);
                    // The second was made after its dispatch was sent:
                    // when the run it led to records its admission (the
                    // job's creation time), then; otherwise by its `Ok` or
                    // by the first run begun since the dispatch was sent,
                    // if sooner. Its answer, and even that run, can come
                    // seconds after it (seed 1541: that run's process was
                    // killed and the key moved on; seed 1542: the start
                    // waited out a recovery after a hand-off).
                    let made = last_sent
                        .get(key.as_str())
                        .and_then(|&sent| admission_made(key, sent, prev, *t, intervals))
                        .unwrap_or(*t);
                    if forgotten_between(key, prev, made)
                        || lost_out_of_reach(key, prev, made)
                        || lost_with_killed_holder(
                            key,
                            (prev, made),
                            last_failed.get(key.as_str()).copied(),
                            intervals,
                            faults,
                            windows,
                        )
                    {
                        report.readmitted_after_loss += 1;
                    } else {
                        report.violations.push(Violation::DoubleAdmission {
                            key: key.clone(),
                            at: (answered, *t),
                        });
                    }
                }
            }
            // A run that finished on its own ends the pair too: the key
            // left the pool (recorded, or about to be).
            Record::StopSent { key } => {
                last_admit.remove(key.as_str());
                pair_ended.insert(key, *t);
            }
            Record::Finished { key, .. } => {
                last_admit.remove(key.as_str());
                pair_ended.insert(key, *t);
                last_finish.insert(key, *t);
            }
            Record::Ended { key, outcome, .. } if outcome == "finished" => {
                last_admit.remove(key.as_str());
                pair_ended.insert(key, *t);
                last_finish.insert(key, *t);
            }
            _ => {}
        }
    }
}

/// What the dispatcher last learnt about a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Running,
    Stopped,
    Unknown,
}

/// The `(failover, exposure, notice)` windows of
/// Whether the admission of `key` whose `Ok` came back at `answered`
/// (its dispatch sent at `sent`) had already finished on its own, the last
/// finish of the key at `finish`: a run began after the dispatch was sent
/// and finished since, and none began after that finish, unless another
/// dispatch of the key was still in flight (`others_in_flight`: that run
/// is its admission's, seed 1472: two dispatches sent at once, the first
/// run finished in 13 ms and the second admission started its run 0.1 ms
/// before the first `Ok` came back).
fn finished_before_its_answer(
    key: &str,
    sent: u64,
    finish: Option<u64>,
    answered: u64,
    intervals: &[Interval],
    others_in_flight: bool,
) -> bool {
    finish.is_some_and(|f| {
        f >= sent
            && intervals
                .iter()
                .any(|iv| iv.key == key && iv.start >= sent && iv.start <= f)
            && (others_in_flight
                || !intervals
                    .iter()
                    .any(|iv| iv.key == key && iv.start > f && iv.start < answered))
    })
}

/// How close before a dispatch was sent an admission may seem made, in
/// ns: the server-time estimate that places it is off by a few ms.
pub(super) const ADMITTED_SLACK: u64 = 20_000_000;

/// When the admission answering a dispatch of `key` sent at `sent` (answered
/// at `answered`; the key's previous admission first ran at `prev`) was
/// made: the earliest admission recorded by a run begun since the dispatch
/// was sent that came after it, else the first such run's start. `None`
/// when no run began since.
fn admission_made(
    key: &str,
    sent: u64,
    prev: u64,
    answered: u64,
    intervals: &[Interval],
) -> Option<u64> {
    intervals
        .iter()
        .filter(|iv| iv.key == key && iv.start > sent.max(prev) && iv.start < answered)
        .filter_map(|iv| match iv.admitted {
            // A run of an older admission (moved since): not this one.
            Some(a) if a + ADMITTED_SLACK < sent => None,
            Some(a) => Some(a.clamp(sent, iv.start)),
            None => Some(iv.start),
        })
        .min()
}

/// [`lost_with_killed_holder`], in ns.
fn killed_holder_windows(options: &CheckOptions) -> (u64, u64, u64) {
    (
        options.failover_within.as_nanos() as u64,
        options.orphan_exposure.as_nanos() as u64,
        options.notice_within.as_nanos() as u64,
    )
}

/// Whether Redis lost `key` between `after` and `before` when no live
/// process held it: the process of its last run before the loss was
/// killed, and the loss came before anything could restart the key
/// elsewhere: within `failover` of the kill when the run went on until the
/// kill (the cleanup moves it), within `exposure` when the run had stopped
/// before on a lease loss (the process held it to re-assert it or give it
/// back to the orphan sweep, which restarts it one grace later). Or the
/// other way round: the run went on through the loss, and its process was
/// killed within `notice` after it (before its next renewal could find the
/// loss and re-assert the key). The same when the run failed before the
/// loss (`failed_at`: the key's last failure) and its process, holding the
/// restart until its backoff ran out, was killed within `notice` after it,
/// or stopped within `exposure` before it and its process, holding the key
/// to re-assert or give back, was killed within `notice` after it.
/// Two faults at once (the process, and Redis's data) take every copy.
fn lost_with_killed_holder(
    key: &str,
    (after, before): (u64, u64),
    failed_at: Option<u64>,
    intervals: &[Interval],
    faults: &[FaultSpan],
    (failover, exposure, notice): (u64, u64, u64),
) -> bool {
    faults
        .iter()
        .filter(|f| f.kind.loses_data() && after < f.from && f.from < before)
        .any(|f| {
            let Some(last) = intervals
                .iter()
                .filter(|iv| iv.key == key && iv.start < f.from)
                .max_by_key(|iv| iv.start)
            else {
                return false;
            };
            // Its process killed after the loss, within `notice` of it and
            // not before `since`, before it could re-assert the key.
            let lost_by = f.to.unwrap_or(f.from);
            let killed_before_notice = |since: u64| {
                faults.iter().any(|k| {
                    k.kind == FaultKind::Kill
                        && k.target == Some(last.pid)
                        && f.from.max(since) <= k.from
                        && k.from <= lost_by + notice
                })
            };
            // Still running at the loss: its process re-asserts it, unless
            // killed before it could.
            let Some(ended) = last.end.filter(|e| *e <= f.from) else {
                return last.end.is_some_and(killed_before_notice);
            };
            // Failed before the loss, its restart waiting out a backoff in
            // its process (seed 1432: Redis restarted empty, the process
            // killed 10 ms later).
            if failed_at == Some(ended) && killed_before_notice(ended) {
                return true;
            }
            let within = |from: u64, to: u64, bound: u64| {
                from <= to && to - from <= bound + stalled(faults, from, to)
            };
            // Stopped on a lease loss before the loss and still held by its
            // process (suspended, or left to the orphan sweep and
            // remembered to give back for `exposure`), which was killed
            // within `notice` after the loss, before it could give the key
            // back again (seed 1471: Redis down 2-3 s, back with the key
            // as an orphan, restarted empty 1.8 s later, and the process
            // killed 156 ms after that).
            if within(ended, f.from, exposure) && killed_before_notice(ended) {
                return true;
            }
            let kills = || faults.iter().filter(|k| k.kind == FaultKind::Kill);
            kills().any(|k| {
                // Stopped before the kill: held for re-assertion, or left
                // to the orphan sweep; running until the kill: the cleanup
                // moves it within the failover bound, counted while Redis
                // takes writes.
                let bound = if ended < k.from { exposure } else { failover };
                k.target == Some(last.pid) && ended <= k.from && within(k.from, f.from, bound)
            }) || kills().any(|k| {
                // Running until its process was killed, then moved by the
                // cleanup to a worker whose process was killed too before
                // it could start it (it looked alive: its keep-alive was
                // younger than a TTL), and lost with Redis's data within
                // the failover bound of that second kill: three faults.
                k.target == Some(last.pid)
                    && ended == k.from
                    && kills().any(|next| {
                        next.target != k.target
                            && within(k.from, next.from, failover)
                            && within(next.from, f.from, failover)
                    })
            })
        })
}

/// How long, between `from` and `to`, Redis took no write (out of memory,
/// read-only, frozen, or down and then recovering: an outage before a
/// kill): stalls that overlap are counted once.
fn stalled(faults: &[FaultSpan], from: u64, to: u64) -> u64 {
    let mut spans: Vec<(u64, u64)> = faults
        .iter()
        .filter(|s| s.kind.stalls_redis() || s.kind == FaultKind::OutageThenKill)
        .map(|s| (s.from.max(from), s.to.unwrap_or(u64::MAX).min(to)))
        .filter(|(a, b)| a < b)
        .collect();
    spans.sort_unstable();
    let (mut total, mut reached) = (0, from);
    for (a, b) in spans {
        let a = a.max(reached);
        if b > a {
            total += b - a;
            reached = b;
        }
    }
    total
}

/// I2 at `end`: a key the dispatcher last saw admitted runs on a live,
/// unpaused process (unless two faults took every copy, counted in
/// `lost_with_killed_holder`); one it last saw stopped runs nowhere
/// (unless a stop asked through a worker process was lost with the
/// processes that knew it, as the stops-hold check excuses: `stops.rs`).
pub(super) fn check_running_at(
    end: u64,
    driver: &[(u64, &Record)],
    intervals: &[Interval],
    faults: &[FaultSpan],
    options: &CheckOptions,
    report: &mut Report,
) {
    let runs = final_failures::Runs::of(driver, intervals, faults, options);
    let mut expect: BTreeMap<&str, (u64, Expect)> = BTreeMap::new();
    // Keys whose final failure a kill cut short, and when.
    let mut cut_short: HashMap<&str, u64> = HashMap::new();
    // `--lifecycle` runs: per key, the last dispatch sent, the last run
    // that finished on its own (reported or recorded) and the last that
    // failed (restarted by the pool after a backoff).
    let mut sent: HashMap<&str, u64> = HashMap::new();
    let mut finished: HashMap<&str, u64> = HashMap::new();
    let mut failed: HashMap<&str, u64> = HashMap::new();
    // Per key, a dispatch sent and not answered by the check instant: a
    // schedule's run still going on then (a schedule keeps running
    // through the recovery window; the driver's load is settled before
    // it), or one whose answer its leader could not record.
    let mut unanswered: HashMap<&str, u64> = HashMap::new();
    // Per key, the last stop sent, and the last answered through a worker
    // process: (that process, when sent, when answered).
    let mut stop_sent: HashMap<&str, u64> = HashMap::new();
    let mut stopped_via: HashMap<&str, (u32, u64, u64)> = HashMap::new();
    for (t, r) in driver {
        if *t > end {
            break;
        }
        if let Record::Admit { key, .. }
        | Record::Exists { key }
        | Record::Recent { key }
        | Record::DispatchUnknown { key }
        | Record::StopSent { key }
        | Record::StopDone { key, .. } = r
        {
            unanswered.remove(key.as_str());
        }
        let (key, e) = match r {
            Record::DispatchSent { key } => {
                sent.insert(key, *t);
                unanswered.insert(key, *t);
                continue;
            }
            // `JobExists` for a dispatch sent before the key finished: the
            // answer is older than the finish, whatever order the two
            // processes wrote them in.
            Record::Exists { key } if finished.get(key.as_str()) > sent.get(key.as_str()) => {
                (key, Expect::Unknown)
            }
            // An admission whose run finished on its own before its `Ok`
            // came back (a run that finished at once): its finish may have
            // been recorded, or lost with Redis's data before it could be.
            Record::Admit { key, .. }
                if finished_before_its_answer(
                    key,
                    sent.get(key.as_str()).copied().unwrap_or(0),
                    finished.get(key.as_str()).copied(),
                    *t,
                    intervals,
                    false,
                ) =>
            {
                (key, Expect::Unknown)
            }
            // Running since the admission was made, which can be well
            // before its `Ok` came back: a data loss that began in between
            // (seed 1573: a rollback begun 0.2 ms before the `Ok` arrived,
            // the run's process killed 10 ms after it) can have taken it.
            Record::Admit { key, .. } => {
                let made = sent
                    .get(key.as_str())
                    .and_then(|&s| admission_made(key, s, 0, *t, intervals))
                    .unwrap_or(*t);
                expect.insert(key.as_str(), (made, Expect::Running));
                continue;
            }
            Record::Exists { key } => (key, Expect::Running),
            // The pool recorded the finish: the key must run nowhere.
            Record::Finished { key, .. } => {
                finished.insert(key, *t);
                (key, Expect::Stopped)
            }
            // Reported: it ends unless the report comes too late (the run
            // was stopped or moved meanwhile) and the pool runs it again.
            Record::Ended { key, outcome, .. } if outcome == "finished" => {
                finished.insert(key, *t);
                (key, Expect::Unknown)
            }
            // A final failure whose log a kill cut short (see
            // `final_failures.rs`): the key left the pool, as on a
            // recorded finish, and must run nowhere.
            Record::Ended {
                key,
                token,
                outcome,
                ..
            } if outcome == "failed"
                && options.final_failures
                && final_failures::cut_short(key, *token, *t, &runs) =>
            {
                expect.insert(key.as_str(), (*t, Expect::Stopped));
                cut_short.insert(key.as_str(), *t);
                continue;
            }
            Record::Ended { key, .. } => {
                failed.insert(key, *t);
                continue;
            }
            // A dispatch of a running key that may or may not have been
            // admitted stops nothing: the key is still expected to run,
            // since its admission (the driver waits for it too).
            Record::DispatchUnknown { key }
                if matches!(expect.get(key.as_str()), Some((_, Expect::Running))) =>
            {
                continue;
            }
            Record::StopSent { key } => {
                stop_sent.insert(key, *t);
                (key, Expect::Unknown)
            }
            Record::DispatchUnknown { key } => (key, Expect::Unknown),
            Record::StopDone { key, outcome, via } if outcome == "ok" || outcome == "not_found" => {
                let asked = stop_sent.get(key.as_str()).copied().unwrap_or(*t);
                match via {
                    Some(via) => stopped_via.insert(key, (*via, asked, *t)),
                    None => stopped_via.remove(key.as_str()),
                };
                (key, Expect::Stopped)
            }
            Record::StopDone { key, .. } => (key, Expect::Unknown),
            _ => continue,
        };
        expect.insert(key.as_str(), (*t, e));
    }
    let paused_at_end = |pid: u32| {
        faults.iter().any(|f| {
            f.kind.pauses_process()
                && f.target == Some(pid)
                && f.from <= end
                && f.to.is_none_or(|t| t > end)
        })
    };
    let mut running: HashMap<&str, Vec<&Interval>> = HashMap::new();
    for iv in intervals {
        if iv.start <= end && iv.end.is_none_or(|e| e > end) && !paused_at_end(iv.pid) {
            running.entry(iv.key.as_str()).or_default().push(iv);
        }
    }
    let windows = killed_holder_windows(options);
    for (key, (since, e)) in expect {
        if matches!(e, Expect::Stopped) && cut_short.get(key) == Some(&since) {
            report
                .left_with_final_failure_cut_short
                .push(key.to_string());
        }
        match e {
            Expect::Running if !running.contains_key(key) => {
                let restarting = failed.get(key).is_some_and(|f| {
                    end.saturating_sub(*f) <= options.restart_within.as_nanos() as u64
                });
                if restarting {
                    report.restarting_at_end += 1;
                } else if lost_with_killed_holder(
                    key,
                    (since, end),
                    failed.get(key).copied(),
                    intervals,
                    faults,
                    windows,
                ) {
                    report.lost_with_killed_holder.push(key.to_string());
                } else {
                    report.violations.push(Violation::NotRunning {
                        key: key.to_string(),
                    })
                }
            }
            // Stopped or finished, then sent again: it may run.
            Expect::Stopped if unanswered.get(key).is_some_and(|at| *at > since) => {}
            Expect::Stopped => {
                let holder = super::finishes::Holder {
                    faults,
                    notice: options.notice_within.as_nanos() as u64,
                };
                let runs: Vec<&Interval> = intervals.iter().filter(|iv| iv.key == key).collect();
                let grace = options.stop_grace.as_nanos() as u64;
                for iv in running.get(key).into_iter().flatten() {
                    let stop = stopped_via.get(key).filter(|(_, _, at)| *at == since);
                    if stop.is_some_and(|stop| {
                        super::stops::lost_with_its_holders(&holder, &runs, *stop, grace, iv)
                    }) {
                        report.stops_lost_with_their_holders += 1;
                        continue;
                    }
                    report.violations.push(Violation::StoppedStillRunning {
                        interval: (*iv).clone(),
                    });
                }
            }
            _ => {}
        }
    }
}
