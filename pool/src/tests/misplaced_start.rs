//! A job whose start was under way when the ring changed: the rebalance
//! pass the change brings looks at the jobs that run, not at a start not
//! finished yet, so the job ends up running on a worker the ring no longer
//! names, and no later change of the ring may come to move it (the
//! partition test, under load: nine keys ran for 20 s away from their ring
//! owner). A job that starts away from its ring owner brings another pass.

use super::*;
use crate::lanes::lane_of;

/// Starts of one key that wait at a gate until the test opens it; other
/// keys start at once.
#[derive(Clone)]
struct GatedStart {
    gated: Arc<std::sync::Mutex<String>>,
    entered: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl Handler for GatedStart {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        if job.key != *self.gated.lock().unwrap() {
            return Ok(());
        }
        self.entered.fetch_add(1, Ordering::SeqCst);
        let permit = self.gate.acquire().await.expect("the gate stays open");
        permit.forget();
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_started_while_its_owner_joined_the_ring_moves_to_it() {
    let server = RedisServer::start().unwrap();
    let handler = GatedStart {
        gated: Arc::default(),
        entered: Arc::default(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let name = flotilla_testkit::unique_name("misplaced-start");
    let (_client, a, b, wa, wb) = two_nodes_with(&server, &name, handler.clone()).await;
    key_placed_on(&a, &wb).await; // the ring is complete
    let on_wb: Vec<String> = (0..200)
        .map(|i| format!("k{i}"))
        .filter(|k| a.placement(k).as_deref() == Some(wb.id()))
        .collect();
    // `moved`: started at once, moved by the pass the ring change brings;
    // `gated`: its start is under way during that pass. In different
    // lanes: a start holds its lane's key lock, which a hand-off of a key
    // in that lane waits for.
    let lanes = wa.inner.key_locks.len();
    let moved = on_wb[0].clone();
    let gated = on_wb
        .iter()
        .find(|k| lane_of(k, lanes) != lane_of(&moved, lanes))
        .expect("a key in another lane")
        .clone();
    *handler.gated.lock().unwrap() = gated.clone();
    // Out of the ring: both keys go to wa.
    assert!(b.drain_worker(wb.id()).await.unwrap());
    wait_until(Duration::from_secs(5), "a places both keys on wa", || {
        let on_a = [&moved, &gated]
            .iter()
            .all(|k| a.placement(k).as_deref() == Some(wa.id()));
        async move { on_a }
    })
    .await
    .unwrap();
    a.dispatch_job(&moved, &b"p"[..]).await.unwrap();
    assert!(wa.job_token(&moved).is_some());
    let dispatch = tokio::spawn({
        let (a, gated) = (a.clone(), gated.clone());
        async move { a.dispatch_job(&gated, &b"p"[..]).await }
    });
    wait_until(Duration::from_secs(5), "wa's start is under way", || {
        let entered = handler.entered.load(Ordering::SeqCst) == 1;
        async move { entered }
    })
    .await
    .unwrap();
    // Back in the ring while the start is under way: the pass the change
    // brings moves the job that runs, and cannot see the other.
    assert!(b.undrain_worker(wb.id()).await.unwrap());
    wait_until(
        Duration::from_secs(10),
        "the pass moved the running job",
        || async { wb.job_token(&moved).is_some() },
    )
    .await
    .unwrap();
    handler.gate.add_permits(1);
    dispatch.await.unwrap().unwrap();
    wait_until(
        Duration::from_secs(15),
        "the job whose start was under way runs on its ring owner, wb, alone",
        || async { wb.job_token(&gated).is_some() && wa.job_token(&gated).is_none() },
    )
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
