//! Unit tests of the idempotency-window check (times in ms).

use super::*;

fn windowed_admit(at: u64, key: &str) -> Line {
    line(
        1,
        at,
        Record::Admit {
            key: key.into(),
            node: "d".into(),
            window_ms: Some(1_500),
        },
    )
}

fn recent(at: u64, key: &str) -> Line {
    line(1, at, Record::Recent { key: key.into() })
}

/// A dispatch of `key` sent at `at` and admitted 10 ms later, then a stop
/// answered `Ok` 100 ms after that (so that I3 has its stop between).
fn admitted_then_stopped(at: u64, key: &str, window: bool) -> Vec<Line> {
    let admitted = if window {
        windowed_admit(at + 10, key)
    } else {
        admit(at + 10, key)
    };
    vec![
        dispatch_sent(at, key),
        admitted,
        line(1, at + 100, Record::StopSent { key: key.into() }),
        line(
            1,
            at + 110,
            Record::StopDone {
                key: key.into(),
                outcome: "ok".into(),
                via: None,
            },
        ),
    ]
}

#[test]
fn a_second_windowed_admission_within_the_window_is_flagged() {
    let mut d = Vec::new();
    // Admitted at 0–10, refused at 500, admitted again by 1,010: broken.
    d.extend(admitted_then_stopped(0, "w", true));
    d.extend([dispatch_sent(500, "w"), recent(510, "w")]);
    d.extend(admitted_then_stopped(1_000, "w", true));
    // Again only once the window is over (1,710 + slack past 0): fine.
    d.extend(admitted_then_stopped(0, "late", true));
    d.extend(admitted_then_stopped(1_700, "late", true));
    // Dispatches without a window promise nothing of the kind.
    d.extend(admitted_then_stopped(0, "plain", false));
    d.extend(admitted_then_stopped(600, "plain", false));
    // Two dispatches in flight, the first sent at 0: whichever the `Ok` at
    // 300 answers, that admission was made at 0 or later; the next, by
    // 1,310, is within the window.
    d.extend([
        dispatch_sent(0, "race"),
        dispatch_sent(200, "race"),
        windowed_admit(300, "race"),
        line(1, 310, Record::Exists { key: "race".into() }),
        line(1, 400, Record::StopSent { key: "race".into() }),
    ]);
    d.extend(admitted_then_stopped(1_300, "race", true));
    // An admission whose `Ok` took long: it may have been made at 0, so
    // one answered by 1,390 is within its window even though the first
    // `Ok` came at 900 (1,390 - 900 is far below it).
    d.extend([
        dispatch_sent(0, "slow"),
        windowed_admit(900, "slow"),
        line(1, 950, Record::StopSent { key: "slow".into() }),
    ]);
    d.extend(admitted_then_stopped(1_380, "slow", true));
    d.sort_by_key(|l| l.mono_ns);
    let r = check(&[d], &CheckOptions::default());
    let mut broken: Vec<&str> = r
        .violations
        .iter()
        .filter_map(|v| match v {
            Violation::WindowBroken { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    broken.sort_unstable();
    assert_eq!(broken, vec!["race", "slow", "w"], "{:?}", r.violations);
    assert_eq!(kinds(&r).len(), 3, "{:?}", r.violations);
    assert_eq!((r.windowed_admissions, r.window_refusals), (8, 1));
    assert_eq!(r.window_readmissions_excused, 0);
}

#[test]
fn a_loss_or_a_clock_step_in_between_excuses_a_second_admission() {
    let mut d = Vec::new();
    d.extend(admitted_then_stopped(0, "lost", true));
    d.extend(admitted_then_stopped(1_000, "lost", true));
    d.push(untargeted(300, FaultKind::Rollback, false));
    d.push(untargeted(400, FaultKind::Rollback, true));
    d.extend(admitted_then_stopped(5_000, "stepped", true));
    d.extend(admitted_then_stopped(6_000, "stepped", true));
    d.push(untargeted(5_500, FaultKind::ClockStep, false));
    d.push(untargeted(5_500, FaultKind::ClockStep, true));
    // A freeze of Redis keeps both its data and its clock: no excuse.
    d.extend(admitted_then_stopped(10_000, "frozen", true));
    d.extend(admitted_then_stopped(11_000, "frozen", true));
    d.push(untargeted(10_300, FaultKind::FreezeRedis, false));
    d.push(untargeted(10_800, FaultKind::FreezeRedis, true));
    d.sort_by_key(|l| l.mono_ns);
    let r = check(&[d], &CheckOptions::default());
    assert_eq!(kinds(&r), vec!["window_broken"], "{:?}", r.violations);
    assert!(matches!(&r.violations[0], Violation::WindowBroken { key, .. } if key == "frozen"));
    assert_eq!(r.window_readmissions_excused, 2);
}
