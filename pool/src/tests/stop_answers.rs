//! What a stop answers when Redis lost the stopped job's record, and that
//! the answer holds: a worker that held the job and stopped it answers
//! `Ok`, never `JobNotFound`, and its dispatcher remembers the stop to make
//! it stand again if Redis then goes back in time (chaos soak seed 104: a
//! stop queued at the job's worker just before an empty restart was carried
//! out, answered `JobNotFound` without a token, and a rollback then brought
//! back a hand-off of the job, which ran again 26 s after the stop).

use fred::prelude::StreamsInterface;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_job_stopped_after_redis_lost_its_record_answers_ok() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("held-stop");
    let (node, worker, handler) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let token = worker.job_token("k").unwrap();

    // The worker reads its inbox only once the test lets go: the stop is
    // queued at the job's worker while Redis still knows the job.
    let ops = worker.inner.ops.write().await;
    let stop = {
        let node = node.clone();
        tokio::spawn(async move { node.stop_job("k").await })
    };
    let inbox = node.inner.inbox(worker.id()).unwrap().key().to_string();
    wait_until(Duration::from_secs(10), "the stop is queued", || async {
        let len: u64 = client.xlen(&inbox).await.unwrap();
        len == 1
    })
    .await
    .unwrap();
    // Redis loses the job's record and payload before the worker gets to
    // the stop (an empty restart, a rollback).
    let pool_name = node.inner.store.pool.clone();
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    forget_in_redis(
        &client,
        &[jobs_hash, crate::keys::payloads(&pool_name)],
        "k",
    )
    .await;
    drop(ops);

    let answer = stop.await.unwrap();
    assert!(answer.is_ok(), "the running job's stop answered {answer:?}");
    assert_eq!(handler.stops.load(Ordering::SeqCst), 1);
    assert!(worker.job_token("k").is_none());
    // The dispatcher remembers a tombstone above the stopped run, to make
    // the stop stand again after a rollback.
    assert!(node.inner.stops_requested.covers("k", token));
    node.close().await.unwrap();
}
