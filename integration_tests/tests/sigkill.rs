//! A worker PROCESS killed with SIGKILL: every job it ran starts again on a
//! worker of another process within 1.5 × TTL, exactly once, and never on
//! two workers at once (checked from the ledgers).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use flotilla_integration_tests::checker::{CheckOptions, check};
use flotilla_integration_tests::clock::{ServerClock, mono_ns};
use flotilla_integration_tests::ledger::{FaultKind, LedgerWriter, Line, Record, read_ledger};
use flotilla_integration_tests::process::{WorkerProcess, WorkerSpec};
use flotilla_pool::{Node, NodeOptions};
use flotilla_testkit::{RedisServer, unique_name, wait_until};
use nix::sys::signal::Signal;

const TTL: Duration = Duration::from_secs(2);
const JOBS: usize = 24;

fn starts_after<'a>(lines: &'a [Line], after_ns: u64) -> impl Iterator<Item = (&'a str, u64)> + 'a {
    lines.iter().filter_map(move |l| match &l.record {
        Record::Start { key, .. } if l.mono_ns > after_ns => Some((key.as_str(), l.mono_ns)),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_process_jobs_restart_elsewhere_once_within_one_and_a_half_ttl() {
    let server = RedisServer::start()
        .expect("redis-server must be installed (apt-get install redis-server)");
    let dir = tempfile::tempdir().unwrap();
    let pool = unique_name("sigkill");
    let mut processes = Vec::new();
    for i in 0..3 {
        let spec = WorkerSpec {
            binary: env!("CARGO_BIN_EXE_flotilla-test-worker").into(),
            redis_url: server.url(),
            pool: pool.clone(),
            ttl: TTL,
            workers: 2,
            ledger: dir.path().join(format!("worker-{i}.jsonl")),
        };
        processes.push(
            WorkerProcess::spawn(&spec, Duration::from_secs(20))
                .await
                .unwrap(),
        );
    }
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let clock = ServerClock::new();
    clock.sample(&client, true).await.unwrap();
    let driver_path = dir.path().join("driver.jsonl");
    let driver = LedgerWriter::open(&driver_path, clock).unwrap();
    let node = Node::join(
        &client,
        &pool,
        NodeOptions::default()
            .client_only(true)
            .worker_ttl(TTL)
            .dispatch_timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let all_workers: usize = processes.iter().map(|p| p.workers.len()).sum();
    wait_until(
        Duration::from_secs(10),
        "dispatcher sees every worker",
        || {
            let n = node.pool_workers().len();
            async move { n == all_workers }
        },
    )
    .await
    .unwrap();
    let keys: Vec<String> = (0..JOBS).map(|i| format!("job-{i}")).collect();
    for key in &keys {
        node.dispatch_job(key, &b"x"[..]).await.unwrap();
        driver.record(Record::Admit {
            key: key.clone(),
            node: node.id().to_string(),
        });
    }

    // The victim: the process running the most jobs (ledger = truth).
    let running_on = |p: &WorkerProcess| -> HashSet<String> {
        let mut open = HashSet::new();
        for l in read_ledger(&p.ledger).unwrap() {
            match l.record {
                Record::Start { key, .. } => {
                    open.insert(key);
                }
                Record::Stop { key, .. } => {
                    open.remove(&key);
                }
                _ => {}
            }
        }
        open
    };
    let (victim_index, victim_keys) = processes
        .iter()
        .enumerate()
        .map(|(i, p)| (i, running_on(p)))
        .max_by_key(|(_, k)| k.len())
        .unwrap();
    assert!(!victim_keys.is_empty(), "the victim runs no job");
    let mut victim = processes.remove(victim_index);
    victim.signal(Signal::SIGKILL).unwrap();
    let killed_ns = mono_ns();
    driver.record(Record::Fault {
        kind: FaultKind::Kill,
        target: Some(victim.pid()),
        end: false,
    });
    victim.sigkill().await.unwrap();

    // Every job of the victim starts on a survivor.
    let survivors: Vec<_> = processes.iter().map(|p| p.ledger.clone()).collect();
    let restarted = || {
        let mut seen = HashMap::<String, u64>::new();
        for path in &survivors {
            let lines = read_ledger(path).unwrap();
            for (key, at) in starts_after(&lines, killed_ns) {
                seen.entry(key.to_string()).or_insert(at);
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
    let survivor_workers: HashSet<String> = processes
        .iter()
        .flat_map(|p| p.workers.iter().cloned())
        .collect();
    wait_until(Duration::from_secs(10), "jobs owned by survivors", || {
        let ok = keys.iter().all(|k| {
            node.job_owner(k)
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
            *new_starts.entry(key.to_string()).or_default() += 1;
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
    let mut ledgers = vec![
        read_ledger(&driver_path).unwrap(),
        read_ledger(&victim.ledger).unwrap(),
    ];
    ledgers.extend(survivors.iter().map(|p| read_ledger(p).unwrap()));
    let report = check(
        &ledgers,
        &CheckOptions {
            lease_stop_after: TTL * 2 / 3,
            end_ns: Some(mono_ns()),
            ..CheckOptions::default()
        },
    );
    assert!(report.ok(), "violations: {:#?}", report.violations);
    assert!(report.intervals >= JOBS + victim_keys.len());
    for mut p in processes {
        p.sigkill().await.unwrap();
    }
}
