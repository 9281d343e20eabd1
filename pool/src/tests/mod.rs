//! In-crate tests that need a real Redis and a look inside a worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use flotilla_testkit::{RedisServer, wait_until};
use fred::prelude::{ClientLike, HashesInterface};

use crate::handler::{Handler, HandlerError, Job};
use crate::{Node, NodeOptions, Worker};

/// Counts starts and stops.
#[derive(Clone, Default)]
struct Counting {
    starts: Arc<AtomicUsize>,
    stops: Arc<AtomicUsize>,
    messages: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for Counting {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        self.stops.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn message(&self, _key: &str, _payload: bytes::Bytes) -> Result<(), HandlerError> {
        self.messages.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A node (mirroring the jobs and pending maps: these tests read its
/// replicas) with one worker.
async fn pool(server: &RedisServer, name: &str) -> (Node, Worker, Counting) {
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(10))
        .dispatch_timeout(Duration::from_secs(8));
    let node = Node::join(&client, name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    (node, worker, handler)
}

/// Two nodes of one pool, a worker on each; `a`'s handler is returned.
async fn two_nodes(
    server: &RedisServer,
    name: &str,
) -> (fred::prelude::Client, Node, Node, Worker, Worker, Counting) {
    let handler_a = Counting::default();
    let (client, a, b, wa, wb) = two_nodes_with(server, name, handler_a.clone()).await;
    (client, a, b, wa, wb, handler_a)
}

/// A node of a new pool (mirroring the jobs map) whose renewals come every
/// second (TTL 3 s): a cleanup claim goes once older than 3 s, and the
/// recovery window a script opens lasts 3 s.
async fn short_lease_node(client: &fred::prelude::Client, prefix: &str) -> Node {
    let name = flotilla_testkit::unique_name(prefix);
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(3));
    Node::join(client, &name, options).await.unwrap()
}

/// Two nodes of one pool, a worker on each, `a`'s with `handler_a`. Both
/// mirror the jobs and pending maps: these tests read their replicas.
async fn two_nodes_with(
    server: &RedisServer,
    name: &str,
    handler_a: impl Handler,
) -> (fred::prelude::Client, Node, Node, Worker, Worker) {
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(10));
    two_nodes_with_options(server, name, options, handler_a).await
}

/// Two nodes of one pool joined with `options`, a worker on each, `a`'s
/// with `handler_a`.
async fn two_nodes_with_options(
    server: &RedisServer,
    name: &str,
    options: NodeOptions,
    handler_a: impl Handler,
) -> (fred::prelude::Client, Node, Node, Worker, Worker) {
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let a = Node::join(&client, name, options.clone()).await.unwrap();
    let b = Node::join(&client, name, options).await.unwrap();
    let wa = Worker::new(&a, handler_a).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        a.pool_workers().len() == 2 && b.pool_workers().len() == 2
    })
    .await
    .unwrap();
    (client, a, b, wa, wb)
}

/// Whether Redis judges `worker` silent for over `ttl`: its keep-alive
/// (server time) older than that by the server's clock.
async fn silent_for_over(node: &Node, worker: &str, ttl: Duration) -> bool {
    let store = &node.inner.store;
    let hash = store.maps.keepalive.keys_info().hash.clone();
    let last: Option<u64> = store.client.hget(&hash, worker).await.unwrap();
    let now = store.server_time_ms().await.unwrap();
    last.is_some_and(|last| now.saturating_sub(last) > ttl.as_millis() as u64)
}

/// A key that `node`'s ring places on `worker`. Waits for the ring to
/// include the worker: the workers map can show a new worker before the
/// ring (built from it and the keep-alives) does.
async fn key_placed_on(node: &Node, worker: &Worker) -> String {
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let find = || {
        keys.iter()
            .find(|k| node.placement(k).as_deref() == Some(worker.id()))
            .cloned()
    };
    // The ring is rebuilt after the membership replica changes: until it
    // holds every worker the pool has, a key it places here may move on
    // as soon as it is dispatched (each of 100 keys missing a worker by
    // chance: 2^-100 with two).
    let ring_complete = || {
        node.pool_workers().iter().all(|w| {
            keys.iter()
                .any(|k| node.placement(k).as_deref() == Some(w.id.as_str()))
        })
    };
    wait_until(
        Duration::from_secs(5),
        "the ring holds every worker and places a key on this one",
        || {
            let found = ring_complete() && find().is_some();
            async move { found }
        },
    )
    .await
    .unwrap();
    find().expect("one of 100 keys hashes to the worker")
}

