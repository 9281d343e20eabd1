//! The checker on runs that end on their own (`--lifecycle`): failed runs
//! the pool restarts, finished runs that leave the pool.

use super::*;

fn ended(pid: u32, at: u64, key: &str, worker: &str, token: u64, outcome: &str) -> Line {
    line(
        pid,
        at,
        Record::Ended {
            key: key.into(),
            worker: worker.into(),
            token,
            outcome: outcome.into(),
        },
    )
}

fn finished(pid: u32, at: u64, key: &str, token: u64) -> Line {
    line(
        pid,
        at,
        Record::Finished {
            key: key.into(),
            token,
        },
    )
}

fn at_end(end_ms: u64) -> CheckOptions {
    CheckOptions {
        end_ns: Some(end_ms * MS),
        ..CheckOptions::default()
    }
}

/// A failed run ends its interval; the restart on the same worker is a new
/// one, and a key waiting out its backoff at the end is not lost, while
/// one whose failure is older than the backoff allows is.
#[test]
fn a_failed_run_is_restarted_or_waits_out_its_backoff() {
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "failed"),
        start(10, 60, "k", "a", 2),
        ended(10, 9_000, "k", "a", 2, "failed"),
        start(10, 5, "gone", "a", 1),
        ended(10, 50, "gone", "a", 1, "failed"),
    ];
    let d = vec![admit(1, "k"), admit(1, "gone")];
    let r = check(&[w, d], &at_end(10_000));
    assert_eq!(kinds(&r), vec!["not_running"], "{:?}", r.violations);
    assert!(matches!(&r.violations[0], Violation::NotRunning { key } if key == "gone"));
    assert_eq!(r.restarting_at_end, 1);
    assert_eq!(r.intervals, 3);
}

/// With slow handler starts, a run can fail during its own `start` (its
/// timer runs from the start line), and the pool restarts it only once
/// that start has returned: the backoff window grows by the longest start
/// (slow-start soak, seed 1301: failed 50 ms into a 2.75 s start,
/// restarted 3.7 s after the failure).
#[test]
fn a_run_that_failed_during_a_slow_start_waits_out_its_start_too() {
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "failed"),
    ];
    let d = vec![admit(1, "k")];
    let r = check(&[w.clone(), d.clone()], &at_end(3_800));
    assert_eq!(kinds(&r), vec!["not_running"]);
    let slow_starts = CheckOptions {
        restart_within: crate::lifecycle::restart_within(Duration::from_secs(3)),
        ..at_end(3_800)
    };
    let r = check(&[w, d], &slow_starts);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.restarting_at_end, 1);
}

/// A recorded finish holds like a stop: a run of the key after it, before
/// a new dispatch, is a finish undone; a run after a new dispatch is not.
#[test]
fn a_recorded_finish_must_hold_until_the_next_dispatch() {
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "finished"),
        finished(10, 51, "k", 1),
        start(20, 300, "k", "b", 2),
        stop(20, 400, "k", "b"),
        start(20, 600, "k", "b", 3),
    ];
    let d = vec![admit(1, "k"), dispatch_sent(500, "k"), admit(501, "k")];
    let r = check(&[w, d], &at_end(1_000));
    assert_eq!(kinds(&r), vec!["finish_undone"], "{:?}", r.violations);
    assert_eq!(r.finishes_checked, 1);
    // A dispatch sent between the report and the `finished` line (the pool
    // recorded the end, then logged it) may start the key again.
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "finished"),
        finished(10, 60, "k", 1),
        start(20, 61, "k", "b", 2),
    ];
    let d = vec![admit(1, "k"), dispatch_sent(55, "k"), admit(62, "k")];
    let r = check(&[w.clone(), d], &at_end(1_000));
    assert!(r.ok(), "{:?}", r.violations);
    // ... or sent before the run even ended, racing the first dispatch,
    // and answered `Ok` after the finish.
    let d = vec![
        dispatch_sent(0, "k"),
        dispatch_sent(0, "k"),
        admit(1, "k"),
        admit(62, "k"),
    ];
    let r = check(&[w.clone(), d], &at_end(1_000));
    assert!(r.ok(), "{:?}", r.violations);
    // ... or answered with an error after the finish (its caller gave up:
    // admitted or not, nobody knows; slow-start soak, seed 1302).
    let in_flight = |answered_at: u64| {
        vec![
            dispatch_sent(0, "k"),
            dispatch_sent(0, "k"),
            admit(1, "k"),
            line(1, answered_at, Record::DispatchUnknown { key: "k".into() }),
        ]
    };
    let r = check(&[w.clone(), in_flight(3_000)], &at_end(4_000));
    assert!(r.ok(), "{:?}", r.violations);
    // Answered before the finish: not in flight across it (and the key,
    // finished, still runs at the end).
    let r = check(&[w, in_flight(40)], &at_end(4_000));
    assert_eq!(kinds(&r), vec!["finish_undone", "stopped_running"]);
}

