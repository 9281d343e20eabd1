//! A dispatch whose stop `stop_job` was answered for, made to stand again
//! after Redis went back in time, and found undone by a newer run of that
//! dispatch (`stop_stands.lua`: 'undone'), is marked over: a cleanup of a
//! dead worker running it, a cleaner's move of its start and the orphan
//! sweep end it instead of issuing another run. A later dispatch of the
//! key is not touched, and drops the mark. Chaos soak seed 1586 (behind
//! Sentinel): such runs, on a worker dead since, waited out the recovery
//! window; the cleanup after it moved them to live workers, which started
//! the stopped dispatches again before their stops reached them.

use super::*;
use fred::prelude::{HashesInterface, StreamsInterface};

/// The mark's field in the fencing hash.
fn mark_field(key: &str) -> String {
    format!("{}{key}", keys::ENDED_FIELD_PREFIX)
}

/// A claim on `worker` by node `node`, old enough to be a dead worker's.
async fn claim(f: &Fixture, worker: &str, node: &str) {
    f.store
        .maps
        .cleanup
        .set(worker, &format!("{node} 1000"))
        .await
        .unwrap();
}

/// A cleanup (node "n-me", its claim on w1 taken) moves `key`'s start,
/// the first entry of w1's inbox, to w2.
async fn moved_by_cleaner(f: &Fixture, key: &str) -> (Moved, Option<u64>) {
    let entries: Vec<(String, HashMap<String, Bytes>)> = f
        .store
        .client
        .xrange(f.inbox("w1"), "-", "+", None)
        .await
        .unwrap();
    let (queued, fields) = entries.into_iter().next().unwrap();
    claim(f, "w1", "n-me").await;
    let (from_inbox, to_inbox) = (f.inbox("w1"), f.inbox("w2"));
    let entry = EntryMove {
        from: "w1",
        from_inbox: &from_inbox,
        to: "w2",
        to_inbox: &to_inbox,
        id: &queued,
        name: "start",
        payload: fields["p"].clone(),
        requeue: Requeue {
            key: Some(key),
            cleaner: Some("n-me"),
        },
        worker_ttl: TTL,
        pending_ttl: TTL,
        floor_ms: None,
    };
    f.store.move_entry_token(entry).await.unwrap()
}

/// Whether Redis holds a record, guard or payload of `key`.
async fn held(f: &Fixture, key: &str) -> bool {
    let (_, record, guard) = f.store.job_records(key).await.unwrap();
    record.is_some() || guard.is_some() || f.store.payload(key).await.unwrap().is_some()
}

/// Admits `key` at `worker` and stops that dispatch: Redis went back to a
/// state where the stopped dispatch has a newer run than the stopped one
/// (`newer`: a record at `owner`, or with `None` a guard of a requeued
/// start), and the stop, made to stand, finds it undone. The stopped run's
/// token.
async fn undone(f: &Fixture, key: &str, worker: &str, owner: Option<&str>) -> u64 {
    let s = &f.store;
    let stopped = f.admitted(key, worker).await;
    let dispatch = f.admission_stamp(key).await;
    let newer = stopped + 1_000;
    match owner {
        Some(owner) => {
            s.maps.pending_map().delete(key).await.unwrap();
            let record = format!("{owner} {newer}");
            s.maps.jobs_map().set(key, &record).await.unwrap();
        }
        None => {
            let guard = format!("{newer} 9999999999999 n-test/1");
            s.maps.pending_map().set(key, &guard).await.unwrap();
        }
    }
    let _: i64 = s
        .client
        .hset(keys::fencing(&s.pool), (key, newer.to_string()))
        .await
        .unwrap();
    assert_eq!(
        s.stop_stands_batch(&[(key, stopped)], StopKind::Dispatch)
            .await
            .unwrap(),
        vec![StopStands::Undone(dispatch)]
    );
    stopped
}

#[tokio::test]
async fn a_cleanup_ends_a_dead_workers_run_of_a_dispatch_marked_over() {
    let f = &fixture().await;
    let s = &f.store;
    for w in ["w1", "w2", "w3"] {
        f.register(w).await;
    }
    undone(f, "k", "w1", Some("w2")).await;
    claim(f, "w2", "n-me").await;
    assert_eq!(
        f.handoff("k", "w2", "w3", Some("n-me")).await,
        Handoff::Ended
    );
    assert!(
        !held(f, "k").await,
        "the stopped dispatch is still in Redis"
    );
    assert!(f.entry_ids("w3").await.is_empty(), "a start was enqueued");

    // A later dispatch of the key is another one: moved as before, and the
    // mark, which names no dispatch Redis holds any more, goes.
    let later = f.admitted("k", "w1").await;
    s.maps.pending_map().delete("k").await.unwrap();
    let record = format!("w2 {later}");
    s.maps.jobs_map().set("k", &record).await.unwrap();
    let moved = f.handoff("k", "w2", "w3", Some("n-me")).await;
    assert!(matches!(moved, Handoff::Ok { .. }), "{moved:?}");
    let marked: bool = s
        .client
        .hexists(keys::fencing(&s.pool), mark_field("k"))
        .await
        .unwrap();
    assert!(!marked, "the mark outlived its dispatch");
}

