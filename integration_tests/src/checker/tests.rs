//! Unit tests of the checker on synthetic ledgers (times in ms).

use super::*;

const MS: u64 = 1_000_000;

fn line(pid: u32, at_ms: u64, record: Record) -> Line {
    Line {
        pid,
        mono_ns: at_ms * MS,
        server_us: at_ms * 1_000,
        record,
    }
}
pub(super) fn start(pid: u32, at: u64, key: &str, worker: &str, token: u64) -> Line {
    line(
        pid,
        at,
        Record::Start {
            key: key.into(),
            token,
            worker: worker.into(),
        },
    )
}
pub(super) fn stop(pid: u32, at: u64, key: &str, worker: &str) -> Line {
    line(
        pid,
        at,
        Record::Stop {
            key: key.into(),
            worker: worker.into(),
        },
    )
}
pub(super) fn fault(at: u64, kind: FaultKind, target: u32, end: bool) -> Line {
    line(
        1,
        at,
        Record::Fault {
            kind,
            target: Some(target),
            end,
        },
    )
}
/// A fault on Redis (no target process), in the driver's ledger.
pub(super) fn untargeted(at: u64, kind: FaultKind, end: bool) -> Line {
    line(
        1,
        at,
        Record::Fault {
            kind,
            target: None,
            end,
        },
    )
}

fn dispatch_sent(at: u64, key: &str) -> Line {
    line(1, at, Record::DispatchSent { key: key.into() })
}

pub(super) fn admit(at: u64, key: &str) -> Line {
    line(
        1,
        at,
        Record::Admit {
            key: key.into(),
            node: "d".into(),
        },
    )
}
fn ring(pid: u32, at: u64, workers: &[&str]) -> Line {
    line(
        pid,
        at,
        Record::Ring {
            workers: workers.iter().map(|w| w.to_string()).collect(),
        },
    )
}

pub(super) fn kinds(report: &Report) -> Vec<&'static str> {
    report
        .violations
        .iter()
        .map(|v| match v {
            Violation::Overlap { .. } => "overlap",
            Violation::PausedOwnerNotFenced { .. } => "paused",
            Violation::NotRunning { .. } => "not_running",
            Violation::StoppedStillRunning { .. } => "stopped_running",
            Violation::DoubleAdmission { .. } => "double",
            Violation::NeedlessMove { .. } => "needless",
            Violation::StopUndone { .. } => "stop_undone",
        })
        .collect()
}

#[test]
fn clean_handoff_passes() {
    let a = vec![start(10, 100, "k", "a", 1), stop(10, 200, "k", "a")];
    let b = vec![start(20, 201, "k", "b", 2)];
    let d = vec![admit(101, "k")];
    let r = check(
        &[a, b, d],
        &CheckOptions {
            end_ns: Some(300 * MS),
            ..CheckOptions::default()
        },
    );
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!((r.intervals, r.admissions), (2, 1));
}

#[test]
fn overlap_is_reported_in_both_time_bases() {
    let a = vec![start(10, 100, "k", "a", 1), stop(10, 250, "k", "a")];
    let b = vec![start(20, 200, "k", "b", 2)];
    for time_base in [TimeBase::Monotonic, TimeBase::Server] {
        let r = check(
            &[a.clone(), b.clone()],
            &CheckOptions {
                time_base,
                ..CheckOptions::default()
            },
        );
        assert_eq!(kinds(&r), vec!["overlap"]);
    }
    // Within the tolerance it is not.
    let r = check(
        &[a, b],
        &CheckOptions {
            tolerance: Duration::from_millis(60),
            ..CheckOptions::default()
        },
    );
    assert!(r.ok());
}

#[test]
fn open_interval_of_a_killed_process_ends_at_the_kill() {
    let a = vec![start(10, 100, "k", "a", 1)]; // never stopped: SIGKILLed
    let b = vec![start(20, 2500, "k", "b", 2)];
    let killed = vec![fault(2000, FaultKind::Kill, 10, false)];
    assert!(check(&[a.clone(), b.clone(), killed], &CheckOptions::default()).ok());
    // Killed after the other start: overlap.
    let late = vec![fault(3000, FaultKind::Kill, 10, false)];
    assert_eq!(
        kinds(&check(
            &[a.clone(), b.clone(), late],
            &CheckOptions::default()
        )),
        vec!["overlap"]
    );
    // Not killed at all: overlap (open forever).
    assert_eq!(
        kinds(&check(&[a, b], &CheckOptions::default())),
        vec!["overlap"]
    );
}

