//! Redis losing its data or going back in time under a running pool:
//! suspended and running copies, hand-offs, stops during recovery, fencing
//! tokens and orphans.

use super::*;

/// After Redis lost its data, a job a worker had *suspended* on lease loss
/// (and that was moved meanwhile) must not win over the worker that runs
/// it: the suspended copy is re-asserted first here, and still the running
/// worker keeps the key, and the suspended one never starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspended_job_does_not_win_over_the_running_copy_after_data_loss() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("suspended");
    let (client, a, b, wa, wb, handler_a) = two_nodes(&server, &name).await;
    let key = key_placed_on(&a, &wb).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    let running = wb.job_token(&key).unwrap();
    // The same key, stopped on `a` by a lease loss before it was moved to
    // `b` (an older token).
    wa.inner
        .suspended
        .lock()
        .await
        .insert(key.clone(), local_job(&key, running - 1));
    flushall(&client).await;
    a.inner.reregister(wa.id()).await.unwrap();
    // Read Redis itself: the replicas learn of the flush only later.
    let jobs_hash = a.inner.store.maps.jobs_map().keys_info().hash.clone();
    let owned_by_b = format!("{} {running}", wb.id());
    wait_until(
        Duration::from_secs(15),
        "the running worker re-asserted its job",
        || async {
            let owner: Option<String> =
                fred::prelude::HashesInterface::hget(&client, jobs_hash.as_str(), key.as_str())
                    .await
                    .unwrap();
            owner.as_deref() == Some(owned_by_b.as_str())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        wb.job_token(&key),
        Some(running),
        "running copy was stopped"
    );
    assert!(wa.job_token(&key).is_none(), "suspended copy came back");
    assert!(!wa.inner.suspended.lock().await.contains_key(&key));
    assert_eq!(handler_a.starts.load(Ordering::SeqCst), 0);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A rebalance that runs after Redis lost its data, before this worker
/// re-asserted its jobs, finds nobody owning the job it just stopped to
/// move. It does not take the job back while the pool recovers (a hand-off
/// whose reply was lost may have started it elsewhere, and Redis knows
/// nothing of that run until it re-asserts): the job is left to the orphan
/// sweep, and runs again once the pool has recovered, instead of being
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_refused_after_data_loss_leaves_the_job_to_the_orphan_sweep() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("lostmove");
    let (client, a, b, wa, wb, handler_a) = two_nodes(&server, &name).await;
    // A key the ring gives to `b`, running on `a` (as after a ring change
    // this node has not acted on yet).
    let key = key_placed_on(&a, &wb).await;
    wa.inner.jobs.insert(key.clone(), local_job(&key, 7));
    flushall(&client).await;
    a.inner.hand_off_local(&wa.inner, &key).await;
    left_to_the_sweep_then_runs(&client, &handler_a, &a, &wa, &wb, &key).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A rebalance that acts on a ring computed before Redis lost its data
/// finds the ring empty (no worker registered yet): the job stays, running,
/// rather than being stopped for a move that has no target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_against_an_empty_ring_keeps_the_job_running() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("emptyring");
    let (client, a, b, wa, wb, handler_a) = two_nodes(&server, &name).await;
    let key = key_placed_on(&a, &wb).await;
    wa.inner.jobs.insert(key.clone(), local_job(&key, 7));
    flushall(&client).await;
    // As the replicas show it once they resynchronised, before the workers
    // registered again.
    empty_ring(&a);
    a.inner.hand_off_local(&wa.inner, &key).await;
    assert_eq!(handler_a.stops.load(Ordering::SeqCst), 0, "stopped");
    assert_eq!(wa.job_token(&key), Some(7), "no longer running here");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// `key` was stopped on `wa` (node `a`) to be moved while the pool
/// recovers from a data loss: it is neither running there nor taken back
/// for it, but left to the orphan sweep (payload back, marked), and runs
/// again on one of the two workers, with a token newer than the old one
/// (7), once the pool has recovered.
async fn left_to_the_sweep_then_runs(
    client: &fred::prelude::Client,
    counts: &Counting,
    a: &Node,
    wa: &Worker,
    wb: &Worker,
    key: &str,
) {
    use fred::prelude::HashesInterface;
    assert_eq!(counts.stops.load(Ordering::SeqCst), 1, "stopped to move");
    assert_eq!(
        counts.starts.load(Ordering::SeqCst),
        0,
        "started again here"
    );
    assert!(wa.job_token(key).is_none());
    assert!(!wa.inner.suspended.lock().await.contains_key(key));
    let store = &a.inner.store;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let record: Option<String> = client.hget(jobs_hash.as_str(), key).await.unwrap();
    assert_eq!(record, None, "taken back while the pool recovers");
    let payload: bool = client
        .hexists(crate::keys::payloads(&store.pool), key)
        .await
        .unwrap();
    assert!(payload, "the payload is back");
    let mark: Option<String> = client
        .hget(crate::keys::orphan_marks(&store.pool), key)
        .await
        .unwrap();
    assert!(mark.is_some(), "marked for the orphan sweep");
    wait_until(Duration::from_secs(90), "the orphan runs again", || async {
        wa.job_token(key).is_some() || wb.job_token(key).is_some()
    })
    .await
    .unwrap();
    let tokens = [wa.job_token(key), wb.job_token(key)];
    assert!(
        tokens.iter().flatten().count() == 1 && tokens.iter().flatten().all(|&t| t > 7),
        "runs once, with a new token: {tokens:?}"
    );
}

/// Redis loses its data while a job is stopped to be moved, and the ring
/// is empty by the time the move is tried: with no target and no record
/// left, the job is given back to Redis as an orphan and runs again once
/// the pool has recovered, instead of being lost (Finding 10 of the chaos
/// suite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_loss_during_a_handoff_leaves_the_job_to_the_orphan_sweep() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("midmove");
    let handler_a = HookOnStop::default();
    let (client, a, b, wa, wb) = two_nodes_with(&server, &name, handler_a.clone()).await;
    let key = key_placed_on(&a, &wb).await;
    wa.inner.jobs.insert(key.clone(), local_job(&key, 7));
    let (node, client2) = (a.clone(), client.clone());
    let hook: StopHook = Box::new(move || {
        let (client, node) = (client.clone(), node.clone());
        Box::pin(async move {
            flushall(&client).await;
            empty_ring(&node);
        })
    });
    handler_a.hook.set(hook).ok().unwrap();
    a.inner.hand_off_local(&wa.inner, &key).await;
    left_to_the_sweep_then_runs(&client2, &handler_a.counts, &a, &wa, &wb, &key).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A copy of a start entry that a cleaner moved away (deleted here,
/// appended to another inbox) is never started by its old holder, even
/// when Redis still shows the admission pending: the claim checks that the
/// entry is still in the worker's own inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_entry_is_not_claimed_by_its_old_holder() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("moved");
    let (node, worker, handler) = pool(&server, &name).await;
    let key = "moved-away";
    let token = 4242u64;
    node.inner
        .store
        .maps
        .pending_map()
        .set(key, &live_guard(token))
        .await
        .unwrap();
    // In this worker's hands, but no longer in its inbox; read before a
    // doubt (the lease gap that let the cleaner move it).
    start_in_hand(&node, &worker, key, token).await;
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        0,
        "moved copy started"
    );
    assert!(worker.job_token(key).is_none());
    assert!(
        node.inner.store.maps.pending_map().get(key).is_some(),
        "the live copy's admission is untouched"
    );
    node.close().await.unwrap();
}

