//! A stop answered `Ok` that Redis lost, undone by a run of the same
//! dispatch issued before the stop stood again, is carried out again once
//! the node that asked for it makes it stand. Chaos soak seed 1551
//! (`bcd447c`): Redis went back to a state from before nine stops; the
//! workers that carried them out were in a killed process, and the node
//! that asked was cut off 18 ms later, before it noticed. A cleanup of the
//! dead worker moved the jobs to a live one (new tokens), and the asking
//! node, back, found a record newer than each stop and left it: the
//! stopped jobs ran on for good.

use fred::types::Value;

use super::*;

/// The pool's raw payload and fencing counter of `key`, as a state from
/// before a stop holds them.
async fn raw_state(client: &fred::prelude::Client, node: &Node, key: &str) -> (Value, Value) {
    let store = &node.inner.store;
    let payload: Value = client.hget(store.maps.payloads_key(), key).await.unwrap();
    let fencing: Value = client
        .hget(crate::keys::fencing(&node.inner.pool), key)
        .await
        .unwrap();
    assert!(!payload.is_null() && !fencing.is_null(), "{key} admitted");
    (payload, fencing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_undone_by_a_requeue_of_its_dispatch_is_carried_out_again() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("stop-undone");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_millis(1500))
        .orphan_grace(Duration::from_millis(300))
        .sweep_interval(Duration::from_millis(100));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();

    // "undone": stopped, then brought back as Redis held it before the
    // stop, as an orphan of the same dispatch. "again": stopped, then
    // dispatched anew: a new dispatch the old stop must leave alone.
    node.dispatch_job("undone", &b"p"[..]).await.unwrap();
    let before_stop = raw_state(&client, &node, "undone").await;
    node.stop_job("undone").await.unwrap();
    node.dispatch_job("again", &b"p"[..]).await.unwrap();
    node.stop_job("again").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    node.dispatch_job("again", &b"q"[..]).await.unwrap();
    let again = worker.job_token("again").expect("the new dispatch runs");

    // Redis goes back to before the stop of "undone" (its payload and
    // counter; the record it showed named a worker gone since, which a
    // cleanup released), and the orphan sweep requeues it: a newer run of
    // the stopped dispatch.
    let (payload, fencing) = before_stop;
    let _: i64 = client
        .hset(node.inner.store.maps.payloads_key(), ("undone", payload))
        .await
        .unwrap();
    let _: i64 = client
        .hset(crate::keys::fencing(&node.inner.pool), ("undone", fencing))
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "the orphan requeued", || {
        let runs = worker.job_token("undone").is_some();
        async move { runs }
    })
    .await
    .unwrap();

    // The node that asked for the stop makes it stand, as its recovery
    // does once it notices Redis went back in time.
    node.inner.requested_stops_stand().await.unwrap();
    let stopped = wait_until(
        Duration::from_secs(10),
        "the undone stop carried out",
        || {
            let runs = worker.job_token("undone").is_some();
            let store = &node.inner.store;
            async move {
                let payload: Value = store
                    .client
                    .hget(store.maps.payloads_key(), "undone")
                    .await
                    .unwrap();
                !runs && payload.is_null()
            }
        },
    )
    .await;
    assert!(
        stopped.is_ok(),
        "the stopped dispatch of \"undone\" still runs (token {:?}) after its stop was made to stand",
        worker.job_token("undone")
    );
    assert_eq!(
        worker.job_token("again"),
        Some(again),
        "the new dispatch of \"again\" goes on"
    );
    node.close().await.unwrap();
}
