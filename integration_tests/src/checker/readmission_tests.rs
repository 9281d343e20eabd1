//! The checker's counted exceptions to I3: a key admitted again after a
//! data loss while every holder of it was out of reach, and a key lost
//! with its killed holder and Redis's data (two faults at once).

use super::*;

/// A second admission is not flagged only when Redis lost its data in
/// between while the key ran on the process cut off then, and nowhere
/// else; another process's cut, or a loss outside the two admissions,
/// leaves it a violation.
#[test]
fn a_readmission_after_a_loss_cut_off_from_the_holder_is_counted_not_flagged() {
    for kind in [FaultKind::CutRestartEmpty, FaultKind::CutFlushJoin] {
        readmission_after_a_cut_loss(kind);
    }
}

fn readmission_after_a_cut_loss(kind: FaultKind) {
    let driver = |fault_at: u64, target: u32| {
        vec![
            admit(10, "k"),
            fault(fault_at, kind, target, false),
            fault(fault_at + 40, kind, target, true),
            admit(60, "k"),
        ]
    };
    // "k" ran on process 7 from 12 to 25 (stopped on its lease loss), then
    // on process 8 from 61.
    let workers = vec![
        start(7, 12, "k", "w7", 1),
        stop(7, 25, "k", "w7"),
        start(8, 61, "k", "w8", 2),
    ];
    let r = check(&[driver(20, 7), workers.clone()], &CheckOptions::default());
    assert!(r.ok(), "{kind:?}: {:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    for (at, target) in [(20, 8), (5, 7)] {
        let r = check(
            &[driver(at, target), workers.clone()],
            &CheckOptions::default(),
        );
        assert_eq!(
            kinds(&r),
            vec!["double"],
            "{kind:?}: cut of {target} at {at}"
        );
        assert_eq!(r.readmitted_after_loss, 0);
    }
}

/// Any loss counts the same way when every process that ran the key across
/// it was out of reach from within `notice_within` (667 ms) after the loss
/// until within it before the second admission (chaos soak seed 140,
/// `--overlap`: a rollback, then the holder paused 84 ms later, and the
/// key dispatched again during the pause). A holder out of reach only
/// later, or back in reach long enough to re-assert the key, leaves it a
/// violation.
#[test]
fn a_readmission_while_every_holder_is_out_of_reach_since_a_loss_is_counted() {
    let run = |pause_from: u64, readmit_at: u64| {
        let driver = vec![
            admit(1000, "k"),
            untargeted(3000, FaultKind::Rollback, false),
            untargeted(3020, FaultKind::Rollback, true),
            fault(pause_from, FaultKind::Pause, 7, false),
            fault(6990, FaultKind::Pause, 7, true),
            admit(readmit_at, "k"),
        ];
        // "k" ran on process 7 from 1005 until its watchdog stopped it
        // after SIGCONT, and on process 8 from just before the second
        // admission returned.
        let workers = vec![
            start(7, 1005, "k", "w7", 1),
            stop(7, 7010, "k", "w7"),
            start(8, readmit_at - 2, "k", "w8", 2),
        ];
        check(&[driver, workers], &CheckOptions::default())
    };
    let r = run(3100, 6200);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    // A pause, then at once a cut of the same process (chaos_short with
    // `overlap`): out of reach throughout.
    let mut ledgers = vec![
        vec![
            admit(1000, "k"),
            untargeted(3000, FaultKind::Rollback, false),
            untargeted(3020, FaultKind::Rollback, true),
            fault(3100, FaultKind::Pause, 7, false),
            fault(6990, FaultKind::Pause, 7, true),
            fault(6991, FaultKind::Cut, 7, false),
            fault(11_000, FaultKind::Cut, 7, true),
            admit(9000, "k"),
        ],
        vec![start(7, 1005, "k", "w7", 1), stop(7, 7010, "k", "w7")],
    ];
    ledgers.push(vec![start(8, 8998, "k", "w8", 2)]);
    let r = check(&ledgers, &CheckOptions::default());
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    // The same with the process back for 2 s between the two.
    ledgers[0][5] = fault(8990, FaultKind::Cut, 7, false);
    let r = check(&ledgers, &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["double"]);
    // Paused too late after the loss to have missed it, or back long
    // before the second admission.
    for (pause_from, readmit_at) in [(3800, 6200), (3100, 9000)] {
        let r = run(pause_from, readmit_at);
        assert_eq!(
            kinds(&r),
            vec!["double"],
            "pause from {pause_from}, readmitted at {readmit_at}"
        );
        assert_eq!(r.readmitted_after_loss, 0);
    }
}

