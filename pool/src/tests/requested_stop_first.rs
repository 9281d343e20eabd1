//! A stop this node's `stop_job` was answered for stands before a worker of
//! the same node re-asserts a copy of the stopped run it still holds. A
//! worker cut off when its job was stopped holds a suspended copy that
//! only the stop's tombstone keeps out; Redis may lose that tombstone (an
//! empty restart, a rollback). The re-assertion a renewal makes when Redis
//! forgot the worker comes before the node's recovery makes its requested
//! stops stand, and a recovery no longer holds every worker's
//! re-assertion back until all of them stand (a node that had stopped
//! 2,000 jobs held them back 88 ms at the median): so each re-assertion
//! makes stand first the requested stops of the runs it is about to
//! re-assert. Without that, the suspended copy came back in Redis over a
//! stop answered `Ok`.

use fred::types::Value;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_a_worker_still_holds_is_not_reasserted_over_its_stop() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("requested-stop-first");
    let (node, worker, handler) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let key = "stopped-while-cut-off";
    node.dispatch_job(key, &b"p"[..]).await.unwrap();
    let token = worker.job_token(key).expect("the job runs here");

    // The worker was cut off: the lapse stopped the handler and holds the
    // run suspended. The node's `stop_job` was answered for that run (its
    // tombstone is remembered here) and Redis then went back to before the
    // stop: it shows the run on the worker, its payload, its counter.
    let (_, job) = worker.inner.jobs.remove(key).unwrap();
    worker.inner.stop_handler(key).await.unwrap();
    let admitted = job.admitted;
    worker
        .inner
        .suspended
        .lock()
        .await
        .insert(key.to_string(), job);
    node.inner
        .stops_requested
        .record_dispatch(key, token, admitted);
    let record = node.inner.store.job_record(key).await.unwrap();
    assert_eq!(
        record.as_deref(),
        Some(format!("{} {token}", worker.id()).as_str()),
        "Redis shows the stopped run on the worker"
    );

    // The re-assertion a renewal makes when Redis forgot the worker.
    node.inner.reassert_all(&worker.inner).await.unwrap();

    assert!(
        !worker.inner.suspended.lock().await.contains_key(key),
        "the worker gave up its copy of the stopped run"
    );
    assert!(worker.job_token(key).is_none(), "nor does it run it");
    assert_eq!(
        node.inner.store.job_record(key).await.unwrap(),
        None,
        "the stopped run was re-asserted over its stop"
    );
    let payload: Value = client
        .hget(node.inner.store.maps.payloads_key(), key)
        .await
        .unwrap();
    assert!(
        payload.is_null(),
        "the stopped run's payload stays for the orphan sweep to start again: {payload:?}"
    );
    let fencing: Option<u64> = client
        .hget(crate::keys::fencing(&node.inner.pool), key)
        .await
        .unwrap();
    assert!(
        fencing.is_some_and(|counter| counter > token),
        "the counter is above the stopped run's token: {fencing:?}"
    );
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1, "started once");
    node.close().await.unwrap();
}
