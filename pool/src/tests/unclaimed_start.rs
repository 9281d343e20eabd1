//! A start entry a worker read, whose claim found Redis's data gone (a
//! `FLUSHALL` or an empty restart between the read and the claim): the
//! entry in the worker's hands is then the job's only copy. The chaos
//! suite's `stop-leave` fault lost a job that way (seed 503): a closing
//! process handed it off, Redis was flushed before the new owner claimed
//! it, and it ran nowhere.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_lost_with_redis_data_before_its_claim_runs_again() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("unclaimed");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .orphan_grace(Duration::from_secs(1));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    let key = "lost-before-claim";
    let token = 4242u64;
    // In the worker's hands, read before a doubt (so it is claimed); Redis
    // loses everything before the claim.
    flushall(&client).await;
    start_in_hand(&node, &worker, key, token).await;
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        0,
        "started without a claim"
    );
    // Given back as an orphan: the sweep runs it again once the pool has
    // recovered (a window of one TTL) and the grace has passed.
    wait_until(Duration::from_secs(20), "the job runs again", || async {
        worker.job_token(key).is_some()
    })
    .await
    .unwrap();
    assert!(worker.job_token(key).is_some_and(|t| t > token));
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    node.close().await.unwrap();
}
