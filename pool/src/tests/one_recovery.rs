//! One rollback, one recovery. A node hears of a rollback twice: its
//! identity check finds the server's new run id, and its replicas, once
//! their subscriptions reconnect, resync and find Redis behind them. When
//! the second news came while the first recovery ran, the node recovered a
//! second time right after: every start under way was interrupted again,
//! jobs of live workers stopped and resumed, and the pool's recovery window
//! stayed open as long again (chaos soak seed 1432: a second recovery
//! 1.7 s after the first, two `I4 needless move`).

use super::*;
use flotilla_testkit::ServerOptions;
use fred::prelude::KeysInterface;
use futures::FutureExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn news_of_a_rollback_heard_while_recovering_from_it_starts_no_second_recovery() {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("one-recovery");
    let ttl = Duration::from_secs(1);
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_millis(500));
    let node = Node::join(&client, &name, options).await.unwrap();
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

    // A renewal after the snapshot: the keep-alive map's replica is then
    // ahead of the state Redis goes back to, and its resync finds Redis
    // behind it.
    let revision_key = node.inner.store.maps.keepalive_revision_key();
    let revision = |client: fred::prelude::Client, key: String| async move {
        client
            .get::<Option<u64>, _>(key)
            .await
            .unwrap()
            .unwrap_or(0)
    };
    let snapshot = server.save_snapshot().unwrap();
    let at_snapshot = revision(client.clone(), revision_key.clone()).await;
    wait_until(
        Duration::from_secs(5),
        "a renewal after the snapshot",
        || revision(client.clone(), revision_key.clone()).map(|r| r > at_snapshot),
    )
    .await
    .unwrap();
    let mut regressions = node.inner.store.maps.keepalive.regressions();
    regressions.borrow_and_update();

    // The worker's reconcile waits for this: the recovery is under way
    // until it is dropped, and both kinds of news arrive meanwhile.
    let slow = worker.inner.ops.read().await;
    server.roll_back(&snapshot).unwrap();
    wait_until(
        Duration::from_secs(10),
        "a recovery begun and the replica's resync found Redis behind it",
        || {
            let begun = node.inner.recoveries_begun.load(Ordering::SeqCst) >= 1;
            let regressed = regressions.has_changed().unwrap_or(false);
            async move { begun && regressed }
        },
    )
    .await
    .unwrap();
    drop(slow);

    // The recovery ends: its mark is cleared and the window closes
    // (nothing else recovers), so a new key is admitted again.
    let ended = std::time::Instant::now();
    let admitted = loop {
        match node.dispatch_job("after", &b"p"[..]).await {
            Ok(()) => break ended.elapsed(),
            Err(crate::Error::Timeout(_)) if ended.elapsed() < ttl * 10 => continue,
            Err(e) => panic!("no admission after the recovery: {e}"),
        }
    };
    // A second recovery begins right after the first ends, when it does.
    // Give it two TTLs (or the time the admission took, if longer).
    let watch_until = std::time::Instant::now() + (ttl * 2).max(admitted);
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
