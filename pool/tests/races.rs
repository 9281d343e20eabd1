//! Concurrency: exactly-once admission, balance and minimal movement,
//! racing cleaners, killed and partitioned workers.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use flotilla_pool::{Error, LeasePolicy, Worker};
use flotilla_testkit::FaultProxy;
use support::{Env, Ledger, eventually, fast, victim};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dispatch_of_one_key_admits_once() {
    let env = Env::new("race-admit");
    let ledger = Ledger::default();
    let nodes = vec![
        env.node(fast()).await,
        env.node(fast()).await,
        env.node(fast()).await,
    ];
    let _w = Worker::new(&nodes[0], ledger.handler("w0")).await.unwrap();
    let _w2 = Worker::new(&nodes[1], ledger.handler("w1")).await.unwrap();
    for round in 0..5 {
        let key = format!("successor-{round}");
        let mut handles = Vec::new();
        for i in 0..32 {
            let node = nodes[i % 3].clone();
            let key = key.clone();
            handles.push(tokio::spawn(async move {
                node.dispatch_job(&key, &b"x"[..]).await
            }));
        }
        let mut ok = 0;
        for h in handles {
            match h.await.unwrap() {
                Ok(()) => ok += 1,
                Err(Error::JobExists(_)) => {}
                Err(e) => panic!("unexpected error {e:?}"),
            }
        }
        assert_eq!(ok, 1, "exactly one dispatch is admitted");
        assert_eq!(ledger.starts(&key), 1, "the job starts once");
    }
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    for n in nodes {
        n.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_jobs_balance_and_adding_a_worker_moves_about_a_seventh() {
    let env = Env::new("race-balance");
    let ledger = Ledger::default();
    let nodes = vec![
        env.node(fast()).await,
        env.node(fast()).await,
        env.node(fast()).await,
    ];
    let mut workers = Vec::new();
    for i in 0..6 {
        workers.push(
            Worker::new(&nodes[i % 3], ledger.handler(&format!("w{i}")))
                .await
                .unwrap(),
        );
    }
    eventually("all nodes see 6 workers", Duration::from_secs(5), || {
        nodes.iter().all(|n| n.pool_workers().len() == 6)
    })
    .await;
    let mut handles = Vec::new();
    for i in 0..1000 {
        let node = nodes[i % 3].clone();
        handles.push(tokio::spawn(async move {
            node.dispatch_job(&format!("job-{i}"), &b"p"[..]).await
        }));
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    assert_eq!(ledger.total_starts(), 1000, "each job started exactly once");
    let before = ledger.running();
    assert_eq!(before.len(), 1000);
    let per_worker = workers
        .iter()
        .map(|w| w.job_keys().len())
        .collect::<Vec<_>>();
    assert!(
        per_worker.iter().all(|c| *c > 100 && *c < 250),
        "balance: {per_worker:?}"
    );

    let added = Worker::new(&nodes[0], ledger.handler("w6")).await.unwrap();
    eventually("rebalance done", Duration::from_secs(10), || {
        let owners: Vec<String> = (0..1000)
            .map(|i| nodes[1].placement(&format!("job-{i}")).unwrap())
            .collect();
        let running = ledger.running();
        // The ring must show the new worker first: before it does, every
        // key is "placed" where it runs and nothing has moved yet.
        let placed_on_added = owners.iter().filter(|o| *o == added.id()).count();
        running.len() == 1000
            && placed_on_added > 0
            && placed_on_added == added.job_keys().len()
            && (0..1000).all(|i| {
                let k = format!("job-{i}");
                let w = running.get(&k).cloned().unwrap_or_default();
                nodes[1].placement(&k).as_deref()
                    == Some(if w == "w6" {
                        added.id()
                    } else {
                        workers[w[1..].parse::<usize>().unwrap()].id()
                    })
            })
    })
    .await;
    let after = ledger.running();
    let moved: Vec<&String> = before.keys().filter(|k| before[*k] != after[*k]).collect();
    assert!(
        moved.iter().all(|k| after[*k] == "w6"),
        "jobs moved only to the new worker"
    );
    let ideal = 1000.0 / 7.0;
    assert!(
        (moved.len() as f64) <= ideal * 1.3 && (moved.len() as f64) >= ideal * 0.7,
        "moved {} jobs, ideal {ideal:.0}",
        moved.len()
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    println!(
        "rebalance: added 1 worker to 6, moved {} of 1000 jobs (ideal {ideal:.0})",
        moved.len()
    );
    for n in nodes {
        n.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_cleaners_requeue_a_dead_workers_jobs_once() {
    let env = Env::new("race-clean");
    let ledger = Ledger::default();
    let (proxy, doomed, victim) = victim(&env, &ledger).await;
    let cleaners = vec![
        env.node(fast()).await,
        env.node(fast()).await,
        env.node(fast()).await,
    ];
    let mut survivors = Vec::new();
    for (i, n) in cleaners.iter().enumerate() {
        survivors.push(
            Worker::new(n, ledger.handler(&format!("s{i}")))
                .await
                .unwrap(),
        );
    }
    for i in 0..300 {
        cleaners[i % 3]
            .dispatch_job(&format!("j{i}"), &b"p"[..])
            .await
            .unwrap();
    }
    let victims: Vec<String> = victim.job_keys();
    assert!(!victims.is_empty());
    let cut_at = Instant::now();
    proxy.cut();
    // The victim stops its own jobs when its lease lapses (before anyone
    // may take them); the cleaners then requeue them once.
    eventually(
        "victim jobs running elsewhere",
        Duration::from_secs(10),
        || {
            let running = ledger.running();
            victims
                .iter()
                .all(|k| running.get(k).is_some_and(|w| w != "victim"))
        },
    )
    .await;
    let failover = cut_at.elapsed();
    for k in &victims {
        assert_eq!(ledger.starts(k), 2, "{k} requeued exactly once");
    }
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    println!("failover after cut: {failover:?} (ttl 1.5 s)");
    assert!(
        failover < Duration::from_millis(1500 * 3 / 2 + 1000),
        "failover took {failover:?}"
    );
    eventually("dead worker removed", Duration::from_secs(10), || {
        cleaners[0]
            .pool_workers()
            .iter()
            .all(|w| w.id != victim.id())
    })
    .await;
    for n in cleaners {
        n.close().await.unwrap();
    }
    drop(doomed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_worker_stops_before_others_start_and_rejoins() {
    partitioned_worker_hands_over_and_rejoins("partition", FaultProxy::black_hole).await;
}

/// A one-way failure: the far node's commands reach Redis and run, its
/// renewals too, but no reply comes back. Redis must not count renewals
/// from a node that hears nothing: the far node stops its jobs when it
/// hears no renewal, and they must move on, not wait for the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deaf_worker_stops_before_others_start_and_rejoins() {
    partitioned_worker_hands_over_and_rejoins("deaf", FaultProxy::deafen).await;
}

/// A node behind `proxy` runs jobs; `fail` breaks its link: its jobs must
/// run on the other node, each stopped there first, and after the heal the
/// far worker rejoins and every job runs once.
async fn partitioned_worker_hands_over_and_rejoins(name: &str, fail: fn(&FaultProxy)) {
    let env = Env::new(name);
    let ledger = Ledger::default();
    let proxy = FaultProxy::start(env.server.addr()).await.unwrap();
    let far = env
        .proxied_node(&proxy, fast().lease_policy(LeasePolicy::StopJobs))
        .await;
    let far_worker = Worker::new(&far, ledger.handler("far")).await.unwrap();
    let near = env.node(fast()).await;
    let _near_worker = Worker::new(&near, ledger.handler("near")).await.unwrap();
    for i in 0..60 {
        near.dispatch_job(&format!("p{i}"), &b"p"[..])
            .await
            .unwrap();
    }
    let far_jobs = far_worker.job_keys();
    assert!(!far_jobs.is_empty());
    fail(&proxy);
    eventually("far jobs moved to near", Duration::from_secs(10), || {
        let running = ledger.running();
        far_jobs
            .iter()
            .all(|k| running.get(k).map(String::as_str) == Some("near"))
    })
    .await;
    // The ledger records a violation if "near" started a key while "far"
    // still ran it.
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    proxy.heal();
    // Healed: the far worker re-registers; jobs rebalance back to it, each
    // stopped on "near" before starting on "far".
    eventually(
        "far worker back in the pool",
        Duration::from_secs(15),
        || {
            near.pool_workers()
                .iter()
                .any(|w| w.node == far.id() && !w.cleaning)
        },
    )
    .await;
    eventually("every job running once", Duration::from_secs(15), || {
        ledger.running().len() == 60
    })
    .await;
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    let per: HashMap<String, usize> = ledger.running().values().fold(HashMap::new(), |mut m, w| {
        *m.entry(w.clone()).or_default() += 1;
        m
    });
    println!("after heal: {per:?}");
    near.close().await.unwrap();
    far.close().await.unwrap();
}

/// `close()` of a worker running 500 jobs whose `stop` takes 20–50 ms: every
/// job stops (all at once, each within the stop budget) before it starts on
/// the other worker — never two runners of a key — and close does not take
/// one stop time per job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_worker_with_500_slow_stopping_jobs_never_overlaps_the_new_owner() {
    let env = Env::new("close500");
    let ledger = Ledger::default();
    let b = env.node(fast()).await;
    let _wb = Worker::new(&b, ledger.handler("wb")).await.unwrap();
    let a = env.node(fast()).await;
    let wa = Worker::new(&a, ledger.slow_stop_handler("wa", 20, 50))
        .await
        .unwrap();
    eventually("both workers in a's ring", Duration::from_secs(5), || {
        (0..50).any(|i| a.placement(&format!("k{i}")).as_deref() != Some(wa.id()))
            && (0..50).any(|i| a.placement(&format!("k{i}")).as_deref() == Some(wa.id()))
    })
    .await;
    let keys: Vec<String> = (0..)
        .map(|i| format!("close-{i}"))
        .filter(|k| a.placement(k).as_deref() == Some(wa.id()))
        .take(500)
        .collect();
    futures::future::join_all(keys.iter().map(|k| a.dispatch_job(k, &b"p"[..])))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert_eq!(wa.job_keys().len(), 500, "every job on the closing worker");
    let closing = std::time::Instant::now();
    a.close().await.unwrap();
    let took = closing.elapsed();
    eventually(
        "every job runs on the other worker",
        Duration::from_secs(20),
        || {
            let running = ledger.running();
            keys.iter()
                .all(|k| running.get(k).map(String::as_str) == Some("wb"))
        },
    )
    .await;
    assert_eq!(ledger.violations(), Vec::<String>::new());
    eprintln!("close() of a worker with 500 jobs (stop 20-50 ms) took {took:?}");
    // One stop time each in series would be 500 × 20 ms = 10 s at least.
    assert!(took < Duration::from_secs(10), "close took {took:?}");
    b.close().await.unwrap();
}

/// `close()` of a worker cut off from Redis: its lease lapses while the
/// close waits for Redis, and the lease watchdog starts stopping its jobs
/// (slowly); the link heals while those stops run, and the close goes on
/// to hand the jobs over. None may be handed over, and start on the other
/// worker, before its stop on the closing worker has ended (I1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_closed_while_cut_off_hands_over_no_job_before_its_stop_ends() {
    let env = Env::new("close-cut");
    let ledger = Ledger::default();
    let proxy = FaultProxy::start(env.server.addr()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let far = env.proxied_node(&proxy, fast().worker_ttl(ttl)).await;
    // Stops within the stop budget (TTL / 6 = 500 ms), long enough for the
    // close to get through once the link heals.
    let far_worker = Worker::new(&far, ledger.slow_stop_handler("far", 350, 450))
        .await
        .unwrap();
    let near = env.node(fast().worker_ttl(ttl)).await;
    let _near_worker = Worker::new(&near, ledger.handler("near")).await.unwrap();
    for i in 0..60 {
        near.dispatch_job(&format!("c{i}"), &b"p"[..])
            .await
            .unwrap();
    }
    let far_jobs = far_worker.job_keys();
    assert!(!far_jobs.is_empty());
    proxy.black_hole();
    let closing = tokio::spawn({
        let far = far.clone();
        async move { far.close().await }
    });
    // The watchdog takes each job off the running set as its stop begins.
    eventually(
        "the far lease's stops begun",
        Duration::from_secs(10),
        || far_worker.job_keys().is_empty(),
    )
    .await;
    proxy.heal();
    eventually("far jobs moved to near", Duration::from_secs(20), || {
        let running = ledger.running();
        far_jobs
            .iter()
            .all(|k| running.get(k).map(String::as_str) == Some("near"))
    })
    .await;
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    let _ = closing.await.unwrap();
    near.close().await.unwrap();
}
