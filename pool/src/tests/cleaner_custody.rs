//! A dead worker's jobs that a cleanup moved are held by Redis alone until
//! their new owners start them: the worker they came from is gone, so a
//! loss of Redis's data in between took them (chaos soak seed 1402:
//! `job-0128`, its holder killed, moved by the cleanup 2 s later and
//! flushed 0.9 s after that, before its new owner had started it). The
//! cleaning node remembers each such job with one of its workers, which
//! gives it back as an orphan after a loss (`handoffs.rs`).

use super::*;

/// The cleanup of a dead worker leaves each job it moved in the memory of
/// a worker of the cleaning node, under the token of the move, with the
/// job's body, as that worker's own hand-offs are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaner_remembers_the_jobs_it_moved() {
    let server = RedisServer::start().unwrap();
    let (client, a, b, wa, wb, _) = two_nodes(&server, "cleaner-custody").await;
    // `b` has a second worker: the one that does not take the job keeps it.
    let keeper = Worker::new(&b, Counting::default()).await.unwrap();
    // `a`'s ring must hold `keeper` before a key is picked: one placed on
    // `wa` by a ring without it may move on to it once `a` sees it.
    wait_until(
        Duration::from_secs(5),
        "a sees b's second worker",
        || async { a.pool_workers().iter().any(|w| w.id == keeper.id()) },
    )
    .await
    .unwrap();
    let key = key_placed_on(&a, &wa).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    let (_, ran) = wa.inner.jobs.remove(&key).expect("the job runs on wa");

    // `wa` looks dead to `b`, which claims it and cleans it up.
    let now_ms = crate::store::call::server_time_ms(&client).await.unwrap();
    b.inner
        .store
        .maps
        .cleanup
        .set(wa.id(), &format!("{} {now_ms}", b.inner.id))
        .await
        .unwrap();
    assert_eq!(
        b.inner.clean_worker(wa.id()).await.unwrap(),
        crate::cleanup::Claim::Held
    );

    wait_until(Duration::from_secs(10), "the job runs on b", || async {
        wb.job_token(&key).is_some() || keeper.job_token(&key).is_some()
    })
    .await
    .unwrap();
    let (owner, other) = if wb.job_token(&key).is_some() {
        (&wb, &keeper)
    } else {
        (&keeper, &wb)
    };
    let token = owner.job_token(&key).unwrap();
    let remembered = other.inner.handed_off.remembered();
    assert!(
        remembered.iter().any(|h| h.key == key
            && h.token == token
            && h.admitted == ran.admitted
            && h.body == ran.raw_body),
        "the moved job (token {token}) is not remembered by the worker that \
         does not run it: {remembered:?}"
    );
    drop(keeper);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A start entry of a dead worker that its cleanup moves (the worker had
/// not started it, or its start was not recorded) is remembered the same
/// way, under the token the move gives it: Redis alone holds the job until
/// the new owner starts it (chaos soak seed 1419: `job-1436`, its worker
/// killed 66 ms after its handler started and before the start was
/// recorded, the worker that had handed it there killed 7 s later, the
/// entry moved by the cleanup and flushed 5 s after that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaner_remembers_the_start_entries_it_moved() {
    let server = RedisServer::start().unwrap();
    let (client, a, b, wa, wb, _) = two_nodes(&server, "cleaner-custody-entries").await;
    let keeper = Worker::new(&b, Counting::default()).await.unwrap();
    // A worker no process hosts any more, with a start queued in its inbox
    // (admitted as a dispatch to it is: guard, payload, entry).
    let dead = "w-dead";
    let store = &b.inner.store;
    store
        .register(dead, r#"{"node":"n-gone","host":"h","pid":1}"#)
        .await
        .unwrap();
    let key = "queued-at-the-dead";
    let created_ms = crate::store::call::server_time_ms(&client).await.unwrap();
    let body = crate::codec::encode(&crate::codec::JobBody {
        key: key.to_string(),
        payload: b"p".to_vec(),
        restart: None,
    });
    let token = 7;
    let mut entry = format!("{token} {created_ms} 0 0 -\n").into_bytes();
    entry.extend_from_slice(&body);
    let _: i64 = client
        .hset(
            store.maps.pending_map().keys_info().hash.as_str(),
            (key, format!("{token} {}", created_ms + 60_000)),
        )
        .await
        .unwrap();
    let _: i64 = client
        .hset(
            crate::keys::payloads(&store.pool),
            (key, crate::codec::stored(created_ms, &body)),
        )
        .await
        .unwrap();
    b.inner
        .inbox(dead)
        .unwrap()
        .add("start", entry)
        .await
        .unwrap();

    let now_ms = crate::store::call::server_time_ms(&client).await.unwrap();
    store
        .maps
        .cleanup
        .set(dead, &format!("{} {now_ms}", b.inner.id))
        .await
        .unwrap();
    assert_eq!(
        b.inner.clean_worker(dead).await.unwrap(),
        crate::cleanup::Claim::Held
    );

    // The entry goes to the key's ring owner: any of the three workers.
    let workers = [&wa, &wb, &keeper];
    wait_until(Duration::from_secs(10), "the moved start runs", || async {
        workers.iter().any(|w| w.job_token(key).is_some())
    })
    .await
    .unwrap();
    let owner = workers.iter().find(|w| w.job_token(key).is_some()).unwrap();
    let moved = owner.job_token(key).unwrap();
    assert!(moved > token, "the move gave the start a new token");
    // A worker of the cleaning node other than the owner remembers it.
    let remembered: Vec<_> = [&wb, &keeper]
        .iter()
        .filter(|w| w.id() != owner.id())
        .flat_map(|w| w.inner.handed_off.remembered())
        .collect();
    assert!(
        remembered.iter().any(|h| h.key == key
            && h.token == moved
            && h.admitted == created_ms
            && h.body == body),
        "the moved start (token {moved}, run by {}) is not remembered by a worker \
         of the cleaning node that does not run it: {remembered:?}",
        owner.id()
    );
    drop(keeper);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
