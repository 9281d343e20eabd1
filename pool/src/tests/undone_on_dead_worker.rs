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

use super::dead_owner_stop::{held_in_redis, options};
use super::resume::Failing;
use super::*;
use crate::store::{StopKind, StopStands};

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
    go_back(&client, &asker, "k", payload, wb.id(), stopped + 1_000).await;
    // The asker makes its stop stand (as its recovery does): undone.
    let stood = store
        .stop_stands_batch(&[("k", stopped)], StopKind::Dispatch)
        .await
        .unwrap();
    assert!(
        matches!(stood.as_slice(), [StopStands::Undone(_)]),
        "{stood:?}"
    );
    not_moved_on(&client, &name, &asker, wb.id(), "k", &[]).await;
    asker.close().await.unwrap();
}

/// Puts back `key`'s `payload` and a record of a run of it at `worker`
/// under token `newer` (the key's counter), as a state Redis went back to.
async fn go_back(
    client: &fred::prelude::Client,
    node: &Node,
    key: &str,
    payload: Value,
    worker: &str,
    newer: u64,
) {
    let store = &node.inner.store;
    let _: i64 = client
        .hset(store.maps.payloads_key(), (key, payload))
        .await
        .unwrap();
    let _: i64 = client
        .hset(crate::keys::fencing(&node.inner.pool), (key, newer))
        .await
        .unwrap();
    let record = format!("{worker} {newer}");
    let _: i64 = client
        .hset(store.maps.jobs_keys.hash.as_str(), (key, record))
        .await
        .unwrap();
}

/// Once `dead`, a worker whose process died, is silent for a TTL, a live
/// worker joins on a new node that cleans `dead` up: `key`'s dispatch,
/// marked over, must start neither there nor on any of `others`, and Redis
/// must hold nothing of it.
async fn not_moved_on(
    client: &fred::prelude::Client,
    name: &str,
    node: &Node,
    dead: &str,
    key: &str,
    others: &[&Worker],
) {
    let ttl = Duration::from_millis(1500);
    wait_until(
        Duration::from_secs(10),
        "the dead worker silent for a TTL",
        || silent_for_over(node, dead, ttl),
    )
    .await
    .unwrap();
    let c = Node::join(client, name, options(Duration::from_millis(200)))
        .await
        .unwrap();
    let stays = Counting::default();
    let wc = Worker::new(&c, stays.clone()).await.unwrap();
    let workers = c.inner.store.maps.workers.keys_info().hash.clone();
    wait_until(
        Duration::from_secs(15),
        "the dead worker cleaned up",
        || {
            let (client, workers, gone) = (client.clone(), workers.clone(), dead.to_string());
            async move {
                let registered: bool = client.hexists(&workers, &gone).await.unwrap();
                !registered
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (stays.starts.load(Ordering::SeqCst), wc.job_token(key)),
        (0, None),
        "the ended dispatch started on the worker that cleaned the dead one up"
    );
    for other in others {
        assert_eq!(other.job_token(key), None, "the ended dispatch runs again");
    }
    assert!(
        !held_in_redis(&c, key).await,
        "the ended dispatch is still in Redis"
    );
    c.close().await.unwrap();
}

/// The same for a dispatch a worker finished: its end, made to stand by
/// the worker's node after the rollback, finds a newer run of the finished
/// dispatch on the dead worker and marks it over (seed 1586's 27 `I2
/// finish undone`: finished jobs moved off a dead worker and run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_run_of_a_dispatch_finished_elsewhere_is_not_moved_on() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("finished-dead");
    let never = Duration::from_secs(3600);
    let a = Node::join(&client, &name, options(never)).await.unwrap();
    let handler = Failing::default();
    let wa = Worker::new(&a, handler.clone()).await.unwrap();
    let b = Node::join(&client, &name, options(never)).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        a.pool_workers().len() == 2
    })
    .await
    .unwrap();
    let key = key_placed_on(&a, &wa).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs on a", || async {
        wa.job_token(&key).is_some()
    })
    .await
    .unwrap();
    let store = &a.inner.store;
    let payload: Value = client.hget(store.maps.payloads_key(), &key).await.unwrap();
    handler.outcome.lock().unwrap().take().unwrap().finished();
    wait_until(Duration::from_secs(5), "the finish recorded", || async {
        wa.inner.stopped.newest(&key).is_some()
    })
    .await
    .unwrap();
    let ended_at = wa.inner.stopped.newest(&key).unwrap();

    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    go_back(&client, &a, &key, payload, wb.id(), ended_at + 1_000).await;
    // a's recovery makes its worker's ends stand.
    a.inner
        .stops_stand(&wa.inner, &std::collections::HashSet::new())
        .await
        .unwrap();
    not_moved_on(&client, &name, &a, wb.id(), &key, &[&wa]).await;
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        1,
        "started again on a"
    );
    a.close().await.unwrap();
}