/// A finished key need not run at the end, and must not when the finish
/// was recorded; a second admission after a finish is no double admission;
/// a `JobExists` for a dispatch sent before the finish (written after it)
/// does not expect the key to run.
#[test]
fn a_finished_key_is_not_expected_to_run() {
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "finished"),
        finished(10, 51, "k", 1),
        start(10, 60, "again", "a", 5),
        ended(10, 70, "again", "a", 5, "finished"),
        finished(10, 71, "again", 5),
        start(10, 80, "only_reported", "a", 7),
        ended(10, 90, "only_reported", "a", 7, "finished"),
    ];
    let d = vec![
        admit(1, "k"),
        dispatch_sent(40, "k"),
        line(1, 55, Record::Exists { key: "k".into() }),
        admit(1, "again"),
        dispatch_sent(100, "again"),
        admit(101, "again"),
        admit(1, "only_reported"),
    ];
    let w2 = vec![start(20, 102, "again", "b", 6)];
    let r = check(&[w, w2, d], &at_end(1_000));
    assert!(r.ok(), "{:?}", r.violations);
    // A key whose finish was recorded that runs at the end was stopped in
    // all but name.
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "finished"),
        finished(10, 51, "k", 1),
        start(20, 300, "k", "b", 2),
    ];
    let r = check(&[w, vec![admit(1, "k")]], &at_end(1_000));
    let mut k = kinds(&r);
    k.sort();
    assert_eq!(k, vec!["finish_undone", "stopped_running"]);
}

/// The worker that recorded a finish was killed and then Redis went back to
/// before it: nothing remembers the end, and the run after it is counted.
#[test]
fn a_finish_undone_by_a_kill_and_a_rollback_is_counted() {
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "finished"),
        finished(10, 51, "k", 1),
    ];
    let w2 = vec![start(20, 3_000, "k", "b", 2)];
    let f = vec![
        fault(100, FaultKind::Kill, 10, false),
        untargeted(200, FaultKind::Rollback, false),
        untargeted(210, FaultKind::Rollback, true),
    ];
    let d = vec![admit(1, "k")];
    let r = check(&[w, w2, d, f], &CheckOptions::default());
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.finishes_lost_with_their_holder, 1);
}

/// The worker that recorded a finish is cut off as Redis goes back to
/// before it (and removed while cut off): its memory of the end cannot
/// reach Redis, and the run after it is counted. A finish whose worker
/// stayed in reach must hold.
#[test]
fn a_finish_undone_while_its_holder_was_cut_off_is_counted() {
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "finished"),
        finished(10, 51, "k", 1),
    ];
    let w2 = vec![start(20, 3_000, "k", "b", 2)];
    let d = vec![admit(1, "k")];
    let loss = vec![
        untargeted(200, FaultKind::Rollback, false),
        untargeted(210, FaultKind::Rollback, true),
    ];
    let mut cut = loss.clone();
    cut.extend([
        fault(220, FaultKind::CutRemove, 10, false),
        fault(4_000, FaultKind::CutRemove, 10, true),
    ]);
    let r = check(
        &[w.clone(), w2.clone(), d.clone(), cut],
        &CheckOptions::default(),
    );
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.finishes_lost_with_their_holder, 1);
    let r = check(&[w, w2, d, loss], &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["finish_undone"]);
}

