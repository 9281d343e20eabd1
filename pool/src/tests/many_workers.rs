//! A node with several workers acts on all of them together. A close: they
//! all leave the ring before any hands its jobs on, and they retire
//! together. Retired one after the other, the first worker's jobs went to
//! the next worker of the same node, which stopped them again at its own
//! turn (a second move), and the close took one stop per worker. A pool
//! shutdown stops them together too, and a lease that comes back resumes
//! every worker's jobs together.

use std::collections::HashMap;
use std::sync::Mutex;

use super::gathering::Gathering;
use super::*;

/// A handler shared by the workers of the closing node: records every
/// start, and each stop waits until `together` stops are under way at
/// once (or `give_up` has passed).
#[derive(Clone)]
struct GatheringStops {
    gathering: Gathering,
    starts: Arc<Mutex<HashMap<String, usize>>>,
}

impl GatheringStops {
    fn new(together: usize, give_up: Duration) -> GatheringStops {
        GatheringStops {
            gathering: Gathering::new(together, give_up),
            starts: Arc::default(),
        }
    }

    fn starts_of(&self, key: &str) -> usize {
        self.starts.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

#[async_trait]
impl Handler for GatheringStops {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        *self.starts.lock().unwrap().entry(job.key).or_default() += 1;
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        self.gathering.gather().await;
        Ok(())
    }
}

/// Node `a` has four workers with two jobs each, node `b` one worker. When
/// `a` closes, its eight stops are under way at once, and each job moves
/// once, to `b`'s worker: none starts on another worker of `a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_node_retires_its_workers_together() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("close-workers");
    let options = NodeOptions::default().dispatch_timeout(Duration::from_secs(8));
    let client_a = flotilla_testkit::client(&server.url()).await.unwrap();
    let client_b = flotilla_testkit::client(&server.url()).await.unwrap();
    let a = Node::join(&client_a, &name, options.clone()).await.unwrap();
    let b = Node::join(&client_b, &name, options).await.unwrap();
    const PER_WORKER: usize = 2;
    const A_WORKERS: usize = 4;
    let handler_a = GatheringStops::new(PER_WORKER * A_WORKERS, Duration::from_secs(3));
    let mut workers_a = Vec::new();
    for _ in 0..A_WORKERS {
        workers_a.push(Worker::new(&a, handler_a.clone()).await.unwrap());
    }
    let handler_b = Counting::default();
    let worker_b = Worker::new(&b, handler_b.clone()).await.unwrap();
    // Two keys placed on each of `a`'s workers, once `b`'s ring holds all five.
    key_placed_on(&b, &worker_b).await;
    let mut keys = Vec::new();
    for worker in &workers_a {
        let placed: Vec<String> = (0..1000)
            .map(|i| format!("w{i}"))
            .filter(|k| b.placement(k).as_deref() == Some(worker.id()))
            .take(PER_WORKER)
            .collect();
        assert_eq!(placed.len(), PER_WORKER, "keys placed on {}", worker.id());
        keys.extend(placed);
    }
    for key in &keys {
        b.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    wait_until(Duration::from_secs(20), "every job runs on a", || async {
        workers_a.iter().map(|w| w.job_keys().len()).sum::<usize>() == keys.len()
    })
    .await
    .unwrap();

    a.close().await.unwrap();

    assert_eq!(
        handler_a.gathering.most(),
        keys.len(),
        "stops under way at once while a closed"
    );
    wait_until(Duration::from_secs(20), "every job runs on b", || async {
        let running = worker_b.job_keys();
        keys.iter().all(|k| running.contains(k))
    })
    .await
    .unwrap();
    for key in &keys {
        assert_eq!(
            handler_a.starts_of(key),
            1,
            "starts of {key} on a's workers: moved to another worker of the closing node"
        );
    }
    assert_eq!(handler_b.starts.load(Ordering::SeqCst), keys.len());
    drop(workers_a);
    b.close().await.unwrap();
}

/// A pool shutdown stops the jobs of every worker of a node together: the
/// eight stops of four workers are under way at once, and none of the
/// jobs starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_shutdown_stops_every_worker_of_a_node_together() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("shutdown-workers");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let node = Node::join(&client, &name, NodeOptions::default())
        .await
        .unwrap();
    const WORKERS: usize = 4;
    const JOBS: usize = 8;
    let handler = GatheringStops::new(JOBS, Duration::from_secs(3));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(Worker::new(&node, handler.clone()).await.unwrap());
    }
    let keys: Vec<String> = (0..JOBS).map(|i| format!("s{i}")).collect();
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    node.shutdown().await.unwrap();
    assert_eq!(
        handler.gathering.most(),
        JOBS,
        "stops under way at once during the shutdown"
    );
    for key in &keys {
        assert_eq!(handler.starts_of(key), 1, "starts of {key}");
    }
    drop(workers);
}

/// Starts that each wait until `together` starts are under way at once (or
/// `give_up` has passed), from when `gather` is set.
#[derive(Clone)]
struct GatheringRestarts {
    gathering: Gathering,
    gather: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl Handler for GatheringRestarts {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        if self.gather.load(Ordering::SeqCst) {
            self.gathering.gather().await;
        }
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A lease lapse stops the jobs of a node's four workers; when the lease
/// comes back, the restarts of all four workers are under way at once.
/// Resumed one worker after the other, each worker's jobs waited for every
/// slow start of the workers before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_comes_back_resumes_every_worker_together() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("resume-workers");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(3));
    let node = Node::join(&client, &name, options).await.unwrap();
    const WORKERS: usize = 4;
    let handler = GatheringRestarts {
        gathering: Gathering::new(WORKERS, Duration::from_secs(3)),
        gather: Arc::default(),
    };
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(Worker::new(&node, handler.clone()).await.unwrap());
    }
    // One key placed on each worker.
    let mut keys = Vec::new();
    for worker in &workers {
        keys.push(key_placed_on(&node, worker).await);
    }
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    let running = || workers.iter().map(|w| w.job_keys().len()).sum::<usize>();
    assert_eq!(running(), WORKERS);
    handler.gather.store(true, Ordering::SeqCst);
    node.inner.lose_lease(tokio::time::Instant::now()).await;
    assert_eq!(running(), 0, "the lapse stopped every job");
    wait_until(
        Duration::from_secs(30),
        "every job runs again after the lease came back",
        || async { running() == WORKERS },
    )
    .await
    .unwrap();
    assert_eq!(
        handler.gathering.most(),
        WORKERS,
        "restarts under way at once when the lease came back"
    );
    drop(workers);
    node.close().await.unwrap();
}
