//! A rebalance stops a job for its new owner only while few entries wait
//! in that owner's inbox: a worker whose starts are slow, owed a share of
//! many jobs, is handed them a few at a time, and each job runs on its old
//! worker until its new owner is about to start it (chaos soak seed 1618:
//! a worker back from a deaf link was handed ~660 jobs at once, and the
//! last of them ran nowhere for seconds).

use std::sync::Mutex;
use std::time::Instant;

use super::*;

const JOBS: usize = 80;
const START_TAKES: Duration = Duration::from_millis(100);

/// One start (its beginning) or stop, on the test's monotonic clock.
struct Step {
    key: String,
    worker: &'static str,
    start: bool,
    at: Instant,
}

/// Logs when each start begins and each stop ends; a start then takes
/// `start_takes`.
#[derive(Clone)]
struct Timeline {
    worker: &'static str,
    start_takes: Duration,
    steps: Arc<Mutex<Vec<Step>>>,
}

impl Timeline {
    fn log(&self, key: &str, start: bool) {
        self.steps.lock().unwrap().push(Step {
            key: key.to_string(),
            worker: self.worker,
            start,
            at: Instant::now(),
        });
    }
}

#[async_trait]
impl Handler for Timeline {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.log(&job.key, true);
        tokio::time::sleep(self.start_takes).await;
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.log(key, false);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_starting_owner_is_handed_its_share_a_few_jobs_at_a_time() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let pool = flotilla_testkit::unique_name("paced");
    // One lane: a rebalance lets at most 8 entries wait in an inbox.
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(3))
        .worker_lanes(1);
    let steps = Arc::new(Mutex::new(Vec::new()));
    let timeline = |worker, start_takes| Timeline {
        worker,
        start_takes,
        steps: steps.clone(),
    };
    let a = Node::join(&client, &pool, options.clone()).await.unwrap();
    let _wa = Worker::new(&a, timeline("a", Duration::ZERO))
        .await
        .unwrap();
    let keys: Vec<String> = (0..JOBS).map(|i| format!("j{i}")).collect();
    for key in &keys {
        a.dispatch_job(key, &b""[..]).await.unwrap();
    }

    let b = Node::join(&client, &pool, options).await.unwrap();
    let wb = Worker::new(&b, timeline("b", START_TAKES)).await.unwrap();
    wait_until(Duration::from_secs(5), "a's ring names b", || {
        let seen = a.inner.ring.load().contains(wb.id());
        async move { seen }
    })
    .await
    .unwrap();
    let owed: Vec<String> = keys
        .iter()
        .filter(|k| a.inner.ring.load().owner(k) == Some(wb.id()))
        .cloned()
        .collect();
    assert!(
        owed.len() >= 20,
        "b owes enough jobs to tell paced from not: {}",
        owed.len()
    );
    let deadline = START_TAKES * owed.len() as u32 * 3 + Duration::from_secs(10);
    wait_until(deadline, "b runs every job it owns", || {
        let running = wb.job_keys();
        let all = owed.iter().all(|k| running.contains(k));
        async move { all }
    })
    .await
    .unwrap();

    // How long each job ran nowhere: from its stop on a to the beginning
    // of its start on b. Handed all at once, the last waited for the
    // starts of all the others (owed × 100 ms); paced, for the few queued
    // before it.
    let worst = worst_gap(&steps.lock().unwrap(), &owed);
    let bound = START_TAKES * 14;
    println!(
        "{} jobs handed to b; the longest ran nowhere for {worst:?} (bound {bound:?}, \
         all at once: about {:?})",
        owed.len(),
        START_TAKES * owed.len() as u32
    );
    assert!(
        worst < bound,
        "a job ran nowhere for {worst:?} while b started the others"
    );
    b.close().await.unwrap();
    a.close().await.unwrap();
}

/// The longest time one of `owed` ran nowhere: from its stop on a to the
/// beginning of its start on b (each once, in that order).
fn worst_gap(steps: &[Step], owed: &[String]) -> Duration {
    let mut worst = Duration::ZERO;
    for key in owed {
        let of = |worker: &str, start: bool| {
            steps
                .iter()
                .filter(|s| s.key == *key && s.worker == worker && s.start == start)
                .map(|s| s.at)
                .collect::<Vec<_>>()
        };
        let (stops, starts) = (of("a", false), of("b", true));
        assert_eq!(stops.len(), 1, "{key} stopped once on a");
        assert_eq!(starts.len(), 1, "{key} started once on b");
        assert!(
            starts[0] > stops[0],
            "{key} started on b before a stopped it"
        );
        worst = worst.max(starts[0] - stops[0]);
    }
    worst
}
