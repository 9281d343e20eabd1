//! A worker holds a run of a dispatch whose admission Redis lost, and Redis
//! records a run of an *older* dispatch of the same key over it, with a
//! newer token: the state Redis went back to showed that dispatch (over
//! before the held one was admitted), and a cleanup moved it on (chaos
//! soak `chaos_short_scheduled_jobs` seed 45, `sched-19`: a finished
//! dispatch's run moved while the holder was cut off). The holder's
//! re-assertion stops the older run through its worker, and the held
//! dispatch takes its place in Redis as that run ends: the key is never
//! unknown to Redis in between, so no dispatch of it is admitted again, and
//! the held dispatch runs again (the orphan sweep requeues it).

use std::sync::Mutex;

use super::*;

/// Records the payload of every start.
#[derive(Clone, Default)]
struct Bodies {
    started: Arc<Mutex<Vec<Vec<u8>>>>,
    stops: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for Bodies {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.started
            .lock()
            .expect("not poisoned")
            .push(job.payload.to_vec());
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        self.stops.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl Bodies {
    fn started(&self) -> Vec<Vec<u8>> {
        self.started.lock().expect("not poisoned").clone()
    }
}

/// Three nodes: a dispatcher, a holder (drained: it takes no
/// placements) and a runner with two workers, where the older dispatch
/// of a key ran on the first and was handed off to the second with a token
/// from the clock.
struct Setup {
    requester: Node,
    holder_node: Node,
    runner_node: Node,
    holder: Worker,
    first: Bodies,
    second: Bodies,
    key: String,
    /// The older dispatch's admission stamp.
    older: u64,
    /// Its run's token on the second worker.
    moved: u64,
}

async fn older_dispatch_moved(server: &RedisServer, name: &str) -> Setup {
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name(name);
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_millis(300));
    let requester = Node::join(&client, &name, options.clone()).await.unwrap();
    let holder_node = Node::join(&client, &name, options.clone()).await.unwrap();
    let runner_node = Node::join(&client, &name, options).await.unwrap();
    let holder = Worker::new(&holder_node, Bodies::default()).await.unwrap();
    let (first, second) = (Bodies::default(), Bodies::default());
    let wb = Worker::new(&runner_node, first.clone()).await.unwrap();
    let wc = Worker::new(&runner_node, second.clone()).await.unwrap();
    wait_until(Duration::from_secs(5), "three workers seen", || async {
        requester.pool_workers().len() == 3
    })
    .await
    .unwrap();
    let key = key_placed_on(&requester, &wb).await;
    requester.drain_worker(holder.id()).await.unwrap();
    wait_until(Duration::from_secs(5), "the holder drained", || async {
        (0..100).all(|i| requester.placement(&format!("k{i}")).as_deref() != Some(holder.id()))
    })
    .await
    .unwrap();
    assert_eq!(requester.placement(&key).as_deref(), Some(wb.id()));

    requester.dispatch_job(&key, &b"old"[..]).await.unwrap();
    wait_until(
        Duration::from_secs(5),
        "the old dispatch runs on wb",
        || async { wb.job_token(&key).is_some() },
    )
    .await
    .unwrap();
    let stored = requester.inner.store.payload(&key).await.unwrap().unwrap();
    let older: u64 = std::str::from_utf8(stored.split(|b| *b == b' ').next().unwrap())
        .unwrap()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    requester.drain_worker(wb.id()).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the old dispatch runs on wc",
        || async { wc.job_token(&key).is_some() },
    )
    .await
    .unwrap();
    let moved = wc.job_token(&key).unwrap();
    assert_eq!(second.started(), [b"old".to_vec()]);
    Setup {
        requester,
        holder_node,
        runner_node,
        holder,
        first,
        second,
        key,
        older,
        moved,
    }
}

/// A run of a dispatch of `key` admitted at `stamp` (µs) with token
/// `stamp`, payload "new": newer than the older dispatch of a [`Setup`].
fn newer_dispatch(key: &str, stamp: u64) -> crate::worker::LocalJob {
    crate::worker::LocalJob {
        token: stamp,
        admitted: stamp,
        payload: bytes::Bytes::from_static(b"new"),
        raw_body: crate::codec::encode(&crate::codec::JobBody {
            key: key.to_string(),
            payload: b"new".to_vec(),
            restart: None,
        }),
    }
}