/// A stop sent while the pool recovers from a data loss, before the job's
/// worker re-asserted it, waits for the re-assertion and stops the job,
/// instead of answering "not found" for a job that keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_recovery_waits_for_the_job_to_be_re_asserted() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("stoprecover");
    let (node, worker, handler) = pool(&server, &name).await;
    node.dispatch_job("rk", &b"p"[..]).await.unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    flushall(&client).await;
    // The worker re-asserts at its next renewal (within a third of its TTL);
    // the stop is sent right away, before that.
    node.stop_job("rk").await.unwrap();
    assert_eq!(handler.stops.load(Ordering::SeqCst), 1, "not stopped");
    assert!(worker.job_token("rk").is_none(), "still running");
    node.close().await.unwrap();
}

/// Time-based fencing tokens (16 digits, Redis server time in µs) keep
/// every digit through the scripts that write them into the jobs map: a
/// resumed job's record parses, names the new token, and cleanup finds it
/// (before `resume.lua` formatted its token with `%d`, Lua wrote
/// "1.7953564485967e+15" and the job was skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_based_tokens_round_trip_through_every_job_record() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("tokens");
    let (client, a, b, wa, _wb, _handler_a) = two_nodes(&server, &name).await;
    let key = key_placed_on(&a, &wa).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    let first = wa.job_token(&key).unwrap();
    assert!(first > 1_000_000_000_000_000, "time-based: {first}");
    let jobs_hash = a.inner.store.maps.jobs_map().keys_info().hash.clone();
    let record = |client: fred::prelude::Client, key: String, hash: String| async move {
        let v: String = client.hget(&hash, &key).await.unwrap();
        v
    };
    assert_eq!(
        record(client.clone(), key.clone(), jobs_hash.clone()).await,
        format!("{} {first}", wa.id())
    );
    // Lease loss and resume: resume.lua issues the next token.
    let job = wa.inner.jobs.get(&key).unwrap().clone();
    wa.inner.jobs.remove(&key);
    let restarted = a.inner.restart_owned(&wa.inner, &key, job).await.unwrap();
    assert!(matches!(restarted, crate::lease::Restart::Started));
    let second = wa.job_token(&key).unwrap();
    assert!(second > first, "{second} > {first}");
    let raw = record(client.clone(), key.clone(), jobs_hash.clone()).await;
    assert_eq!(
        raw,
        format!("{} {second}", wa.id()),
        "record keeps every digit"
    );
    assert_eq!(
        crate::store::records::job_owner(&raw),
        Some((wa.id(), second)),
        "the record parses"
    );
    eventually_owner(&b, &key, wa.id(), second).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

