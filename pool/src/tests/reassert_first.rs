//! After Redis lost writes, a worker's running jobs are re-asserted without
//! waiting for the stops it remembers to stand again. Until it has
//! re-asserted them, the worker is their only holder, and a crash takes
//! them along. A busy worker remembers thousands of stops (two minutes of
//! them): made to stand first, one after the other, they held its
//! re-assertion back for 100 ms and more on a loaded node, and a kill in
//! that time lost every job it ran (chaos soak seed 1439: restart of
//! Redis without persistence, then the busiest process killed 213 ms
//! later, its workers' re-registration begun 104 ms after the recovery
//! window opened).

use fred::prelude::HashesInterface;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_jobs_are_reasserted_before_every_remembered_stop_stands() {
    let mut server = RedisServer::start_with(flotilla_testkit::ServerOptions::default()).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("reassert-first");
    // Mirroring: the test names the jobs hash through the replica.
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(3))
        .mirror_jobs(true);
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    let snapshot = server.save_snapshot().unwrap();
    let key = "kept";
    node.dispatch_job(key, &b"p"[..]).await.unwrap();
    let token = worker.job_token(key).unwrap();

    // Stops the worker carried out lately, of keys it no longer runs.
    const STOPS: usize = 20_000;
    for i in 0..STOPS {
        worker
            .inner
            .stopped
            .record(&format!("gone-{i}"), 1_000 + i as u64);
    }

    // Redis goes back to before the dispatch: only the worker knows of
    // the job now.
    let fencing = crate::keys::fencing(&node.inner.store.pool);
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    server.roll_back(&snapshot).unwrap();
    let owner = format!("{} {token}", worker.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let counters = loop {
        let record: Option<String> = client.hget(jobs_hash.as_str(), key).await.unwrap_or(None);
        if record.as_deref() == Some(owner.as_str()) {
            // Read after the record was seen: at most this many stood
            // when it was written.
            let counters: u64 = client.hlen(fencing.as_str()).await.unwrap();
            break counters;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job was not re-asserted"
        );
        tokio::time::sleep(Duration::from_millis(1)).await; // poll pace
    };
    assert!(
        counters < STOPS as u64,
        "the job was re-asserted only once all {STOPS} stops stood ({counters} counters)"
    );

    // And every stop stands in the end.
    wait_until(Duration::from_secs(60), "every stop stands", || async {
        let counters: u64 = client.hlen(fencing.as_str()).await.unwrap_or(0);
        counters > STOPS as u64
    })
    .await
    .unwrap();
    assert_eq!(worker.job_token(key), Some(token));
    assert_eq!(handler.stops.load(Ordering::SeqCst), 0);
    node.close().await.unwrap();
}

/// A reconcile releases the records Redis went back to that name its
/// worker for jobs it no longer runs many at a time, not one round trip
/// after another: it holds the worker's lock throughout, and a rollback
/// that comes meanwhile waits for it to re-assert what the worker runs
/// (chaos soak seed 1440: 69 records, 600 ms on a loaded node, and a kill
/// then took the 440 jobs the second rollback had lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_releases_stale_records_many_at_a_time() {
    let server = RedisServer::start().unwrap();
    let direct = flotilla_testkit::client(&server.url()).await.unwrap();
    let proxy = flotilla_testkit::FaultProxy::start(server.addr())
        .await
        .unwrap();
    let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("stale-records");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(5))
        .mirror_jobs(true);
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();

    // Records naming the worker for jobs it does not run (Redis lost the
    // stops that ended them here).
    const STALE: usize = 100;
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let records: Vec<(String, String)> = (0..STALE)
        .map(|i| {
            (
                format!("stale-{i}"),
                format!("{} {}", worker.id(), 1_000 + i),
            )
        })
        .collect();
    let _: i64 = direct.hset(jobs_hash.as_str(), records).await.unwrap();

    // Every round trip takes 2 × 40 ms: one after the other, the records
    // alone (a read and a script each) would take 16 s.
    proxy.slow_down(Duration::from_millis(40));
    let began = std::time::Instant::now();
    node.inner.reconcile(&worker.inner).await.unwrap();
    let took = began.elapsed();
    proxy.heal();
    let left: u64 = direct.hlen(jobs_hash.as_str()).await.unwrap();
    assert_eq!(left, 0, "every stale record released");
    assert!(
        took < Duration::from_secs(6),
        "the reconcile held the worker's lock for {took:?}"
    );
    node.close().await.unwrap();
}
