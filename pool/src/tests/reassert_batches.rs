//! A worker re-asserts its jobs in batches. After Redis lost its data a
//! worker is the only holder of each job it runs until it has re-asserted
//! it, and one call per job left a worker with 450–490 jobs re-asserting
//! for 70–330 ms on a loaded machine (chaos soak seed 1412, three worker
//! processes of 500 keys each): a `SIGKILL` 215 ms after an empty restart
//! (105 ms after the worker registered again) lost the jobs it had not
//! re-asserted yet, and their keys were admitted again. The stops a node
//! makes stand again, before its workers re-assert, go in batches too.

use fred::prelude::KeysInterface;

use super::*;

/// `FCALL`s the server has run so far.
async fn function_calls(client: &fred::prelude::Client) -> u64 {
    flotilla_testkit::command_stats(client)
        .await
        .unwrap()
        .into_iter()
        .filter(|(name, _)| name == "fcall")
        .map(|(_, calls)| calls)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_re_asserts_hundreds_of_jobs_in_a_few_calls() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("reassert-batches");
    let (node, worker, handler) = pool(&server, &name).await;
    const JOBS: usize = 300;
    let keys: Vec<String> = (0..JOBS).map(|i| format!("k{i}")).collect();
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    assert_eq!(worker.inner.jobs.len(), JOBS);

    // Redis loses every record and payload (as an empty restart would).
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let store = &node.inner.store;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = client.del(&jobs_hash).await.unwrap();
    let _: i64 = client
        .del(crate::keys::payloads(&store.pool))
        .await
        .unwrap();

    let before = function_calls(&client).await;
    node.inner.reassert_all(&worker.inner).await.unwrap();
    let calls = function_calls(&client).await - before;
    // 300 jobs in batches of 64: 5 calls, plus whatever the node's
    // background tasks (renewals, the sweeper) ran meanwhile.
    assert!(
        calls <= 15,
        "{calls} function calls to re-assert {JOBS} jobs"
    );
    for key in &keys {
        let record: Option<String> = client.hget(&jobs_hash, key.as_str()).await.unwrap();
        let token = worker.job_token(key).unwrap();
        assert_eq!(
            record.as_deref().and_then(crate::store::records::job_owner),
            Some((worker.id(), token)),
            "{key} re-asserted"
        );
        let payload: bool = client
            .hexists(crate::keys::payloads(&store.pool), key.as_str())
            .await
            .unwrap();
        assert!(payload, "{key}'s payload restored");
    }
    assert_eq!(handler.stops.load(Ordering::SeqCst), 0, "a job stopped");
    node.close().await.unwrap();
}

/// A recovery makes the stops a node remembers stand again in batches:
/// until they stand, and before its workers re-assert, a crash of the node
/// takes them along, and one call per stop made a node that had stopped
/// hundreds of runs in the last two minutes spend that many calls first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_makes_hundreds_of_stops_stand_in_a_few_calls() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("stop-batches");
    let (node, worker, _handler) = pool(&server, &name).await;
    const JOBS: usize = 300;
    let keys: Vec<String> = (0..JOBS).map(|i| format!("k{i}")).collect();
    let mut tokens = Vec::with_capacity(JOBS);
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
        tokens.push(worker.job_token(key).unwrap());
    }
    for key in &keys {
        node.stop_job(key).await.unwrap();
    }

    // Redis goes back to before the stops: each record names the worker
    // again, and each fencing counter is the run's token.
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let store = &node.inner.store;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let fencing = crate::keys::fencing(&store.pool);
    for (key, token) in keys.iter().zip(&tokens) {
        let record = format!("{} {token}", worker.id());
        let _: i64 = client
            .hset(&jobs_hash, (key.as_str(), record.as_str()))
            .await
            .unwrap();
        let _: i64 = client
            .hset(&fencing, (key.as_str(), token.to_string()))
            .await
            .unwrap();
    }

    let before = function_calls(&client).await;
    node.inner.requested_stops_stand().await.unwrap();
    let calls = function_calls(&client).await - before;
    // 300 stops in batches of 64: 5 calls, plus whatever the node's
    // background tasks ran meanwhile.
    assert!(
        calls <= 15,
        "{calls} function calls to make {JOBS} stops stand"
    );
    for (key, token) in keys.iter().zip(&tokens) {
        let record: Option<String> = client.hget(&jobs_hash, key.as_str()).await.unwrap();
        assert_eq!(record, None, "{key}'s stop stands");
        let counter: u64 = client.hget(&fencing, key.as_str()).await.unwrap();
        assert!(
            counter > *token,
            "{key}: counter {counter} not above {token}"
        );
    }
    node.close().await.unwrap();
}

