//! How many keys a worker handles at once: one per lane
//! (`NodeOptions::worker_lanes`), the events of one key in order.

use super::gathering::Gathering;
use super::*;
use crate::lanes::lane_of;

/// Starts that each wait until `together` starts are under way at once (or
/// `give_up` has passed); counts those that returned.
#[derive(Clone)]
struct GatheringStarts {
    gathering: Gathering,
    started: Arc<AtomicUsize>,
}

impl GatheringStarts {
    fn new(together: usize, give_up: Duration) -> GatheringStarts {
        GatheringStarts {
            gathering: Gathering::new(together, give_up),
            started: Arc::default(),
        }
    }
}

#[async_trait]
impl Handler for GatheringStarts {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        self.gathering.gather().await;
        self.started.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// `count` keys that fall in `count` different lanes of `lanes`.
fn keys_in_distinct_lanes(count: usize, lanes: usize) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    (0..)
        .map(|i| format!("lane-key-{i}"))
        .filter(|key| taken.insert(lane_of(key, lanes)))
        .take(count)
        .collect()
}

async fn node_with_lanes(
    server: &RedisServer,
    lanes: usize,
    handler: GatheringStarts,
) -> (Node, Worker) {
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .worker_lanes(lanes)
        .dispatch_timeout(Duration::from_secs(20));
    let name = flotilla_testkit::unique_name("lanes");
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, handler).await.unwrap();
    (node, worker)
}

/// With enough lanes, slow starts of many keys run side by side: 48 starts
/// that each wait for the other 47 all return, together, well before any
/// of them gives up.
#[tokio::test]
async fn slow_starts_of_keys_in_different_lanes_run_at_once() {
    let server = RedisServer::start().unwrap();
    let keys = keys_in_distinct_lanes(48, 64);
    let handler = GatheringStarts::new(keys.len(), Duration::from_secs(15));
    let (node, _worker) = node_with_lanes(&server, 64, handler.clone()).await;
    let began = std::time::Instant::now();
    let dispatches = keys.iter().map(|key| node.dispatch_job(key, &b""[..]));
    for result in futures::future::join_all(dispatches).await {
        result.unwrap();
    }
    assert_eq!(
        handler.gathering.most(),
        keys.len(),
        "starts under way at once"
    );
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "48 gathered starts took {:?}: some waited for the others to give up",
        began.elapsed()
    );
    node.close().await.unwrap();
}

/// A worker handles no more keys at once than it has lanes, and every key
/// still starts.
#[tokio::test]
async fn a_worker_handles_at_most_its_lanes_of_keys_at_once() {
    let server = RedisServer::start().unwrap();
    // Each start waits 200 ms for company that cannot come (more than 2).
    let handler = GatheringStarts::new(usize::MAX, Duration::from_millis(200));
    let (node, _worker) = node_with_lanes(&server, 2, handler.clone()).await;
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let dispatches = keys.iter().map(|key| node.dispatch_job(key, &b""[..]));
    for result in futures::future::join_all(dispatches).await {
        result.unwrap();
    }
    assert_eq!(handler.started.load(Ordering::SeqCst), keys.len());
    let most = handler.gathering.most();
    assert!(
        (1..=2).contains(&most),
        "{most} starts under way at once with 2 lanes"
    );
    node.close().await.unwrap();
}

#[test]
fn lanes_out_of_range_are_refused() {
    for lanes in [0, 4097] {
        let refused = NodeOptions::default().worker_lanes(lanes).validate();
        assert!(
            matches!(
                refused,
                Err(crate::Error::InvalidOptions {
                    option: "worker_lanes",
                    ..
                })
            ),
            "{lanes}: {refused:?}"
        );
    }
    assert!(NodeOptions::default().worker_lanes(4096).validate().is_ok());
}