pub(super) async fn eventually_owner(node: &Node, key: &str, worker: &str, token: u64) {
    wait_until(
        Duration::from_secs(5),
        "the replica shows the owner",
        || {
            let ok = node.job_owner(key) == Some((worker.to_string(), token));
            async move { ok }
        },
    )
    .await
    .unwrap();
}

/// A job left to the orphan sweep (suspended on lease loss, its ownership
/// lost with Redis's data, its payload kept so that the sweep runs it
/// again) is not "not found": a stop ends it — the payload goes, and the
/// stop leaves a newer fencing token behind, so the suspended copy can
/// never re-assert itself over the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_of_an_orphan_ends_it_and_no_older_copy_comes_back() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("orphanstop");
    let (node, worker, _handler) = pool(&server, &name).await;
    node.dispatch_job("ok1", &b"p"[..]).await.unwrap();
    let (_, job) = worker.inner.jobs.remove("ok1").unwrap();
    worker.inner.stop_handler("ok1").await.unwrap();
    worker
        .inner
        .suspended
        .lock()
        .await
        .insert("ok1".into(), job.clone());
    node.inner
        .store
        .maps
        .jobs_map()
        .delete("ok1")
        .await
        .unwrap();
    assert!(
        node.job_payload("ok1").await.unwrap().is_some(),
        "an orphan"
    );

    node.stop_job("ok1").await.unwrap();
    assert_eq!(node.job_payload("ok1").await.unwrap(), None, "payload gone");
    for state in [
        crate::lease::Reassert::Suspended,
        crate::lease::Reassert::Running,
    ] {
        let status = node
            .inner
            .reassert(&worker.inner, "ok1", &job, state)
            .await
            .unwrap();
        assert_eq!(status, "lost", "{state:?}: the stopped job came back");
    }
    assert_eq!(node.job_payload("ok1").await.unwrap(), None);
    assert!(matches!(
        node.stop_job("ok1").await,
        Err(crate::Error::JobNotFound(_))
    ));
    node.close().await.unwrap();
}

/// Redis went back to the moment a job was admitted but not yet started:
/// the pending guard carries the very token the worker runs it with. Its
/// re-assertion takes the job (the guard is its own admission), rather than
/// taking the guard for a newer start elsewhere and stopping the only run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reassert_over_the_guard_of_its_own_start_keeps_the_job() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("ownguard");
    let (node, worker, _handler) = pool(&server, &name).await;
    node.dispatch_job("g1", &b"p"[..]).await.unwrap();
    let job = worker.inner.jobs.get("g1").unwrap().clone();
    // The state before the start was recorded: guard, no record.
    node.inner.store.maps.jobs_map().delete("g1").await.unwrap();
    node.inner
        .store
        .maps
        .pending_map()
        .set("g1", &format!("{} 99999999999999", job.token))
        .await
        .unwrap();
    let status = node
        .inner
        .reassert(&worker.inner, "g1", &job, crate::lease::Reassert::Running)
        .await
        .unwrap();
    assert_eq!(status, "ok");
    wait_until(Duration::from_secs(5), "record and no guard", || {
        let ok = node.job_owner("g1") == Some((worker.id().to_string(), job.token))
            && node.inner.store.maps.pending_map().get("g1").is_none();
        async move { ok }
    })
    .await
    .unwrap();
    node.close().await.unwrap();
}

