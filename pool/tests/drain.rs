//! Operator actions on any worker: drain (its jobs move through the safe
//! handoff, nothing new reaches it, on every node), undrain, draining the
//! last worker, and removing a dead worker on demand (decided on Redis's
//! keep-alive: a live worker is refused).

mod support;

use std::collections::HashMap;
use std::time::Duration;

use flotilla_pool::{Error, Node, Worker, WorkerRemoval};
use flotilla_testkit::FaultProxy;
use support::{Env, Ledger, eventually, fast};
use tokio::time::Instant;

/// Whether `jobs` jobs run and none on `worker`, read from one snapshot of
/// the ledger: two reads could each be true at a different instant (all
/// running before `worker`'s last stop, none on `worker` after it, before
/// the job started elsewhere).
fn all_run_but_on(ledger: &Ledger, jobs: usize, worker: &str) -> bool {
    let running = ledger.running();
    running.len() == jobs && running.values().all(|w| w != worker)
}

/// Dispatches `keys` from `node` concurrently; every dispatch must succeed.
async fn dispatch_all(node: &Node, keys: impl IntoIterator<Item = String>) {
    let calls = keys.into_iter().map(|k| {
        let node = node.clone();
        async move { node.dispatch_job(&k, &b"p"[..]).await.map_err(|e| (k, e)) }
    });
    for result in futures::future::join_all(calls).await {
        if let Err((key, e)) = result {
            panic!("dispatch of {key} failed: {e}");
        }
    }
}

/// Keys running on `worker` (by the ledger's worker name).
fn running_on(ledger: &Ledger, worker: &str) -> Vec<String> {
    let mut keys: Vec<String> = ledger
        .running()
        .into_iter()
        .filter(|(_, w)| w == worker)
        .map(|(k, _)| k)
        .collect();
    keys.sort();
    keys
}