#[test]
fn paused_owner_stopped_by_the_watchdog_on_resume_is_accepted_when_fenced() {
    // Paused at 1000 for 3 s; another worker took the job at 3000 with a
    // higher token; the watchdog stopped it 5 ms after SIGCONT. A pause
    // with a rollback meanwhile is a pause too.
    let a = vec![start(10, 100, "k", "a", 1), stop(10, 4005, "k", "a")];
    let b = vec![start(20, 3000, "k", "b", 2)];
    for kind in [FaultKind::PauseRollback, FaultKind::Pause] {
        let f = vec![fault(1000, kind, 10, false), fault(4000, kind, 10, true)];
        let r = check(&[a.clone(), b.clone(), f], &CheckOptions::default());
        assert!(r.ok(), "{kind:?}: {:?}", r.violations);
        assert_eq!(r.stale_windows, 1);
        assert_eq!(r.worst_stale_window_ns, 5 * MS);
    }
    let f = vec![
        fault(1000, FaultKind::Pause, 10, false),
        fault(4000, FaultKind::Pause, 10, true),
    ];

    // Still running 2 s after SIGCONT: the watchdog did not act.
    let slow = vec![start(10, 100, "k", "a", 1), stop(10, 6000, "k", "a")];
    let r = check(&[slow, b, f.clone()], &CheckOptions::default());
    assert!(kinds(&r).contains(&"paused"), "{:?}", r.violations);

    // The newer run has a lower token: no fencing could reject the stale owner.
    let a = vec![start(10, 100, "k", "a", 5), stop(10, 4005, "k", "a")];
    let b = vec![start(20, 3000, "k", "b", 2)];
    let r = check(&[a, b, f], &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["paused"]);
}

#[test]
fn start_recorded_just_after_the_pause_record_ran_into_the_pause() {
    // SIGSTOP was sent at 1000, but the target's own ledger shows a start
    // at 1001 (kill returns before every thread stopped): that run was in
    // the process when it stopped, so it is a stale window like any other.
    let f = vec![
        fault(1000, FaultKind::Pause, 10, false),
        fault(4000, FaultKind::Pause, 10, true),
    ];
    let a = vec![start(10, 1001, "k", "a", 1), stop(10, 4005, "k", "a")];
    let b = vec![start(20, 3000, "k", "b", 2)];
    let r = check(&[a, b, f.clone()], &CheckOptions::default());
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.stale_windows, 1);

    // Unless the run that overlaps it has no higher token.
    let a = vec![start(10, 1001, "k", "a", 5), stop(10, 4005, "k", "a")];
    let b = vec![start(20, 3000, "k", "b", 2)];
    assert_eq!(
        kinds(&check(&[a, b, f], &CheckOptions::default())),
        vec!["paused"]
    );
}

#[test]
fn short_pause_is_not_excused() {
    // A pause shorter than the lease: the job legitimately stays, so a
    // concurrent start elsewhere is a plain overlap.
    let a = vec![start(10, 100, "k", "a", 1), stop(10, 1600, "k", "a")];
    let b = vec![start(20, 1200, "k", "b", 2)];
    let f = vec![
        fault(1000, FaultKind::Pause, 10, false),
        fault(1500, FaultKind::Pause, 10, true),
    ];
    assert_eq!(
        kinds(&check(&[a, b, f], &CheckOptions::default())),
        vec!["overlap"]
    );
}

#[test]
fn lost_and_leaked_jobs_are_reported_at_the_end() {
    let d = vec![
        admit(10, "lost"),
        admit(10, "ok"),
        admit(10, "stopped"),
        line(
            1,
            20,
            Record::StopSent {
                key: "stopped".into(),
            },
        ),
        line(
            1,
            30,
            Record::StopDone {
                key: "stopped".into(),
                outcome: "ok".into(),
            },
        ),
        admit(10, "unknown"),
        line(
            1,
            20,
            Record::StopSent {
                key: "unknown".into(),
            },
        ),
        line(
            1,
            30,
            Record::StopDone {
                key: "unknown".into(),
                outcome: "unknown".into(),
            },
        ),
    ];
    let w = vec![
        start(10, 5, "lost", "a", 1),
        stop(10, 50, "lost", "a"),
        start(10, 5, "ok", "a", 1),
        start(10, 5, "stopped", "a", 1),
    ];
    let r = check(
        &[w, d],
        &CheckOptions {
            end_ns: Some(100 * MS),
            ..CheckOptions::default()
        },
    );
    let mut k = kinds(&r);
    k.sort();
    assert_eq!(k, vec!["not_running", "stopped_running"]);
}

#[test]
fn jobs_on_a_paused_process_do_not_count_as_running() {
    let d = vec![admit(10, "k")];
    let w = vec![start(10, 5, "k", "a", 1)];
    let f = vec![fault(50, FaultKind::Pause, 10, false)];
    let r = check(
        &[w, d, f],
        &CheckOptions {
            end_ns: Some(100 * MS),
            ..CheckOptions::default()
        },
    );
    assert_eq!(kinds(&r), vec!["not_running"]);
}

#[test]
fn double_admission_needs_a_stop_between() {
    let ok = vec![
        admit(10, "k"),
        line(1, 20, Record::StopSent { key: "k".into() }),
        admit(30, "k"),
    ];
    assert!(check(&[ok], &CheckOptions::default()).ok());
    let bad = vec![admit(10, "k"), admit(11, "k")];
    assert_eq!(
        kinds(&check(&[bad], &CheckOptions::default())),
        vec!["double"]
    );
}

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

