//! Resuming jobs after a lease loss.
//!
//! A worker whose lease lapsed comes back while a cleanup claim on it
//! stands: the claim holds its jobs back (the cleaner may be moving them),
//! but a cleaner that dies, or stalls until the worker's renewals clear
//! its claim, moves nothing. The worker keeps such jobs suspended and asks
//! again; forgetting them would leave records naming it for jobs nobody
//! runs (found reading a chaos soak: "job moved during lease loss" for
//! every job of a worker whose cleanup claim Redis went back to).

use std::sync::atomic::AtomicBool;

use tokio::time::Instant;

use super::*;
use crate::store::records::job_owner;

/// A cleanup claim on `worker` by node `cleaner`, made now (server time),
/// then a lease loss on `node`: its jobs stop, and its next renewal
/// resumes them while the claim stands.
async fn claim_then_lose_lease(node: &Node, worker: &Worker, cleaner: &str) {
    let store = &node.inner.store;
    let now = store.server_time_ms().await.unwrap();
    store
        .maps
        .cleanup
        .set(worker.id(), &format!("{cleaner} {now}"))
        .await
        .unwrap();
    node.inner.lose_lease(Instant::now()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_cleanup_claim_holds_back_resumes_once_the_claim_goes() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let node = short_lease_node(&client, "claim-resume").await;
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let first = worker.job_token("k").unwrap();

    // A cleaner claimed the worker, then died before it moved anything.
    claim_then_lose_lease(&node, &worker, "n-gone").await;
    let store = &node.inner.store;
    assert!(worker.job_token("k").is_none(), "stopped on lease loss");
    assert_eq!(handler.stops.load(Ordering::SeqCst), 1);

    // The next renewal resumes; the claim refuses, and the job is held
    // (the resume task takes it out of the suspended set while it asks,
    // and puts it back). Forgotten, it would be in neither set for good.
    wait_until(
        Duration::from_secs(10),
        "the job held, or resumed",
        || async {
            let resumed = !worker.inner.lease_lost.load(Ordering::SeqCst);
            (resumed && worker.inner.suspended.lock().await.contains_key("k"))
                || worker.job_token("k").is_some()
        },
    )
    .await
    .expect("a job Redis still names this worker for was forgotten");
    if worker.job_token("k").is_none() {
        // Held: noted once (logged at INFO), not at every renewal.
        assert!(worker.inner.held_back.lock().unwrap().contains("k"));
    }
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let record = || async {
        let v: Option<String> = client.hget(jobs_hash.as_str(), "k").await.unwrap();
        v
    };

    // The worker's renewals clear the claim once it is older than a TTL;
    // the job then runs here again, with a newer token.
    wait_until(Duration::from_secs(15), "the held job resumed", || async {
        worker.job_token("k").is_some()
    })
    .await
    .unwrap();
    let resumed = worker.job_token("k").unwrap();
    assert!(resumed > first, "{resumed} > {first}");
    let raw = record().await.expect("a record");
    assert_eq!(job_owner(&raw), Some((worker.id(), resumed)));
    assert!(!worker.inner.suspended.lock().await.contains_key("k"));
    assert!(
        worker.inner.held_back.lock().unwrap().is_empty(),
        "a resumed job is no longer noted as held"
    );
    assert_eq!(handler.starts.load(Ordering::SeqCst), 2);
    node.close().await.unwrap();
}

/// Starts at once, except the second start of a key, which takes
/// `slow` (the resume after a lease loss).
#[derive(Clone)]
struct SlowSecondStart {
    starts: Arc<AtomicUsize>,
    in_slow_start: Arc<AtomicBool>,
    slow: Duration,
}

#[async_trait]
impl Handler for SlowSecondStart {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        if self.starts.fetch_add(1, Ordering::SeqCst) == 1 {
            self.in_slow_start.store(true, Ordering::SeqCst);
            tokio::time::sleep(self.slow).await;
            self.in_slow_start.store(false, Ordering::SeqCst);
        }
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A resume whose handler start takes longer than a renewal period does
/// not hold the renewals back: they go on meanwhile, and the lease does
/// not lapse again because of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_resume_does_not_hold_the_renewals_back() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("slow-resume");
    // Renewals every second; the lease lapses 2 s after the last one.
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(3));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = SlowSecondStart {
        starts: Arc::default(),
        in_slow_start: Arc::default(),
        slow: Duration::from_secs(4),
    };
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();

    node.inner.lose_lease(Instant::now()).await;
    wait_until(Duration::from_secs(10), "the resume starts", || async {
        handler.in_slow_start.load(Ordering::SeqCst)
    })
    .await
    .unwrap();
    let during = *node.inner.last_renewal.borrow();
    let renewed = wait_until(
        Duration::from_secs(3),
        "a renewal during the resume",
        || async { *node.inner.last_renewal.borrow() > during },
    )
    .await;
    assert!(
        handler.in_slow_start.load(Ordering::SeqCst),
        "the slow start ended first; the test proves nothing"
    );
    renewed.unwrap();
    assert!(
        !node.inner.lease_suspended.load(Ordering::SeqCst),
        "the lease lapsed during the resume"
    );
    wait_until(Duration::from_secs(10), "the job resumed", || async {
        worker.job_token("k").is_some()
    })
    .await
    .unwrap();
    node.close().await.unwrap();
}

