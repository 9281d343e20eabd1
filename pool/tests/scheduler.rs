//! `Node::schedule` against a real Redis: the producer runs on the leader
//! only, never twice at once and about once per interval pool-wide; jobs
//! are started and stopped to match its set (and only the schedule's own
//! jobs are stopped); a leader change (graceful, or a leader cut off
//! mid-run) never dispatches a job twice; a deposed leader that does not
//! know it yet cannot stop a job its successor wants; producer errors and
//! panics do not kill the schedule.

mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_pool::{Error, Node, NodeOptions, Schedule, ScheduleOptions, ScheduledJobs, Worker};
use flotilla_testkit::{FaultProxy, wait_until};
use fred::prelude::*;
use support::{Env, Ledger, eventually, fast};
use tokio::time::Instant;

/// Every producer call: (node index, entered, left).
type Calls = Arc<Mutex<Vec<(usize, Instant, Instant)>>>;
/// The set the producers return, changed by the test.
type Desired = Arc<Mutex<Vec<String>>>;

const INTERVAL: Duration = Duration::from_millis(200);

fn schedule_options() -> ScheduleOptions {
    ScheduleOptions::default()
        .leader_ttl(Duration::from_millis(1_000))
        .follower_poll(Duration::from_millis(50))
}

/// Starts schedule "sync" on `node`; its producer records its calls and
/// returns `desired`, taking `work` to do so.
async fn start(
    node: &Node,
    index: usize,
    desired: &Desired,
    calls: &Calls,
    work: Duration,
) -> Schedule {
    let (desired, calls) = (Arc::clone(desired), Arc::clone(calls));
    node.schedule_with("sync", INTERVAL, schedule_options(), move || {
        let (desired, calls) = (Arc::clone(&desired), Arc::clone(&calls));
        async move {
            let entered = Instant::now();
            tokio::time::sleep(work).await;
            let jobs: ScheduledJobs = desired
                .lock()
                .unwrap()
                .iter()
                .map(|k| (k.clone(), Bytes::from(format!("payload of {k}"))))
                .collect();
            calls.lock().unwrap().push((index, entered, Instant::now()));
            Ok(jobs)
        }
    })
    .await
    .expect("schedule")
}

fn set(keys: &[&str]) -> HashSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

fn set_desired(desired: &Desired, keys: &[&str]) {
    *desired.lock().unwrap() = keys.iter().map(|k| k.to_string()).collect();
}

fn leaders(schedules: &[Option<Schedule>]) -> Vec<usize> {
    schedules
        .iter()
        .enumerate()
        .filter(|(_, s)| s.as_ref().is_some_and(Schedule::is_leader))
        .map(|(i, _)| i)
        .collect()
}

/// No two producer calls overlap, across all nodes.
fn check_one_producer_at_a_time(calls: &Calls) {
    let mut calls = calls.lock().unwrap().clone();
    calls.sort_by_key(|c| c.1);
    for pair in calls.windows(2) {
        assert!(
            pair[0].2 <= pair[1].1,
            "producers ran at once on nodes {} and {}",
            pair[0].0,
            pair[1].0
        );
    }
}

