//! A re-assertion after Redis lost its data does not wait for a rebalance's
//! hand-offs queued behind each other (chaos soak seed 1422: a process
//! joined, a worker began handing 30 jobs on, its hand-offs waiting in turn
//! for their keys' locks through handler stops; Redis restarted empty
//! 30 ms later, and the worker's re-assertion, which waits for every
//! hand-off holding its `ops` lock, came 650 ms after, too late: the
//! process was killed 700 ms after the loss and 29 jobs it had not
//! re-asserted ran nowhere again).

use super::*;

/// Stops take `takes` each; starts return at once.
#[derive(Clone)]
struct SlowStops {
    takes: Duration,
    stops: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for SlowStops {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        self.stops.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.takes).await;
        Ok(())
    }
}

/// One lane (one key lock) per worker: a rebalance's hand-offs stop their
/// jobs one after the other, 400 ms each. Redis loses its data as the
/// first stop begins, and the other worker registers again before this
/// one (the ring names it alone). Until the worker re-asserts its jobs it
/// holds their only copy: that is within a renewal or two (TTL 3 s), not
/// after the 20 or so queued hand-offs (8 s), and every job still runs
/// once the pool settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_loss_is_reasserted_without_waiting_for_queued_hand_offs() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(3))
        .worker_lanes(1)
        .dispatch_timeout(Duration::from_secs(30));
    let name = flotilla_testkit::unique_name("reassert-handoffs");
    let a = Node::join(&client, &name, options.clone()).await.unwrap();
    let handler = SlowStops {
        takes: Duration::from_millis(400),
        stops: Arc::default(),
    };
    let wa = Worker::new(&a, handler.clone()).await.unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i:02}")).collect();
    for key in &keys {
        a.dispatch_job(key, &b"p"[..]).await.unwrap();
    }

    // A second worker joins: about half the jobs are to move to it, one
    // stop at a time.
    let b = Node::join(&client, &name, options).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the first hand-off's stop began",
        || async { handler.stops.load(Ordering::SeqCst) >= 1 },
    )
    .await
    .unwrap();
    flushall(&client).await;
    let lost_at = std::time::Instant::now();
    // The other worker registers again first (its renewal came first): the
    // ring names it alone, and the queued hand-offs go on to it.
    b.inner.reregister(wb.id()).await.unwrap();

    // Read Redis itself: the replica learns of the flush only later.
    let jobs_hash = a.inner.store.maps.jobs_map().keys_info().hash.clone();
    // (running, of which without their record): until the worker has
    // re-asserted its jobs, it holds their only copy.
    let asserted = || async {
        let (mut running, mut alone) = (0, 0);
        for key in &keys {
            let Some(token) = wa.job_token(key) else {
                continue;
            };
            running += 1;
            let owner: Option<String> = client.hget(jobs_hash.as_str(), key).await.unwrap();
            if owner != Some(format!("{} {token}", wa.id())) {
                alone += 1;
            }
        }
        (running, alone)
    };
    // The jobs that stay are re-asserted while they run: the renewals go
    // on (a renewal that waited for the re-assertion, itself waiting for
    // the hand-offs, let the lease lapse and stopped them all).
    wait_until(
        Duration::from_secs(4),
        "the jobs the worker keeps are re-asserted while they run",
        || async {
            let (running, alone) = asserted().await;
            running >= 10 && alone == 0
        },
    )
    .await
    .unwrap();
    let took = lost_at.elapsed();
    let stops = handler.stops.load(Ordering::SeqCst);
    assert!(
        stops < 10,
        "re-asserted {took:?} after the loss, after {stops} stops"
    );

    // No job is lost: each runs on one of the two workers.
    wait_until(Duration::from_secs(40), "every job runs", || async {
        keys.iter()
            .all(|k| wa.job_token(k).is_some() || wb.job_token(k).is_some())
    })
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