/// A start entry a cleaner moves out of a silent worker's inbox gets a new
/// fencing token: that worker may have started it just before going quiet
/// (a start is recorded after the handler's `start`), and the run on the
/// new owner must be fenced off from that one, not share its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_start_entry_gets_a_new_token() {
    use fred::prelude::StreamsInterface;
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("requeuetoken");
    let (client, a, _b, wa, wb, _handler_a) = two_nodes(&server, &name).await;
    let key = "requeued";
    let token = 4242u64;
    a.inner
        .store
        .maps
        .pending_map()
        .set(key, &live_guard(token))
        .await
        .unwrap();
    let _: () = client
        .hset(a.inner.store.maps.payloads_key(), (key, "0 x"))
        .await
        .unwrap();
    let silent = "w-silent";
    let inbox = a.inner.inbox(silent).unwrap().key().to_string();
    let payload = bytes::Bytes::from(start_entry(key, token));
    let _: String = client
        .xadd(
            &inbox,
            false,
            None,
            "*",
            vec![("n", bytes::Bytes::from_static(b"start")), ("p", payload)],
        )
        .await
        .unwrap();
    a.inner
        .requeue_worker_inbox(silent, None, &mut Default::default())
        .await
        .unwrap();
    wait_until(Duration::from_secs(5), "the moved entry runs", || {
        let t = wa.job_token(key).or(wb.job_token(key));
        async move { t.is_some() }
    })
    .await
    .unwrap();
    let started = wa.job_token(key).or(wb.job_token(key)).unwrap();
    assert!(started > token, "moved with its old token: {started}");
    a.close().await.unwrap();
}

/// An empty restart of a pool that runs nothing: the jobs map's revision
/// does not come back until something changes the map, which must not read
/// as Redis having gone back in time forever — dispatches work again once
/// the recovery window of the data loss has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_works_after_an_empty_restart_of_an_idle_pool() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("idlerestart");
    let (node, worker, _handler) = pool(&server, &name).await;
    node.dispatch_job("i1", &b"p"[..]).await.unwrap();
    node.stop_job("i1").await.unwrap();
    // The replica applies the start's change message on its own time.
    wait_until(Duration::from_secs(5), "the replica saw a revision", || {
        let seen = node.inner.store.maps.jobs_map().revision_high_water();
        async move { seen > 0 }
    })
    .await
    .unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    flushall(&client).await;
    // Within the dispatch timeout (8 s) of this pool: the window of the
    // data loss lasts one TTL (10 s) from the first script that finds the
    // epoch gone, so retry until it has passed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match node.dispatch_job("i2", &b"p"[..]).await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "not admitted yet");
            }
            Err(e) => panic!("never admitted after an empty restart: {e}"),
        }
    }
    assert!(worker.job_token("i2").is_some());
    node.close().await.unwrap();
}

/// A worker stopped a run of a key on request, then ran the key again
/// (a new dispatch, a newer token) and suspended that run on a lease loss
/// while Redis lost its data. Making the old stop stand after the loss
/// must not end the newer run: its payload, given back for the orphan
/// sweep by the worker's re-assertion, stays, and the job runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_stop_does_not_end_a_newer_suspended_run_after_data_loss() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("oldstop");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(1))
        .dispatch_timeout(Duration::from_secs(5));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let stopped = worker.job_token("k").unwrap();
    node.stop_job("k").await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let newer = worker.job_token("k").unwrap();
    assert!(newer > stopped);
    // The newer run suspended, as a lease loss does.
    let (_, job) = worker.inner.jobs.remove("k").unwrap();
    worker.inner.stop_handler("k").await.unwrap();
    worker.inner.suspended.lock().await.insert("k".into(), job);
    flushall(&client).await;
    wait_until(Duration::from_secs(20), "'k' runs again", || async {
        worker.job_token("k").is_some_and(|t| t > newer)
    })
    .await
    .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 3);
    node.close().await.unwrap();
}