/// A run that finished at once, before the `Ok` of its admission came
/// back, whose end Redis lost before it was recorded (chaos soak seed
/// 1425: ended 14 ms after its start, answered 28 ms after that, a
/// `FLUSHALL` 173 ms later): the key is not expected to run at the end. A
/// run that finished before the dispatch was sent is no such run: the
/// admission's own run is missing.
#[test]
fn an_admission_whose_run_finished_before_its_answer_is_not_expected_to_run() {
    let w = vec![
        start(10, 10, "k", "a", 1),
        ended(10, 24, "k", "a", 1, "finished"),
    ];
    let d = vec![dispatch_sent(0, "k"), admit(52, "k")];
    let f = vec![
        untargeted(225, FaultKind::Flush, false),
        untargeted(226, FaultKind::Flush, true),
    ];
    let r = check(&[w.clone(), d, f.clone()], &at_end(5_000));
    assert!(r.ok(), "{:?}", r.violations);
    let d = vec![dispatch_sent(30, "k"), admit(52, "k")];
    let r = check(&[w, d, f], &at_end(5_000));
    assert_eq!(kinds(&r), vec!["not_running"], "{:?}", r.violations);
}

/// A `cut-one` as Redis goes back to before a finish (chaos soak seed
/// 1424): when the connection cut is the one the holder's commands go on,
/// its renewals fail and it loses its lease during the fault, its memory
/// of the end cannot reach Redis, and a cleanup moves the job: counted.
/// Without a lease loss (another of its connections was cut) the finish
/// must hold.
#[test]
fn a_finish_undone_while_its_holder_could_not_write_is_counted() {
    let w = vec![
        start(10, 5, "k", "a", 1),
        ended(10, 50, "k", "a", 1, "finished"),
        finished(10, 51, "k", 1),
    ];
    let w2 = vec![start(20, 1_100, "k", "b", 2)];
    let d = vec![admit(1, "k")];
    let f = vec![
        untargeted(200, FaultKind::Rollback, false),
        untargeted(210, FaultKind::Rollback, true),
        fault(224, FaultKind::CutOne, 10, false),
        fault(1_430, FaultKind::CutOne, 10, true),
    ];
    let mut lapsed = w.clone();
    lapsed.push(line(10, 566, Record::LeaseLost));
    let r = check(
        &[lapsed, w2.clone(), d.clone(), f.clone()],
        &CheckOptions::default(),
    );
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.finishes_lost_with_their_holder, 1);
    let r = check(&[w, w2, d, f], &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["finish_undone"]);
}

/// A finish recorded between the two rollbacks of a rollback-twice and
/// lost by the second, its worker's link slowed past its lease right
/// after (chaos soak seed 1405): the checker knows the second loss's
/// moment from the rollback the driver records within the fault; the
/// fault's start alone, before the finish, is no loss after it.
#[test]
fn a_finish_lost_by_the_second_rollback_of_two_is_counted() {
    let run = |inner_rollbacks: bool| {
        let w = vec![
            start(10, 5, "k", "a", 1),
            ended(10, 150, "k", "a", 1, "finished"),
            finished(10, 151, "k", 1),
        ];
        let w2 = vec![start(20, 3_000, "k", "b", 2)];
        let d = vec![admit(1, "k")];
        let mut f = vec![untargeted(100, FaultKind::RollbackTwice, false)];
        if inner_rollbacks {
            f.extend([
                untargeted(100, FaultKind::Rollback, false),
                untargeted(110, FaultKind::Rollback, true),
                untargeted(260, FaultKind::Rollback, false),
                untargeted(270, FaultKind::Rollback, true),
            ]);
        }
        f.extend([
            untargeted(271, FaultKind::RollbackTwice, true),
            fault(272, FaultKind::Slow, 10, false),
            fault(1_500, FaultKind::Slow, 10, true),
        ]);
        check(&[w, w2, d, f], &CheckOptions::default())
    };
    let r = run(true);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.finishes_lost_with_their_holder, 1);
    assert_eq!(kinds(&run(false)), vec!["finish_undone"]);
}

