//! The pool's sweeper: one elected node requeues orphans (once, never
//! before their grace) and removes stale pending guards, page by page from
//! Redis; another node takes over when it closes or is cut off.

use std::collections::HashMap;
use std::sync::Mutex;

use flotilla_testkit::FaultProxy;
use tokio::time::Instant;

use super::*;
use crate::{ClusterLock, LockOptions};

/// Grace of the orphan sweep in these tests.
const GRACE: Duration = Duration::from_millis(1500);

/// Records when each key started, and how often.
#[derive(Clone, Default)]
struct Starts {
    seen: Arc<Mutex<HashMap<String, Vec<Instant>>>>,
}

impl Starts {
    fn count(&self, key: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |starts| starts.len())
    }

    fn first(&self, key: &str) -> Option<Instant> {
        self.seen
            .lock()
            .unwrap()
            .get(key)
            .and_then(|s| s.first().copied())
    }
}

#[async_trait]
impl Handler for Starts {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.seen
            .lock()
            .unwrap()
            .entry(job.key.clone())
            .or_default()
            .push(Instant::now());
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Mirroring the jobs and pending maps: these tests write and read
/// through the replicas.
fn options() -> NodeOptions {
    NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_millis(1500))
        .orphan_grace(GRACE)
        .sweep_interval(Duration::from_millis(100))
        .sweep_batch(50)
}

/// The node id holding the pool's sweeper lease, as Redis says.
async fn sweeper(client: &fred::prelude::Client, pool: &str) -> Option<String> {
    let lock = ClusterLock::new(
        client,
        crate::keys::SWEEPER_LEASE,
        LockOptions::default().hash_tag(pool),
    )
    .unwrap();
    lock.info().await.unwrap().map(|info| info.owner_id)
}

/// Leaves an orphan in Redis as a crashed dispatch would: a payload, no
/// pending guard, and `record` (or none) in the jobs hash.
async fn plant_orphan(node: &Node, key: &str, record: Option<&str>) {
    let store = &node.inner.store;
    let now = store.server_time_ms().await.unwrap();
    let mut stored = format!("{now} ").into_bytes();
    stored.extend_from_slice(&crate::codec::encode(&crate::codec::JobBody {
        key: key.to_string(),
        payload: b"p".to_vec(),
        restart: None,
    }));
    let _: i64 = store
        .client
        .hset(
            store.maps.payloads_key(),
            (key, fred::types::Value::Bytes(stored.into())),
        )
        .await
        .unwrap();
    if let Some(record) = record {
        store.maps.jobs_map().set(key, record).await.unwrap();
    }
}

/// Every key in `keys`, orphaned from `planted` on, first started no
/// sooner than the grace after.
fn assert_started_after_the_grace(starts: &Starts, keys: &[String], planted: Instant) {
    for key in keys {
        let first = starts.first(key).unwrap();
        assert!(
            first.duration_since(planted) >= GRACE,
            "{key} requeued {:?} after it was orphaned, before the grace",
            first.duration_since(planted)
        );
    }
}