/// A frozen Redis answers nobody: a holder cut off since a rollback whose
/// cut heals as Redis is frozen stays out of reach until Redis wakes
/// (`chaos_short_scheduled_jobs`, seed 45: `job-0031`'s holder cut 9.6 ms
/// after a rollback, the cut healed 0.1 ms before a `freeze-redis`, and a
/// dispatch sent during the freeze was the first call Redis took on
/// waking). Redis back for long enough before the second admission leaves
/// it a violation, and so does a freeze with the holder in reach before it.
#[test]
fn a_readmission_while_redis_is_frozen_after_the_holders_cut_is_counted() {
    let run = |cut_heals: u64, freeze_from: u64| {
        let driver = vec![
            admit(1000, "k"),
            untargeted(3000, FaultKind::Rollback, false),
            untargeted(3040, FaultKind::Rollback, true),
            fault(3050, FaultKind::Cut, 7, false),
            fault(cut_heals, FaultKind::Cut, 7, true),
            untargeted(freeze_from, FaultKind::FreezeRedis, false),
            untargeted(freeze_from + 1330, FaultKind::FreezeRedis, true),
            admit(freeze_from + 1335, "k"),
        ];
        // "k" ran on process 7 until its lease lapsed during the cut, and
        // there again from the second admission.
        let workers = vec![
            start(7, 1005, "k", "w7", 1),
            stop(7, 3660, "k", "w7"),
            start(7, freeze_from + 1334, "k", "w7", 2),
        ];
        check(&[driver, workers], &CheckOptions::default())
    };
    let r = run(5070, 5070);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    // Back in reach for 2 s before the freeze, or the freeze over long
    // before the second admission.
    let r = run(5070, 7070);
    assert_eq!(kinds(&r), vec!["double"]);
    let mut late = vec![
        admit(1000, "k"),
        untargeted(3000, FaultKind::Rollback, false),
        untargeted(3040, FaultKind::Rollback, true),
        fault(3050, FaultKind::Cut, 7, false),
        fault(5070, FaultKind::Cut, 7, true),
        untargeted(5070, FaultKind::FreezeRedis, false),
        untargeted(6400, FaultKind::FreezeRedis, true),
        admit(8400, "k"),
    ];
    let workers = vec![
        start(7, 1005, "k", "w7", 1),
        stop(7, 3660, "k", "w7"),
        start(7, 8399, "k", "w7", 2),
    ];
    let r = check(&[late.clone(), workers.clone()], &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["double"]);
    assert_eq!(r.readmitted_after_loss, 0);
    // A freeze is no fault of one process: Redis frozen while the holder
    // was in reach all along excuses nothing.
    late.remove(4);
    late.remove(3);
    let r = check(&[late, workers], &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["double"]);
}

/// A holder paused for a graceful stop (`pause-remove`) is out of reach as
/// a plain pause is (chaos soak seed 471, `--overlap`: an empty restart,
/// the holder paused 1 ms after it and told to stop, the key dispatched
/// again during the pause, before the `SIGCONT`).
#[test]
fn a_readmission_while_the_holder_is_paused_for_a_stop_is_counted() {
    let driver = vec![
        admit(1000, "k"),
        untargeted(3000, FaultKind::RestartEmpty, false),
        untargeted(3020, FaultKind::RestartEmpty, true),
        fault(3021, FaultKind::PauseRemove, 7, false),
        fault(6990, FaultKind::PauseRemove, 7, true),
        fault(6990, FaultKind::RemoveWorker, 7, false),
        fault(7400, FaultKind::RemoveWorker, 7, true),
        admit(6200, "k"),
    ];
    let workers = vec![
        start(7, 1005, "k", "w7", 1),
        stop(7, 7010, "k", "w7"),
        start(8, 6198, "k", "w8", 2),
    ];
    let r = check(&[driver, workers], &CheckOptions::default());
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
}

