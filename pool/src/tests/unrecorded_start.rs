//! A start the handler made but Redis did not record (the record call
//! failed: writes refused, a timeout) keeps running, and its entry stays
//! in the inbox to be recorded when a rewind reads it again. By then the
//! ring may place the key on another worker: the entry must not be
//! forwarded there while it runs here (chaos soak seed 1201 with slow
//! starts: the forwarded entry, with the run's own token and pending
//! guard, was claimed and started by the other worker).

use flotilla_testkit::WriteRefusal;

use super::slow_starts::SlowStart;
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_start_whose_record_failed_is_not_forwarded() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("unrecorded");
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(30))
        .redis_timeout(Duration::from_secs(2));
    let first = Node::join(&client, &name, options.clone()).await.unwrap();
    // Each key's first start takes 2 s.
    let slow = SlowStart::new(Duration::from_secs(2));
    let _slow_worker = Worker::new(&first, slow.clone()).await.unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    for key in &keys {
        let first = first.clone();
        let key = key.clone();
        tokio::spawn(async move { first.dispatch_job(&key, &b"p"[..]).await });
    }
    wait_until(Duration::from_secs(5), "starts are under way", || {
        let n = slow.running.lock().unwrap().len();
        async move { n >= 4 }
    })
    .await
    .unwrap();
    // A second worker joins; the first node's ring places some keys on it.
    let second = Node::join(&client, &name, options).await.unwrap();
    let quick = SlowStart::new(Duration::ZERO);
    let quick_worker = Worker::new(&second, quick.clone()).await.unwrap();
    wait_until(
        Duration::from_secs(5),
        "the ring holds both workers",
        || {
            let moved = keys
                .iter()
                .any(|k| first.placement(k).as_deref() == Some(quick_worker.id()));
            async move { moved }
        },
    )
    .await
    .unwrap();
    // Redis refuses writes until the starts under way have returned: their
    // records fail, and the jobs run unrecorded.
    server.refuse_writes(WriteRefusal::ReadOnlyReplica).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.accept_writes(WriteRefusal::ReadOnlyReplica).unwrap();
    // The rewinds read the entries again: no key may start on the second
    // worker while it runs on the first.
    let until = std::time::Instant::now() + Duration::from_secs(6);
    while std::time::Instant::now() < until {
        let overlap: Vec<String> = keys
            .iter()
            .filter(|k| quick.runs(k) && slow.runs(k))
            .cloned()
            .collect();
        assert!(
            overlap.is_empty(),
            "{overlap:?} started on the second worker while they ran on the first"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    second.close().await.unwrap();
    first.close().await.unwrap();
}