/// Orphans — with no record, and with a record naming a worker that is not
/// registered — are requeued once each, by the sweeper, and not before
/// their grace; three nodes compete and only one holds the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_requeued_once_and_not_before_the_grace() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("sweep-once");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let starts = Starts::default();
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let node = Node::join(&client, &name, options()).await.unwrap();
        workers.push(Worker::new(&node, starts.clone()).await.unwrap());
        nodes.push(node);
    }
    wait_until(Duration::from_secs(5), "a sweeper elected", || async {
        sweeper(&client, &name).await.is_some()
    })
    .await
    .unwrap();
    let holder = sweeper(&client, &name).await.unwrap();
    assert!(nodes.iter().any(|n| n.id() == holder));

    // More orphans than one sweep page, so a pass takes several steps.
    let keys: Vec<String> = (0..120).map(|i| format!("orphan-{i}")).collect();
    let planted = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        let record = (i % 2 == 0).then_some("ghost-worker 7");
        plant_orphan(&nodes[0], key, record).await;
    }
    wait_until(Duration::from_secs(20), "every orphan started", || async {
        keys.iter().all(|k| starts.count(k) >= 1)
    })
    .await
    .unwrap();
    assert_started_after_the_grace(&starts, &keys, planted);
    // Two more graces (many passes of the sweeper): nothing starts again.
    let marks = crate::keys::orphan_marks(&name);
    wait_until(Duration::from_secs(10), "orphan marks cleared", || async {
        let n: u64 = client.hlen(marks.as_str()).await.unwrap();
        n == 0
    })
    .await
    .unwrap();
    tokio::time::sleep(GRACE * 2).await;
    for key in &keys {
        assert_eq!(starts.count(key), 1, "{key} started once");
    }
    assert_eq!(
        sweeper(&client, &name).await.as_deref(),
        Some(holder.as_str())
    );
    for node in nodes {
        node.close().await.unwrap();
    }
}

/// A pending guard past its deadline (server time) is removed by the
/// sweeper, and its job then runs as an orphan after the grace; a live
/// guard stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pending_guard_is_removed_and_its_job_runs() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("sweep-pending");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let starts = Starts::default();
    let node = Node::join(&client, &name, options()).await.unwrap();
    let _worker = Worker::new(&node, starts.clone()).await.unwrap();
    plant_orphan(&node, "stale", None).await;
    let pending = node.inner.store.maps.pending_map();
    pending.set("stale", "5 1000 -/0").await.unwrap();
    pending.set("live", &live_guard(6)).await.unwrap();
    let pending_hash = pending.keys_info().hash.clone();
    wait_until(Duration::from_secs(10), "stale guard removed", || async {
        let exists: bool = client
            .hexists(pending_hash.as_str(), "stale")
            .await
            .unwrap();
        !exists
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(10), "its job started", || async {
        starts.count("stale") == 1
    })
    .await
    .unwrap();
    let live: bool = client.hexists(pending_hash.as_str(), "live").await.unwrap();
    assert!(live, "a guard within its deadline was removed");
    node.close().await.unwrap();
}

/// The sweeper closes: another node takes the lease and requeues an orphan
/// left after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_sweeps_when_the_sweeper_closes() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("sweep-close");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let starts = Starts::default();
    let first = Node::join(&client, &name, options()).await.unwrap();
    let _w1 = Worker::new(&first, starts.clone()).await.unwrap();
    wait_until(Duration::from_secs(5), "the first node sweeps", || async {
        sweeper(&client, &name).await.as_deref() == Some(first.id())
    })
    .await
    .unwrap();
    let second = Node::join(&client, &name, options()).await.unwrap();
    let _w2 = Worker::new(&second, starts.clone()).await.unwrap();
    first.close().await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the second node sweeps",
        || async { sweeper(&client, &name).await.as_deref() == Some(second.id()) },
    )
    .await
    .unwrap();
    plant_orphan(&second, "after-close", None).await;
    wait_until(Duration::from_secs(15), "orphan requeued", || async {
        starts.count("after-close") == 1
    })
    .await
    .unwrap();
    second.close().await.unwrap();
}