/// A start entry for `key` with `token`, forwarded as often as allowed (so
/// the worker that reads it runs it).
fn start_entry(key: &str, token: u64) -> Vec<u8> {
    let mut entry = format!("{token} 0 {} 0 -\n", super::worker::MAX_HOPS).into_bytes();
    entry.extend_from_slice(&crate::codec::encode(&crate::codec::JobBody {
        key: key.to_string(),
        payload: b"p".to_vec(),
        restart: None,
    }));
    entry
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid` (a Redis server's,
/// to stall it through a failover).
pub(super) fn signal(signal: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Hands `worker` a start entry of `key` with `token` as if read from its
/// inbox before a doubt (so it is claimed in Redis before it starts), and
/// lets it handle the entry.
async fn start_in_hand(node: &Node, worker: &Worker, key: &str, token: u64) {
    let payload = bytes::Bytes::from(start_entry(key, token));
    let event = flotilla_streaming::Event {
        id: "1-0".to_string(),
        stream: format!("inbox:{}", worker.id()),
        name: crate::codec::EV_START.to_string(),
        topic: None,
        payload: payload.clone(),
        server: None,
    };
    node.inner.freshness.invalidate("test");
    let entry = crate::codec::StartEntry::parse(&payload).unwrap();
    worker
        .inner
        .on_start(&node.inner, &event, entry)
        .await
        .unwrap();
}

/// A pending guard for `token` whose deadline is a minute away.
fn live_guard(token: u64) -> String {
    let deadline_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
        + 60_000;
    format!("{token} {deadline_ms} -/0")
}

/// A job as a worker keeps it locally.
fn local_job(key: &str, token: u64) -> crate::worker::LocalJob {
    crate::worker::LocalJob {
        token,
        admitted: 0,
        payload: bytes::Bytes::from_static(b"p"),
        raw_body: crate::codec::encode(&crate::codec::JobBody {
            key: key.to_string(),
            payload: b"p".to_vec(),
            restart: None,
        }),
    }
}

/// `node`'s ring as it is after Redis lost its data: no worker.
fn empty_ring(node: &Node) {
    let ring = crate::routing::Ring::new(Vec::<String>::new());
    node.inner.ring.store(Arc::new(ring));
}

/// Redis loses all its data.
async fn flushall(client: &fred::prelude::Client) {
    let _: fred::types::Value = client
        .custom(
            fred::types::CustomCommand::new_static("FLUSHALL", None, false),
            Vec::<String>::new(),
        )
        .await
        .unwrap();
}

/// Waits for `renewals` more renewals of `node`'s keep-alives.
async fn renewals(node: &Node, renewals: usize) {
    let mut renewed = node.inner.last_renewal.subscribe();
    for _ in 0..renewals {
        tokio::time::timeout(Duration::from_secs(10), renewed.changed())
            .await
            .expect("a renewal within 10 s")
            .unwrap();
    }
}

/// Marks `worker`'s lease lost and dispatches `key` from `node` in a task;
/// returns once the start reached the worker and was refused: it failed,
/// is still in the inbox, and the rewind after the failure found no lease
/// and gave up.
async fn dispatch_without_lease(
    node: &Node,
    worker: &Worker,
    key: &'static str,
) -> tokio::task::JoinHandle<crate::Result<()>> {
    worker.inner.lease_lost.store(true, Ordering::Release);
    let dispatch = {
        let node = node.clone();
        tokio::spawn(async move { node.dispatch_job(key, &b"p"[..]).await })
    };
    let inbox = node.inner.inbox(worker.id()).unwrap();
    wait_until(Duration::from_secs(5), "start refused", || async {
        let (failures, scheduled) = worker.inner.rewind_state();
        failures > 0 && !scheduled && inbox.len().await.unwrap() == 1
    })
    .await
    .unwrap();
    dispatch
}

/// A start refused while the lease is lost stays in the inbox and runs as
/// soon as the lease is back, within the dispatcher's timeout (not after
/// the pending guard expires and the orphan sweep requeues it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_refused_without_lease_runs_when_the_lease_is_back() {
    let server = RedisServer::start().unwrap();
    let (node, worker, handler) = pool(&server, &flotilla_testkit::unique_name("rewind")).await;
    let dispatch = dispatch_without_lease(&node, &worker, "k1").await;
    assert_eq!(handler.starts.load(Ordering::SeqCst), 0);
    node.inner.resume_all().await;
    tokio::time::timeout(Duration::from_secs(5), dispatch)
        .await
        .expect("dispatch answered within 5 s of the lease coming back")
        .unwrap()
        .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    let inbox = node.inner.inbox(worker.id()).unwrap();
    assert_eq!(inbox.len().await.unwrap(), 0, "entry removed once handled");
    node.close().await.unwrap();
}

/// Reading the inbox again (a rewind) while entries are queued or just
/// handled never handles one twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewinds_never_handle_an_entry_twice() {
    let server = RedisServer::start().unwrap();
    let (node, worker, handler) = pool(&server, &flotilla_testkit::unique_name("rewind2")).await;
    let mut dispatches = Vec::new();
    for i in 0..200 {
        let n = node.clone();
        dispatches.push(tokio::spawn(async move {
            n.dispatch_job(&format!("k{i}"), &b"p"[..]).await
        }));
        if i % 20 == 0 {
            worker.inner.rewind_soon(&node.inner);
        }
    }
    for d in dispatches {
        d.await.unwrap().unwrap();
    }
    // Messages are not answered: many queue up while rewinds re-read them.
    for i in 0..2000 {
        node.dispatch_message(&format!("m{i}"), &b"x"[..])
            .await
            .unwrap();
        if i % 50 == 0 {
            worker.inner.rewind_soon(&node.inner);
            tokio::task::yield_now().await;
        }
    }
    worker.inner.rewind_soon(&node.inner);
    let inbox = node.inner.inbox(worker.id()).unwrap();
    wait_until(Duration::from_secs(10), "inbox drained", || async {
        inbox.len().await.unwrap() == 0 && handler.messages.load(Ordering::SeqCst) >= 2000
    })
    .await
    .unwrap();
    // Give a duplicate the time to show up before counting.
    wait_until(Duration::from_secs(1), "rewinds done", || async {
        !worker.inner.rewind_state().1
    })
    .await
    .unwrap();
    assert_eq!(
        handler.messages.load(Ordering::SeqCst),
        2000,
        "each message handled once"
    );
    assert_eq!(handler.starts.load(Ordering::SeqCst), 200);
    assert_eq!(handler.stops.load(Ordering::SeqCst), 0, "no restarts");
    node.close().await.unwrap();
}

/// Garbage in a worker's inbox is dead-lettered (removed and logged); the
/// worker keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_inbox_entries_are_dead_lettered() {
    let server = RedisServer::start().unwrap();
    let (node, worker, handler) = pool(&server, &flotilla_testkit::unique_name("garbage")).await;
    let inbox = node.inner.inbox(worker.id()).unwrap();
    for (name, payload) in [
        ("start", &b"no header"[..]),
        ("start", &b"1 2 3\n\xff\xfe"[..]),
        ("start", &b"x y z w v\n"[..]),
        ("stop", &b"\xc1"[..]),
        ("notify", &b""[..]),
        ("message", &b"\x92\x01"[..]),
        ("bogus", &b"anything"[..]),
    ] {
        inbox.add(name, payload).await.unwrap();
    }
    wait_until(Duration::from_secs(5), "garbage removed", || async {
        inbox.len().await.unwrap() == 0
    })
    .await
    .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 0);
    node.dispatch_job("after-garbage", &b"p"[..]).await.unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    assert_eq!(worker.job_keys(), vec!["after-garbage".to_string()]);
    node.close().await.unwrap();
}

/// `stop_job` of a job admitted but not started yet is not lost: the job is
/// stopped as soon as it runs, and `stop_job` returns once it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_of_a_pending_job_stops_it_once_started() {
    let server = RedisServer::start().unwrap();
    let (node, worker, handler) =
        pool(&server, &flotilla_testkit::unique_name("stop-pending")).await;
    let dispatch = dispatch_without_lease(&node, &worker, "k1").await;
    let stopper = node.clone();
    let stop = tokio::spawn(async move { stopper.stop_job("k1").await });
    // The stop waits for the start; let the lease come back.
    node.inner.resume_all().await;
    dispatch.await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(5), stop)
        .await
        .expect("stop answered")
        .unwrap()
        .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    assert_eq!(handler.stops.load(Ordering::SeqCst), 1);
    assert!(worker.job_keys().is_empty());
    wait_until(Duration::from_secs(2), "jobs map cleared", || async {
        node.job_owner("k1").is_none()
    })
    .await
    .unwrap();
    assert!(matches!(
        node.stop_job("k1").await,
        Err(crate::Error::JobNotFound(_))
    ));
    node.close().await.unwrap();
}

/// Two nodes of pool `name` joined with `options`, a worker on each, both
/// with `handler`.
async fn two_nodes_sharing<H: Handler + Clone>(
    client: &fred::prelude::Client,
    name: &str,
    options: NodeOptions,
    handler: &H,
) -> (Node, Node, Worker, Worker) {
    let a = Node::join(client, name, options.clone()).await.unwrap();
    let b = Node::join(client, name, options).await.unwrap();
    let wa = Worker::new(&a, handler.clone()).await.unwrap();
    let wb = Worker::new(&b, handler.clone()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        a.pool_workers().len() == 2 && b.pool_workers().len() == 2
    })
    .await
    .unwrap();
    (a, b, wa, wb)
}

/// Runs per key: how many handlers run it now, the most at once, and how
/// many starts there were.
#[derive(Clone, Default)]
struct Overlap {
    running: Arc<dashmap::DashMap<String, usize>>,
    most: Arc<AtomicUsize>,
    starts: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for Overlap {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let mut n = self.running.entry(job.key).or_default();
        *n += 1;
        self.most.fetch_max(*n, Ordering::SeqCst);
        drop(n);
        // Long enough for the other worker to get there too.
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        if let Some(mut n) = self.running.get_mut(key) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }
    async fn message(&self, _key: &str, _payload: bytes::Bytes) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// The same admitted start in two workers' hands at once (as when one
/// process kept an entry that was moved on while it was cut off, and its
/// replica lags): the claim in Redis lets exactly one handler start the
/// key; the other never calls `start`, not even briefly. Both nodes had a
/// reason for doubt (a lease gap, a reconnect) since the entries were
/// appended, which is what makes a worker claim before starting: without
/// one, a copy in a second inbox cannot exist (see `freshness.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_start_in_two_hands_is_started_once() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("claim");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    // Mirroring: the test writes the pending guards through `a`'s replica.
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(10));
    let handler = Overlap::default();
    let (a, b, wa, wb) = two_nodes_sharing(&client, &name, options, &handler).await;
    let keys: Vec<String> = (0..20).map(|i| format!("twice-{i}")).collect();
    // Hold the entries in the inboxes until both nodes had their doubt.
    wa.inner.lease_lost.store(true, Ordering::Release);
    wb.inner.lease_lost.store(true, Ordering::Release);
    let inboxes = [
        a.inner.inbox(wa.id()).unwrap(),
        b.inner.inbox(wb.id()).unwrap(),
    ];
    for (i, key) in keys.iter().enumerate() {
        let token = 1000 + i as u64;
        // Admitted with this token, as `admit.lua` leaves it.
        a.inner
            .store
            .maps
            .pending_map()
            .set(key, &live_guard(token))
            .await
            .unwrap();
        let entry = start_entry(key, token);
        let (x, y) = tokio::join!(
            inboxes[0].add("start", entry.clone()),
            inboxes[1].add("start", entry)
        );
        x.unwrap();
        y.unwrap();
    }
    wait_until(Duration::from_secs(10), "every start held", || async {
        let (fa, sa) = wa.inner.rewind_state();
        let (fb, sb) = wb.inner.rewind_state();
        fa > 0 && fb > 0 && !sa && !sb
    })
    .await
    .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 0);
    a.inner.freshness.invalidate("test");
    b.inner.freshness.invalidate("test");
    tokio::join!(a.inner.resume_all(), b.inner.resume_all());
    wait_until(Duration::from_secs(10), "both inboxes drained", || async {
        inboxes[0].len().await.unwrap() == 0 && inboxes[1].len().await.unwrap() == 0
    })
    .await
    .unwrap();
    assert_eq!(handler.most.load(Ordering::SeqCst), 1, "a key ran twice");
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        keys.len(),
        "a start was attempted without a claim"
    );
    let running: usize = keys
        .iter()
        .filter(|k| wa.job_token(k).is_some() != wb.job_token(k).is_some())
        .count();
    assert_eq!(running, keys.len(), "each key runs on exactly one worker");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Changes the default user's permissions (`rules`, e.g. `-fcall`).
