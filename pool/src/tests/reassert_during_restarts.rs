//! A re-assertion after Redis lost its data does not wait for the restarts
//! of failed runs, or the records of runs' ends, queued for their key's
//! stripe while holding the worker's `ops` lock. Chaos soak seed 1449
//! (`--lifecycle`, two lanes per worker): Redis restarted empty while a
//! worker handed jobs on; its re-registration waited for `ops` behind
//! restarts that came due, each queued for one of the two stripes, and
//! through one Redis call after another; the process was killed 360 ms
//! after the loss, before it re-asserted, and the job it had just been
//! handed ran nowhere again.

use super::resume::{Failing, failed_job_due};
use super::*;

/// How long a re-assertion may wait for the worker's `ops` lock here:
/// nothing holds it but operations that give way.
const PROMPTLY: Duration = Duration::from_secs(1);

/// Waits until something holds `worker`'s `ops` lock (shared).
async fn ops_held(worker: &Worker) {
    wait_until(Duration::from_secs(5), "an operation holds ops", || {
        let held = worker.inner.ops.try_write().is_err();
        async move { held }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_assertion_does_not_wait_for_a_restart_queued_for_its_stripe() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .worker_lanes(1)
        .worker_ttl(Duration::from_secs(3));
    let (node, worker, handler, token) =
        failed_job_due(&client, "restart-gives-way", options).await;
    let inner = worker.inner.clone();
    let starts = handler.starts.load(Ordering::SeqCst);
    // The key's stripe is busy (a lane's handler stop, say) when the
    // restart comes due: it takes `ops` and queues for the stripe.
    let stripe = inner.lock_key("k").await;
    let restart = tokio::spawn(inner.clone().restart("k".to_string(), token));
    ops_held(&worker).await;
    let reassertion = tokio::time::timeout(PROMPTLY, inner.lock_for_reassertion()).await;
    assert!(
        matches!(reassertion, Ok(Some(_))),
        "the re-assertion waited for a restart queued for its stripe"
    );
    drop(reassertion);
    drop(stripe);
    restart.await.unwrap();
    // The restart gave way and is tried again.
    wait_until(Duration::from_secs(10), "the job restarted", || {
        let restarted = handler.starts.load(Ordering::SeqCst) > starts;
        async move { restarted }
    })
    .await
    .unwrap();
    assert!(worker.job_token("k").is_some_and(|t| t > token));
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_assertion_does_not_wait_for_a_run_s_end_queued_for_its_stripe() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_lanes(1)
        .worker_ttl(Duration::from_secs(3))
        .restart_policy(
            crate::RestartPolicy::default()
                .first_delay(Duration::from_secs(3600))
                .max_delay(Duration::from_secs(3600)),
        );
    let name = flotilla_testkit::unique_name("end-gives-way");
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Failing::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let inner = worker.inner.clone();
    // The run fails while its key's stripe is busy: the record of its end
    // takes `ops` and queues for the stripe.
    let stripe = inner.lock_key("k").await;
    let outcome = handler.outcome.lock().unwrap().take().unwrap();
    outcome.failed("boom");
    ops_held(&worker).await;
    let reassertion = tokio::time::timeout(PROMPTLY, inner.lock_for_reassertion()).await;
    assert!(
        matches!(reassertion, Ok(Some(_))),
        "the re-assertion waited for a run's end queued for its stripe"
    );
    drop(reassertion);
    drop(stripe);
    // The end gave way and is recorded later: the restart is due.
    wait_until(Duration::from_secs(10), "the failure is recorded", || {
        let waiting = worker.inner.lifecycle.restarting() == 1;
        async move { waiting }
    })
    .await
    .unwrap();
    node.close().await.unwrap();
}
