//! A stop answered `Ok` that Redis lost, undone by a run of the same
//! dispatch issued before the stop stood again, is not carried out twice:
//! the worker that stopped the dispatch does not start it again, and the
//! node that asked for the stop stops it again wherever it runs once it
//! makes its stops stand. Chaos soak seeds 1551 (`bcd447c`) and 1557
//! (`6c8bb45`): Redis went back to a state from before stops of moved jobs;
//! a cleanup (or the cleaner's custody) moved them again, new tokens, and
//! the stopped jobs ran on. A dispatch admitted right after a stop, within
//! its millisecond, is another dispatch (its admission stamp is its own
//! token) and goes on.

use fred::types::Value;

use super::*;

/// The pool's raw payload, fencing counter and dispatch-over mark (see
/// `ENDED` in `scripts/base.lua`) of `key`, as a state from before a stop
/// holds them.
async fn raw_state(client: &fred::prelude::Client, node: &Node, key: &str) -> [Value; 3] {
    let store = &node.inner.store;
    let fencing = crate::keys::fencing(&node.inner.pool);
    let payload: Value = client.hget(store.maps.payloads_key(), key).await.unwrap();
    let counter: Value = client.hget(&fencing, key).await.unwrap();
    let ended_field = format!("{}{key}", crate::keys::ENDED_FIELD_PREFIX);
    let ended: Value = client.hget(&fencing, ended_field).await.unwrap();
    assert!(!payload.is_null() && !counter.is_null(), "{key} admitted");
    [payload, counter, ended]
}

/// Puts back `key`'s payload, counter and mark from before its stop, as
/// Redis going back in time does (the record it showed named a worker gone
/// since, which a cleanup released): an orphan of the stopped dispatch,
/// which the sweep requeues.
async fn go_back(
    client: &fred::prelude::Client,
    node: &Node,
    key: &str,
    [payload, counter, ended]: [Value; 3],
) {
    let fencing = crate::keys::fencing(&node.inner.pool);
    let _: i64 = client
        .hset(node.inner.store.maps.payloads_key(), (key, payload))
        .await
        .unwrap();
    let _: i64 = client.hset(&fencing, (key, counter)).await.unwrap();
    let ended_field = format!("{}{key}", crate::keys::ENDED_FIELD_PREFIX);
    if ended.is_null() {
        let _: i64 = client.hdel(&fencing, ended_field).await.unwrap();
    } else {
        let _: i64 = client.hset(&fencing, (ended_field, ended)).await.unwrap();
    }
}

/// Whether Redis holds a payload for `key`.
async fn has_payload(node: &Node, key: &str) -> bool {
    let store = &node.inner.store;
    let payload: Value = store
        .client
        .hget(store.maps.payloads_key(), key)
        .await
        .unwrap();
    !payload.is_null()
}