/// A key whose process stopped it on a lease loss and holds it (to
/// re-assert it, or to give it back to Redis as an orphan it remembers),
/// lost by Redis while that process is out of reach until the key is
/// admitted again, is counted, not flagged (chaos seed 251, the CI overlap
/// configuration: an empty restart 41 ms before a cut of the holder, 8.7 s
/// after its lease-loss stop, the key admitted again during the cut). The
/// holder back in reach long enough, or the loss past the exposure window
/// after the stop, is a violation.
#[test]
fn a_readmission_while_the_process_holding_a_stopped_run_is_out_of_reach_is_counted() {
    let run = |loss_at: u64, cut_from: u64| {
        let driver = vec![
            admit(1000, "k"),
            fault(1500, FaultKind::Cut, 7, false),
            fault(5500, FaultKind::Cut, 7, true),
            untargeted(loss_at, FaultKind::RestartEmpty, false),
            untargeted(loss_at + 15, FaultKind::RestartEmpty, true),
            fault(cut_from, FaultKind::Cut, 7, false),
            fault(cut_from + 4000, FaultKind::Cut, 7, true),
            admit(cut_from + 2000, "k"),
        ];
        // "k" ran on process 7 until its lease lapsed in the first cut.
        let workers = vec![start(7, 998, "k", "w7", 1), stop(7, 2500, "k", "w7")];
        let others = vec![start(8, cut_from + 1998, "k", "w8", 2)];
        check(&[driver, workers, others], &CheckOptions::default())
    };
    let r = run(10_000, 10_040);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    // Back in reach for 3 s after the loss; or the loss 13.5 s after the
    // stop, past the exposure window (6 TTLs of 2 s).
    for (loss_at, cut_from) in [(10_000, 13_000), (16_000, 16_040)] {
        let r = run(loss_at, cut_from);
        assert_eq!(
            kinds(&r),
            vec!["double"],
            "loss at {loss_at}, cut from {cut_from}"
        );
        assert_eq!(r.readmitted_after_loss, 0);
    }
}

/// A key lost with its process (SIGKILL) and Redis's data is counted, not
/// flagged: stopped on a lease loss before the kill and an empty restart
/// 3.4 s after it (chaos soak seed 143 with `--overlap`), or running until
/// the kill and the restart 0.6 s after it (seed 144). A loss long after
/// the kill (past 6 TTLs, or past the failover bound for a key running
/// until the kill), or no kill, is a violation.
#[test]
fn a_key_lost_with_its_killed_holder_and_redis_data_is_counted() {
    let loss = |at: u64| {
        [false, true].map(|end| {
            line(
                1,
                at + u64::from(end) * 20,
                Record::Fault {
                    kind: FaultKind::RestartEmpty,
                    target: None,
                    end,
                },
            )
        })
    };
    let run = |stop_at: Option<u64>, kill_at: Option<u64>, loss_at: u64| {
        let mut driver = vec![admit(1000, "k")];
        if let Some(at) = kill_at {
            driver.push(fault(at, FaultKind::Kill, 7, false));
        }
        driver.extend(loss(loss_at));
        let mut worker = vec![start(7, 1005, "k", "w7", 1)];
        if let Some(at) = stop_at {
            worker.push(stop(7, at, "k", "w7"));
        }
        let options = CheckOptions {
            end_ns: Some(40_000 * MS),
            ..CheckOptions::default()
        };
        check(&[driver, worker], &options)
    };
    // Stopped, then killed, then the loss 3.4 s later; running until the
    // kill, then the loss 0.6 s later (seed 144).
    for (stop_at, loss_at) in [(Some(3000), 8400), (None, 5600)] {
        let r = run(stop_at, Some(5000), loss_at);
        assert!(r.ok(), "{:?}", r.violations);
        assert_eq!(r.lost_with_killed_holder, ["k"]);
    }
    for (stop_at, kill_at, loss_at) in [
        (Some(3000), Some(5000), 18_000), // the loss 13 s after the kill
        (Some(3000), None, 8400),         // its process lives: it gives it back
        (None, Some(5000), 8400),         // running when killed, past 3 s
    ] {
        let r = run(stop_at, kill_at, loss_at);
        assert_eq!(
            kinds(&r),
            vec!["not_running"],
            "stop {stop_at:?}, kill {kill_at:?}, loss {loss_at}"
        );
        assert!(r.lost_with_killed_holder.is_empty());
    }
    // The other order: an empty restart, and 1 ms after it the holder's
    // SIGKILL, before its next renewal could find the loss (seed 230);
    // killed 2 s after the loss, it had time to re-assert the key.
    let loss_then_kill = |kill_at: u64| {
        let mut driver = vec![admit(1000, "k")];
        driver.extend(loss(5000));
        driver.push(fault(kill_at, FaultKind::Kill, 7, false));
        let worker = vec![start(7, 1005, "k", "w7", 1)];
        let options = CheckOptions {
            end_ns: Some(40_000 * MS),
            ..CheckOptions::default()
        };
        check(&[driver, worker], &options)
    };
    let r = loss_then_kill(5021);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.lost_with_killed_holder, ["k"]);
    let r = loss_then_kill(7020);
    assert_eq!(kinds(&r), vec!["not_running"]);
    assert!(r.lost_with_killed_holder.is_empty());
}

