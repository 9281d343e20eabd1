//! A Sentinel primary frozen (`SIGSTOP`) across its failover: the
//! Sentinels promote its replica, a worker process joins there, and the
//! old primary wakes to the clients still connected to it, answering them
//! as a primary until a Sentinel demotes it. From the handlers' ledgers:
//! nothing runs twice, no job is lost, and a stop answered holds.

mod sentinel_harness;

use std::time::{Duration, Instant};

use flotilla_integration_tests::ledger::{FaultKind, Record};
use flotilla_testkit::SentinelOptions;
use nix::sys::signal::Signal;
use sentinel_harness::{HaHarness, TTL, worker_process};

/// The primary frozen (`SIGSTOP`) across its failover, on the deployment
/// the pool README recommends (two replicas, `min-replicas-to-write 1` on
/// every server): a worker process joins on the promoted replica
/// meanwhile, and the old primary wakes, a TTL later, to the clients still
/// connected to it. It refuses their writes (its replicas left it), so
/// their leases lapse and their jobs stop before the promoted side takes
/// them: from the ledgers nothing ran twice, no job was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_frozen_across_its_failover_runs_no_job_twice() {
    let options = SentinelOptions {
        replicas: 2,
        min_replicas: Some((1, 1)),
        ..SentinelOptions::default()
    };
    frozen_primary_runs_no_job_twice("sentinel-frozen-primary", options).await;
}

/// The same fault on Redis's defaults (one replica, no
/// `min-replicas-to-write`): the woken primary takes its clients' writes,
/// renewals included, until a Sentinel demotes it seconds later. The nodes
/// on it ask the Sentinels after each renewal, find another server named
/// the primary, and do not count it: their leases lapse and their jobs
/// stop. Without that check every job ran on both sides, job-0 for 10.7 s
/// (and the chaos soak seed 1450 found 12,968 violations in 6 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_frozen_across_its_failover_on_redis_defaults_runs_no_job_twice() {
    frozen_primary_runs_no_job_twice("sentinel-frozen-defaults", SentinelOptions::default()).await;
}

async fn frozen_primary_runs_no_job_twice(name: &str, options: SentinelOptions) {
    let mut h = HaHarness::start_with(name, 2, options).await;
    let keys: Vec<String> = (0..18).map(|i| format!("job-{i}")).collect();
    for k in &keys {
        h.dispatch(k).await.unwrap();
    }
    let (old, pid) = freeze_until_failover(&mut h).await;
    tokio::time::sleep(TTL).await;
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    let woke = Instant::now();
    let ha = &h.ha;
    tokio::task::block_in_place(|| {
        ha.wait_for_replica(old, Duration::from_secs(60), Duration::from_secs(20))
    })
    .unwrap();
    println!(
        "the woken primary was an in-sync replica {:?} after it woke",
        woke.elapsed()
    );
    h.driver.record(Record::Fault {
        kind: FaultKind::FrozenFailover,
        target: None,
        end: true,
    });
    h.settle(&keys).await;
    tokio::time::sleep(TTL * 2).await;

    let report = h.check_now();
    assert!(report.ok(), "violations: {:#?}", report.violations);
    h.kill_all().await;
}

/// Stops sent as the frozen primary wakes, on Redis's defaults: the
/// dispatcher is still connected to the woken primary, which answers them
/// from its own (superseded) records while the promoted side has moved the
/// jobs to the process that joined there. A stop answered `Ok` must hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_stops_answered_as_a_frozen_primary_wakes_hold() {
    let mut h = HaHarness::start_with("sentinel-frozen-stops", 2, SentinelOptions::default()).await;
    let keys: Vec<String> = (0..18).map(|i| format!("job-{i}")).collect();
    for k in &keys {
        h.dispatch(k).await.unwrap();
    }
    let (old, pid) = freeze_until_failover(&mut h).await;
    tokio::time::sleep(TTL * 2).await;
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    let (stopped, running) = keys.split_at(keys.len() / 2);
    let outcomes = futures::future::join_all(stopped.iter().map(|k| h.stop_any(k))).await;
    println!("stops as the primary woke: {outcomes:?}");
    let ha = &h.ha;
    tokio::task::block_in_place(|| {
        ha.wait_for_replica(old, Duration::from_secs(60), Duration::from_secs(20))
    })
    .unwrap();
    h.driver.record(Record::Fault {
        kind: FaultKind::FrozenFailover,
        target: None,
        end: true,
    });
    h.settle(running).await;
    tokio::time::sleep(TTL * 2).await;

    let report = h.check_now();
    assert!(report.ok(), "violations: {:#?}", report.violations);
    h.kill_all().await;
}

/// Freezes the primary (`SIGSTOP`) until the Sentinels promote a replica,
/// then has a worker process join on the promoted side; the old primary's
/// port and pid (still frozen).
async fn freeze_until_failover(h: &mut HaHarness) -> (u16, nix::unistd::Pid) {
    let old = h.ha.primary_port().unwrap();
    let pid = nix::unistd::Pid::from_raw(h.ha.server_pid(old).unwrap() as i32);
    h.driver.record(Record::Fault {
        kind: FaultKind::FrozenFailover,
        target: None,
        end: false,
    });
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    let ha = &h.ha;
    let promoted =
        tokio::task::block_in_place(|| ha.wait_for_failover(old, Duration::from_secs(20)));
    if let Err(e) = promoted {
        let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
        panic!("no failover: {e}");
    }
    let joined = worker_process(&h.ha, h.dir.path(), &h.pool, h.processes.len()).await;
    h.processes.push(joined);
    (old, pid)
}
