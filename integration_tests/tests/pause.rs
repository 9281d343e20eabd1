//! A worker process paused with SIGSTOP for longer than the TTL: its jobs
//! move to other processes, and when it resumes (SIGCONT) its lease
//! watchdog stops them at once (stale owner with a lower fencing token), it
//! rejoins, and nobody judges the live workers of other processes dead.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use flotilla_integration_tests::clock::mono_ns;
use flotilla_integration_tests::ledger::{FaultKind, Record, read_ledger};
use flotilla_testkit::wait_until;
use nix::sys::signal::Signal;
use support::{Harness, TTL, starts_after};

/// Pause/resume cycles per run: a race with the replica's catch-up shows
/// in a fraction of cycles only, so several cycles make it likely to show.
const CYCLES: usize = 3;

// Guards against a node judging live workers dead from a stale replica:
// after a pause its keep-alive replica is the pre-pause snapshot until the
// buffered pub/sub updates are applied. (Before the cleanup claim checked
// the keep-alive in Redis, this failed about one cycle in five.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_process_stands_down_on_resume_and_live_workers_stay() {
    let mut h = Harness::start("pause", 3, 2).await;
    let keys: Vec<String> = (0..24).map(|i| format!("job-{i}")).collect();
    h.dispatch(&keys).await;
    let mut paused_keys = 0;
    for _ in 0..CYCLES {
        paused_keys += pause_cycle(&h, &keys).await;
    }
    let report = h.check_now();
    assert!(report.ok(), "violations: {:#?}", report.violations);
    assert!(report.stale_windows >= paused_keys, "{report:?}");
    h.kill_all().await;
}

/// Pauses the busiest process until its jobs run elsewhere, resumes it,
/// waits for the pool to settle and checks that no live worker left the
/// ring meanwhile. Returns how many jobs the paused process ran.
async fn pause_cycle(h: &Harness, keys: &[String]) -> usize {
    let victim = h.busiest();
    let victim_keys = h.running_on(victim);
    let victim_pid = h.processes[victim].pid();
    let others: Vec<usize> = (0..h.processes.len()).filter(|i| *i != victim).collect();
    let live_workers: HashSet<String> = others
        .iter()
        .flat_map(|i| h.processes[*i].workers.iter().cloned())
        .collect();

    h.processes[victim].signal(Signal::SIGSTOP).unwrap();
    let paused_ns = mono_ns();
    h.driver.record(Record::Fault {
        kind: FaultKind::Pause,
        target: Some(victim_pid),
        end: false,
    });
    let other_ledgers: Vec<_> = others
        .iter()
        .map(|i| h.processes[*i].ledger.clone())
        .collect();
    wait_until(
        Duration::from_secs(10),
        "paused process's jobs restarted elsewhere",
        || {
            let seen: HashSet<String> = other_ledgers
                .iter()
                .flat_map(|p| starts_after(&read_ledger(p).unwrap(), paused_ns))
                .map(|(k, _)| k)
                .collect();
            let done = victim_keys.iter().all(|k| seen.contains(k));
            async move { done }
        },
    )
    .await
    .unwrap();
    h.driver.record(Record::Fault {
        kind: FaultKind::Pause,
        target: Some(victim_pid),
        end: true,
    });
    h.processes[victim].signal(Signal::SIGCONT).unwrap();
    let resumed = tokio::time::Instant::now();

    // The resumed process rejoins and the pool settles.
    let all_workers = 2 * h.processes.len();
    let node = h.node.clone();
    wait_until(
        Duration::from_secs(15),
        "resumed process rejoined, jobs owned",
        || {
            let active = node.pool_workers().iter().filter(|w| !w.cleaning).count();
            let owned = keys.iter().all(|k| node.job_owner(k).is_some());
            async move { active == all_workers && owned }
        },
    )
    .await
    .unwrap();
    // Observation window: a cleanup sweep of every node after the resume.
    tokio::time::sleep_until(resumed + TTL).await;

    // Evidence of a node judging live workers dead: a surviving process's
    // ring view without one of the surviving workers.
    for path in &other_ledgers {
        for l in read_ledger(path).unwrap() {
            if let Record::Ring { workers } = &l.record
                && l.mono_ns > paused_ns
            {
                let missing: Vec<_> = live_workers
                    .iter()
                    .filter(|w| !workers.contains(w))
                    .collect();
                assert!(
                    missing.is_empty(),
                    "live workers {missing:?} left the ring of pid {} {:.0} ms after the \
                         pause of pid {victim_pid} began; history:\n{}",
                    l.pid,
                    (l.mono_ns - paused_ns) as f64 / 1e6,
                    support::ring_history(h, paused_ns)
                );
            }
        }
    }
    victim_keys.len()
}