/// The sweeper is cut off from Redis (a crash, as the pool sees it): its
/// lease expires, another node takes it within about a TTL and requeues
/// an orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_sweeps_when_the_sweeper_is_cut_off() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("sweep-cut");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let doomed_client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let doomed = Node::join(&doomed_client, &name, options()).await.unwrap();
    wait_until(Duration::from_secs(5), "the doomed node sweeps", || async {
        sweeper(&client, &name).await.as_deref() == Some(doomed.id())
    })
    .await
    .unwrap();
    let starts = Starts::default();
    let survivor = Node::join(&client, &name, options()).await.unwrap();
    let _worker = Worker::new(&survivor, starts.clone()).await.unwrap();
    proxy.cut();
    let cut_at = Instant::now();
    plant_orphan(&survivor, "after-cut", None).await;
    wait_until(Duration::from_secs(10), "the survivor sweeps", || async {
        sweeper(&client, &name).await.as_deref() == Some(survivor.id())
    })
    .await
    .unwrap();
    let took_over = cut_at.elapsed();
    // Lease TTL (1.5 s) plus the follower's poll (cleanup_interval, TTL/4).
    assert!(
        took_over < Duration::from_millis(1500 * 3 / 2 + 1000),
        "takeover after {took_over:?}"
    );
    wait_until(Duration::from_secs(15), "orphan requeued", || async {
        starts.count("after-cut") == 1
    })
    .await
    .unwrap();
    survivor.close().await.unwrap();
    drop(doomed);
}

/// A dead worker's jobs are listed from Redis, not from the cleaner's
/// replica: a job recorded behind the replica's back (as a replica can be
/// stale after a restart) moves with the dead worker's cleanup, long
/// before the orphan sweep's grace would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_job_the_replica_never_saw_is_requeued_by_its_cleanup() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("sweep-hidden");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let starts = Starts::default();
    let options = options().orphan_grace(Duration::from_secs(600));
    let node = Node::join(&client, &name, options).await.unwrap();
    let _worker = Worker::new(&node, starts.clone()).await.unwrap();
    let store = &node.inner.store;
    // A worker that registers and never renews: dead after a TTL.
    store
        .register("ghost", r#"{"node":"n-gone","host":"h","pid":1}"#)
        .await
        .unwrap();
    plant_orphan(&node, "hidden", None).await;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = client
        .hset(jobs_hash.as_str(), ("hidden", "ghost 9"))
        .await
        .unwrap();
    assert!(
        store.maps.jobs_map().get("hidden").is_none(),
        "replica saw it"
    );
    wait_until(Duration::from_secs(10), "the hidden job runs", || async {
        starts.count("hidden") == 1
    })
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the dead worker removed",
        || async { !node.pool_workers().iter().any(|w| w.id == "ghost") },
    )
    .await
    .unwrap();
    assert_eq!(starts.count("hidden"), 1);
    node.close().await.unwrap();
}

/// Many orphans at once (Redis lost its data: every job is one): the
/// sweeper takes its steps one after the other while they find orphans,
/// so a pass over a pool many pages long marks them at once and the
/// requeues follow about one grace later. At one page per interval the
/// 1,000 orphans below, in pages of 50 a second, would take two passes
/// of 20 s (chaos soak seed 1551: 5,000 jobs, pages of 500, TTL 600 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_of_orphans_is_swept_in_quick_steps() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("sweep-mass");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let starts = Starts::default();
    let interval = Duration::from_secs(1);
    let options = options().sweep_interval(interval).sweep_batch(50);
    let node = Node::join(&client, &name, options).await.unwrap();
    let _worker = Worker::new(&node, starts.clone()).await.unwrap();
    let keys: Vec<String> = (0..1000).map(|i| format!("mass-{i}")).collect();
    let planted = Instant::now();
    for key in &keys {
        plant_orphan(&node, key, None).await;
    }
    // The grace, a step to find the marks due, the requeues themselves
    // (1,000 at 32 in flight) and slack for a loaded machine: far below
    // the 40 s of one page per interval.
    let bound = GRACE + interval * 2 + Duration::from_secs(8);
    wait_until(bound, "every orphan started", || async {
        keys.iter().all(|k| starts.count(k) >= 1)
    })
    .await
    .unwrap_or_else(|e| {
        let left = keys.iter().filter(|k| starts.count(k) == 0).count();
        panic!(
            "{e}: {left} of 1000 not started {:?} after",
            planted.elapsed()
        )
    });
    assert_started_after_the_grace(&starts, &keys, planted);
    for key in &keys {
        assert_eq!(starts.count(key), 1, "{key} started once");
    }
    node.close().await.unwrap();
}
