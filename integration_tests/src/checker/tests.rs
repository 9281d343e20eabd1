//! Unit tests of the checker on synthetic ledgers (times in ms).

use super::*;

const MS: u64 = 1_000_000;

pub(super) fn line(pid: u32, at_ms: u64, record: Record) -> Line {
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
            admitted_ms: None,
        },
    )
}
/// A start whose run comes from an admission made at `admitted` (ms).
pub(super) fn start_admitted(
    pid: u32,
    at: u64,
    key: &str,
    worker: &str,
    token: u64,
    admitted: u64,
) -> Line {
    let mut line = start(pid, at, key, worker, token);
    if let Record::Start { admitted_ms, .. } = &mut line.record {
        *admitted_ms = Some(admitted);
    }
    line
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

pub(super) fn dispatch_sent(at: u64, key: &str) -> Line {
    line(1, at, Record::DispatchSent { key: key.into() })
}

pub(super) fn admit(at: u64, key: &str) -> Line {
    line(
        1,
        at,
        Record::Admit {
            key: key.into(),
            node: "d".into(),
            window_ms: None,
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
            Violation::FinishUndone { .. } => "finish_undone",
            Violation::WindowBroken { .. } => "window_broken",
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
                via: None,
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
                via: None,
            },
        ),
    ];
    let w = vec![
        start(10, 5, "lost", "a", 1),
        stop(10, 50, "lost", "a"),
        start(10, 5, "ok", "a", 1),
        start(10, 5, "stopped", "a", 1),
    ];
    let r = check(&[w, d], &ending_at_100_ms());
    let mut k = kinds(&r);
    k.sort();
    assert_eq!(k, vec!["not_running", "stopped_running"]);
}

#[test]
fn jobs_on_a_paused_process_do_not_count_as_running() {
    let d = vec![admit(10, "k")];
    let w = vec![start(10, 5, "k", "a", 1)];
    let f = vec![fault(50, FaultKind::Pause, 10, false)];
    let r = check(&[w, d, f], &ending_at_100_ms());
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
                via: None,
            },
        ),
    ];
    assert!(check(&[bad.clone(), d], &CheckOptions::default()).ok());
    let mut lease = bad.clone();
    lease.insert(4, line(10, 5001, Record::LeaseLost));
    assert!(check(&[lease], &CheckOptions::default()).ok());

    // A loss of Redis's data disturbs every process, whichever process
    // the fault also paused or cut off (slow-start soak, seed 1301: a
    // fresh start's claim found its admission rolled back while another
    // process was paused, and the start was undone); a fault that only
    // paused another process does not.
    let other = |kind| vec![fault(4990, kind, 11, false), fault(6000, kind, 11, true)];
    assert!(
        check(
            &[bad.clone(), other(FaultKind::PauseRollback)],
            &CheckOptions::default()
        )
        .ok()
    );
    assert_eq!(
        kinds(&check(
            &[bad.clone(), other(FaultKind::Pause)],
            &CheckOptions::default()
        )),
        vec!["needless"]
    );

    // A stop whose caller gave up (outcome unknown) excuses the stop it
    // asked for carried out later (slow-start soak, seed 1201: 2.1 s after
    // the answer), until the key is admitted again.
    let gave_up = |admitted_again: Option<u64>| {
        let mut d = vec![
            line(1, 4000, Record::StopSent { key: stays.clone() }),
            stop_done(4500, stays, "unknown"),
        ];
        d.extend(admitted_again.map(|at| admit(at, stays)));
        d
    };
    assert!(check(&[bad.clone(), gave_up(None)], &CheckOptions::default()).ok());
    assert_eq!(
        kinds(&check(
            &[bad, gave_up(Some(4800))],
            &CheckOptions::default()
        )),
        vec!["needless"]
    );
}

fn stop_done(at: u64, key: &str, outcome: &str) -> Line {
    line(
        1,
        at,
        Record::StopDone {
            key: key.into(),
            outcome: outcome.into(),
            via: None,
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

#[path = "readmission_tests.rs"]
mod readmission_tests;

#[path = "lifecycle_tests.rs"]
mod lifecycle_tests;

#[path = "windows_tests.rs"]
mod windows_tests;

/// A key stopped, then sent again (a schedule's run under way at the
/// check instant, or one its leader could not record): it may run then.
/// Answered `Ok` or not sent at all, the stop or the admission governs.
#[test]
fn a_dispatch_unanswered_at_the_check_instant_leaves_a_stopped_key_open() {
    let stop_sent = |at: u64, key: &str| line(1, at, Record::StopSent { key: key.into() });
    let d = vec![
        admit(10, "resent"),
        stop_sent(25, "resent"),
        stop_done(30, "resent", "ok"),
        dispatch_sent(40, "resent"),
        admit(10, "answered"),
        stop_sent(25, "answered"),
        stop_done(30, "answered", "ok"),
        dispatch_sent(40, "answered"),
        admit(45, "answered"),
        admit(10, "stays-stopped"),
        dispatch_sent(20, "stays-stopped"),
        stop_sent(25, "stays-stopped"),
        stop_done(30, "stays-stopped", "ok"),
    ];
    let w = vec![
        start(10, 41, "resent", "a", 2),
        start(10, 41, "answered", "a", 2),
        start(10, 41, "stays-stopped", "a", 2),
    ];
    let r = check(&[w, d], &ending_at_100_ms());
    let flagged: Vec<String> = r
        .violations
        .iter()
        .map(|v| match v {
            Violation::StoppedStillRunning { interval } => interval.key.clone(),
            other => format!("{other}"),
        })
        .collect();
    assert_eq!(flagged, vec!["stays-stopped".to_string()]);
}

/// The default options of a run that ended 100 ms in (the end-of-run I2
/// check is made then).
fn ending_at_100_ms() -> CheckOptions {
    CheckOptions {
        end_ns: Some(100 * MS),
        ..CheckOptions::default()
    }
}
