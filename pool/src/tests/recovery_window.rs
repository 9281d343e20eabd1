//! The recovery window after Redis went back in time ends when the pool
//! re-converged, not after a fixed TTL: while a node's workers have not
//! re-asserted what they run, nothing is admitted (a key running there
//! could start twice), however long that takes; once they have, admissions
//! go on at once.

use super::*;
use flotilla_testkit::ServerOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_window_lasts_until_every_worker_reconciled() {
    window_case(false).await;
}

/// The same with nodes that mirror the jobs map (they compare its
/// revision too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_window_lasts_until_every_worker_reconciled_on_mirroring_nodes() {
    window_case(true).await;
}

/// The rollback may come within the second of the snapshot's SAVE (same
/// LASTSAVE) and lose no keep-alive renewal: the dispatcher, which made no
/// write after the SAVE, then sees the restart only by the server's run id,
/// which its scripts compare on every call (or, mirroring, by the jobs
/// map's revision).
async fn window_case(mirror_jobs: bool) {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("recovery-window");
    let ttl = Duration::from_secs(1);
    let options = NodeOptions::default()
        .mirror_jobs(mirror_jobs)
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_millis(500));
    let node = Node::join(&client, &name, options.clone()).await.unwrap();
    // Dispatches from a node with no workers, whose own recovery is quick.
    let dispatcher = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("before", &b"p"[..]).await.unwrap();
    let snapshot = server.save_snapshot().unwrap();
    // Admitted in the writes the rollback loses: Redis forgets it, the
    // worker runs it.
    node.dispatch_job("lost", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "both jobs run", || async {
        handler.starts.load(Ordering::SeqCst) == 2
    })
    .await
    .unwrap();

    // The worker's reconcile waits for this (it takes the worker's
    // operations lock for writing): a slow re-assertion.
    let slow = worker.inner.ops.read().await;
    server.roll_back(&snapshot).unwrap();
    let back = std::time::Instant::now();
    // Well past the window's own TTL, the worker has not re-asserted
    // "lost" yet: admitting it again would run it twice.
    while back.elapsed() < ttl * 3 {
        match dispatcher.dispatch_job("lost", &b"again"[..]).await {
            Err(crate::Error::Timeout(_)) => {}
            other => panic!("'lost' admitted before its worker re-asserted it: {other:?}"),
        }
    }
    drop(slow);
    // Re-asserted: the window closes with the last reconcile.
    let released = std::time::Instant::now();
    let again = loop {
        match dispatcher.dispatch_job("new", &b"p"[..]).await {
            Ok(()) => break released.elapsed(),
            Err(crate::Error::Timeout(_)) if released.elapsed() < ttl * 10 => continue,
            Err(e) => panic!(
                "no admission {:?} after the reconcile: {e}",
                released.elapsed()
            ),
        }
    };
    assert!(
        matches!(
            dispatcher.dispatch_job("lost", &b"again"[..]).await,
            Err(crate::Error::JobExists(_))
        ),
        "'lost' runs and is known again"
    );
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        3,
        "before, lost and new started once each"
    );
    tracing::info!(?again, "admitting again after the reconcile");
    dispatcher.close().await.unwrap();
    node.close().await.unwrap();
}