/// A recovery gives back the jobs a worker remembers passing on in batches
/// too: until a job whose hand-off Redis lost is given back, the old
/// owner's memory is its only copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gives_back_hundreds_of_hand_offs_in_a_few_calls() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("give-back-batches");
    let (node, worker, _handler) = pool(&server, &name).await;
    const JOBS: usize = 300;
    let keys: Vec<String> = (0..JOBS).map(|i| format!("h{i}")).collect();
    // Passed on lately (the hand-offs Redis then lost: it knows none of
    // the keys).
    for key in &keys {
        worker.inner.handed_off.record(crate::handoffs::HandedOff {
            key: key.clone(),
            token: 1_000,
            admitted: 1,
            body: bytes::Bytes::from_static(b"payload"),
        });
    }
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let before = function_calls(&client).await;
    node.inner.handoffs_stand(&worker.inner).await.unwrap();
    let calls = function_calls(&client).await - before;
    assert!(
        calls <= 15,
        "{calls} function calls to give back {JOBS} jobs"
    );
    let payloads = crate::keys::payloads(&node.inner.store.pool);
    for key in &keys {
        let given_back: bool = client.hexists(&payloads, key.as_str()).await.unwrap();
        assert!(given_back, "{key} given back");
    }
    node.close().await.unwrap();
}

/// Stops that take a while, counting how many are under way at once.
#[derive(Clone, Default)]
struct SlowStops {
    counts: Counting,
    stopping: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for SlowStops {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.counts.start(job).await
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        let now = self.stopping.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.stopping.fetch_sub(1, Ordering::SeqCst);
        self.counts.stop(key).await
    }
    async fn message(&self, key: &str, payload: bytes::Bytes) -> Result<(), HandlerError> {
        self.counts.message(key, payload).await
    }
}

/// The jobs a re-assertion finds running elsewhere stop all at once. One
/// after the other, a dozen handler stops of 50–100 ms held the worker's
/// lock for 630 ms after a rollback (chaos soak seed 1432); Redis then
/// restarted empty, the worker's re-assertion of its 150 other jobs waited
/// for that lock, and a kill 350 ms after the restart took them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_that_run_elsewhere_stop_at_once() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("reassert-stops");
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(10));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = SlowStops::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    const JOBS: usize = 8;
    let keys: Vec<String> = (0..JOBS).map(|i| format!("k{i}")).collect();
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    // Redis shows each key on another worker with a newer token (a
    // rollback to a state where they had moved on, say).
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    for key in &keys {
        let token = worker.job_token(key).unwrap();
        let _: i64 = client
            .hset(&jobs_hash, (key.as_str(), format!("w-other {}", token + 1)))
            .await
            .unwrap();
    }
    node.inner.reassert_all(&worker.inner).await.unwrap();
    assert!(worker.job_keys().is_empty(), "every job stopped here");
    assert_eq!(handler.counts.stops.load(Ordering::SeqCst), JOBS);
    assert_eq!(
        handler.most_at_once.load(Ordering::SeqCst),
        JOBS,
        "the stops ran one after the other"
    );
    node.close().await.unwrap();
}
