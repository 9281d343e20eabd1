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

/// A claim that finds its worker unregistered (Redis lost its data since
/// the last renewal) has the node renew at once, not a renewal period
/// later: the worker registers again and re-asserts the jobs it runs, of
/// which its process holds the only copy until then. Chaos soak seed 1449
/// (TTL 600 ms): Redis restarted empty, a claim found the worker gone
/// 140 ms before the next renewal did, and the process was killed while
/// that renewal's re-assertion ran; the jobs it ran were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_finds_its_worker_unregistered_renews_at_once() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("unregistered-claim");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    // Renewals every 3 s.
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(9));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("runs", &b"p"[..]).await.unwrap();
    let token = worker.job_token("runs").expect("the job runs");
    // Right after a renewal, Redis loses everything; a start in the
    // worker's hands is claimed before the next renewal is due.
    let mut renewals = node.inner.last_renewal.subscribe();
    renewals.borrow_and_update();
    renewals.changed().await.unwrap();
    let renewed = std::time::Instant::now();
    flushall(&client).await;
    start_in_hand(&node, &worker, "in-hand", 4242).await;
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let record = format!("{} {token}", worker.id());
    wait_until(
        Duration::from_secs(5),
        "the running job re-asserted",
        || async {
            let owner: Option<String> = client.hget(jobs_hash.as_str(), "runs").await.unwrap();
            owner.as_deref() == Some(record.as_str())
        },
    )
    .await
    .unwrap();
    // Without the early renewal, the loss was noticed a second after it
    // here (the periodic renewal is due 3 s after it).
    let took = renewed.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "re-asserted {took:?} after the loss"
    );
    node.close().await.unwrap();
}
