//! A start the handler made but Redis did not record (the record call
//! failed: writes refused, a timeout) keeps running, and its entry stays
//! in the inbox to be recorded when a rewind reads it again. By then the
//! ring may place the key on another worker: the entry must not be
//! forwarded there while it runs here (chaos soak seed 1201 with slow
//! starts: the forwarded entry, with the run's own token and pending
//! guard, was claimed and started by the other worker).

use flotilla_testkit::WriteRefusal;

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
    // Each key's first start on the first worker takes 2 s; the second
    // joins while they are under way.
    let pair =
        super::slow_starts::slow_then_quick(&client, &name, options, Duration::from_secs(2), 12)
            .await;
    let (first, second, keys, quick_worker) =
        (&pair.first, &pair.second, &pair.keys, &pair.quick_worker);
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
    pair.never_both_for(Duration::from_secs(6)).await;
    second.close().await.unwrap();
    first.close().await.unwrap();
}

/// The same run held suspended here: its record failed, then the lease
/// lapsed and the watchdog took it from the running set to stop it. Its
/// entry, read again meanwhile (a rewind already on its way), must not be
/// forwarded to the key's new ring owner either: that worker claimed it
/// (the guard is this run's) and started it while the stop here still ran
/// (chaos soak seed 1201 with slow starts, a read-only Redis: 87 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_of_a_run_held_suspended_here_is_not_forwarded() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("held-start");
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(10));
    let a = Node::join(&client, &name, options.clone()).await.unwrap();
    let b = Node::join(&client, &name, options).await.unwrap();
    let handler_a = Counting::default();
    let wa = Worker::new(&a, handler_a.clone()).await.unwrap();
    let handler_b = Counting::default();
    let wb = Worker::new(&b, handler_b.clone()).await.unwrap();
    let key = key_placed_on(&a, &wb).await;
    // The run's start never reached Redis's records: its guard and payload
    // are there, and it is held suspended on the first worker.
    let token = 4_242u64;
    let body = crate::codec::encode(&crate::codec::JobBody {
        key: key.clone(),
        payload: b"p".to_vec(),
        restart: None,
    });
    a.inner
        .store
        .maps
        .pending_map()
        .set(&key, &live_guard(token))
        .await
        .unwrap();
    let _: () = client
        .hset(
            crate::keys::payloads(&a.inner.store.pool),
            (key.as_str(), crate::codec::stored(0, &body)),
        )
        .await
        .unwrap();
    wa.inner
        .suspended
        .lock()
        .await
        .insert(key.clone(), local_job(&key, token));
    // Its start entry, never forwarded yet (no hop), is read again.
    let mut entry = format!("{token} 0 0 0 -\n").into_bytes();
    entry.extend_from_slice(&body);
    a.inner
        .inbox(wa.id())
        .unwrap()
        .add("start", entry)
        .await
        .unwrap();
    // Past the first renewals' resume of the held run (every third of a
    // TTL) and the rebalance pass that then moves the resumed run to the
    // key's ring owner (stopped here first, with a new token there): the
    // other worker never runs the held run's own start, nor the key while
    // it runs or is held here.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        let here =
            wa.job_token(&key).is_some() || wa.inner.suspended.lock().await.contains_key(&key);
        let there = wb.job_token(&key);
        assert_ne!(
            there,
            Some(token),
            "the held run's start entry was forwarded, and started there"
        );
        assert!(
            !(here && there.is_some()),
            "the key ran on the other worker while it ran or was held here"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The renewals resumed the held run where it was (a new token), and
    // the old entry went as superseded.
    assert_eq!(handler_a.starts.load(Ordering::SeqCst), 1);
    wait_until(
        Duration::from_secs(10),
        "the resumed run, moved on to the key's ring owner",
        || async { wa.job_token(&key).is_none() && wb.job_token(&key).is_some_and(|t| t > token) },
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(10), "the old entry is gone", || {
        let inbox = a.inner.inbox(wa.id()).unwrap();
        async move { inbox.len().await.unwrap() == 0 }
    })
    .await
    .unwrap();
    b.close().await.unwrap();
    a.close().await.unwrap();
}