/// A stop answered `JobNotFound` while the job's only copy was held
/// suspended by a worker cut off from Redis (which had lost its data) still
/// holds after a second data loss: the stop's tombstone went with the
/// second loss, and the cut-off worker, healing, gives its copy back to the
/// orphan sweep; the node that answered the stop makes it stand again, so
/// the job never runs again (chaos soak seed 90: an empty restart while the
/// worker was cut off, a stop, another empty restart, then the heal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_answered_not_found_holds_through_a_second_data_loss() {
    let mut server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("notfoundstop");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(1))
        .dispatch_timeout(Duration::from_secs(10));
    let node = Node::join(&client, &name, options.clone()).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    let dispatcher = Node::join(&client, &name, options).await.unwrap();
    dispatcher.dispatch_job("k", &b"p"[..]).await.unwrap();
    // The worker is cut off: its lease lapses and it suspends the job. It
    // keeps the copy out of sight until it heals (it cannot reach Redis).
    let (_, job) = worker.inner.jobs.remove("k").unwrap();
    worker.inner.stop_handler("k").await.unwrap();

    server.restart().unwrap();
    // Nobody re-asserts 'k' within the recovery window: not found.
    let answer = dispatcher.stop_job("k").await;
    assert!(
        matches!(answer, Err(crate::Error::JobNotFound(_))),
        "{answer:?}"
    );
    server.restart().unwrap();
    // The cut heals: the worker re-asserts its suspended copy, which is
    // left to the orphan sweep (the pool recovers).
    wait_until(
        Duration::from_secs(10),
        "the healed worker re-asserted its copy",
        || async {
            node.inner
                .reassert(&worker.inner, "k", &job, crate::lease::Reassert::Suspended)
                .await
                .is_ok()
        },
    )
    .await
    .unwrap();
    // The stop stands again: the payload goes before the sweep could run
    // the copy.
    let waited = wait_until(
        Duration::from_secs(20),
        "the stopped job's payload is gone",
        || async { matches!(dispatcher.job_payload("k").await, Ok(None)) },
    )
    .await;
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        1,
        "'k' started again after its stop (payload wait: {waited:?})"
    );
    waited.unwrap();
    assert!(worker.job_token("k").is_none(), "'k' runs again");
    assert!(matches!(
        dispatcher.stop_job("k").await,
        Err(crate::Error::JobNotFound(_))
    ));
    dispatcher.close().await.unwrap();
    node.close().await.unwrap();
}

/// A worker that closes before it re-asserted what it runs after Redis
/// lost its data finds its hand-offs refused (Redis names nobody as the
/// jobs' owner): it re-asserts each job, the one it ran and the one it held
/// suspended, and hands it on, instead of dropping it (chaos soak seed 140
/// with `--overlap`: a rollback, then `SIGTERM` of the holder 1 ms later,
/// lost the jobs Redis had forgotten).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_hands_on_the_jobs_redis_forgot() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("close-forgot");
    let (client, a, b, wa, wb, _) = two_nodes(&server, &name).await;
    let running = key_placed_on(&a, &wa).await;
    let held = (0..100)
        .map(|i| format!("k{i}"))
        .find(|k| *k != running && a.placement(k).as_deref() == Some(wa.id()))
        .unwrap();
    for k in [&running, &held] {
        a.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    // `held` stopped on a lease loss and kept suspended here.
    let (_, job) = wa.inner.jobs.remove(&held).unwrap();
    wa.inner.stop_handler(&held).await.unwrap();
    wa.inner.suspended.lock().await.insert(held.clone(), job);
    // Redis as it was before both were admitted.
    let pool_name = a.inner.store.pool.clone();
    let hashes = [
        a.inner.store.maps.jobs_map().keys_info().hash.clone(),
        crate::keys::payloads(&pool_name),
        crate::keys::fencing(&pool_name),
    ];
    for k in [&running, &held] {
        forget_in_redis(&client, &hashes, k).await;
    }
    a.remove_worker(&wa).await.unwrap();
    wait_until(
        Duration::from_secs(15),
        "both jobs run on the other worker",
        || async { wb.job_token(&running).is_some() && wb.job_token(&held).is_some() },
    )
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A node that mirrors no map and dispatches nothing still notices, within
/// a few seconds, that Redis lost the pool's data on a server that kept
/// running (`FLUSHALL`: no new run id), and recovers: it must make the
/// stops it answered for stand again before the orphan sweep requeues a
/// job another worker gives back (chaos soak seed 491, `flush` fault: a
/// lean dispatcher noticed only at a later restart, and the stopped jobs
/// ran again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lean_node_notices_a_flush_without_a_restart() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("flush-lean");
    let (worker_node, _worker, _handler) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let lean = Node::join(
        &client,
        &name,
        NodeOptions::default()
            .client_only(true)
            .mirror_jobs(false)
            .worker_ttl(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let mut restarts = lean.inner.server_restarts.subscribe();
    restarts.borrow_and_update();
    flushall(&client).await;
    tokio::time::timeout(Duration::from_secs(6), restarts.changed())
        .await
        .expect("the lean node did not notice the flush within 6 s")
        .unwrap();
    lean.close().await.unwrap();
    worker_node.close().await.unwrap();
}
