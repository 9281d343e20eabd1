//! A data loss inside a cut fault (`cut-empty`, `cut-rollback`,
//! `cut-flush-join`): the driver records the loss as a fault of its own,
//! so the checker knows when Redis lost its data, not only that it had by
//! the heal (times in ms).

use super::tests::{admit, dispatch_sent, fault, kinds, start, start_admitted, stop, untargeted};

const MS: u64 = 1_000_000;
use super::*;

/// Chaos soak 804 (`cut-flush-join,cut-empty,flush,remove,stop-leave`):
/// process 7 ran "k" until it handed it off (a stop without a request) to a
/// worker that was gone, so it remembered "k" to give it back. It was cut
/// off 9.2 s later, Redis restarted empty during the cut, and the key was
/// dispatched again before the heal. Nothing reachable knew the key: the
/// second admission is counted, not flagged, once the checker knows when
/// the loss happened. Without that record it took the heal as the loss,
/// after the second admission, and flagged it.
#[test]
fn a_readmission_after_a_loss_inside_a_cut_of_the_only_holder_is_counted() {
    let ledgers = |loss_recorded: bool, cut: u32| {
        let mut driver = vec![
            admit(10_000, "k"),
            fault(29_200, FaultKind::CutRestartEmpty, cut, false),
        ];
        if loss_recorded {
            driver.push(untargeted(30_000, FaultKind::RestartEmpty, false));
            driver.push(untargeted(30_050, FaultKind::RestartEmpty, true));
        }
        driver.push(admit(32_800, "k"));
        driver.push(fault(33_200, FaultKind::CutRestartEmpty, cut, true));
        let workers = vec![
            start(7, 10_010, "k", "w7", 1),
            stop(7, 20_000, "k", "w7"),
            start(8, 32_810, "k", "w8", 2),
        ];
        vec![driver, workers]
    };
    let r = check(&ledgers(true, 7), &CheckOptions::default());
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.readmitted_after_loss, 1);
    let r = check(&ledgers(false, 7), &CheckOptions::default());
    assert_eq!(
        kinds(&r),
        vec!["double"],
        "the loss not known within the cut"
    );
    // Another process cut off: process 7 could have given the key back.
    let r = check(&ledgers(true, 9), &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["double"], "the holder in reach");
}

/// A worker killed, then Redis refusing writes (no cleanup can move its
/// jobs), then Redis losing its data: the failover bound runs only while
/// Redis takes writes, so the key lost with the killed process is counted
/// (three faults took every copy), not flagged. Without the stall it is a
/// loss.
#[test]
fn a_failover_stalled_by_refused_writes_extends_the_two_fault_window() {
    let w = vec![start(10, 5, "k", "a", 1)];
    let d = vec![admit(6, "k")];
    let stalled = vec![
        fault(1_000, FaultKind::Kill, 10, false),
        untargeted(1_100, FaultKind::OutOfMemory, false),
        untargeted(5_000, FaultKind::OutOfMemory, true),
        untargeted(5_100, FaultKind::RestartEmpty, false),
        untargeted(5_120, FaultKind::RestartEmpty, true),
    ];
    let r = check(
        &[w.clone(), d.clone(), stalled],
        &CheckOptions {
            end_ns: Some(20_000 * MS),
            ..CheckOptions::default()
        },
    );
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.lost_with_killed_holder, vec!["k".to_string()]);
    let not_stalled = vec![
        fault(1_000, FaultKind::Kill, 10, false),
        untargeted(5_100, FaultKind::RestartEmpty, false),
        untargeted(5_120, FaultKind::RestartEmpty, true),
    ];
    let r = check(
        &[w, d, not_stalled],
        &CheckOptions {
            end_ns: Some(20_000 * MS),
            ..CheckOptions::default()
        },
    );
    assert_eq!(kinds(&r), vec!["not_running"]);
}

/// A worker killed while it ran "k"; its cleanup moved "k" to a worker
/// whose process had been killed too, 0.7 s before the move (its
/// keep-alive still young), which never started it; Redis then lost its
/// data 0.8 s after: three faults took every copy, counted. The same loss
/// with no second kill is flagged (the cleanup's target was alive).
#[test]
fn a_job_moved_to_a_worker_killed_before_it_started_it_is_counted() {
    let w = vec![start(10, 5, "k", "a", 1)];
    let w2 = vec![start(20, 5, "other", "b", 1)];
    let d = vec![admit(6, "k")];
    let end = CheckOptions {
        end_ns: Some(30_000 * MS),
        ..CheckOptions::default()
    };
    let mut faults = vec![
        fault(1_000, FaultKind::Kill, 10, false),
        untargeted(4_800, FaultKind::Flush, false),
        untargeted(4_801, FaultKind::Flush, true),
    ];
    let r = check(&[w.clone(), w2.clone(), d.clone(), faults.clone()], &end);
    assert_eq!(kinds(&r), vec!["not_running"]);
    faults.push(fault(3_300, FaultKind::Kill, 20, false));
    let r = check(&[w, w2, d, faults], &end);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.lost_with_killed_holder, vec!["k".to_string()]);
}

