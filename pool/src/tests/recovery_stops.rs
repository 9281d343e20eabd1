//! A handler stop the pool has begun ends within the stop budget, whatever
//! the task that began it waits for next. A recovery renewed its node's
//! recovery mark while its workers reconciled, and waiting for that
//! renewal's answer left the reconcile, and the handler stops it had
//! begun, unpolled: a job the reconcile found running elsewhere ran on
//! for 1.35 s after the decision to stop it, because its node was cut off
//! right after and the renewal waited for the link. The node's lease
//! lapsed meanwhile, but the lease-loss stop only stops the jobs a worker
//! still lists, and the job's old owner, told the pool had recovered,
//! started it again (chaos soak seed 1439: `I1 overlap` of 650 ms).

use std::sync::Mutex;
use std::time::Instant;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_a_reassertion_began_ends_within_the_budget_while_its_task_waits() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("recovery-stops");
    // Mirroring: the test names the jobs hash through the replica. A
    // stop budget of half a second.
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(3));
    let budget = options.stop_timeout;
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = HookOnStop::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    let key = "moved-on";
    node.dispatch_job(key, &b"p"[..]).await.unwrap();
    let token = worker.job_token(key).unwrap();

    // The handler's stop: says it began, takes 50 ms, and notes how long
    // it took once it is polled again after that.
    let began = Arc::new(tokio::sync::Notify::new());
    let took: Arc<Mutex<Option<Duration>>> = Arc::default();
    let hook: StopHook = {
        let (began, took) = (began.clone(), took.clone());
        Box::new(move || {
            let (began, took) = (began.clone(), took.clone());
            Box::pin(async move {
                let at = Instant::now();
                began.notify_one();
                tokio::time::sleep(Duration::from_millis(50)).await;
                *took.lock().unwrap() = Some(at.elapsed());
            })
        })
    };
    assert!(handler.hook.set(hook).is_ok());

    // Redis shows the key on another worker with a newer token (a rollback
    // to a state where it had moved on).
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = client
        .hset(&jobs_hash, (key, format!("w-other {}", token + 1)))
        .await
        .unwrap();
    // The re-assertion runs until the handler's stop has begun, then waits
    // unpolled, as a recovery waiting for an answer over a cut link did.
    let reassert = node.inner.reassert_all(&worker.inner);
    tokio::pin!(reassert);
    tokio::select! {
        _ = &mut reassert => panic!("the re-assertion ended without stopping the job"),
        () = began.notified() => {}
    }
    assert!(
        worker.job_token(key).is_none(),
        "the job no longer runs here"
    );
    let ended = wait_until(4 * budget, "the handler's stop ended", || {
        let done = took.lock().unwrap().is_some();
        async move { done }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the handler's 50 ms stop had not ended {:?} after it began (stop budget {budget:?}): \
         it waited for the task that began it",
        4 * budget
    );
    let took = took.lock().unwrap().unwrap();
    assert!(took < budget, "the handler's 50 ms stop took {took:?}");
    reassert.await.unwrap();
    node.close().await.unwrap();
}
