//! A stop of a job whose worker Redis judges dead (silent for over a TTL
//! on server time, the pool not recovering) is carried out in Redis, at
//! once: nothing would read the dead worker's inbox, and the cleanup that
//! comes later would otherwise move the stopped job to a live worker,
//! which would start it after the stop was answered. Chaos soak seed 1591
//! (`6330ec7`, behind Sentinel): a stop Redis lost, asked again for the
//! dispatch that undid it, waited in the inbox of a worker whose process
//! had left; the cleanup moved the job to a new worker, which started it
//! 5 s after the stop's `Ok`.

use super::*;

/// A node whose own cleanup pass never comes within a test: whether a
/// dead worker is cleaned up is up to the node the test joins for it.
pub(super) fn options(cleanup: Duration) -> NodeOptions {
    NodeOptions::default()
        .worker_ttl(Duration::from_millis(1500))
        .dispatch_timeout(Duration::from_secs(4))
        .cleanup_interval(cleanup)
}

/// Whether Redis holds anything of `key`: a record, a pending guard, a
/// payload.
pub(super) async fn held_in_redis(node: &Node, key: &str) -> bool {
    let store = &node.inner.store;
    let mut held = false;
    for hash in [
        store.maps.jobs_keys.hash.as_str(),
        store.maps.pending_keys.hash.as_str(),
        store.maps.payloads_key(),
    ] {
        let exists: bool = store.client.hexists(hash, key).await.unwrap();
        held |= exists;
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_of_a_job_on_a_dead_worker_is_carried_out_in_redis() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("dead-owner-stop");
    let never = Duration::from_secs(3600);
    let asker = Node::join(&client, &name, options(never).client_only(true))
        .await
        .unwrap();
    let b = Node::join(&client, &name, options(never)).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    asker.dispatch_job("k", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs on b", || {
        let runs = wb.job_token("k").is_some();
        async move { runs }
    })
    .await
    .unwrap();

    // b's process dies (no close): its worker stays registered, the job's
    // record names it, and no node has cleaned it up yet.
    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    let ttl = Duration::from_millis(1500);
    wait_until(
        Duration::from_secs(10),
        "b's worker silent for a TTL",
        || silent_for_over(&asker, wb.id(), ttl),
    )
    .await
    .unwrap();

    let asked = std::time::Instant::now();
    let stopped = asker.stop_job("k").await;
    let took = asked.elapsed();
    assert!(
        stopped.is_ok() && took < Duration::from_secs(2),
        "the stop of a job on a dead worker answered {stopped:?} after {took:?}"
    );
    assert!(
        !held_in_redis(&asker, "k").await,
        "the stopped job is still in Redis"
    );

    // A live worker joins, and its node cleans b's worker up: the stopped
    // job must not start there.
    let c = Node::join(&client, &name, options(Duration::from_millis(200)))
        .await
        .unwrap();
    let stays = Counting::default();
    let wc = Worker::new(&c, stays.clone()).await.unwrap();
    let workers = c.inner.store.maps.workers.keys_info().hash.clone();
    wait_until(Duration::from_secs(15), "b's worker cleaned up", || {
        let (client, workers, gone) = (client.clone(), workers.clone(), wb.id().to_string());
        async move {
            let registered: bool = client.hexists(&workers, &gone).await.unwrap();
            !registered
        }
    })
    .await
    .unwrap();
    assert_eq!(
        (stays.starts.load(Ordering::SeqCst), wc.job_token("k")),
        (0, None),
        "the stopped job started on the worker that joined after its stop"
    );
    c.close().await.unwrap();
    asker.close().await.unwrap();
}
