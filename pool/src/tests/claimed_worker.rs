//! A worker whose lease came back while another node's cleanup claim
//! stands on it starts nothing until the claim is gone. Its cleaner may be
//! moving its inbox entries; a fresh entry (appended after the lease's
//! lapse) is started before it is recorded, so one read before its move
//! ran here while its moved copy ran on the worker it went to. Chaos soak
//! seed 1598 on `07e2c17`: Redis refused writes for two seconds, a cleaner
//! claimed a worker silent since, the worker's next renewal brought its
//! lease back, it started a fresh entry, and the cleaner moved that entry
//! on: both workers ran the key (`I1 overlap`).

use fred::types::Value;

use super::*;

/// A cleanup claim on `worker` by another node, made now by server time.
async fn claim(client: &fred::prelude::Client, node: &Node, worker: &str) {
    let time: Vec<String> = client
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .unwrap();
    let since_ms = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    let cleanup = node.inner.store.maps.cleanup.keys_info().hash.clone();
    let _: i64 = client
        .hset(cleanup, (worker, format!("n-cleaner {since_ms}")))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_under_a_cleanup_claim_starts_nothing_until_it_is_gone() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("claimed-worker");
    // Renewals every 2 s; a claim younger than the TTL stands.
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(6))
        .dispatch_timeout(Duration::from_secs(30));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();

    // A fresh entry waits in the inbox while the worker's lease is lost
    // (Redis refused the renewals); a cleaner claims the silent worker;
    // the next renewal brings the lease back and finds the claim.
    let dispatch = dispatch_without_lease(&node, &worker, "k").await;
    claim(&client, &node, worker.id()).await;
    renewals(&node, 1).await;
    node.inner.resume_all().await;
    // Two renewals later (the entry read and asked again meanwhile), the
    // claim still stands, and nothing started.
    renewals(&node, 2).await;
    let cleanup = node.inner.store.maps.cleanup.keys_info().hash.clone();
    let standing: Value = client.hget(&cleanup, worker.id()).await.unwrap();
    assert!(!standing.is_null(), "the claim stands");
    assert_eq!(
        (handler.starts.load(Ordering::SeqCst), worker.job_token("k")),
        (0, None),
        "a worker under a cleanup claim started a job"
    );

    // The claim goes (the cleaner gave up): once a renewal finds it gone,
    // the entry starts at once, not after the delay its refusals grew
    // (up to 5 s; its pending guard may run out first).
    let _: i64 = client.hdel(&cleanup, worker.id()).await.unwrap();
    wait_until(
        Duration::from_secs(15),
        "a renewal found the claim gone",
        || {
            let claimed = worker.inner.cleanup_claimed.load(Ordering::SeqCst);
            async move { !claimed }
        },
    )
    .await
    .unwrap();
    let gone = tokio::time::Instant::now();
    wait_until(Duration::from_secs(15), "the job started", || {
        let runs = worker.job_token("k").is_some();
        async move { runs }
    })
    .await
    .unwrap();
    assert!(
        gone.elapsed() < Duration::from_secs(2),
        "the job started {:?} after the claim was found gone",
        gone.elapsed()
    );
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    tokio::time::timeout(Duration::from_secs(15), dispatch)
        .await
        .expect("dispatch answered")
        .unwrap()
        .unwrap();
    node.close().await.unwrap();
}
