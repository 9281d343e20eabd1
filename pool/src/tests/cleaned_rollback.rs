//! A run stopped on request, whose worker then died and was cleaned up,
//! and which Redis then showed again under that worker (it went back to a
//! state from before the stop) after the node that asked for the stop
//! crashed too: the node that cleaned the worker up remembers that its
//! cleanup did not find the run there, and ends it in its recovery rather
//! than moving it (chaos soak seed 1567, `job-0740`).

use super::*;

/// The job's stored payload, read over `client`.
async fn payload_of(client: &fred::prelude::Client, name: &str, key: &str) -> Option<Vec<u8>> {
    client.hget(crate::keys::payloads(name), key).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaner_ends_a_stopped_run_a_rollback_put_back_under_the_worker_it_cleaned_up() {
    let mut server =
        RedisServer::start_with(flotilla_testkit::ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("cleaned-rollback");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let requester = Node::join(&client, &name, options.clone()).await.unwrap();
    let b = Node::join(&client, &name, options.clone()).await.unwrap();
    let c = Node::join(&client, &name, options).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    let stays = Counting::default();
    let wc = Worker::new(&c, stays.clone()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        requester.pool_workers().len() == 2 && c.pool_workers().len() == 2
    })
    .await
    .unwrap();
    let key = key_placed_on(&requester, &wb).await;
    requester.dispatch_job(&key, &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs on b", || async {
        wb.job_token(&key).is_some()
    })
    .await
    .unwrap();
    let snapshot = server.save_snapshot().unwrap();
    requester.stop_job(&key).await.unwrap();

    // b's process dies; c finds its worker dead and cleans it up, finding
    // nothing of the stopped job. The node that asked for the stop dies
    // too, without a close: nothing of the stop is left with anyone.
    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    requester.inner.stop_tasks().await;
    drop((wb, b, requester));
    let workers = c.inner.store.maps.workers.keys_info().hash.clone();
    let only_c_registered = || async {
        let registered: std::collections::HashMap<String, String> =
            client.hgetall(&workers).await.unwrap_or_default();
        registered.len() == 1 && registered.contains_key(wc.id())
    };
    wait_until(
        Duration::from_secs(15),
        "b's worker cleaned up by c",
        only_c_registered,
    )
    .await
    .unwrap();
    assert_eq!(payload_of(&client, &name, &key).await, None);

    // Redis goes back to before the stop: b's worker registered, running
    // the job. Its next cleanup comes after the recovery window.
    server.roll_back(&snapshot).unwrap();
    let inbox = crate::keys::worker_inbox(wc.id());
    wait_until(
        Duration::from_secs(30),
        "b's worker cleaned up again and c's inbox read",
        || async {
            let queued: u64 = fred::prelude::StreamsInterface::xlen(&client, &inbox)
                .await
                .unwrap_or(1);
            only_c_registered().await && queued == 0
        },
    )
    .await
    .unwrap();
    assert_eq!(
        stays.starts.load(Ordering::SeqCst),
        0,
        "{key}, stopped on request at b, runs again on c"
    );
    assert!(wc.job_token(&key).is_none());
    assert_eq!(
        payload_of(&client, &name, &key).await,
        None,
        "the stopped job is back in the pool"
    );
    c.close().await.unwrap();
}

/// The other way a run leaves a worker before its cleanup: passed on (here
/// by a drain). Its end, made to stand by the cleaner after the rollback,
/// takes only the older run under the dead worker: the run it was passed
/// to re-asserts its newer token and goes on, started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_passed_on_before_the_cleanup_goes_on_where_it_was_passed() {
    let mut server =
        RedisServer::start_with(flotilla_testkit::ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("cleaned-passed-on");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let b = Node::join(&client, &name, options.clone()).await.unwrap();
    let c = Node::join(&client, &name, options).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    let takes = Counting::default();
    let wc = Worker::new(&c, takes.clone()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        b.pool_workers().len() == 2 && c.pool_workers().len() == 2
    })
    .await
    .unwrap();
    let key = key_placed_on(&c, &wb).await;
    c.dispatch_job(&key, &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs on b", || async {
        wb.job_token(&key).is_some()
    })
    .await
    .unwrap();
    let ran = wb.job_token(&key).unwrap();
    let snapshot = server.save_snapshot().unwrap();

    // Drained, b's worker passes the job on to c's; then b's process dies
    // and c cleans its worker up, finding nothing there.
    assert!(b.drain_worker(wb.id()).await.unwrap());
    wait_until(
        Duration::from_secs(10),
        "the job passed on to c",
        || async { wc.job_token(&key).is_some() && wb.job_token(&key).is_none() },
    )
    .await
    .unwrap();
    let passed = wc.job_token(&key).unwrap();
    assert!(passed > ran);
    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    drop((wb, b));
    let workers = c.inner.store.maps.workers.keys_info().hash.clone();
    let only_c_registered = || async {
        let registered: std::collections::HashMap<String, String> =
            client.hgetall(&workers).await.unwrap_or_default();
        registered.len() == 1 && registered.contains_key(wc.id())
    };
    wait_until(
        Duration::from_secs(15),
        "b's worker cleaned up by c",
        only_c_registered,
    )
    .await
    .unwrap();

    // Redis goes back to before the drain: the job under b's worker again.
    server.roll_back(&snapshot).unwrap();
    let jobs = c.inner.store.maps.jobs_keys.hash.clone();
    wait_until(
        Duration::from_secs(30),
        "b's worker cleaned up again, the job recorded under c's",
        || async {
            let record: Option<String> = client.hget(&jobs, &key).await.unwrap_or_default();
            only_c_registered().await
                && record.is_some_and(|r| r == format!("{} {passed}", wc.id()))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        wc.job_token(&key),
        Some(passed),
        "the passed-on run goes on"
    );
    assert_eq!(takes.starts.load(Ordering::SeqCst), 1, "started once at c");
    assert!(
        payload_of(&client, &name, &key).await.is_some(),
        "the running job's payload is kept"
    );
    c.close().await.unwrap();
}
