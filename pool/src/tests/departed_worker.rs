//! A rollback brings back a worker that left: its registration and its
//! last renewal, a moment old, are in Redis again, and it is in every
//! node's ring until a cleanup finds it silent. The jobs that hash to it
//! stay where they run. A rebalance that handed them to it stopped them for
//! a worker that never reads its inbox: they ran nowhere until the cleanup,
//! and with losses every few seconds longer still (chaos soak seed 804).

use super::*;
use flotilla_testkit::ServerOptions;
use std::time::Instant;

/// The workers map's hash of pool `name`.
fn workers_hash(name: &str) -> String {
    flotilla_rmap::MapKeys::new(crate::keys::WORKERS_MAP, Some(name))
        .unwrap()
        .hash
}

/// Waits until `worker`, which left, is back in `node`'s ring after a
/// rollback.
async fn back_in_ring(node: &Node, worker: &str) {
    wait_until(
        Duration::from_secs(5),
        "the departed worker is back in the ring",
        || {
            let back = node.inner.ring.load().contains(worker);
            async move { back }
        },
    )
    .await
    .unwrap();
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
    back_in_ring(&a, &departed).await;
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

/// A close while the pool recovers from a rollback that brought back a
/// worker that left (chaos soak seed 1002: a process's close ran past the
/// harness's 15 s and no job moved in the whole pool meanwhile). Three
/// faults, each enough to stall the close:
/// * a job the departed worker refused (it does not read its inbox) was
///   offered to that same worker again and again, for 12 s; it now goes
///   to the next worker in the ring that reads its inbox;
/// * the node's recovery waited for the closing worker's lock, which the
///   close holds until it is done, and the node's recovery mark held the
///   pool's recovery window open meanwhile, and with it the cleanup that
///   takes the departed worker out of the ring (and the close waited for
///   that window to end): the recovery now leaves a closing worker to its
///   close;
/// * the closing worker's renewals cleared its own "closing" claim, which
///   put it back in every ring, and another node handed it jobs it never
///   read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_during_a_recovery_hands_jobs_past_a_worker_that_left() {
    const JOBS: usize = 24;
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let name = flotilla_testkit::unique_name("departed-close");
    let ttl = Duration::from_secs(4);
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_secs(2));
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        let node = Node::join(&client, &name, options.clone()).await.unwrap();
        workers.push(Worker::new(&node, Counting::default()).await.unwrap());
        nodes.push(node);
    }
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let (wa, wb) = (&workers[0], &workers[1]);
    let departed = workers[2].id().to_string();
    wait_until(Duration::from_secs(5), "three workers in b's ring", || {
        let all = workers.iter().all(|w| b.inner.ring.load().contains(w.id()));
        async move { all }
    })
    .await
    .unwrap();
    for i in 0..JOBS {
        a.dispatch_job(&format!("k{i}"), &b"p"[..]).await.unwrap();
    }
    wait_until(Duration::from_secs(10), "every job runs", || async {
        workers.iter().map(|w| w.job_keys().len()).sum::<usize>() == JOBS
    })
    .await
    .unwrap();

    // Redis goes back to a moment when c's worker was registered; c then
    // leaves, its jobs moving to a and b.
    let snapshot = server.save_snapshot().unwrap();
    c.close().await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "every job runs on a or b",
        || async { wa.job_keys().len() + wb.job_keys().len() == JOBS },
    )
    .await
    .unwrap();
    server.roll_back(&snapshot).unwrap();
    back_in_ring(b, &departed).await;
    let ring = b.inner.ring.load_full();
    let passed_to_departed = wb
        .job_keys()
        .into_iter()
        .filter(|key| ring.owner_excluding(key, wb.id()) == Some(departed.as_str()))
        .count();
    assert!(
        passed_to_departed > 0,
        "none of b's jobs would go to the departed worker: the test shows nothing"
    );

    // b closes while the pool recovers. The departed worker stays in the
    // ring until a cleanup, which waits for the recovery window (a TTL from
    // the rollback, and as long as a node's recovery goes on); b's close
    // waits at most that long for it to come back before leaving what b
    // remembers with a's worker.
    let closing = {
        let b = b.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            b.close().await.map(|()| started.elapsed())
        })
    };
    // The close holds b's worker from here on (it cancels the worker once
    // it holds its lock), and b's node notices the rollback again only
    // now, as a node whose close began as Redis went back does: it
    // recovers, and its recovery mark holds the window open until done.
    wait_until(Duration::from_secs(5), "b's close holds its worker", || {
        let held = wb.inner.cancel.is_cancelled();
        async move { held }
    })
    .await
    .unwrap();
    b.inner.server_restarts.send_modify(|n| *n += 1);
    let took = closing.await.unwrap().unwrap();
    assert!(
        took < 2 * ttl,
        "b's close took {took:?}, past the recovery window: {passed_to_departed} of its jobs \
         were offered to the worker that left"
    );
    // Every job b ran went to a's worker during the close: none waits for
    // an orphan sweep (as one handed back to b's leaving worker would).
    wait_until(ttl, "every job runs on a", || async {
        wa.job_keys().len() == JOBS
    })
    .await
    .unwrap();
    a.close().await.unwrap();
}

/// A renewal made while a worker closes finds it unknown to Redis once
/// the close removed its registration: it must not register it again (a
/// worker in every ring that no process reads for, until a cleanup finds
/// it silent), nor wait for the lock the close holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_worker_is_not_registered_again() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("departed-worker");
    let (node, worker, _) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let id = worker.id().to_string();
    // What a close does first (takes the worker's lock, cancels the
    // worker) and last (removes its registration), with the renewal's
    // re-registration in between.
    let _close_holds = worker.inner.ops.write().await;
    worker.inner.cancel.cancel();
    let _: i64 = client.hdel(workers_hash(&name), &id).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), node.inner.reregister(&id))
        .await
        .expect("the renewal does not wait for a closing worker")
        .unwrap();
    let registered: Option<String> = client.hget(workers_hash(&name), &id).await.unwrap();
    assert_eq!(registered, None, "a closing worker was registered again");
}
