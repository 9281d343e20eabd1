//! A re-assertion after Redis lost its data does not wait for handler
//! starts under way: the worker's other jobs are the only copies until it
//! has re-asserted them, and a crash meanwhile would lose them.

use std::collections::HashSet;
use std::sync::Mutex;

use super::*;

/// Starts of keys beginning with `slow` take `takes` (the first time);
/// others return at once. Records what runs.
#[derive(Clone)]
struct SlowKeys {
    takes: Duration,
    running: Arc<Mutex<HashSet<String>>>,
    slow_once: Arc<Mutex<HashSet<String>>>,
    stops: Arc<AtomicUsize>,
}

impl SlowKeys {
    fn new(takes: Duration) -> SlowKeys {
        SlowKeys {
            takes,
            running: Arc::default(),
            slow_once: Arc::default(),
            stops: Arc::default(),
        }
    }
    fn runs(&self, key: &str) -> bool {
        self.running.lock().unwrap().contains(key)
    }
}

#[async_trait]
impl Handler for SlowKeys {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.running.lock().unwrap().insert(job.key.clone());
        if job.key.starts_with("slow") && self.slow_once.lock().unwrap().insert(job.key.clone()) {
            tokio::time::sleep(self.takes).await;
        }
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.stops.fetch_add(1, Ordering::SeqCst);
        self.running.lock().unwrap().remove(key);
        Ok(())
    }
}

/// Redis loses its data while a handler's `start` takes 20 s: the job
/// that already ran is re-asserted within a few renewals (TTL 3 s), not
/// once that start returns; the start under way is undone and held, and
/// its job runs again once the pool has recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_loss_is_reasserted_without_waiting_for_a_slow_start() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(3))
        .dispatch_timeout(Duration::from_secs(30));
    let name = flotilla_testkit::unique_name("reassert-starts");
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = SlowKeys::new(Duration::from_secs(20));
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("quick", &b"q"[..]).await.unwrap();
    let token = worker.job_token("quick").unwrap();
    let slow = {
        let node = node.clone();
        tokio::spawn(async move { node.dispatch_job("slow", &b"s"[..]).await })
    };
    wait_until(Duration::from_secs(10), "the slow start began", || async {
        handler.runs("slow")
    })
    .await
    .unwrap();
    flushall(&client).await;
    let lost_at = std::time::Instant::now();
    // Read Redis itself: the replica learns of the flush only later.
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let owned = format!("{} {token}", worker.id());
    wait_until(
        Duration::from_secs(6),
        "the running job re-asserted while the slow start is under way",
        || async {
            let owner: Option<String> = client.hget(jobs_hash.as_str(), "quick").await.unwrap();
            owner.as_deref() == Some(owned.as_str())
        },
    )
    .await
    .unwrap();
    assert!(
        lost_at.elapsed() < Duration::from_secs(6),
        "re-asserted {:?} after the loss",
        lost_at.elapsed()
    );
    assert!(handler.runs("quick"));
    // The start under way was undone, and its job is not lost: it runs
    // again (its next start is quick) once the pool has recovered.
    wait_until(
        Duration::from_secs(40),
        "the slow job runs again",
        || async { worker.job_token("slow").is_some() && handler.runs("slow") },
    )
    .await
    .unwrap();
    assert!(
        handler.stops.load(Ordering::SeqCst) >= 1,
        "the slow start was not undone"
    );
    slow.abort();
    node.close().await.unwrap();
}
