//! A worker that re-asserted a job and then found Redis no longer naming
//! it holds the job until a renewal settles it: Redis may have gone back in
//! time between the two calls, and forgetting the job then loses it (chaos
//! soak seed 1439: a failed run's restart re-asserted the job after a
//! first rollback, a second rollback came before the restart's own call,
//! which found an older record and dropped the job; the recovery then
//! released that record and its payload, and the key ran nowhere).

use fred::prelude::LuaInterface;

use super::resume::{behind_a_proxy, failed_job_due};
use super::*;

/// The record of job `key` in the jobs hash, read over a direct link.
struct Record {
    direct: fred::prelude::Client,
    jobs_hash: String,
    key: &'static str,
}

impl Record {
    fn of(node: &Node, direct: fred::prelude::Client, key: &'static str) -> Self {
        let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
        Self {
            direct,
            jobs_hash,
            key,
        }
    }

    /// Two rollbacks of the record to `older`: one now, and one right
    /// after the re-assertion that writes `current`, before the call that
    /// follows it reaches Redis (the node's answers come 40 ms late from
    /// here on, until the proxy forwards again). The task answers whether
    /// the second rollback happened.
    async fn roll_back_around_a_reassertion(
        &self,
        proxy: &flotilla_testkit::FaultProxy,
        current: String,
        older: String,
    ) -> tokio::task::JoinHandle<bool> {
        let _: () = self
            .direct
            .hset(self.jobs_hash.as_str(), (self.key, older.as_str()))
            .await
            .unwrap();
        let (direct, jobs_hash, key) = (self.direct.clone(), self.jobs_hash.clone(), self.key);
        let second = tokio::spawn(async move {
            let script = "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then \
                          redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) return 1 end return 0";
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while tokio::time::Instant::now() < deadline {
                let rolled: i64 = direct
                    .eval(script, vec![jobs_hash.clone()], vec![key, &current, &older])
                    .await
                    .unwrap();
                if rolled == 1 {
                    return true;
                }
            }
            false
        });
        proxy.set_mode(flotilla_testkit::ProxyMode::Delay(Duration::from_millis(
            20,
        )));
        second
    }

    /// Waits until `worker` runs the job again under a token newer than
    /// `token`, and checks that the record names that run.
    async fn runs_again(&self, worker: &Worker, token: u64, within: Duration, rolled_back: bool) {
        let result = wait_until(within, "the job runs again", || {
            let restarted = worker.job_token(self.key).is_some_and(|t| t > token);
            async move { restarted }
        })
        .await;
        assert!(
            result.is_ok(),
            "the job runs nowhere (Redis went back between its re-assertion and its restart: \
             {rolled_back})"
        );
        let restarted = worker.job_token(self.key).unwrap();
        let record: Option<String> = self
            .direct
            .hget(self.jobs_hash.as_str(), self.key)
            .await
            .unwrap();
        assert_eq!(record, Some(format!("{} {restarted}", worker.id())));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_whose_record_went_back_after_its_re_assertion_keeps_the_job() {
    let server = RedisServer::start().unwrap();
    let (proxy, client) = behind_a_proxy(&server).await;
    let direct = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(10));
    let (node, worker, handler, token) = failed_job_due(&client, "restart-between", options).await;
    let record = Record::of(&node, direct, "k");
    // Redis names an older run of the key here, so the restart re-asserts
    // the job first; the second rollback comes before its own call.
    let mine = format!("{} {token}", worker.id());
    let older = format!("{} {}", worker.id(), token - 1);
    let rollback = record
        .roll_back_around_a_reassertion(&proxy, mine, older)
        .await;
    worker.inner.clone().restart("k".to_string(), token).await;
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    let rolled_back = rollback.await.unwrap();
    // Held, not forgotten: the next renewal re-asserts it and restarts it.
    record
        .runs_again(&worker, token, Duration::from_secs(10), rolled_back)
        .await;
    assert_eq!(handler.starts.load(Ordering::SeqCst), 2);
    node.close().await.unwrap();
}

/// The same for a job resumed after a lease loss: its resume re-asserts
/// it when Redis names an older run, and a rollback before the restart's
/// own call must not have it forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_whose_record_went_back_after_its_re_assertion_keeps_the_job() {
    let server = RedisServer::start().unwrap();
    let (proxy, client) = behind_a_proxy(&server).await;
    let direct = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("resume-between");
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(3));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let token = worker.job_token("k").expect("the job runs");
    let record = Record::of(&node, direct, "k");
    // An older run on another worker, as before a hand-off to this one.
    let mine = format!("{} {token}", worker.id());
    let older = format!("w-before {}", token - 1);
    let rollback = record
        .roll_back_around_a_reassertion(&proxy, mine, older)
        .await;
    // The lease lapses: the job stops and waits for the next renewal's
    // resume.
    node.inner.lose_lease(tokio::time::Instant::now()).await;
    assert!(worker.job_token("k").is_none(), "suspended");
    let rolled_back = rollback.await.unwrap();
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    record
        .runs_again(&worker, token, Duration::from_secs(15), rolled_back)
        .await;
    node.close().await.unwrap();
}