impl Setup {
    async fn close(self) {
        for node in [self.requester, self.holder_node, self.runner_node] {
            node.close().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_dispatch_outlives_an_older_dispatchs_run_recorded_over_it() {
    let server = RedisServer::start().unwrap();
    let s = older_dispatch_moved(&server, "superseded-dispatch").await;
    let (requester, key) = (&s.requester, &s.key);

    // The holder holds, suspended, a newer dispatch admitted in between
    // (after the older one ended) whose admission Redis lost.
    let newer = s.older + 1_000;
    assert!(
        s.moved > newer,
        "a token from the clock: {} over {newer}",
        s.moved
    );
    let held = newer_dispatch(key, newer);
    s.holder
        .inner
        .suspended
        .lock()
        .await
        .insert(key.clone(), held);
    s.holder_node
        .inner
        .reconcile(&s.holder.inner)
        .await
        .unwrap();
    assert!(!s.holder.inner.runs_or_holds(key).await, "given way");

    // The older run stops, the newer dispatch starts on wc, and no
    // dispatch of the key is admitted again meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !s.second.started().iter().any(|b| b == b"new") {
        match requester.dispatch_job(key, &b"again"[..]).await {
            Ok(()) => panic!("{key} admitted again over the held dispatch"),
            Err(crate::Error::JobExists(_) | crate::Error::Timeout(_)) => {}
            Err(e) => panic!("unexpected answer: {e}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the held dispatch never ran: wc started {:?}",
            s.second.started()
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // dispatch pace
    }
    assert_eq!(
        s.second.stops.load(Ordering::SeqCst),
        1,
        "the old run stopped"
    );
    assert_eq!(
        s.second.started(),
        [b"old".to_vec(), b"new".to_vec()],
        "the old dispatch stopped, the held one started"
    );
    assert!(!s.first.started().iter().any(|b| b == b"again"));
    assert!(matches!(
        requester.dispatch_job(key, &b"again"[..]).await,
        Err(crate::Error::JobExists(_))
    ));
    s.close().await;
}

/// A worker that ended a dispatch (finished, failed for good, stopped on
/// request) finds, making that end stand again, a newer run of the same
/// dispatch on a live worker (Redis went back to before the end, and a
/// cleanup moved the run on): the dispatch is marked over, and the
/// worker's node stops that run through its worker, as a node does for a
/// stop it asked for. Marked over alone, the ended dispatch ran on there
/// until a hand-off or a cleanup moved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_ended_here_and_running_again_elsewhere_is_stopped() {
    let server = RedisServer::start().unwrap();
    let s = older_dispatch_moved(&server, "ended-runs-again").await;
    let key = &s.key;
    // The holder finished the dispatch under an older token of it.
    s.holder
        .inner
        .stopped
        .record_dispatch(key, s.older + 10, s.older);
    s.holder_node
        .inner
        .stops_stand(&s.holder.inner, &std::collections::HashSet::new())
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the ended dispatch stopped",
        || async { s.second.stops.load(Ordering::SeqCst) == 1 },
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(5), "nothing of it left", || async {
        s.requester.inner.store.payload(key).await.ok() == Some(None)
    })
    .await
    .unwrap();
    assert_eq!(s.second.started(), [b"old".to_vec()], "not started again");
    s.close().await;
}

/// A worker that leaves (its node stays) gives back what it remembers
/// passing on where Redis lost it (`custody.rs`): a newer dispatch handed
/// on, whose hand-off Redis lost, over which Redis now records a run of an
/// older dispatch with a newer token. The give-back marks that dispatch
/// over and leaves the newer one waiting for its end; the node stops the
/// older run through its worker, as a re-assertion does. Marked over
/// alone, the older run went on until a move, and the newer dispatch
/// waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_workers_give_back_stops_an_older_dispatchs_run_in_its_way() {
    let server = RedisServer::start().unwrap();
    let s = older_dispatch_moved(&server, "superseded-leave").await;
    let key = &s.key;
    let newer = s.older + 1_000;
    let handed = newer_dispatch(key, newer);
    s.holder
        .inner
        .handed_off
        .record(crate::handoffs::HandedOff::of(key, newer, &handed));
    s.holder_node.remove_worker(&s.holder).await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the older run stopped and the newer dispatch started",
        || async { s.second.started().iter().any(|b| b == b"new") },
    )
    .await
    .unwrap();
    assert_eq!(
        s.second.stops.load(Ordering::SeqCst),
        1,
        "the old run stopped"
    );
    assert_eq!(s.second.started(), [b"old".to_vec(), b"new".to_vec()]);
    s.close().await;
}
