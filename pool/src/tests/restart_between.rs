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

/// Sets job `key`'s record to `older` once, the first time it shows
/// `current` (a rollback right after the re-assertion that wrote it).
/// Polled over a direct link while the node's answers come late.
fn roll_back_once_written(
    direct: fred::prelude::Client,
    jobs_hash: String,
    key: &'static str,
    current: String,
    older: String,
) -> tokio::task::JoinHandle<bool> {
    tokio::spawn(async move {
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
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_whose_record_went_back_after_its_re_assertion_keeps_the_job() {
    let server = RedisServer::start().unwrap();
    let (proxy, client) = behind_a_proxy(&server).await;
    let direct = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(10));
    let (node, worker, handler, token) = failed_job_due(&client, "restart-between", options).await;
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let mine = format!("{} {token}", worker.id());
    let older = format!("{} {}", worker.id(), token - 1);
    // A first rollback: Redis names an older run of the key here, so the
    // restart re-asserts the job first.
    let _: () = direct
        .hset(jobs_hash.as_str(), ("k", older.as_str()))
        .await
        .unwrap();
    // A second one right after the re-assertion, before the restart's own
    // call reaches Redis (each answer to the node comes 40 ms late).
    let rollback = roll_back_once_written(direct.clone(), jobs_hash.clone(), "k", mine, older);
    proxy.set_mode(flotilla_testkit::ProxyMode::Delay(Duration::from_millis(
        20,
    )));
    worker.inner.clone().restart("k".to_string(), token).await;
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    let rolled_back = rollback.await.unwrap();
    // Held, not forgotten: the next renewal re-asserts it and restarts it.
    let result = wait_until(Duration::from_secs(10), "the job runs again", || {
        let restarted = worker.job_token("k").is_some_and(|t| t > token);
        async move { restarted }
    })
    .await;
    assert!(
        result.is_ok(),
        "the failed job runs nowhere (Redis went back between its re-assertion and its \
         restart: {rolled_back})"
    );
    assert_eq!(handler.starts.load(Ordering::SeqCst), 2);
    let restarted = worker.job_token("k").unwrap();
    let record: Option<String> = direct.hget(jobs_hash.as_str(), "k").await.unwrap();
    assert_eq!(record, Some(format!("{} {restarted}", worker.id())));
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
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let mine = format!("{} {token}", worker.id());
    // An older run on another worker, as before a hand-off to this one.
    let older = format!("w-before {}", token - 1);
    // A first rollback, and a second right after the resume's
    // re-assertion; each answer to the node comes 40 ms late.
    let _: () = direct
        .hset(jobs_hash.as_str(), ("k", older.as_str()))
        .await
        .unwrap();
    let rollback = roll_back_once_written(direct.clone(), jobs_hash.clone(), "k", mine, older);
    proxy.set_mode(flotilla_testkit::ProxyMode::Delay(Duration::from_millis(
        20,
    )));
    // The lease lapses: the job stops and waits for the next renewal's
    // resume.
    node.inner.lose_lease(tokio::time::Instant::now()).await;
    assert!(worker.job_token("k").is_none(), "suspended");
    let rolled_back = rollback.await.unwrap();
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    let result = wait_until(Duration::from_secs(15), "the job runs again", || {
        let restarted = worker.job_token("k").is_some_and(|t| t > token);
        async move { restarted }
    })
    .await;
    assert!(
        result.is_ok(),
        "the suspended job runs nowhere (Redis went back between its re-assertion and its \
         restart: {rolled_back})"
    );
    let restarted = worker.job_token("k").unwrap();
    let record: Option<String> = direct.hget(jobs_hash.as_str(), "k").await.unwrap();
    assert_eq!(record, Some(format!("{} {restarted}", worker.id())));
    node.close().await.unwrap();
}