async fn acl_default_user(client: &fred::prelude::Client, rules: &[&str]) {
    let mut args = vec!["SETUSER", "default"];
    args.extend_from_slice(rules);
    let _: fred::types::Value = client
        .custom(
            fred::types::CustomCommand::new_static("ACL", None, false),
            args,
        )
        .await
        .unwrap();
}

/// A job stopped to be moved, whose move and restart here both fail with
/// Redis errors, is handed on once Redis answers again: recorded as this
/// worker's but not running, nothing else would ever notice it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_neither_moved_nor_restarted_is_requeued() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("stuck");
    let handler_a = HookOnStop::default();
    let (client, a, b, wa, wb) = two_nodes_with(&server, &name, handler_a.clone()).await;
    let key = key_placed_on(&a, &wb).await;
    let job = local_job(&key, 7);
    let status = a
        .inner
        .reassert(&wa.inner, &key, &job, crate::lease::Reassert::Running)
        .await
        .unwrap();
    assert_eq!(status, "ok", "recorded as running on a");
    wa.inner.jobs.insert(key.clone(), job);
    // Every script and function call is refused for 1.5 s from the stop
    // on, as when Redis errors in the middle of a handoff.
    let hook: StopHook = Box::new(move || {
        let client = client.clone();
        Box::pin(async move {
            acl_default_user(&client, &["-evalsha", "-fcall"]).await;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                acl_default_user(&client, &["+evalsha", "+fcall"]).await;
            });
        })
    });
    handler_a.hook.set(hook).ok().unwrap();
    a.inner.hand_off_local(&wa.inner, &key).await;
    wait_until(Duration::from_secs(15), "the job runs on b", || async {
        wb.job_token(&key).is_some_and(|t| t > 7)
    })
    .await
    .unwrap();
    assert!(
        wa.job_token(&key).is_none(),
        "still counted as running on a"
    );
    assert_eq!(handler_a.counts.starts.load(Ordering::SeqCst), 0);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// What a [`HookOnStop`] handler does when a job stops.
