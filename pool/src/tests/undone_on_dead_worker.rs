//! A dispatch whose stop Redis lost, made to stand again after Redis went
//! back in time, finds a newer run of it on a worker that died since
//! (`stop_stands.lua`: 'undone'). The node that asked stops it again
//! through its worker, but a dead worker reads nothing, and while the pool
//! recovers the stop waits; the cleanup that comes after the recovery
//! window moved the run to a live worker, which started the stopped
//! dispatch again (chaos soak seed 1586, behind Sentinel: 61 `I2 stop
//! undone` within 2 s of one cleanup). The stop marks the dispatch over in
//! Redis, and the cleanup ends it instead of moving it on.

use fred::types::Value;

use super::*;
use crate::store::{StopKind, StopStands};

/// A node whose own cleanup runs every `cleanup`.
fn options(cleanup: Duration) -> NodeOptions {
    NodeOptions::default()
        .worker_ttl(Duration::from_millis(1500))
        .dispatch_timeout(Duration::from_secs(4))
        .cleanup_interval(cleanup)
}

/// Whether Redis judges `worker` silent for over `ttl` by its clock.
async fn silent_for_over(node: &Node, worker: &str, ttl: Duration) -> bool {
    let store = &node.inner.store;
    let hash = store.maps.keepalive.keys_info().hash.clone();
    let last: Option<u64> = store.client.hget(&hash, worker).await.unwrap();
    let now = store.server_time_ms().await.unwrap();
    last.is_some_and(|last| now.saturating_sub(last) > ttl.as_millis() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_run_of_a_dispatch_whose_stop_stood_again_is_not_moved_on() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("undone-dead");
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
    let stopped = wb.job_token("k").unwrap();
    let store = &asker.inner.store;
    let payload: Value = client.hget(store.maps.payloads_key(), "k").await.unwrap();
    asker.stop_job("k").await.unwrap();

    // b's process dies (no close), and Redis goes back to a state that
    // shows the stopped dispatch running on b's worker under a newer token
    // (a move made on writes the stop came after, which it lost).
    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    let newer = stopped + 1_000;
    let _: i64 = client
        .hset(store.maps.payloads_key(), ("k", payload))
        .await
        .unwrap();
    let _: i64 = client
        .hset(crate::keys::fencing(&asker.inner.pool), ("k", newer))
        .await
        .unwrap();
    let record = format!("{} {newer}", wb.id());
    let _: i64 = client
        .hset(store.maps.jobs_keys.hash.as_str(), ("k", record))
        .await
        .unwrap();
    // The asker makes its stop stand (as its recovery does): undone.
    let stood = store
        .stop_stands_batch(&[("k", stopped)], StopKind::Dispatch)
        .await
        .unwrap();
    assert!(
        matches!(stood.as_slice(), [StopStands::Undone(_)]),
        "{stood:?}"
    );
    let ttl = Duration::from_millis(1500);
    wait_until(
        Duration::from_secs(10),
        "b's worker silent for a TTL",
        || silent_for_over(&asker, wb.id(), ttl),
    )
    .await
    .unwrap();

    // A live worker joins, and its node cleans b's worker up: the stopped
    // dispatch must not start there.
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
        "the stopped dispatch started on the worker that cleaned the dead one up"
    );
    let (_, record, guard) = store.job_records("k").await.unwrap();
    let left: Value = client.hget(store.maps.payloads_key(), "k").await.unwrap();
    assert_eq!(
        (record, guard, left.is_null()),
        (None, None, true),
        "the stopped dispatch is still in Redis"
    );
    c.close().await.unwrap();
    asker.close().await.unwrap();
}