async fn recorded(node_client: &Client, pool: &str) -> HashSet<String> {
    let keys: Vec<String> = node_client
        .hkeys(format!("fl:{{{pool}}}:schedule:sync"))
        .await
        .expect("hkeys");
    keys.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_only_producer_reconciles_jobs_across_a_handover() {
    let env = Env::new("sched");
    let ledger = Ledger::default();
    let desired: Desired = Arc::default();
    let calls: Calls = Arc::default();
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    let mut schedules = Vec::new();
    for i in 0..3 {
        let node = env.node(fast()).await;
        workers.push(
            Worker::new(&node, ledger.handler(&format!("w{i}")))
                .await
                .unwrap(),
        );
        nodes.push(node);
    }
    // A job the schedule did not start: it must never be stopped by it.
    nodes[0].dispatch_job("manual", &b""[..]).await.unwrap();
    set_desired(&desired, &["a", "b", "c"]);
    for (i, node) in nodes.iter().enumerate() {
        schedules.push(Some(
            start(node, i, &desired, &calls, Duration::from_millis(5)).await,
        ));
    }
    let started = Instant::now();
    eventually("a, b, c running", Duration::from_secs(5), || {
        ledger.running_keys() == set(&["a", "b", "c", "manual"])
    })
    .await;
    assert_eq!(leaders(&schedules).len(), 1);
    let first = leaders(&schedules)[0];

    set_desired(&desired, &["b", "c", "d"]);
    eventually("a stopped, d started", Duration::from_secs(5), || {
        ledger.running_keys() == set(&["b", "c", "d", "manual"])
    })
    .await;
    // Let a few more intervals pass in the steady state.
    let steady = calls.lock().unwrap().len();
    eventually("more runs", Duration::from_secs(5), || {
        calls.lock().unwrap().len() >= steady + 3
    })
    .await;
    let elapsed = started.elapsed();
    {
        let calls = calls.lock().unwrap();
        assert!(
            calls.iter().all(|(node, _, _)| *node == first),
            "the producer ran on a follower: {:?}",
            calls.iter().map(|c| c.0).collect::<Vec<_>>()
        );
        let most = elapsed.as_millis() / INTERVAL.as_millis() + 2;
        assert!(
            calls.len() as u128 <= most,
            "{} runs in {elapsed:?}",
            calls.len()
        );
    }

    // Graceful hand-over mid-run: the new leader must not dispatch again
    // what runs already, and must know what the old leader started.
    let closing = schedules[first].take().unwrap();
    let closed_at = Instant::now();
    closing.close().await.expect("close");
    wait_until(Duration::from_secs(2), "a new leader", || async {
        !leaders(&schedules).is_empty()
    })
    .await
    .expect("hand-over");
    assert!(closed_at.elapsed() < Duration::from_secs(1));
    let second = leaders(&schedules)[0];
    assert_ne!(second, first);
    set_desired(&desired, &["c", "d", "e"]);
    eventually(
        "b stopped by the new leader, e started",
        Duration::from_secs(5),
        || ledger.running_keys() == set(&["c", "d", "e", "manual"]),
    )
    .await;
    for key in ["a", "b", "c", "d", "e", "manual"] {
        assert_eq!(ledger.starts(key), 1, "{key} started more than once");
    }
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    {
        let calls = calls.lock().unwrap();
        assert!(
            calls
                .iter()
                .all(|(node, entered, _)| *node != first || *entered < closed_at),
            "the closed schedule ran its producer"
        );
        assert!(calls.iter().any(|(node, _, _)| *node == second));
    }
    check_one_producer_at_a_time(&calls);
    let client = flotilla_testkit::client(&env.server.url()).await.unwrap();
    assert_eq!(recorded(&client, &env.pool).await, set(&["c", "d", "e"]));

    for schedule in schedules.into_iter().flatten() {
        schedule.close().await.expect("close");
    }
    for node in nodes {
        node.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_cut_off_mid_run_never_dispatches_twice() {
    let env = Env::new("sched-cut");
    let ledger = Ledger::default();
    let desired: Desired = Arc::default();
    let calls: Calls = Arc::default();
    // Workers on a direct connection; schedulers are client-only nodes
    // behind fault proxies, so cutting a scheduler leaves the jobs alone.
    let worker_node = env.node(fast()).await;
    let _worker = Worker::new(&worker_node, ledger.handler("w0"))
        .await
        .unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("job-{i}")).collect();
    *desired.lock().unwrap() = keys.clone();
    let mut proxies = Vec::new();
    let mut nodes = Vec::new();
    let mut schedules = Vec::new();
    for i in 0..3 {
        let proxy = FaultProxy::start(env.server.addr()).await.expect("proxy");
        let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
        let node = Node::join(&client, &env.pool, NodeOptions::default().client_only(true))
            .await
            .unwrap();
        // A slow producer, so the cut lands in the middle of runs.
        schedules.push(Some(
            start(&node, i, &desired, &calls, Duration::from_millis(60)).await,
        ));
        proxies.push(proxy);
        nodes.push(node);
    }
    eventually("all jobs running", Duration::from_secs(10), || {
        ledger.running_keys().len() == 20
    })
    .await;
    let first = leaders(&schedules)[0];
    proxies[first].black_hole();
    let cut = Instant::now();
    wait_until(Duration::from_secs(3), "a new leader", || async {
        leaders(&schedules).iter().any(|&i| i != first)
    })
    .await
    .expect("failover");
    let failover = cut.elapsed();
    assert!(
        failover <= Duration::from_millis(1_500),
        "failover took {failover:?}"
    );
    // The new leader adds two jobs and drops one.
    let mut next = keys.clone();
    next.retain(|k| k != "job-0");
    next.extend(["job-20".to_string(), "job-21".to_string()]);
    *desired.lock().unwrap() = next.clone();
    eventually("the new set runs", Duration::from_secs(10), || {
        ledger.running_keys() == next.iter().cloned().collect::<HashSet<_>>()
    })
    .await;
    for key in &next {
        assert_eq!(ledger.starts(key), 1, "{key} dispatched twice");
    }
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    check_one_producer_at_a_time(&calls);
    println!("scheduler failover after a cut: {failover:?} (leader ttl 1 s)");

    proxies[first].heal();
    for schedule in schedules.into_iter().flatten() {
        let _ = schedule.close().await;
    }
    for node in nodes {
        let _ = node.close().await;
    }
    worker_node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_errors_panics_and_bad_keys_do_not_kill_the_schedule() {
    let env = Env::new("sched-bad");
    let ledger = Ledger::default();
    let node = env.node(fast()).await;
    let _worker = Worker::new(&node, ledger.handler("w0")).await.unwrap();
    let round = Arc::new(Mutex::new(0u32));
    let counter = Arc::clone(&round);
    let schedule = node
        .schedule_with("flaky", INTERVAL, schedule_options(), move || {
            let counter = Arc::clone(&counter);
            async move {
                let n = {
                    let mut n = counter.lock().unwrap();
                    *n += 1;
                    *n
                };
                match n {
                    1 => Err("database down".into()),
                    2 => panic!("producer exploded"),
                    _ => Ok(vec![
                        ("good".to_string(), Bytes::new()),
                        ("bad{key}".to_string(), Bytes::new()),
                    ]),
                }
            }
        })
        .await
        .expect("schedule");
    let mut runs = schedule.runs();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        runs.changed().await.expect("runs");
        if let Some(run) = runs.borrow_and_update().clone() {
            seen.push(run);
        }
    }
    assert_eq!(seen[0].producer_error.as_deref(), Some("database down"));
    assert!(
        seen[1]
            .producer_error
            .as_deref()
            .is_some_and(|e| e.contains("producer exploded")),
        "{:?}",
        seen[1]
    );
    assert_eq!(seen[2].desired, 2);
    assert_eq!(seen[2].started, vec!["good".to_string()]);
    assert_eq!(seen[2].failed, 1, "the invalid key is reported");
    assert!(seen.windows(2).all(|w| w[0].slot < w[1].slot));
    eventually("good running", Duration::from_secs(2), || {
        ledger.running_keys() == set(&["good"])
    })
    .await;

    assert!(matches!(
        node.schedule("a{b}", INTERVAL, || async { Ok(Vec::new()) })
            .await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        node.schedule("fast", Duration::from_millis(1), || async {
            Ok(Vec::new())
        })
        .await,
        Err(Error::InvalidOptions {
            option: "interval",
            ..
        })
    ));
    schedule.close().await.expect("close");
    node.close().await.unwrap();
}

/// A leader whose lease Redis lost (here deleted; a clock step or a
/// rollback does the same) still believes it leads until its next
/// renewal. Its run, begun before, wants a job stopped that its successor
/// wants kept: the stop is refused (fenced as its admissions are), and
/// the job runs on, started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deposed_leaders_stop_never_reaches_a_job_its_successor_wants() {
    let env = Env::new("sched-fence");
    let ledger = Ledger::default();
    let node = env.node(fast()).await;
    let _worker = Worker::new(&node, ledger.handler("w0")).await.unwrap();
    let keys: Vec<String> = (0..4).map(|i| format!("job-{i}")).collect();
    // The leader's producer, once armed, wants job-0 gone, says so, and
    // waits for the test before its run goes on.
    let armed = Arc::new(Mutex::new(false));
    let entered = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    // A long lease: the deposed leader's next renewal, which would tell
    // it, comes seconds later.
    let options = ScheduleOptions::default()
        .leader_ttl(Duration::from_secs(30))
        .follower_poll(Duration::from_millis(50));
    let mut schedules = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..2 {
        let scheduler = env.node(fast().client_only(true)).await;
        let (keys, armed, entered, release) = (
            keys.clone(),
            Arc::clone(&armed),
            Arc::clone(&entered),
            Arc::clone(&release),
        );
        let producer = move || {
            let gated = std::mem::take(&mut *armed.lock().unwrap());
            let jobs: ScheduledJobs = keys
                .iter()
                .filter(|k| !gated || k.as_str() != "job-0")
                .map(|k| (k.clone(), Bytes::new()))
                .collect();
            let (entered, release) = (Arc::clone(&entered), Arc::clone(&release));
            async move {
                if gated {
                    entered.notify_one();
                    release.notified().await;
                }
                Ok(jobs)
            }
        };
        let schedule = scheduler
            .schedule_with("sync", INTERVAL, options.clone(), producer)
            .await
            .expect("schedule");
        eventually("a leader", Duration::from_secs(5), || {
            i > 0 || schedule.is_leader()
        })
        .await;
        schedules.push(Some(schedule));
        nodes.push(scheduler);
    }
    eventually("all jobs running", Duration::from_secs(5), || {
        ledger.running_keys().len() == 4
    })
    .await;
    let first = leaders(&schedules)[0];
    *armed.lock().unwrap() = true;
    entered.notified().await;
    // Redis loses the lease; the other node takes it.
    let lock = format!("fl:{{{}}}:lock:schedule:sync", env.pool);
    let redis = flotilla_testkit::client(&env.server.url()).await.unwrap();
    let _: i64 = redis.del(&lock).await.unwrap();
    eventually("a new leader", Duration::from_secs(3), || {
        leaders(&schedules).iter().any(|&i| i != first)
    })
    .await;
    if !schedules[first].as_ref().is_some_and(Schedule::is_leader) {
        // Its renewal came in between (every 10 s): its run is cut short
        // before any stop, which the checks below also hold to.
        println!("the deposed leader learnt it before its run went on");
    }
    let mut runs = schedules[first].as_ref().unwrap().runs();
    runs.borrow_and_update();
    release.notify_one();
    let report = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            runs.changed().await.unwrap();
            if let Some(run) = runs.borrow_and_update().clone() {
                return run;
            }
        }
    })
    .await
    .expect("the deposed leader's run ended");
    // Its run has ended: a stop it made would be in the ledger by now.
    assert!(report.stopped.is_empty(), "{report:?}");
    assert!(report.interrupted, "{report:?}");
    let stops = ledger
        .entries()
        .iter()
        .filter(|e| !e.start && e.key == "job-0")
        .count();
    assert_eq!(stops, 0, "the deposed leader stopped job-0");
    // Two runs of the new leader later, job-0 still runs, started once.
    let successor = leaders(&schedules)
        .into_iter()
        .find(|&i| i != first)
        .expect("the new leader");
    let mut successor_runs = schedules[successor].as_ref().unwrap().runs();
    successor_runs.borrow_and_update();
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(5), successor_runs.changed())
            .await
            .expect("a run of the new leader")
            .unwrap();
    }
    assert_eq!(ledger.running_keys().len(), 4);
    assert_eq!(
        ledger.starts("job-0"),
        1,
        "job-0 was stopped and started again"
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    for schedule in schedules.into_iter().flatten() {
        let _ = schedule.close().await;
    }
    for node in nodes {
        let _ = node.close().await;
    }
    node.close().await.unwrap();
}