/// A dispatch's `Ok` can reach its caller after the loss it survived in
/// the ledger's order only: admitted and started before an empty restart,
/// answered (the answer was on its way) just after Redis went down. The
/// key's run that began before the loss shows the admission came first
/// (chaos_short_jobs_that_fail_and_finish, CI: the holder cut off 1 ms
/// after the restart, the key admitted again once the recovery window
/// closed). Without a run before the loss, the loss is not between the two.
#[test]
fn an_admission_answered_after_the_loss_it_came_before_is_counted() {
    let ledgers = |first_run_at: u64| {
        vec![
            vec![
                dispatch_sent(990, "k"),
                untargeted(1020, FaultKind::RestartEmpty, false),
                admit(1025, "k"),
                untargeted(1050, FaultKind::RestartEmpty, true),
                fault(1051, FaultKind::Cut, 7, false),
                fault(3000, FaultKind::Cut, 7, true),
                admit(2200, "k"),
            ],
            vec![
                start(7, first_run_at, "k", "w7", 1),
                stop(7, 1500, "k", "w7"),
            ],
            vec![start(8, 2195, "k", "w8", 2)],
        ]
    };
    let r = check(&ledgers(1000), &CheckOptions::default());
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    // The run began after Redis came back: the first admission was made
    // on the new server, and the second is a double admission.
    let r = check(&ledgers(1060), &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["double"]);
}

/// A dispatch of a running key whose outcome is unknown (it timed out)
/// leaves the key expected to run: nothing stopped it. Lost with its killed
/// holder and Redis's data, it is counted like any running key; not
/// running at the end otherwise, it is a violation. Before, such a key was
/// expected nothing, so the checker never counted it lost, and the
/// driver, which still waited for it, reported it not recovered (seed
/// 1402: `job-0128`, stopped on a lease loss, its process killed 3 s later
/// and Redis flushed 2.9 s after that).
#[test]
fn a_running_key_stays_expected_through_a_dispatch_of_unknown_outcome() {
    let run = |loss: bool| {
        let mut driver = vec![
            admit(1000, "k"),
            line(1, 2000, Record::DispatchSent { key: "k".into() }),
            line(1, 2003, Record::DispatchUnknown { key: "k".into() }),
            fault(5000, FaultKind::Kill, 7, false),
        ];
        if loss {
            for (at, end) in [(7900, false), (7901, true)] {
                driver.push(line(
                    1,
                    at,
                    Record::Fault {
                        kind: FaultKind::Flush,
                        target: None,
                        end,
                    },
                ));
            }
        }
        let worker = vec![start(7, 1005, "k", "w7", 1), stop(7, 3000, "k", "w7")];
        let options = CheckOptions {
            end_ns: Some(40_000 * MS),
            ..CheckOptions::default()
        };
        check(&[driver, worker], &options)
    };
    let r = run(true);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.lost_with_killed_holder, ["k"]);
    let r = run(false);
    assert_eq!(kinds(&r), vec!["not_running"]);
}