/// The other way a held job ends: the cleaner moves it. The worker then
/// forgets it at its next ask, and never runs it beside the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_job_the_cleaner_moves_is_forgotten_not_run() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let node = short_lease_node(&client, "claim-moved").await;
    let (held_handler, new_handler) = (Counting::default(), Counting::default());
    let worker = Worker::new(&node, held_handler.clone()).await.unwrap();
    let new_owner = Worker::new(&node, new_handler.clone()).await.unwrap();
    let key = key_placed_on(&node, &worker).await;
    node.dispatch_job(&key, &b"p"[..]).await.unwrap();

    claim_then_lose_lease(&node, &worker, "n-cleaner").await;
    wait_until(Duration::from_secs(10), "the job held", || async {
        !worker.inner.lease_lost.load(Ordering::SeqCst)
            && worker.inner.suspended.lock().await.contains_key(&key)
    })
    .await
    .unwrap();

    // The cleaner, whose claim stands, hands the job on.
    let moved = node
        .inner
        .handoff(
            &key,
            worker.id(),
            new_owner.id(),
            crate::store::Mover::Cleaner("n-cleaner"),
        )
        .await
        .unwrap();
    assert!(
        matches!(moved, crate::store::Handoff::Ok { .. }),
        "{moved:?}"
    );
    wait_until(
        Duration::from_secs(10),
        "forgotten here, run there",
        || async {
            !worker.inner.suspended.lock().await.contains_key(&key)
                && new_owner.job_token(&key).is_some()
        },
    )
    .await
    .unwrap();
    assert!(worker.job_token(&key).is_none(), "ran beside the new owner");
    assert_eq!(
        held_handler.starts.load(Ordering::SeqCst),
        1,
        "restarted here"
    );
    assert_eq!(new_handler.starts.load(Ordering::SeqCst), 1);
    node.close().await.unwrap();
}

/// A fault proxy in front of `server`, and a client through it.
pub(super) async fn behind_a_proxy(
    server: &RedisServer,
) -> (flotilla_testkit::FaultProxy, fred::prelude::Client) {
    let proxy = flotilla_testkit::FaultProxy::start(server.addr())
        .await
        .unwrap();
    let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    (proxy, client)
}

/// Node options (mirroring the jobs map) whose renewals come every second,
/// each given a second, with a lease of 1 s.
fn short_lease() -> NodeOptions {
    NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(3))
        .lease_stop_after(Duration::from_secs(1))
}

/// Waits for a renewal to go through, then slows the link to 1.2 s each
/// way: no renewal gets its answer within its second any more, and a call
/// sent now, while the lease holds, is answered 2.4 s later. The lease
/// lapses at most a second after the last renewal that went through was
/// sent, before the call, so the answer comes over a second past it: a process starved by a
/// loaded machine still sees the lapse first (at 0.7 s each way the
/// margin was 0.4 s, and a test failed while a soak ran beside it).
async fn slow_link_right_after_a_renewal(node: &Node, proxy: &flotilla_testkit::FaultProxy) {
    wait_until(
        Duration::from_secs(5),
        "a renewal just went through",
        || {
            let fresh = node.inner.last_renewal.borrow().elapsed() < Duration::from_millis(300);
            async move { fresh }
        },
    )
    .await
    .unwrap();
    proxy.set_mode(flotilla_testkit::ProxyMode::Delay(Duration::from_millis(
        1200,
    )));
    assert!(
        node.inner.lease_valid(),
        "the lease holds when the call is sent"
    );
}