/// Starts seen on `worker` so far.
fn starts_on(ledger: &Ledger, worker: &str) -> usize {
    ledger
        .entries()
        .iter()
        .filter(|e| e.start && e.worker == worker)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_workers_jobs_move_without_overlap_and_nothing_new_reaches_it() {
    let env = Env::new("drain");
    let ledger = Ledger::default();
    let (a, b, c) = (
        env.node(fast()).await,
        env.node(fast()).await,
        env.node(fast()).await,
    );
    // Stops take tens of ms, so a start elsewhere before the stop ended
    // would show in the ledger.
    let wa = Worker::new(&a, ledger.slow_stop_handler("a", 20, 60))
        .await
        .unwrap();
    let _wb = Worker::new(&b, ledger.slow_stop_handler("b", 20, 60))
        .await
        .unwrap();
    let _wc = Worker::new(&c, ledger.slow_stop_handler("c", 20, 60))
        .await
        .unwrap();
    eventually(
        "every node sees three workers",
        Duration::from_secs(5),
        || [&a, &b, &c].iter().all(|n| n.pool_workers().len() == 3),
    )
    .await;

    dispatch_all(&b, (0..30).map(|i| format!("job-{i}"))).await;
    let on_a = running_on(&ledger, "a");
    assert!(on_a.len() >= 3, "want several jobs on a: {on_a:?}");
    let tokens_before: HashMap<String, u64> = on_a
        .iter()
        .map(|k| (k.clone(), *ledger.tokens(k).last().unwrap()))
        .collect();
    let starts_on_a = starts_on(&ledger, "a");

    // Drained from another node than its own.
    assert!(b.drain_worker(wa.id()).await.unwrap());
    assert!(!b.drain_worker(wa.id()).await.unwrap(), "idempotent");
    eventually(
        "every job of a runs elsewhere",
        Duration::from_secs(10),
        || all_run_but_on(&ledger, 30, "a"),
    )
    .await;
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    for (key, before) in &tokens_before {
        let tokens = ledger.tokens(key);
        assert_eq!(tokens.len(), 2, "{key} started once elsewhere: {tokens:?}");
        assert!(
            tokens[1] > *before,
            "{key}: tokens must increase: {tokens:?}"
        );
    }
    // Every node routes around it, its own included.
    eventually(
        "no node places a key on the drained worker",
        Duration::from_secs(5),
        || {
            [&a, &b, &c].iter().all(|n| {
                (0..200).all(|i| n.placement(&format!("probe-{i}")).as_deref() != Some(wa.id()))
            })
        },
    )
    .await;
    let info = b.pool_workers();
    let drained: Vec<_> = info.iter().filter(|w| w.drained).map(|w| &w.id).collect();
    assert_eq!(drained, vec![wa.id()]);

    // New jobs, dispatched from the drained worker's node and another one.
    dispatch_all(&a, (0..20).map(|i| format!("new-a-{i}"))).await;
    dispatch_all(&c, (0..20).map(|i| format!("new-c-{i}"))).await;
    assert_eq!(ledger.running().len(), 70);
    assert_eq!(
        starts_on(&ledger, "a"),
        starts_on_a,
        "nothing new started on a"
    );

    // Undrained: it takes its share again, through the same handoff.
    assert!(c.undrain_worker(wa.id()).await.unwrap());
    eventually("a runs jobs again", Duration::from_secs(10), || {
        !running_on(&ledger, "a").is_empty()
    })
    .await;
    eventually("all 70 run", Duration::from_secs(10), || {
        ledger.running().len() == 70
    })
    .await;
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());

    assert!(matches!(
        a.drain_worker("no-such-worker").await,
        Err(Error::UnknownWorker(w)) if w == "no-such-worker"
    ));
    assert!(matches!(
        a.drain_worker("bad{id}").await,
        Err(Error::InvalidName { .. })
    ));
    for node in [a, b, c] {
        node.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_the_last_worker_keeps_its_jobs_until_another_can_take_them() {
    let env = Env::new("drain-last");
    let ledger = Ledger::default();
    let a = env.node(fast()).await;
    let wa = Worker::new(&a, ledger.slow_stop_handler("a", 20, 60))
        .await
        .unwrap();
    dispatch_all(&a, (0..6).map(|i| format!("job-{i}"))).await;
    assert!(a.drain_worker(wa.id()).await.unwrap());
    eventually("the ring is empty", Duration::from_secs(5), || {
        a.placement("job-0").is_none()
    })
    .await;
    // Nowhere to go: a dispatch waits for an active worker and gives up.
    let client_only = env
        .node(
            fast()
                .client_only(true)
                .dispatch_timeout(Duration::from_millis(500)),
        )
        .await;
    let refused = client_only.dispatch_job("late", &b"p"[..]).await;
    assert!(
        matches!(refused, Err(Error::NoActiveWorker(_))),
        "{refused:?}"
    );
    // The drained worker's jobs were never stopped meanwhile.
    assert_eq!(running_on(&ledger, "a").len(), 6);
    assert!(ledger.entries().iter().all(|e| e.start), "no stop on a");

    // A worker joins: they move to it.
    let b = env.node(fast()).await;
    let _wb = Worker::new(&b, ledger.slow_stop_handler("b", 20, 60))
        .await
        .unwrap();
    eventually("the jobs moved to b", Duration::from_secs(10), || {
        running_on(&ledger, "b").len() == 6
    })
    .await;
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    for node in [client_only, a, b] {
        node.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_dead_worker_requeues_its_jobs_once_and_a_live_one_is_refused() {
    let env = Env::new("remove-dead");
    let ledger = Ledger::default();
    // No sweep of their own within the test: the removal below is what
    // moves the victim's jobs.
    let quiet = || fast().cleanup_interval(Duration::from_secs(600));
    let proxy = FaultProxy::start(env.server.addr()).await.unwrap();
    let victim_client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let doomed = Node::join(&victim_client, &env.pool, quiet())
        .await
        .unwrap();
    let victim = Worker::new(&doomed, ledger.slow_stop_handler("victim", 20, 60))
        .await
        .unwrap();
    let node = env.node(quiet()).await;
    let survivor = Worker::new(&node, ledger.slow_stop_handler("survivor", 20, 60))
        .await
        .unwrap();
    let admin = env.node(quiet().client_only(true)).await;
    eventually("both workers seen", Duration::from_secs(5), || {
        admin.pool_workers().len() == 2 && node.pool_workers().len() == 2
    })
    .await;
    dispatch_all(&node, (0..20).map(|i| format!("job-{i}"))).await;
    let on_victim = running_on(&ledger, "victim");
    assert!(on_victim.len() >= 2, "{on_victim:?}");

    // Alive by Redis's keep-alive: refused, nothing moves.
    for live in [victim.id(), survivor.id()] {
        let refused = admin.remove_dead_worker(live).await;
        assert!(
            matches!(&refused, Err(Error::WorkerAlive { worker, .. }) if worker == live),
            "{refused:?}"
        );
    }
    assert!(matches!(
        admin.remove_dead_worker("no-such-worker").await,
        Err(Error::UnknownWorker(_))
    ));
    assert_eq!(running_on(&ledger, "victim"), on_victim);

    // The victim's process is cut off (it keeps running): its lease lapses
    // and it stops its jobs; once its keep-alive is a TTL old in Redis the
    // removal goes through.
    proxy.cut();
    let deadline = Instant::now() + Duration::from_secs(10);
    let silent = loop {
        match admin.remove_dead_worker(victim.id()).await {
            Ok(WorkerRemoval::Removed { silent }) => break silent,
            Err(Error::WorkerAlive { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("removal: {other:?}"),
        }
    };
    assert!(silent > fast().worker_ttl, "{silent:?}");
    eventually(
        "the victim's jobs run on the survivor",
        Duration::from_secs(10),
        || all_run_but_on(&ledger, 20, "victim"),
    )
    .await;
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    for key in &on_victim {
        let survivor_starts = ledger
            .entries()
            .iter()
            .filter(|e| e.start && e.worker == "survivor" && e.key == *key)
            .count();
        assert_eq!(survivor_starts, 1, "{key} requeued once");
    }
    eventually("the victim is unregistered", Duration::from_secs(5), || {
        admin.pool_workers().iter().all(|w| w.id != victim.id())
    })
    .await;
    assert!(matches!(
        admin.remove_dead_worker(victim.id()).await,
        Err(Error::UnknownWorker(_))
    ));
    let _ = survivor;
    admin.close().await.unwrap();
    node.close().await.unwrap();
    // The cut-off node is left to the end of the test: closing it would
    // wait for a Redis it cannot reach.
    drop(doomed);
}