/// Two dispatches of a key sent at once: the first is admitted and its run
/// finishes at once, before that admission's `Ok` reaches its caller (a
/// rollback slowed the reply), and the second is admitted after the finish
/// (seed 1407). The key had left the pool between the two admissions: no
/// double admission. Without the finish it is one.
#[test]
fn an_admission_answered_after_its_run_finished_is_not_doubled_by_the_next() {
    let run = |finish: bool| {
        let mut w = vec![start(10, 105, "k", "a", 1)];
        if finish {
            w.extend([
                ended(10, 110, "k", "a", 1, "finished"),
                finished(10, 180, "k", 1),
            ]);
        } else {
            w.push(stop(10, 110, "k", "a"));
        }
        let w2 = vec![start(20, 900, "k", "b", 2)];
        let d = vec![
            dispatch_sent(100, "k"),
            dispatch_sent(100, "k"),
            admit(185, "k"),
            admit(905, "k"),
        ];
        check(&[w, w2, d], &CheckOptions::default())
    };
    let r = run(true);
    assert!(!kinds(&r).contains(&"double"), "{:?}", r.violations);
    assert!(kinds(&run(false)).contains(&"double"));
}

/// The same, with the second admission's run begun 1 ms before the first
/// `Ok` came back (seed 1472: the first run finished within 13 ms): that
/// run is the second dispatch's, still in flight then. With one dispatch
/// sent, a run begun between the finish and the `Ok`, then a second
/// admission, stays a double admission.
#[test]
fn a_racing_admission_s_run_begun_before_the_first_ok_is_not_a_double() {
    let run = |racing: bool| {
        let w = vec![
            start(10, 105, "k", "a", 1),
            ended(10, 110, "k", "a", 1, "finished"),
            finished(10, 180, "k", 1),
        ];
        let w2 = vec![start(20, 184, "k", "b", 2)];
        let mut d = vec![dispatch_sent(100, "k")];
        if racing {
            d.push(dispatch_sent(100, "k"));
        }
        d.push(admit(185, "k"));
        if !racing {
            d.push(dispatch_sent(186, "k"));
        }
        d.push(admit(190, "k"));
        check(&[w, w2, d], &CheckOptions::default())
    };
    let r = run(true);
    assert!(!kinds(&r).contains(&"double"), "{:?}", r.violations);
    assert!(kinds(&run(false)).contains(&"double"));
}

/// A run that failed keeps its key in its process until the backoff runs
/// out and the pool restarts it. Redis restarted empty, and that process
/// killed within the notice window after (seed 1432: 10 ms), took both
/// copies: two faults, counted. A kill long after the loss is not: the
/// process had time to re-assert the key.
#[test]
fn a_failed_run_lost_with_redis_and_its_killed_process_is_counted() {
    let run = |kill_at: u64| {
        let w = vec![
            start(10, 5, "k", "a", 1),
            ended(10, 50, "k", "a", 1, "failed"),
        ];
        let f = vec![
            untargeted(1_000, FaultKind::RestartEmpty, false),
            untargeted(1_020, FaultKind::RestartEmpty, true),
            fault(kill_at, FaultKind::Kill, 10, false),
        ];
        let d = vec![admit(1, "k")];
        check(&[w, d, f], &at_end(10_000))
    };
    let r = run(1_030);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.lost_with_killed_holder, vec!["k".to_string()]);
    let r = run(4_000);
    assert_eq!(kinds(&r), vec!["not_running"], "{:?}", r.violations);
}

/// Two dispatches of "k" sent together (chaos soak seed 1576): the first
/// is admitted and its run finishes at once; the second, still in flight,
/// is admitted as new after that finish and starts a run, which a rollback
/// then takes from Redis; retried, it is answered `JobExists` for that
/// very run. The run's admission stamp, after the finish, shows it comes
/// from the load's dispatch: not a finish undone. A run of the finished
/// admission itself (its stamp from before the finish) is.
#[test]
fn a_run_admitted_after_a_finish_by_a_dispatch_in_flight_is_not_a_finish_undone() {
    let run = |admitted: u64| {
        let w = vec![
            super::tests::start_admitted(10, 5, "k", "a", 1, 2),
            ended(10, 50, "k", "a", 1, "finished"),
            finished(10, 51, "k", 1),
            super::tests::start_admitted(10, 60, "k", "a", 2, admitted),
        ];
        let d = vec![
            dispatch_sent(1, "k"),
            dispatch_sent(1, "k"),
            admit(40, "k"),
            line(1, 900, Record::Exists { key: "k".into() }),
        ];
        check(&[w, d], &at_end(1_000))
    };
    let r = run(58);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.finishes_checked, 1);
    let r = run(2);
    assert_eq!(kinds(&r), vec!["finish_undone"], "{:?}", r.violations);
}