/// A resume answered after the lease lapsed does not start the job (chaos
/// soak seed 230, `--overlap`): a worker on a slow link resumed its jobs
/// after a Redis freeze, one resume at a time, each with the lease valid
/// when sent. One reply came back 1.7 s later, past the lease; a cleaner
/// had moved the job meanwhile and another worker started it, and the
/// handler here started it too (an I1 overlap), stopped 170 ms later by the
/// check after the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_answered_after_the_lease_lapsed_does_not_start_the_job() {
    let server = RedisServer::start().unwrap();
    let (proxy, client) = behind_a_proxy(&server).await;
    let options = short_lease();
    let name = flotilla_testkit::unique_name("late-resume");
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(10), "the job runs", || {
        let runs = worker.job_token("k").is_some();
        async move { runs }
    })
    .await
    .unwrap();
    // Held as a lease loss leaves a job: not running, still recorded here.
    let (_, job) = worker.inner.jobs.remove("k").unwrap();
    let token = job.token;
    let starts = handler.starts.load(Ordering::SeqCst);
    // The resume, sent while the lease holds, is answered past it.
    slow_link_right_after_a_renewal(&node, &proxy).await;
    let restarted = node
        .inner
        .restart_owned(&worker.inner, "k", job)
        .await
        .unwrap();
    assert!(!node.inner.lease_valid(), "the lease lapsed meanwhile");
    // Held under the token the resume issued: Redis records that run now.
    let crate::lease::Restart::Suspended(held) = restarted else {
        panic!("not suspended");
    };
    assert!(held > token, "held under the resume's new token");
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        starts,
        "started after the lease lapsed"
    );
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    node.close().await.unwrap();
}

/// A handler that keeps each run's outcome handle, so the test can fail a
/// run.
#[derive(Clone, Default)]
pub(super) struct Failing {
    pub(super) starts: Arc<AtomicUsize>,
    pub(super) outcome: Arc<std::sync::Mutex<Option<crate::JobOutcome>>>,
}

#[async_trait]
impl Handler for Failing {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        *self.outcome.lock().unwrap() = Some(job.outcome());
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A pool of one worker (`options`, mirroring the jobs map, with a long
/// backoff: the test makes the restart itself, when it wants) whose job
/// "k" ran and failed: the failure is recorded in Redis and the job waits
/// for its restart. Returns the failed run's token.
pub(super) async fn failed_job_due(
    client: &fred::prelude::Client,
    prefix: &str,
    options: NodeOptions,
) -> (Node, Worker, Failing, u64) {
    let options = options.mirror_jobs(true).restart_policy(
        crate::RestartPolicy::default()
            .first_delay(Duration::from_secs(3600))
            .max_delay(Duration::from_secs(3600)),
    );
    let name = flotilla_testkit::unique_name(prefix);
    let node = Node::join(client, &name, options).await.unwrap();
    let handler = Failing::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let token = worker.job_token("k").expect("the job runs");
    let outcome = handler.outcome.lock().unwrap().take().unwrap();
    outcome.failed("boom");
    wait_until(Duration::from_secs(10), "the restart is due", || {
        let waiting = worker.inner.lifecycle.restarting() == 1;
        async move { waiting }
    })
    .await
    .unwrap();
    (node, worker, handler, token)
}

/// The restart of a failed run checks the lease again once Redis answered
/// it, as a resume does (above): sent while the lease held, answered past
/// it, it holds the job suspended instead of starting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_answered_after_the_lease_lapsed_does_not_start_the_job() {
    let server = RedisServer::start().unwrap();
    let (proxy, client) = behind_a_proxy(&server).await;
    let options = short_lease();
    let (node, worker, handler, token) = failed_job_due(&client, "late-restart", options).await;
    let starts = handler.starts.load(Ordering::SeqCst);
    // The restart, sent while the lease holds, is answered past it.
    slow_link_right_after_a_renewal(&node, &proxy).await;
    worker.inner.clone().restart("k".to_string(), token).await;
    assert!(!node.inner.lease_valid(), "the lease lapsed meanwhile");
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        starts,
        "started after the lease lapsed"
    );
    assert!(
        worker.inner.suspended.lock().await.contains_key("k"),
        "held suspended, for the renewals to resume"
    );
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    node.close().await.unwrap();
}