#[tokio::test]
async fn a_cleaners_move_of_a_start_of_a_dispatch_marked_over_ends_it() {
    let f = &fixture().await;
    for w in ["w1", "w2"] {
        f.register(w).await;
    }
    undone(f, "q", "w1", None).await;
    assert_eq!(moved_by_cleaner(f, "q").await, (Moved::Ended, None));
    assert!(
        !held(f, "q").await,
        "the stopped dispatch is still in Redis"
    );
    assert!(f.entry_ids("w1").await.is_empty(), "the start stayed");
    assert!(f.entry_ids("w2").await.is_empty(), "the start moved on");
}

#[tokio::test]
async fn an_orphan_of_a_dispatch_marked_over_is_ended_not_requeued() {
    let f = &fixture().await;
    let s = &f.store;
    for w in ["w1", "w2"] {
        f.register(w).await;
    }
    // Its newer run's worker left; the record went with it.
    undone(f, "o", "w1", Some("w9")).await;
    s.maps.jobs_map().delete("o").await.unwrap();
    let inbox = f.inbox("w2");
    let sweep = |grace| s.sweep_orphans(SCAN_START, SCAN_START, 100, grace, TTL, u64::MAX);
    sweep(Duration::ZERO).await.unwrap();
    let due = sweep(Duration::ZERO).await.unwrap().due;
    assert_eq!(due, vec![("o".to_string(), "-".to_string())]);
    let requeued = s
        .requeue_orphan("o", "-", "w2", &inbox, TTL, TTL, Duration::ZERO, u64::MAX)
        .await
        .unwrap();
    assert_eq!(requeued, OrphanRequeue::Ended);
    assert!(
        !held(f, "o").await,
        "the stopped dispatch is still in Redis"
    );
    assert!(f.entry_ids("w2").await.is_empty(), "a start was enqueued");

    // The same through a hand-off of an orphan.
    undone(f, "h", "w1", Some("w9")).await;
    s.maps.jobs_map().delete("h").await.unwrap();
    assert_eq!(f.handoff("h", "-", "w2", None).await, Handoff::Ended);
    assert!(
        !held(f, "h").await,
        "the stopped dispatch is still in Redis"
    );
}

#[tokio::test]
async fn a_claim_of_a_start_of_a_dispatch_marked_over_ends_it() {
    let f = &fixture().await;
    let s = &f.store;
    for w in ["w1", "w2"] {
        f.register(w).await;
    }
    // The dispatch's start moved on by a cleaner (a newer token, the same
    // admission), on a state Redis went back to; the stop of its first
    // run, made to stand, finds it undone.
    let stopped = f.admitted("c", "w1").await;
    let dispatch = f.admission_stamp("c").await;
    let (moved, token) = moved_by_cleaner(f, "c").await;
    let token = token.expect("a moved start's new token");
    assert_eq!((moved, token > stopped), (Moved::Ok, true));
    assert_eq!(
        s.stop_stands_batch(&[("c", stopped)], StopKind::Dispatch)
            .await
            .unwrap(),
        vec![StopStands::Undone(dispatch)]
    );
    // w2 claims the moved start (not fresh: it follows a rollback).
    let id = f.entry_ids("w2").await[0].clone();
    let start = StartToRecord {
        key: "c".to_string(),
        token,
        worker: "w2".to_string(),
        inbox: f.inbox("w2"),
        entry_id: id,
        reply: None,
        admitted: dispatch,
    };
    assert_eq!(
        s.claim_start(&start, TTL, TTL).await.unwrap(),
        Claimed::Superseded
    );
    assert!(
        !held(f, "c").await,
        "the stopped dispatch is still in Redis"
    );
    assert!(f.entry_ids("w2").await.is_empty(), "the start stayed");
    // A copy of the moved run cannot re-assert over the end.
    let counter: u64 = s.client.hget(keys::fencing(&s.pool), "c").await.unwrap();
    assert!(counter > token, "counter {counter}, moved run {token}");
}
