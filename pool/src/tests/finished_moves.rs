//! A run that ended on its own (finished, or failed for good) after a
//! cleaner moved it under a newer token, on writes a rollback took back:
//! the run went on, ended, and Redis then lost its data. The cleaner still
//! remembers the move and gives the job back after the loss, unless the
//! end it stands against outranks the move (chaos soak seed 1564: a job
//! failed for good, Redis restarted empty 470 ms later, and the cleaner's
//! give-back ran it again).

use super::resume::Failing;
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_outranks_a_move_of_its_run_a_rollback_took_back() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("finished-move");
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let handler = Failing::default();
    let a = Node::join(&client, &name, options.clone()).await.unwrap();
    let b = Node::join(&client, &name, options).await.unwrap();
    let wa = Worker::new(&a, handler.clone()).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        a.pool_workers().len() == 2 && b.pool_workers().len() == 2
    })
    .await
    .unwrap();
    let key = key_placed_on(&a, &wa).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs on a", || async {
        wa.job_token(&key).is_some()
    })
    .await
    .unwrap();
    let token = wa.job_token(&key).unwrap();
    let job = wa.inner.jobs.get(&key).unwrap().value().clone();
    let payloads = crate::keys::payloads(&name);
    let payload = |client: fred::prelude::Client, key: String, payloads: String| async move {
        let held: Option<bytes::Bytes> = client.hget(&payloads, &key).await.unwrap();
        held
    };
    // The server's time: the move's token, issued after the run's and
    // before its end.
    let time: Vec<String> = client
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .unwrap();
    let moved = time[0].parse::<u64>().unwrap() * 1_000_000 + time[1].parse::<u64>().unwrap();
    assert!(moved > token);
    handler.outcome.lock().unwrap().take().unwrap().finished();
    wait_until(Duration::from_secs(5), "the finish recorded", || async {
        payload(client.clone(), key.clone(), payloads.clone())
            .await
            .is_none()
    })
    .await
    .unwrap();
    // A cleaner had moved the run to b's worker under a newer token, on
    // writes a rollback took back before the end: b's worker remembers
    // the move, Redis has not shown it ended yet.
    wb.inner
        .handed_off
        .record(crate::handoffs::HandedOff::of(&key, moved, &job));
    let begun = |n: &Node| n.inner.recoveries_begun.load(Ordering::SeqCst);
    let before = [begun(&a), begun(&b)];
    flushall(&client).await;
    let ttl = Duration::from_secs(2);
    wait_until(
        Duration::from_secs(15),
        "both nodes recovered from the flush",
        || async {
            let since = [begun(&a), begun(&b)];
            since[0] > before[0]
                && since[1] > before[1]
                && !a
                    .inner
                    .store
                    .pool_recovering(a.inner.reply_stream.key(), ttl)
                    .await
                    .unwrap_or(true)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        payload(client.clone(), key.clone(), payloads.clone()).await,
        None,
        "{key}, finished at a, is back in Redis: the move b remembers was given back over the end"
    );
    assert!(wa.job_token(&key).is_none() && wb.job_token(&key).is_none());
    a.close().await.unwrap();
    b.close().await.unwrap();
}