/// Chaos soak seed 1573: a dispatch admitted and started at once, a
/// rollback begun just before its `Ok` came back (Redis went back to before
/// the admission), and the run's process killed 10 ms after the rollback,
/// before it could re-assert the key: two faults took every copy, counted.
/// The loss is judged from when the admission was made, not from its `Ok`.
/// The same kill a second after the rollback is flagged: the process had
/// time to re-assert the key.
#[test]
fn a_loss_begun_between_an_admission_and_its_ok_counts_with_a_killed_holder() {
    let run = |kill_at: u64| {
        let w = vec![start_admitted(10, 102, "k", "a", 1, 101)];
        let d = vec![
            dispatch_sent(100, "k"),
            untargeted(150, FaultKind::Rollback, false),
            admit(151, "k"),
            untargeted(190, FaultKind::Rollback, true),
            fault(kill_at, FaultKind::Kill, 10, false),
        ];
        let end = CheckOptions {
            end_ns: Some(20_000 * MS),
            ..CheckOptions::default()
        };
        check(&[w, d], &end)
    };
    let r = run(200);
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.lost_with_killed_holder, vec!["k".to_string()]);
    let r = run(1_500);
    assert_eq!(kinds(&r), vec!["not_running"], "{:?}", r.violations);
}

/// Chaos soak seed 1624 (`--requests-from-workers`): a stop of "k" asked
/// through a worker process's node, answered `Ok`; Redis went back to
/// before it, and the process was killed 38 ms later. When that process
/// both asked for the stop and ran the run it stopped, nothing else
/// remembered the stop: the runs after it are counted, not flagged. The
/// same stop asked by a dispatching node, or by a process that stayed up,
/// must hold.
#[test]
fn a_stop_undone_with_the_process_that_asked_and_stopped_killed_is_counted() {
    let stop_done = |via: Option<u32>| {
        super::tests::line(
            1,
            60,
            Record::StopDone {
                key: "k".into(),
                outcome: "ok".into(),
                via,
            },
        )
    };
    let sent = super::tests::line(1, 40, Record::StopSent { key: "k".into() });
    let held = vec![start(10, 5, "k", "a", 1), stop(10, 50, "k", "a")];
    let again = vec![start(20, 3_000, "k", "b", 2)];
    let loss_and_kill = vec![
        untargeted(200, FaultKind::Rollback, false),
        untargeted(230, FaultKind::Rollback, true),
        fault(268, FaultKind::Kill, 10, false),
    ];
    let driver = |via| vec![admit(1, "k"), sent.clone(), stop_done(via)];
    let r = check(
        &[
            held.clone(),
            again.clone(),
            driver(Some(10)),
            loss_and_kill.clone(),
        ],
        &CheckOptions::default(),
    );
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.stops_lost_with_their_holders, 1);
    // A dispatching node asked: it makes the stop stand again.
    let r = check(
        &[
            held.clone(),
            again.clone(),
            driver(None),
            loss_and_kill.clone(),
        ],
        &CheckOptions::default(),
    );
    assert_eq!(kinds(&r), vec!["stop_undone"]);
    // Another process asked, and it stayed up.
    let r = check(
        &[
            held.clone(),
            again.clone(),
            driver(Some(30)),
            loss_and_kill.clone(),
        ],
        &CheckOptions::default(),
    );
    assert_eq!(kinds(&r), vec!["stop_undone"]);
    // The process that asked was killed, the one that stopped the run was
    // not: its stop tombstone makes the stop stand again.
    let kill_asker = vec![
        untargeted(200, FaultKind::Rollback, false),
        untargeted(230, FaultKind::Rollback, true),
        fault(268, FaultKind::Kill, 30, false),
    ];
    let r = check(
        &[held.clone(), again.clone(), driver(Some(30)), kill_asker],
        &CheckOptions::default(),
    );
    assert_eq!(kinds(&r), vec!["stop_undone"]);
    // The run after it still open at the I2 check instant (chaos soak seed
    // 1649: a `loss-kill`, the process killed 3.5 ms after the rollback
    // ended): the I2 check counts it as the stops check does, and flags
    // it when a dispatching node asked.
    let end = CheckOptions {
        end_ns: Some(10_000 * MS),
        ..CheckOptions::default()
    };
    let r = check(
        &[
            held.clone(),
            again.clone(),
            driver(Some(10)),
            loss_and_kill.clone(),
        ],
        &end,
    );
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.stops_lost_with_their_holders, 1);
    let r = check(&[held, again, driver(None), loss_and_kill], &end);
    assert_eq!(kinds(&r), vec!["stopped_running"]);
}