/// A key that fails for good (`--fail-for-good`) fails for the second time
/// in a row, and its process is killed 20 ms later, after the pool recorded
/// the final failure and before it logged it (no `Finished` line): the job
/// left the pool, and the next dispatch is admitted as new (seed 1587,
/// `job-2223`). Not when the run was not a restart of a failed one, when
/// the pool restarted it again (the count was lost), when no kill came, or
/// when the run did not use the final-failure policy.
#[test]
fn a_final_failure_whose_log_a_kill_cut_short_ends_the_pair() {
    let key = "job-2223";
    assert!(crate::lifecycle::fails_for_good(key));
    let run = |first_failed: bool, restarted_again: bool, kill: bool, final_failures: bool| {
        let mut w = vec![start_admitted(10, 110, key, "a", 1, 100)];
        if first_failed {
            w.push(ended(10, 200, key, "a", 1, "failed"));
        } else {
            w.push(stop(10, 200, key, "a"));
        }
        w.extend([
            start_admitted(10, 300, key, "a", 2, 100),
            ended(10, 400, key, "a", 2, "failed"),
        ]);
        if restarted_again {
            w.push(start_admitted(10, 410, key, "a", 3, 100));
        }
        let mut d = vec![dispatch_sent(100, key), admit(150, key)];
        if kill {
            d.push(fault(420, FaultKind::Kill, 10, false));
        }
        d.extend([dispatch_sent(1_000, key), admit(1_050, key)]);
        let w2 = vec![start_admitted(20, 1_020, key, "b", 4, 1_000)];
        check(
            &[w, w2, d],
            &CheckOptions {
                final_failures,
                ..CheckOptions::default()
            },
        )
    };
    let r = run(true, false, true, true);
    assert!(!kinds(&r).contains(&"double"), "{:?}", r.violations);
    assert_eq!(r.final_failures_cut_short, 1);
    for (first_failed, restarted_again, kill, final_failures) in [
        (false, false, true, true),
        (true, true, true, true),
        (true, false, false, true),
        (true, false, true, false),
    ] {
        let r = run(first_failed, restarted_again, kill, final_failures);
        assert!(
            kinds(&r).contains(&"double"),
            "{first_failed} {restarted_again} {kill} {final_failures}: {:?}",
            r.violations
        );
        assert_eq!(r.final_failures_cut_short, 0);
    }
}

/// The same final failure cut short, with no later dispatch: at the end of
/// the run the key must run nowhere, as after a recorded finish, rather
/// than count as lost (chaos soak seed 1621: `job-4148` failed for the
/// second time in a row 2 ms before its process was killed; the cleanup of
/// its worker found nothing of the key, and the end check reported
/// `I2 lost: job-4148 runs nowhere`). Without the kill it is lost.
#[test]
fn a_final_failure_whose_log_a_kill_cut_short_is_not_lost_at_the_end() {
    let key = "job-2223";
    let run = |kill: bool| {
        let w = vec![
            start_admitted(10, 110, key, "a", 1, 100),
            ended(10, 200, key, "a", 1, "failed"),
            start_admitted(10, 300, key, "a", 2, 100),
            ended(10, 400, key, "a", 2, "failed"),
        ];
        let mut d = vec![dispatch_sent(100, key), admit(150, key)];
        if kill {
            d.push(fault(402, FaultKind::Kill, 10, false));
        }
        let options = CheckOptions {
            final_failures: true,
            ..at_end(10_000)
        };
        check(&[w, d], &options)
    };
    let r = run(true);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.final_failures_cut_short, 1);
    assert_eq!(r.left_with_final_failure_cut_short, [key]);
    assert!(r.not_expected_to_run(key));
    let r = run(false);
    assert_eq!(kinds(&r), vec!["not_running"], "{:?}", r.violations);
}