/// A pause that starts 2 ms after the last one's SIGCONT (faults during
/// recoveries): the watchdog has its grace after the second SIGCONT, not
/// the first, since the process ran for 2 ms in between.
#[test]
fn back_to_back_pauses_give_the_watchdog_its_grace_after_the_last() {
    let faults = vec![
        fault(1000, FaultKind::Pause, 10, false),
        fault(5000, FaultKind::Pause, 10, true),
        fault(5002, FaultKind::PauseRollback, 10, false),
        fault(9000, FaultKind::PauseRollback, 10, true),
    ];
    let run = |stopped_at: u64| {
        let a = vec![start(10, 100, "k", "a", 1), stop(10, stopped_at, "k", "a")];
        let b = vec![start(20, 3000, "k", "b", 2)];
        check(&[a, b, faults.clone()], &CheckOptions::default())
    };
    let r = run(9002);
    assert!(r.ok(), "{:?}", r.violations);
    // Past the grace after the last SIGCONT: not stopped by the watchdog
    // (and so overlapping b's run).
    assert_eq!(kinds(&run(10_500)), vec!["paused", "overlap"]);
}

#[test]
fn moves_must_follow_the_ring() {
    // Find a key that "a" owns among {a, b} and keeps when c joins, and one
    // that moves to c.
    let before = Ring::new(["a", "b"]);
    let after = Ring::new(["a", "b", "c"]);
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let stays = keys
        .iter()
        .find(|k| before.owner(k) == Some("a") && after.owner(k) == Some("a"))
        .unwrap();
    let moves = keys
        .iter()
        .find(|k| before.owner(k) == Some("a") && after.owner(k) == Some("c"))
        .unwrap();
    let w = vec![
        ring(10, 0, &["a", "b"]),
        start(10, 10, stays, "a", 1),
        start(10, 10, moves, "a", 1),
        ring(10, 5000, &["a", "b", "c"]),
        stop(10, 5010, moves, "a"),
    ];
    let r = check(std::slice::from_ref(&w), &CheckOptions::default());
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.moves_checked, 1);

    let mut bad = w.clone();
    bad.push(stop(10, 5020, stays, "a"));
    assert_eq!(
        kinds(&check(&[bad.clone()], &CheckOptions::default())),
        vec!["needless"]
    );

    // The same stop is excused by a requested stop or by lease loss.
    let d = vec![
        line(1, 5015, Record::StopSent { key: stays.clone() }),
        line(
            1,
            5030,
            Record::StopDone {
                key: stays.clone(),
                outcome: "ok".into(),
            },
        ),
    ];
    assert!(check(&[bad.clone(), d], &CheckOptions::default()).ok());
    let mut lease = bad;
    lease.insert(4, line(10, 5001, Record::LeaseLost));
    assert!(check(&[lease], &CheckOptions::default()).ok());
}

fn stop_done(at: u64, key: &str, outcome: &str) -> Line {
    line(
        1,
        at,
        Record::StopDone {
            key: key.into(),
            outcome: outcome.into(),
        },
    )
}

#[test]
fn a_stop_answer_must_hold_until_the_next_dispatch() {
    // "nf": JobNotFound while the job ran on; "undone": stopped, then it
    // came back on another worker with no dispatch; "fine": stopped, then
    // dispatched again and running; "late": the stop record trails the
    // answer by less than the grace.
    let d = vec![
        admit(10, "nf"),
        stop_done(100, "nf", "not_found"),
        admit(10, "undone"),
        stop_done(100, "undone", "ok"),
        admit(10, "fine"),
        line(1, 50, Record::StopSent { key: "fine".into() }),
        stop_done(100, "fine", "ok"),
        dispatch_sent(3_000, "fine"),
        admit(3_020, "fine"),
        admit(10, "late"),
        stop_done(100, "late", "ok"),
    ];
    let w = vec![
        start(10, 20, "nf", "a", 1),
        stop(10, 4_000, "nf", "a"),
        start(10, 20, "undone", "a", 1),
        stop(10, 90, "undone", "a"),
        start(11, 2_000, "undone", "b", 2),
        stop(11, 2_500, "undone", "b"),
        start(10, 20, "fine", "a", 1),
        stop(10, 90, "fine", "a"),
        start(11, 3_010, "fine", "b", 2),
        start(10, 20, "late", "a", 1),
        stop(10, 400, "late", "a"),
    ];
    let r = check(
        &[w, d],
        &CheckOptions {
            end_ns: Some(5_000 * MS),
            ..CheckOptions::default()
        },
    );
    let undone: Vec<&str> = r
        .violations
        .iter()
        .filter_map(|v| match v {
            Violation::StopUndone { interval, .. } => Some(interval.key.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(undone, vec!["nf", "undone"], "{:?}", r.violations);
    assert_eq!(r.stops_checked, 4);
    assert_eq!(kinds(&r), vec!["stop_undone", "stop_undone"]);
}
