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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_dispatch_outlives_an_older_dispatchs_run_recorded_over_it() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("superseded-dispatch");
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
    // The holder takes no placements: the held dispatch runs on wc in the
    // end, wherever the sweep requeues it.
    let key = key_placed_on(&requester, &wb).await;
    requester.drain_worker(holder.id()).await.unwrap();
    wait_until(Duration::from_secs(5), "the holder drained", || async {
        (0..100).all(|i| requester.placement(&format!("k{i}")).as_deref() != Some(holder.id()))
    })
    .await
    .unwrap();
    assert_eq!(requester.placement(&key).as_deref(), Some(wb.id()));

    // The older dispatch runs on wb, then is handed off to wc with a
    // token from the clock.
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

    // The holder holds, suspended, a newer dispatch admitted in between
    // (after the older one ended) whose admission Redis lost.
    let newer = older + 1_000;
    assert!(
        moved > newer,
        "a token from the clock: {moved} over {newer}"
    );
    let held = crate::worker::LocalJob {
        token: newer,
        admitted: newer,
        payload: bytes::Bytes::from_static(b"new"),
        raw_body: crate::codec::encode(&crate::codec::JobBody {
            key: key.clone(),
            payload: b"new".to_vec(),
            restart: None,
        }),
    };
    holder
        .inner
        .suspended
        .lock()
        .await
        .insert(key.clone(), held);
    holder_node.inner.reconcile(&holder.inner).await.unwrap();
    assert!(!holder.inner.runs_or_holds(&key).await, "given way");

    // The older run stops, the newer dispatch starts on wc, and no
    // dispatch of the key is admitted again meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !second.started().iter().any(|b| b == b"new") {
        match requester.dispatch_job(&key, &b"again"[..]).await {
            Ok(()) => panic!("{key} admitted again over the held dispatch"),
            Err(crate::Error::JobExists(_) | crate::Error::Timeout(_)) => {}
            Err(e) => panic!("unexpected answer: {e}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the held dispatch never ran: wc started {:?}",
            second.started()
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // dispatch pace
    }
    assert_eq!(
        second.stops.load(Ordering::SeqCst),
        1,
        "the old run stopped"
    );
    assert_eq!(
        second.started(),
        [b"old".to_vec(), b"new".to_vec()],
        "the old dispatch stopped, the held one started"
    );
    assert!(!first.started().iter().any(|b| b == b"again"));
    assert!(matches!(
        requester.dispatch_job(&key, &b"again"[..]).await,
        Err(crate::Error::JobExists(_))
    ));
    for node in [requester, holder_node, runner_node] {
        node.close().await.unwrap();
    }
}