/// A key admitted during a pause-rollback (after its snapshot), lost by
/// the rollback, whose holder went deaf at the rollback, and admitted
/// again by another dispatcher (chaos soak seed 1404, `--overlap`). The
/// checker knows the loss's moment from the rollback the driver records
/// within the pause; the pause's start alone, before the admission, is
/// not a loss between the two admissions.
#[test]
fn a_key_admitted_during_a_pause_rollback_and_lost_by_it_is_counted() {
    let run = |inner_rollback: bool| {
        let mut driver = vec![
            fault(1000, FaultKind::PauseRollback, 9, false),
            admit(2000, "k"),
        ];
        if inner_rollback {
            driver.push(untargeted(2400, FaultKind::Rollback, false));
            driver.push(untargeted(2410, FaultKind::Rollback, true));
        }
        driver.extend([
            fault(2420, FaultKind::PauseRollback, 9, true),
            fault(2421, FaultKind::Deaf, 7, false),
            fault(6000, FaultKind::Deaf, 7, true),
            admit(3800, "k"),
        ]);
        // "k" ran on process 7 from just before the first admission
        // returned until its lease lapsed, deaf; then on process 8.
        let workers = vec![
            start(7, 1998, "k", "w7", 1),
            stop(7, 2900, "k", "w7"),
            start(8, 3798, "k", "w8", 2),
        ];
        check(&[driver, workers], &CheckOptions::default())
    };
    let r = run(true);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    assert_eq!(kinds(&run(false)), vec!["double"]);
}

/// A run stopped on its lease loss stays with its process, suspended or
/// left to the orphan sweep and remembered to give back. Redis lost its
/// data, and that process killed within the notice window after (seed
/// 1471: 156 ms), took both copies: two faults, counted, for the key
/// found running nowhere and for its second admission. A kill long after
/// the loss is not (the process had time to give the key back), nor a run
/// that stopped long before the loss (nothing held it any more).
#[test]
fn a_held_run_lost_with_redis_and_its_process_killed_after_is_counted() {
    let run = |stopped_at: u64, kill_at: u64, readmit: bool| {
        let mut w = vec![start(10, 5, "k", "a", 1), stop(10, stopped_at, "k", "a")];
        let mut d = vec![
            admit(1, "k"),
            untargeted(20_000, FaultKind::RestartEmpty, false),
            untargeted(20_020, FaultKind::RestartEmpty, true),
            fault(kill_at, FaultKind::Kill, 10, false),
        ];
        if readmit {
            d.push(admit(30_000, "k"));
            w.push(start(11, 29_990, "k", "b", 2));
        }
        let end = CheckOptions {
            end_ns: Some(40_000 * MS),
            ..CheckOptions::default()
        };
        check(&[w, d], &end)
    };
    for readmit in [false, true] {
        let r = run(19_000, 20_150, readmit);
        assert!(r.ok(), "readmit {readmit}: {:?}", r.violations);
        if readmit {
            assert_eq!(r.readmitted_after_loss, 1);
        } else {
            assert_eq!(r.lost_with_killed_holder, ["k"]);
        }
    }
    assert_eq!(kinds(&run(19_000, 25_000, false)), ["not_running"]);
    assert_eq!(kinds(&run(19_000, 25_000, true)), ["double"]);
    assert_eq!(kinds(&run(60, 20_150, false)), ["not_running"]);
}

