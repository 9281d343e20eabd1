//! A rollback brings back a worker that left: its registration and its
//! last renewal, a moment old, are in Redis again, and it is in every
//! node's ring until a cleanup finds it silent. The jobs that hash to it
//! stay where they run. A rebalance that handed them to it stopped them for
//! a worker that never reads its inbox: they ran nowhere until the cleanup,
//! and with losses every few seconds longer still (chaos soak seed 804).

use super::*;
use flotilla_testkit::ServerOptions;

/// The workers map's hash of pool `name`.
fn workers_hash(name: &str) -> String {
    flotilla_rmap::MapKeys::new(crate::keys::WORKERS_MAP, Some(name))
        .unwrap()
        .hash
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_a_rollback_brought_back_is_handed_no_job() {
    const JOBS: usize = 24;
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let name = flotilla_testkit::unique_name("departed-worker");
    let ttl = Duration::from_secs(3);
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_secs(2));
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let a = Node::join(&client, &name, options.clone()).await.unwrap();
    let stays = Counting::default();
    let wa = Worker::new(&a, stays.clone()).await.unwrap();
    let b_client = flotilla_testkit::client(&server.url()).await.unwrap();
    let b = Node::join(&b_client, &name, options).await.unwrap();
    let leaves = Counting::default();
    let wb = Worker::new(&b, leaves.clone()).await.unwrap();
    let departed = wb.id().to_string();
    wait_until(Duration::from_secs(5), "both workers in a's ring", || {
        let ring = a.inner.ring.load();
        let both = ring.contains(wa.id()) && ring.contains(&departed);
        async move { both }
    })
    .await
    .unwrap();
    for i in 0..JOBS {
        a.dispatch_job(&format!("k{i}"), &b"p"[..]).await.unwrap();
    }
    wait_until(Duration::from_secs(10), "every job runs", || async {
        stays.starts.load(Ordering::SeqCst) + leaves.starts.load(Ordering::SeqCst) == JOBS
    })
    .await
    .unwrap();
    assert!(leaves.starts.load(Ordering::SeqCst) > 0, "b runs some jobs");

    // Redis goes back to a moment when b's worker was registered; b then
    // leaves, its jobs moving to a's worker.
    let snapshot = server.save_snapshot().unwrap();
    b.close().await.unwrap();
    wait_until(Duration::from_secs(10), "every job runs on a", || async {
        wa.job_keys().len() == JOBS
    })
    .await
    .unwrap();
    let stops_before = stays.stops.load(Ordering::SeqCst);
    server.roll_back(&snapshot).unwrap();

    // b's worker is back in Redis, and in a's ring, until a cleanup finds
    // it silent for a TTL and removes it.
    let workers = workers_hash(&name);
    wait_until(
        Duration::from_secs(5),
        "the departed worker is back in a's ring",
        || {
            let back = a.inner.ring.load().contains(&departed);
            async move { back }
        },
    )
    .await
    .unwrap();
    wait_until(4 * ttl, "the departed worker is cleaned up", || {
        let (client, workers, departed) = (client.clone(), workers.clone(), departed.clone());
        async move {
            let there: Result<bool, _> = client.hexists(&workers, &departed).await;
            there.is_ok_and(|there| !there)
        }
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(10), "every job runs on a", || async {
        wa.job_keys().len() == JOBS
    })
    .await
    .unwrap();
    assert_eq!(
        stays.stops.load(Ordering::SeqCst),
        stops_before,
        "a job was stopped on a's worker after the rollback, to go to a worker that left"
    );
    a.close().await.unwrap();
}
