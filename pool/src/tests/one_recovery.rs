//! One rollback, one recovery. A node hears of a rollback twice: its
//! identity check finds the server's new run id, and its replicas, once
//! their subscriptions reconnect, resync and find Redis behind them. When
//! the second news came while the first recovery ran, the node recovered a
//! second time right after: every start under way was interrupted again,
//! jobs of live workers stopped and resumed, and the pool's recovery window
//! stayed open as long again (chaos soak seed 1432: a second recovery
//! 1.7 s after the first, two `I4 needless move`). Which news comes first
//! is a race: the test makes sure a replica's comes during the recovery.

use super::*;
use flotilla_testkit::ServerOptions;
use fred::prelude::{HashesInterface, KeysInterface};

/// A Redis server with AOF (its snapshots can be rolled back to), a
/// client, a node of a new pool named after `name` mirroring the jobs
/// map, and its worker TTL: long enough that the lease outlasts the
/// restart of a loaded machine's Redis (a lapse would stop the jobs for
/// its own reason).
async fn node_on_a_snapshotting_server(
    name: &str,
) -> (RedisServer, fred::prelude::Client, Node, Duration) {
    let server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name(name);
    let ttl = Duration::from_secs(3);
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_millis(500))
        .mirror_jobs(true);
    let node = Node::join(&client, &name, options).await.unwrap();
    (server, client, node, ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn news_of_a_rollback_heard_while_recovering_from_it_starts_no_second_recovery() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (mut server, client, node, ttl) = node_on_a_snapshotting_server("one-recovery").await;
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    for key in ["a", "b", "c"] {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    wait_until(Duration::from_secs(5), "the jobs run", || async {
        handler.starts.load(Ordering::SeqCst) == 3
    })
    .await
    .unwrap();

    let snapshot = server.save_snapshot().unwrap();
    let jobs = node.inner.store.maps.jobs_map();
    let mut regressions = jobs.regressions();
    regressions.borrow_and_update();

    // The worker's reconcile waits for this: the recovery is under way
    // until it is dropped.
    let slow = worker.inner.ops.read().await;
    server.roll_back(&snapshot).unwrap();
    wait_until(Duration::from_secs(10), "a recovery begun", || async {
        node.inner.recoveries_begun.load(Ordering::SeqCst) >= 1
    })
    .await
    .unwrap();
    // The replicas' resyncs find Redis behind them as their subscriptions
    // reconnect, before or after the identity check began the recovery,
    // as it happens. So that one does during the recovery, Redis's
    // revision of the jobs map goes back once more (below the replica's
    // whatever it has applied), and the replica resyncs. Nothing else
    // writes that map now: only the re-assertion, which waits for `slow`.
    regressions.borrow_and_update();
    let behind = jobs.revision().saturating_sub(1);
    let _: () = client
        .set(&jobs.keys_info().revision, behind, None, None, false)
        .await
        .unwrap();
    jobs.resync().await.unwrap();
    assert!(
        regressions.has_changed().unwrap(),
        "the replica's resync found Redis behind it"
    );
    assert_eq!(node.inner.recoveries_begun.load(Ordering::SeqCst), 1);
    drop(slow);

    // The recovery ends: its mark is cleared and the window closes
    // (nothing else recovers), so a new key is admitted again.
    let ended = std::time::Instant::now();
    let mut timed_out = false;
    let admitted = loop {
        match node.dispatch_job("after", &b"p"[..]).await {
            Ok(()) => break ended.elapsed(),
            // A dispatch that timed out on a loaded machine may have been
            // admitted all the same: its retry then finds the job.
            Err(crate::Error::JobExists(_)) if timed_out => break ended.elapsed(),
            Err(crate::Error::Timeout(_)) if ended.elapsed() < ttl * 10 => timed_out = true,
            Err(e) => panic!("no admission after the recovery: {e}"),
        }
    };
    // A second recovery begins right after the first ends, when it does.
    // Give it two seconds (or the time the admission took, if longer).
    let watch_until = std::time::Instant::now() + Duration::from_secs(2).max(admitted);
    while std::time::Instant::now() < watch_until {
        assert_eq!(
            node.inner.recoveries_begun.load(Ordering::SeqCst),
            1,
            "a second recovery from the same rollback"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        handler.stops.load(Ordering::SeqCst),
        0,
        "no job stopped: the worker runs them all"
    );
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        4,
        "a, b, c and after"
    );
    node.close().await.unwrap();
}

/// Redis goes back in time again while the node still recovers from the
/// first time (here one worker's reconcile waits): the jobs the second
/// rollback took are re-asserted at once, not after the first recovery's
/// tail (chaos soak seed 1564: a recovery took 1.6 s, the second rollback
/// of a `rollback-twice` came 0.3 s into it, the node re-asserted its jobs
/// 1.3 s after that, and a dispatch meanwhile admitted a running job
/// again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_rollback_during_a_recovery_is_recovered_from_at_once() {
    let (mut server, client, node, ttl) = node_on_a_snapshotting_server("recovery-again").await;
    let w1 = Worker::new(&node, Counting::default()).await.unwrap();
    let w2 = Worker::new(&node, Counting::default()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        node.pool_workers().len() == 2
    })
    .await
    .unwrap();
    // Both workers registered, no job yet.
    let snapshot = server.save_snapshot().unwrap();
    let keys: Vec<String> = (0..200)
        .map(|i| format!("k{i}"))
        .filter(|k| node.placement(k).as_deref() == Some(w2.id()))
        .take(3)
        .collect();
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    wait_until(Duration::from_secs(5), "the jobs run on w2", || async {
        let running = w2.job_keys();
        keys.iter().all(|k| running.contains(k))
    })
    .await
    .unwrap();
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let recorded = || async {
        for key in &keys {
            let record: Option<String> = client.hget(&jobs_hash, key).await.unwrap_or(None);
            if record.is_none() {
                return false;
            }
        }
        true
    };
    // w1's reconcile waits for this: the first recovery does not end.
    let slow = w1.inner.ops.read().await;
    server.roll_back(&snapshot).unwrap();
    wait_until(
        Duration::from_secs(10),
        "w2's jobs re-asserted after the first rollback",
        recorded,
    )
    .await
    .unwrap();
    server.roll_back(&snapshot).unwrap();
    let result = wait_until(
        ttl,
        "w2's jobs re-asserted after the second rollback, the first recovery still under way",
        recorded,
    )
    .await;
    drop(slow);
    result.unwrap();
    // The first recovery's wait for w1's lock ended with it: w1's starts
    // are no longer interrupted once the recoveries are over.
    let key = key_placed_on(&node, &w1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match node.dispatch_job(&key, &b"p"[..]).await {
            Ok(()) | Err(crate::Error::JobExists(_)) => break,
            // Admissions wait for the pool's recovery to end.
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "dispatch refused; asking again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no admission after the recoveries: {e}"),
        }
    }
    wait_until(
        Duration::from_secs(10),
        "a new job starts on w1",
        || async { w1.job_keys().contains(&key) },
    )
    .await
    .unwrap();
    node.close().await.unwrap();
}
