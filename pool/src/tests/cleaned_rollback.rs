//! A run stopped on request, whose worker then died and was cleaned up,
//! and which Redis then showed again under that worker (it went back to a
//! state from before the stop) after the node that asked for the stop
//! crashed too: the node that cleaned the worker up remembers that its
//! cleanup did not find the run there, and ends it in its recovery rather
//! than moving it (chaos soak seed 1567, `job-0740`).

use super::*;

/// The job's stored payload, read over `client`.
async fn payload_of(client: &fred::prelude::Client, name: &str, key: &str) -> Option<Vec<u8>> {
    client.hget(crate::keys::payloads(name), key).await.unwrap()
}

/// A server that can go back to a snapshot, and a pool on it: node `b`
/// with a worker that runs the job and dies, and node `c` whose worker
/// (counted) stays; `first` joins before both (a requester, or none).
struct Fixture {
    server: RedisServer,
    client: fred::prelude::Client,
    name: String,
    first: Option<Node>,
    b: Node,
    wb: Worker,
    c: Node,
    wc: Worker,
    stays: Counting,
}

impl Fixture {
    async fn start(prefix: &str, with_requester: bool) -> Self {
        let server =
            RedisServer::start_with(flotilla_testkit::ServerOptions::default().aof(true)).unwrap();
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        let name = flotilla_testkit::unique_name(prefix);
        let options = NodeOptions::default()
            .worker_ttl(Duration::from_secs(2))
            .dispatch_timeout(Duration::from_secs(5));
        let first = if with_requester {
            Some(Node::join(&client, &name, options.clone()).await.unwrap())
        } else {
            None
        };
        let b = Node::join(&client, &name, options.clone()).await.unwrap();
        let c = Node::join(&client, &name, options).await.unwrap();
        let wb = Worker::new(&b, Counting::default()).await.unwrap();
        let stays = Counting::default();
        let wc = Worker::new(&c, stays.clone()).await.unwrap();
        wait_until(Duration::from_secs(5), "both workers seen", || async {
            b.pool_workers().len() == 2 && c.pool_workers().len() == 2
        })
        .await
        .unwrap();
        Self {
            server,
            client,
            name,
            first,
            b,
            wb,
            c,
            wc,
            stays,
        }
    }

    /// The node that dispatches and stops: the requester, else `c`.
    fn asker(&self) -> &Node {
        self.first.as_ref().unwrap_or(&self.c)
    }

    /// Dispatches a key `b`'s worker runs and waits until it does.
    async fn dispatch_to_b(&self) -> String {
        let asker = self.asker();
        let key = key_placed_on(asker, &self.wb).await;
        asker.dispatch_job(&key, &b"p"[..]).await.unwrap();
        wait_until(Duration::from_secs(5), "the job runs on b", || async {
            self.wb.job_token(&key).is_some()
        })
        .await
        .unwrap();
        key
    }

    /// Whether Redis shows `c`'s worker alone registered.
    async fn only_c_registered(&self) -> bool {
        let workers = self.c.inner.store.maps.workers.keys_info().hash.clone();
        let registered: std::collections::HashMap<String, String> =
            self.client.hgetall(&workers).await.unwrap_or_default();
        registered.len() == 1 && registered.contains_key(self.wc.id())
    }

    /// `b`'s process dies (no close); `c` cleans its worker up.
    async fn kill_b_and_wait_for_its_cleanup(&self) {
        self.wb.inner.cancel.cancel();
        self.b.inner.stop_tasks().await;
        wait_until(
            Duration::from_secs(15),
            "b's worker cleaned up by c",
            || self.only_c_registered(),
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaner_ends_a_stopped_run_a_rollback_put_back_under_the_worker_it_cleaned_up() {
    let mut f = Fixture::start("cleaned-rollback", true).await;
    let key = f.dispatch_to_b().await;
    let snapshot = f.server.save_snapshot().unwrap();
    f.asker().stop_job(&key).await.unwrap();

    // The node that asked for the stop dies, without a close, and so does
    // b's process: nothing of the stop is left with anyone. c finds b's
    // worker dead and cleans it up, finding nothing of the stopped job.
    if let Some(requester) = f.first.take() {
        requester.inner.stop_tasks().await;
    }
    f.kill_b_and_wait_for_its_cleanup().await;
    assert_eq!(payload_of(&f.client, &f.name, &key).await, None);

    // Redis goes back to before the stop: b's worker registered, running
    // the job. Its next cleanup comes after the recovery window.
    f.server.roll_back(&snapshot).unwrap();
    let inbox = crate::keys::worker_inbox(f.wc.id());
    wait_until(
        Duration::from_secs(30),
        "b's worker cleaned up again and c's inbox read",
        || async {
            let queued: u64 = fred::prelude::StreamsInterface::xlen(&f.client, &inbox)
                .await
                .unwrap_or(1);
            f.only_c_registered().await && queued == 0
        },
    )
    .await
    .unwrap();
    assert_eq!(
        f.stays.starts.load(Ordering::SeqCst),
        0,
        "{key}, stopped on request at b, runs again on c"
    );
    assert!(f.wc.job_token(&key).is_none());
    assert_eq!(
        payload_of(&f.client, &f.name, &key).await,
        None,
        "the stopped job is back in the pool"
    );
    f.c.close().await.unwrap();
}

/// The other way a run leaves a worker before its cleanup: passed on (here
/// by a drain). Its end, made to stand by the cleaner after the rollback,
/// takes only the older run under the dead worker: the run it was passed
/// to re-asserts its newer token and goes on, started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_passed_on_before_the_cleanup_goes_on_where_it_was_passed() {
    let mut f = Fixture::start("cleaned-passed-on", false).await;
    let key = f.dispatch_to_b().await;
    let ran = f.wb.job_token(&key).unwrap();
    let snapshot = f.server.save_snapshot().unwrap();

    // Drained, b's worker passes the job on to c's; then b's process dies
    // and c cleans its worker up, finding nothing there.
    assert!(f.b.drain_worker(f.wb.id()).await.unwrap());
    wait_until(
        Duration::from_secs(10),
        "the job passed on to c",
        || async { f.wc.job_token(&key).is_some() && f.wb.job_token(&key).is_none() },
    )
    .await
    .unwrap();
    let passed = f.wc.job_token(&key).unwrap();
    assert!(passed > ran);
    f.kill_b_and_wait_for_its_cleanup().await;

    // Redis goes back to before the drain: the job under b's worker again.
    f.server.roll_back(&snapshot).unwrap();
    let jobs = f.c.inner.store.maps.jobs_keys.hash.clone();
    let expected = format!("{} {passed}", f.wc.id());
    wait_until(
        Duration::from_secs(30),
        "b's worker cleaned up again, the job recorded under c's",
        || async {
            let record: Option<String> = f.client.hget(&jobs, &key).await.unwrap_or_default();
            f.only_c_registered().await && record.as_deref() == Some(expected.as_str())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        f.wc.job_token(&key),
        Some(passed),
        "the passed-on run goes on"
    );
    assert_eq!(
        f.stays.starts.load(Ordering::SeqCst),
        1,
        "started once at c"
    );
    assert!(
        payload_of(&f.client, &f.name, &key).await.is_some(),
        "the running job's payload is kept"
    );
    f.c.close().await.unwrap();
}
