//! A worker PROCESS killed with SIGKILL: every job it ran starts again on a
//! worker of another process within 1.5 × TTL, exactly once, and never on
//! two workers at once (checked from the ledgers), with a few jobs or with
//! many.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use flotilla_integration_tests::clock::mono_ns;
use flotilla_integration_tests::ledger::{FaultKind, Record, read_ledger};
use flotilla_testkit::wait_until;
use nix::sys::signal::Signal;
use support::{Harness, TTL, starts_after};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_process_jobs_restart_elsewhere_once_within_one_and_a_half_ttl() {
    kill_the_busiest_process("sigkill", 24).await;
}

/// The same with about 500 jobs on the killed process (250 per worker):
/// the cleaners hand them off within the same bound. One at a time, a
/// round trip each, they took past it (about 1,000 jobs: 4.3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_process_with_many_jobs_fails_over_within_one_and_a_half_ttl() {
    kill_the_busiest_process("sigkill-many", 1_500).await;
}

/// Dispatches `jobs` jobs over three processes of two workers, SIGKILLs the
/// one that runs the most, and checks the failover from the ledgers.
async fn kill_the_busiest_process(prefix: &str, jobs: usize) {
    let mut h = Harness::start(prefix, 3, 2).await;
    let keys: Vec<String> = (0..jobs).map(|i| format!("job-{i}")).collect();
    h.dispatch(&keys).await;

    // The victim: the process running the most jobs (ledger = truth).
    let victim_index = h.busiest();
    let victim_keys = h.running_on(victim_index);
    assert!(!victim_keys.is_empty(), "the victim runs no job");
    let mut victim = h.processes.remove(victim_index);
    victim.signal(Signal::SIGKILL).unwrap();
    let killed_ns = mono_ns();
    h.driver.record(Record::Fault {
        kind: FaultKind::Kill,
        target: Some(victim.pid()),
        end: false,
    });
    victim.sigkill().await.unwrap();
    h.gone.push(victim.ledger.clone());

    // Every job of the victim starts on a survivor.
    let survivors: Vec<_> = h.processes.iter().map(|p| p.ledger.clone()).collect();
    let restarted = || {
        let mut seen = HashMap::<String, u64>::new();
        for path in &survivors {
            for (key, at) in starts_after(&read_ledger(path).unwrap(), killed_ns) {
                seen.entry(key).or_insert(at);
            }
        }
        seen
    };
    wait_until(Duration::from_secs(10), "victim's jobs restarted", || {
        let seen = restarted();
        let done = victim_keys.iter().all(|k| seen.contains_key(k));
        async move { done }
    })
    .await
    .unwrap();
    let seen = restarted();
    let failover_ns = victim_keys.iter().map(|k| seen[k]).max().unwrap() - killed_ns;
    let failover = Duration::from_nanos(failover_ns);
    println!(
        "{} jobs of the killed process restarted within {failover:?} (TTL {TTL:?})",
        victim_keys.len()
    );
    assert!(
        failover <= TTL * 3 / 2,
        "failover took {failover:?}, more than 1.5 × TTL"
    );

    // The pool's own view settles: every job owned by a surviving worker.
    let survivor_workers: HashSet<String> = h
        .processes
        .iter()
        .flat_map(|p| p.workers.iter().cloned())
        .collect();
    wait_until(Duration::from_secs(10), "jobs owned by survivors", || {
        let ok = keys.iter().all(|k| {
            h.node
                .job_owner(k)
                .is_some_and(|(w, _)| survivor_workers.contains(&w))
        });
        async move { ok }
    })
    .await
    .unwrap();

    // Exactly one new start per victim job; none for the others.
    let mut new_starts = HashMap::<String, usize>::new();
    for path in &survivors {
        for (key, _) in starts_after(&read_ledger(path).unwrap(), killed_ns) {
            *new_starts.entry(key).or_default() += 1;
        }
    }
    for key in &victim_keys {
        assert_eq!(
            new_starts.get(key),
            Some(&1),
            "{key} restarted {:?} times",
            new_starts.get(key)
        );
    }
    for (key, n) in &new_starts {
        assert!(
            victim_keys.contains(key),
            "{key} of a survivor restarted {n} times"
        );
    }

    // I1–I4 over every ledger (the victim's open runs end at the kill).
    let report = h.check_now();
    assert!(report.ok(), "violations: {:#?}", report.violations);
    assert!(report.intervals >= jobs + victim_keys.len());
    h.kill_all().await;
}