type StopHook = Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// Counts starts and stops, and runs its hook (once set) whenever a job
/// stops: a fault injected in the middle of a handoff.
#[derive(Clone, Default)]
struct HookOnStop {
    counts: Counting,
    hook: Arc<std::sync::OnceLock<StopHook>>,
}

#[async_trait]
impl Handler for HookOnStop {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.counts.start(job).await
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        if let Some(hook) = self.hook.get() {
            hook().await;
        }
        self.counts.stop(key).await
    }
    async fn message(&self, key: &str, payload: bytes::Bytes) -> Result<(), HandlerError> {
        self.counts.message(key, payload).await
    }
}

/// Removes `key` from each of `hashes`, as a loss of Redis's data does,
/// and checks it was there.
async fn forget_in_redis(client: &fred::prelude::Client, hashes: &[String], key: &str) {
    for hash in hashes {
        let removed: i64 = client.hdel(hash, key).await.unwrap();
        assert_eq!(removed, 1, "{key} in {hash}");
    }
}

mod batches;
mod claim_in_recovery;
mod claimed_worker;
mod cleaned_rollback;
mod cleaner_custody;
mod cleanup_empty_ring;
mod clock_step;
mod close_custody;
mod concurrent_close;
mod data_loss;
mod dead_owner_stop;
mod departed_worker;
mod drain;
mod ended_runs;
mod finished_moves;
mod flush_notice;
mod forgotten_jobs;
mod gathering;
mod handoff_rollback;
mod lanes;
mod lapsed_handoff;
mod lease_after_claim;
mod live_pool;
mod lost_claim;
mod many_workers;
mod misplaced_start;
mod node_restart;
mod one_recovery;
mod outage_return;
mod paced_rebalance;
mod pending_admission;
mod reassert_batches;
mod reassert_during_handoffs;
mod reassert_during_restarts;
mod reassert_during_starts;
mod reassert_first;
mod reconcile_lease;
mod recovery_resume;
mod recovery_stops;
mod recovery_window;
mod redis_freeze;
mod refused_writes;
mod requested_stop_first;
mod reregistered_reconcile;
mod restart_between;
mod resume;
mod rewind_at_renewal;
mod ring_view;
mod silent_link;
mod slow_starts;
mod stale_starts;
mod stop_answers;
mod stop_undone;
mod superseded_dispatch;
mod superseded_handoff;
mod sweeper;
mod unclaimed_start;
mod undone_on_dead_worker;
mod unrecorded_start;
mod woken_primary_entries;