fn options() -> NodeOptions {
    NodeOptions::default()
        .worker_ttl(Duration::from_millis(1500))
        .orphan_grace(Duration::from_millis(300))
        .sweep_interval(Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_does_not_start_again_a_dispatch_it_stopped_on_request() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("stop-undone-here");
    let node = Node::join(&client, &name, options()).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();

    node.dispatch_job("undone", &b"p"[..]).await.unwrap();
    let before_stop = raw_state(&client, &node, "undone").await;
    node.stop_job("undone").await.unwrap();
    let starts = handler.starts.load(Ordering::SeqCst);

    go_back(&client, &node, "undone", before_stop).await;
    // The sweep requeues the orphan to the same worker (the ring's owner),
    // which drops the start and makes its stop stand: the payload goes.
    let gone = wait_until(
        Duration::from_secs(10),
        "the orphan's start dropped",
        || {
            let node = node.clone();
            async move { !has_payload(&node, "undone").await }
        },
    )
    .await;
    assert!(
        gone.is_ok(),
        "the stopped dispatch's payload is still there"
    );
    assert_eq!(
        (
            handler.starts.load(Ordering::SeqCst),
            worker.job_token("undone")
        ),
        (starts, None),
        "the worker started again a dispatch it stopped on request"
    );
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_undone_by_a_requeue_of_its_dispatch_elsewhere_is_carried_out_again() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("stop-undone");
    let node = Node::join(&client, &name, options()).await.unwrap();
    let handler = Counting::default();
    let stopper = Worker::new(&node, handler.clone()).await.unwrap();

    // "undone": stopped, then brought back as Redis held it before the
    // stop, as an orphan of the same dispatch, after the worker that
    // stopped it left (the one that runs it next remembers no stop).
    // "again": stopped, then dispatched anew: a new dispatch the old stop
    // must leave alone.
    node.dispatch_job("undone", &b"p"[..]).await.unwrap();
    let before_stop = raw_state(&client, &node, "undone").await;
    node.stop_job("undone").await.unwrap();
    node.remove_worker(&stopper).await.unwrap();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("again", &b"p"[..]).await.unwrap();
    node.stop_job("again").await.unwrap();
    // At once: likely within the millisecond of the stop's token.
    node.dispatch_job("again", &b"q"[..]).await.unwrap();
    let again = worker.job_token("again").expect("the new dispatch runs");

    // Redis goes back to before the stop of "undone", and the orphan sweep
    // requeues it: a newer run of the stopped dispatch.
    go_back(&client, &node, "undone", before_stop).await;
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
            let node = node.clone();
            async move { !runs && !has_payload(&node, "undone").await }
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

/// A stop of one dispatch asked again (an undone stop, an end made to
/// stand) reaches only a run of that dispatch. After a rollback Redis may
/// hold an older dispatch's payload beside the record of a newer
/// dispatch's run, until that run's worker re-asserts it with its own
/// payload: the stop, routed by the older payload to that worker, must
/// leave the newer dispatch's run alone. Chaos soak seed 1599 on
/// `07e2c17` (Sentinel): a stop of an older dispatch asked again stopped
/// the newer dispatch's run, which then ran nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_of_an_older_dispatch_leaves_a_newer_dispatchs_run() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("stop-older-dispatch");
    let node = Node::join(&client, &name, options()).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();

    node.dispatch_job("k", &b"older"[..]).await.unwrap();
    let [older, _, _] = raw_state(&client, &node, "k").await;
    let older_bytes = older.as_bytes().expect("a stored payload").to_vec();
    let (older_stamp, _) = crate::codec::split_stored(&older_bytes).expect("stamped");
    node.stop_job("k").await.unwrap();
    node.dispatch_job("k", &b"newer"[..]).await.unwrap();
    let [newer, _, _] = raw_state(&client, &node, "k").await;
    let run = worker.job_token("k").expect("the newer dispatch runs");
    let stops = handler.stops.load(Ordering::SeqCst);

    let payloads = node.inner.store.maps.payloads_key();
    let stop_older = |within: u64| {
        let node = node.clone();
        async move {
            let dispatch = crate::codec::stamp_us(older_stamp);
            (node.inner)
                .stop_dispatch("k", dispatch, Duration::from_secs(within))
                .await
        }
    };

    // Redis shows the older dispatch's payload under the newer run's record.
    let _: i64 = client.hset(payloads, ("k", older)).await.unwrap();
    // The stop of the older dispatch is asked again; it is not done while
    // that payload routes it to the newer run's worker.
    let asked = stop_older(1).await;
    assert_eq!(
        (worker.job_token("k"), handler.stops.load(Ordering::SeqCst)),
        (Some(run), stops),
        "a stop of the older dispatch stopped the newer dispatch's run (asked: {asked:?})"
    );

    // Once the newer run's payload is back (its worker re-asserts it), the
    // older dispatch is found nowhere: the stop is done.
    let _: i64 = client.hset(payloads, ("k", newer)).await.unwrap();
    let asked = stop_older(5).await;
    assert!(asked.is_ok(), "the older dispatch's stop: {asked:?}");
    assert_eq!(
        (worker.job_token("k"), handler.stops.load(Ordering::SeqCst)),
        (Some(run), stops),
        "the newer dispatch's run goes on"
    );
    node.close().await.unwrap();
}
