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

/// A stop carried out late does not fence out a newer admission of the key
/// (chaos CI, seed 7 with `--overlap`): a worker stopped an older run on
/// request and was cut off before it could record the stop; the stop was
/// answered meanwhile by the run's new owner, the key was admitted again,
/// and Redis then lost its data. The late record found no record of the
/// key and laid a tombstone issued at that moment, above the newer run's
/// token: the newer run's re-assertion was refused, the job stopped, and
/// the key was admitted again 3 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_stop_of_an_older_run_does_not_fence_out_a_newer_admission() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("late-stop");
    let handler = Counting::default();
    let (client, a, b, wa, wb) = two_nodes_with(&server, &name, handler.clone()).await;
    let key = key_placed_on(&a, &wa).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(10), "the job runs on a", || {
        let runs = wa.job_token(&key).is_some();
        async move { runs }
    })
    .await
    .unwrap();
    let newer = wa.job_token(&key).unwrap();
    // `wb` still holds an older run of the key, and a stop for that run
    // reaches it only now, its dispatcher long answered.
    let older = newer - 1_000_000;
    wb.inner.jobs.insert(key.clone(), local_job(&key, older));
    // Redis lost the newer run's record and payload (an empty restart).
    let jobs_hash = a.inner.store.maps.jobs_map().keys_info().hash.clone();
    forget_in_redis(
        &client,
        &[jobs_hash, crate::keys::payloads(&a.inner.store.pool)],
        &key,
    )
    .await;
    let stop = crate::codec::encode(&crate::codec::KeyedRequest {
        key: key.clone(),
        payload: Vec::new(),
        reply: Some(crate::codec::ReplyTo {
            node: b.id().to_string(),
            request: u64::MAX,
        }),
        hops: 0,
    });
    let inbox = b.inner.inbox(wb.id()).unwrap();
    inbox.add(&format!("stop {older}"), stop).await.unwrap();
    let inbox_key = inbox.key().to_string();
    wait_until(
        Duration::from_secs(10),
        "b carried out the stop",
        || async {
            let len: u64 = client.xlen(&inbox_key).await.unwrap();
            len == 0 && wb.job_token(&key).is_none()
        },
    )
    .await
    .unwrap();

    // `wa` re-asserts what it runs, as its recovery from the loss does: the
    // newer run is not the one stopped, and goes on.
    a.inner.reconcile(&wa.inner).await.unwrap();
    assert_eq!(wa.job_token(&key), Some(newer), "the newer run was stopped");
    assert_eq!(handler.stops.load(Ordering::SeqCst), 0);
    crate::tests::data_loss::eventually_owner(&a, &key, wa.id(), newer).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Stops slowly, and notes when each stop ended.
#[derive(Clone, Default)]
struct SlowStop {
    stop_ended: Arc<std::sync::Mutex<Vec<(String, tokio::time::Instant)>>>,
}

#[async_trait]
impl Handler for SlowStop {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(800)).await;
        if let Ok(mut ended) = self.stop_ended.lock() {
            ended.push((key.to_string(), tokio::time::Instant::now()));
        }
        Ok(())
    }
}

/// A stop request handled while the lease watchdog still stops the job
/// (it moves each job to the suspended set as its stop begins) is answered
/// only once that stop has ended: the caller may dispatch the key again at
/// once, and its start elsewhere must not overlap the old run (I1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_lease_stop_is_answered_after_it_ends() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("lease-stop-stop");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    // TTL 6 s: renewals every 2 s, stops within 1 s.
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(6));
    let node = Node::join(&client, &name, options.clone()).await.unwrap();
    let handler = SlowStop::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    let caller = Node::join(&client, &name, options.client_only(true))
        .await
        .unwrap();
    caller.dispatch_job("k", &b"p"[..]).await.unwrap();
    assert!(worker.job_token("k").is_some());
    // Right after a renewal, so that none comes (and resumes the jobs)
    // before the stop request is handled: the lease lapses as after a
    // stall, its stop of "k" begins.
    let mut renewals = node.inner.last_renewal.subscribe();
    renewals.borrow_and_update();
    renewals.changed().await.unwrap();
    let lapse = {
        let inner = node.inner.clone();
        tokio::spawn(async move { inner.lose_lease(tokio::time::Instant::now()).await })
    };
    wait_until(Duration::from_secs(5), "the lease stop of k begun", || {
        let begun = worker.job_token("k").is_none();
        async move { begun }
    })
    .await
    .unwrap();
    caller.stop_job("k").await.unwrap();
    let answered = tokio::time::Instant::now();
    let ended = handler.stop_ended.lock().unwrap().clone();
    assert!(
        ended.iter().any(|(k, at)| k == "k" && *at <= answered),
        "the stop was answered before the lease stop of k ended (stops ended: {ended:?})"
    );
    lapse.await.unwrap();
    caller.close().await.unwrap();
    node.close().await.unwrap();
}