/// A run that finished while its end was being recorded and the lease
/// lapsed meanwhile (chaos soak seed 1101, `--lifecycle`): the watchdog
/// moved the run to the suspended set before Redis answered that the end
/// was recorded, and the resume took the missing record for a loss to
/// Redis, re-asserted the job and started it again, with no dispatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_finished_as_the_lease_lapsed_is_not_resumed() {
    let server = RedisServer::start().unwrap();
    let (proxy, client) = behind_a_proxy(&server).await;
    let direct = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = short_lease();
    let name = flotilla_testkit::unique_name("finish-lapse");
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Failing::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    assert!(worker.job_token("k").is_some(), "the job runs");

    // The run finishes; its end reaches Redis after the lease lapsed here.
    slow_link_right_after_a_renewal(&node, &proxy).await;
    let outcome = handler.outcome.lock().unwrap().take().unwrap();
    outcome.finished();
    wait_until(
        Duration::from_secs(5),
        "the watchdog suspended the run while its end was in flight",
        || {
            let worker = worker.inner.clone();
            async move { worker.suspended.lock().await.contains_key("k") }
        },
    )
    .await
    .unwrap();
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    wait_until(Duration::from_secs(10), "Redis recorded the end", || {
        let direct = direct.clone();
        let jobs_hash = jobs_hash.clone();
        async move {
            let held: bool = direct.hexists(jobs_hash.as_str(), "k").await.unwrap();
            !held
        }
    })
    .await
    .unwrap();
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    finished_job_not_resumed(&node, &worker, &handler).await;
}

/// A failed job waiting for its restart when Redis loses its record (a
/// rollback to before its admission, chaos soak seed 1101 `--lifecycle`):
/// the restart found no record naming this run and dropped the job, before
/// the worker had noticed the loss and re-asserted what it holds. Nothing
/// else knew the job: it was lost. The restart re-asserts it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_whose_record_redis_lost_is_restarted() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(10));
    let (node, worker, handler, token) = failed_job_due(&client, "lost-restart", options).await;
    // Redis goes back to before the admission: no record, no payload.
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = client.hdel(jobs_hash.as_str(), "k").await.unwrap();
    let _: i64 = client
        .hdel(crate::keys::payloads(&node.inner.store.pool), "k")
        .await
        .unwrap();
    worker.inner.clone().restart("k".to_string(), token).await;
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        2,
        "the failed job was not restarted"
    );
    let restarted = worker.job_token("k").expect("the job runs again");
    assert!(restarted > token);
    let record: Option<String> = client.hget(jobs_hash.as_str(), "k").await.unwrap();
    assert_eq!(
        record,
        Some(format!("{} {restarted}", worker.id())),
        "Redis names the new run"
    );
    node.close().await.unwrap();
}

/// A run that finished just before a lease loss, its report handled after
/// the watchdog stopped it: the end is recorded all the same, and the
/// resume does not start the finished job again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_reported_after_a_lease_loss_still_ends_the_job() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(10));
    let name = flotilla_testkit::unique_name("finish-after-loss");
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Failing::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    assert!(worker.job_token("k").is_some(), "the job runs");
    // The watchdog stops every job, then the finish report comes in.
    node.inner.lose_lease(tokio::time::Instant::now()).await;
    assert!(worker.inner.suspended.lock().await.contains_key("k"));
    let outcome = handler.outcome.lock().unwrap().take().unwrap();
    outcome.finished();
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    wait_until(Duration::from_secs(10), "the end is recorded", || {
        let client = client.clone();
        let jobs_hash = jobs_hash.clone();
        let worker = worker.inner.clone();
        async move {
            let held: bool = client.hexists(jobs_hash.as_str(), "k").await.unwrap();
            !held && worker.suspended.lock().await.is_empty()
        }
    })
    .await
    .unwrap();
    finished_job_not_resumed(&node, &worker, &handler).await;
}

/// Once the lease is back, resumes the suspended jobs (whatever resume the
/// renewal asked for has run once this one has: each holds the worker's
/// ops lock, as the recording of an end does) and checks that the job "k",
/// which finished, did not start again, then closes the node.
async fn finished_job_not_resumed(node: &Node, worker: &Worker, handler: &Failing) {
    wait_until(Duration::from_secs(10), "the lease is back", || {
        let back = node.inner.lease_valid() && !node.inner.lease_suspended.load(Ordering::SeqCst);
        async move { back }
    })
    .await
    .unwrap();
    node.inner.resume_all().await;
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        1,
        "the finished job was started again"
    );
    assert!(worker.job_token("k").is_none(), "the job left the worker");
    assert!(worker.inner.suspended.lock().await.is_empty());
    node.close().await.unwrap();
}