/// A second admission made while the holder was out of reach counts as
/// made then, though its `Ok` came seconds later (seed 1541: a rollback,
/// the holder cut 12 ms after it; the key dispatched again during the cut
/// and started at once on another process, which was killed 14 ms later;
/// the key moved back to the holder, once in reach again, and only that
/// run's start answered the dispatch, 2.2 s after its admission). The
/// first run begun since the dispatch was sent bounds when it was made.
/// With the holder back in reach before the dispatch, it stays a
/// violation.
#[test]
fn a_readmission_answered_after_its_holder_came_back_counts_when_it_was_made() {
    let run = |cut_until: u64| {
        let driver = vec![
            admit(1000, "k"),
            untargeted(3000, FaultKind::Rollback, false),
            untargeted(3046, FaultKind::Rollback, true),
            fault(3058, FaultKind::Cut, 7, false),
            fault(cut_until, FaultKind::Cut, 7, true),
            dispatch_sent(5066, "k"),
            fault(5083, FaultKind::Kill, 8, false),
            admit(7310, "k"),
        ];
        let workers = vec![
            start(7, 1005, "k", "w7", 1),
            stop(7, 3688, "k", "w7"),
            start(7, 7283, "k", "w7", 3),
        ];
        let killed = vec![start(8, 5069, "k", "w8", 2), stop(8, 5083, "k", "w8")];
        check(&[driver, workers, killed], &CheckOptions::default())
    };
    let r = run(5080);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    let r = run(4000);
    assert_eq!(kinds(&r), vec!["double"]);
    assert_eq!(r.readmitted_after_loss, 0);
}

/// The run a second admission led to records when that admission was made
/// (the job's creation time): made while the only holder was cut off, it
/// counts though its run began, and its `Ok` came, after the holder was
/// back (seed 1542: an empty restart, the holder cut 3 ms after it; the
/// key dispatched again during the cut and admitted to another worker,
/// whose start waited out the recovery the holder's return began, then
/// moved back to the holder and ran there 1.1 s after the cut). Made
/// after the holder was back, it stays a violation.
#[test]
fn a_readmission_counts_when_the_admission_its_run_records_was_made() {
    let run = |admitted: u64| {
        let driver = vec![
            admit(1000, "k"),
            untargeted(3000, FaultKind::RestartEmpty, false),
            untargeted(3022, FaultKind::RestartEmpty, true),
            fault(3025, FaultKind::Cut, 7, false),
            fault(5025, FaultKind::Cut, 7, true),
            dispatch_sent(4754, "k"),
            admit(6180, "k"),
        ];
        let workers = vec![
            start(7, 1005, "k", "w7", 1),
            stop(7, 3650, "k", "w7"),
            start_admitted(7, 6144, "k", "w7", 2, admitted),
        ];
        check(&[driver, workers], &CheckOptions::default())
    };
    let r = run(4755);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    let r = run(6132);
    assert_eq!(kinds(&r), vec!["double"]);
    assert_eq!(r.readmitted_after_loss, 0);
    // A run of the first admission, moved since, does not place the second.
    let r = run(1000);
    assert_eq!(kinds(&r), vec!["double"]);
}

/// Chaos soak seed 1572: Redis went back in time, and 20 ms later a
/// `cut-one` failed one connection of the only process that ran "k"; it
/// was the connection the process's commands go on (its lease lapsed
/// during the cut), so the process could not re-assert "k", and the load
/// dispatched it again before the heal: counted, as under a `cut`. When
/// the process kept its lease (another of its connections was cut), it
/// could re-assert the key, and the second admission stays a violation.
#[test]
fn a_readmission_while_a_cut_one_cost_the_holder_its_lease_is_counted() {
    let run = |lease_lost: bool| {
        let driver = vec![
            admit(1000, "k"),
            untargeted(3000, FaultKind::Rollback, false),
            untargeted(3020, FaultKind::Rollback, true),
            fault(3040, FaultKind::CutOne, 7, false),
            admit(3900, "k"),
            fault(4240, FaultKind::CutOne, 7, true),
        ];
        let mut holder = vec![start(7, 1005, "k", "w7", 1)];
        if lease_lost {
            holder.push(tests::line(7, 3340, Record::LeaseLost));
        }
        holder.push(stop(7, 3341, "k", "w7"));
        let other = vec![start(8, 3898, "k", "w8", 2)];
        check(&[driver, holder, other], &CheckOptions::default())
    };
    let r = run(true);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    let r = run(false);
    assert_eq!(kinds(&r), vec!["double"], "{:?}", r.violations);
}
