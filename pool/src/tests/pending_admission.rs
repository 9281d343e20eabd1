//! `JobExists` means a job that started: a dispatch that finds another
//! dispatch's admission of its key not started yet waits for that start,
//! because the admission can still fail or be lost with Redis's recent
//! writes (a rollback) while its own dispatcher, never answered `Ok`, is
//! told `Timeout`; a `JobExists` answered for it would promise a job that
//! never runs.

use std::time::Instant;

use super::recovery_window::pending_hash;
use super::*;
use flotilla_testkit::ServerOptions;

/// A node whose worker refuses starts (its lease is marked lost, so start
/// entries wait in its inbox until `resume_all`), a client-only
/// dispatcher, and the worker's handler.
async fn pool_with_a_held_start(
    server: &RedisServer,
    name: &str,
) -> (fred::prelude::Client, Node, Node, Counting) {
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(1))
        .dispatch_timeout(Duration::from_secs(6));
    let node = Node::join(&client, name, options.clone()).await.unwrap();
    let dispatcher = Node::join(&client, name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    worker.inner.lease_lost.store(true, Ordering::Release);
    (client, node, dispatcher, handler)
}

/// Dispatches `key` from `node` in a task; returns once its admission's
/// guard is in Redis (its start held back).
async fn admitted_not_started(
    client: &fred::prelude::Client,
    name: &str,
    node: &Node,
    key: &'static str,
) -> tokio::task::JoinHandle<crate::Result<()>> {
    let first = {
        let node = node.clone();
        tokio::spawn(async move { node.dispatch_job(key, &b"p"[..]).await })
    };
    let pending = pending_hash(name);
    wait_until(Duration::from_secs(5), "the first admission", || {
        let client = client.clone();
        let pending = pending.clone();
        async move { client.hexists::<bool, _, _>(&pending, key).await.unwrap() }
    })
    .await
    .unwrap();
    first
}

/// Dispatches "k" from `dispatcher` in a task, while the first admission's
/// start is held back: whatever it would answer then, it is not
/// `JobExists` (nothing runs "k" yet), so it has not answered 300 ms later.
async fn second_dispatch_waits(
    dispatcher: &Node,
    handler: &Counting,
) -> tokio::task::JoinHandle<crate::Result<()>> {
    let mut second = {
        let dispatcher = dispatcher.clone();
        tokio::spawn(async move { dispatcher.dispatch_job("k", &b"p"[..]).await })
    };
    if let Ok(early) = tokio::time::timeout(Duration::from_millis(300), &mut second).await {
        panic!(
            "the second dispatch answered {:?} before the first started (starts: {})",
            early.unwrap(),
            handler.starts.load(Ordering::SeqCst)
        );
    }
    second
}

/// Waits for "k" to start (once), then closes both nodes.
async fn runs_once_then_close(handler: &Counting, dispatcher: Node, node: Node) {
    wait_until(Duration::from_secs(5), "'k' runs", || async {
        handler.starts.load(Ordering::SeqCst) == 1
    })
    .await
    .unwrap();
    dispatcher.close().await.unwrap();
    node.close().await.unwrap();
}

/// While the first admission has not started, a second dispatch does not
/// answer `JobExists`; once it starts, it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_dispatch_answers_exists_once_the_first_started() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("pending-exists");
    let (client, node, dispatcher, handler) = pool_with_a_held_start(&server, &name).await;
    let first = admitted_not_started(&client, &name, &node, "k").await;
    let second = second_dispatch_waits(&dispatcher, &handler).await;
    node.inner.resume_all().await;
    first.await.unwrap().unwrap();
    let started_at = Instant::now();
    assert!(
        matches!(second.await.unwrap(), Err(crate::Error::JobExists(_))),
        "the second dispatch finds the first's job"
    );
    assert!(started_at.elapsed() < Duration::from_secs(1));
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    dispatcher.close().await.unwrap();
    node.close().await.unwrap();
}

/// Redis goes back to before the first admission while its start is held
/// back: the first dispatch times out, and the second, which had found
/// that admission, must not have answered `JobExists` for a job Redis
/// forgot. It is admitted itself once the pool recovered, and the key runs
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_lost_in_a_rollback_is_not_reported_existing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let name = flotilla_testkit::unique_name("pending-rollback");
    let (client, node, dispatcher, handler) = pool_with_a_held_start(&server, &name).await;
    let snapshot = server.save_snapshot().unwrap();
    let first = admitted_not_started(&client, &name, &node, "k").await;
    let second = second_dispatch_waits(&dispatcher, &handler).await;
    server.roll_back(&snapshot).unwrap();
    node.inner.resume_all().await;
    let second = second.await.unwrap();
    assert!(
        matches!(first.await.unwrap(), Err(crate::Error::Timeout(_))),
        "the first admission was lost: its dispatch is not answered"
    );
    assert!(
        second.is_ok(),
        "the second dispatch is admitted once the first is gone: {second:?}"
    );
    runs_once_then_close(&handler, dispatcher, node).await;
}

/// A dispatch whose start never came, its guard swept as stale and its
/// payload left to the orphan sweep, is not `JobExists` to a later
/// dispatch either: Redis may lose the orphan before any worker holds it,
/// and nobody would run it again (chaos soak seed 93: a dispatch timed out
/// behind a slow link, its guard was swept, two dispatches were told
/// `JobExists`, and an empty restart lost the job). The later dispatch
/// waits; after the loss, a caller's retry is admitted and the key runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_not_started_yet_is_not_reported_existing() {
    let mut server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("pending-orphan");
    let (client, node, dispatcher, handler) = pool_with_a_held_start(&server, &name).await;
    let first = admitted_not_started(&client, &name, &node, "k").await;
    // The stale-pending sweep: the guard goes, the payload stays.
    let _: () = client.hdel(pending_hash(&name), "k").await.unwrap();
    let second = second_dispatch_waits(&dispatcher, &handler).await;
    server.restart().unwrap();
    node.inner.resume_all().await;
    let second = second.await.unwrap();
    assert!(
        !matches!(second, Err(crate::Error::JobExists(_))),
        "JobExists for a job Redis lost before it started"
    );
    assert!(first.await.unwrap().is_err(), "the first never started");
    // A caller retries until answered.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut answer = second;
    while let Err(crate::Error::Timeout(_)) = answer {
        assert!(Instant::now() < deadline, "no answer for 'k'");
        answer = dispatcher.dispatch_job("k", &b"p"[..]).await;
    }
    assert!(answer.is_ok(), "{answer:?}");
    runs_once_then_close(&handler, dispatcher, node).await;
}
