//! The sweep scripts' statuses: an orphan is marked first and due only
//! after the grace, `requeue_orphan` checks it all again, the stale-pending
//! sweep removes only guards past their deadline, and `owned_page` lists a
//! worker's jobs from Redis.

use super::*;
use crate::store::{OrphanRequeue, SCAN_START};

/// Runs orphan sweep steps over the whole payloads hash; the due orphans.
async fn full_pass(f: &Fixture, grace: Duration) -> Vec<(String, String)> {
    let (mut cursor, mut marks) = (SCAN_START.to_string(), SCAN_START.to_string());
    let mut due = Vec::new();
    loop {
        let page = f
            .store
            .sweep_orphans(&cursor, &marks, 2, grace, TTL)
            .await
            .unwrap();
        due.extend(page.due);
        (cursor, marks) = (page.cursor, page.marks_cursor);
        if cursor == SCAN_START {
            return due;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_due_only_after_its_grace_and_requeued_once() {
    let f = fixture().await;
    f.register("w1").await;
    f.orphan("o1", "w1").await;
    let running = f.admitted("r1", "w1").await;
    let grace = Duration::from_millis(300);
    // First sighting: marked, not due; a running job is no orphan.
    assert!(full_pass(&f, grace).await.is_empty());
    let inbox = f.inbox("w1");
    let early = f
        .store
        .requeue_orphan("o1", "-", "w1", &inbox, TTL, TTL, grace)
        .await
        .unwrap();
    assert_eq!(early, OrphanRequeue::Changed, "requeued before the grace");
    tokio::time::sleep(grace).await;
    let due = full_pass(&f, grace).await;
    assert_eq!(due, vec![("o1".to_string(), "-".to_string())]);
    // Not the state the sweep saw: nothing done.
    let other = f
        .store
        .requeue_orphan("o1", "w9 5", "w1", &inbox, TTL, TTL, grace)
        .await
        .unwrap();
    assert_eq!(other, OrphanRequeue::Changed);
    let none = f
        .store
        .requeue_orphan("o1", "-", "nobody", &inbox, TTL, TTL, grace)
        .await
        .unwrap();
    assert_eq!(none, OrphanRequeue::NoTarget);
    let done = f
        .store
        .requeue_orphan("o1", "-", "w1", &inbox, TTL, TTL, grace)
        .await
        .unwrap();
    assert!(matches!(done, OrphanRequeue::Ok { token } if token > running));
    // Requeued: a pending guard now, so neither due nor requeued again.
    let again = f
        .store
        .requeue_orphan("o1", "-", "w1", &inbox, TTL, TTL, grace)
        .await
        .unwrap();
    assert_eq!(again, OrphanRequeue::Changed);
    assert!(full_pass(&f, grace).await.is_empty());
    let marks: u64 = f
        .store
        .client
        .hlen(keys::orphan_marks(&f.store.pool))
        .await
        .unwrap();
    assert_eq!(marks, 0, "marks left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_an_unregistered_worker_is_an_orphan_and_a_new_token_restarts_its_grace() {
    let f = fixture().await;
    f.register("w1").await;
    f.orphan("o1", "w1").await;
    f.store.maps.jobs_map().set("o1", "gone 3").await.unwrap();
    let grace = Duration::from_millis(300);
    assert!(full_pass(&f, grace).await.is_empty());
    tokio::time::sleep(grace).await;
    // A new fencing token meanwhile (the key moved and came back to the
    // same state): the grace starts over.
    let fencing = keys::fencing(&f.store.pool);
    let _: i64 = f
        .store
        .client
        .hincrby(fencing.as_str(), "o1", 1)
        .await
        .unwrap();
    assert!(full_pass(&f, grace).await.is_empty());
    tokio::time::sleep(grace).await;
    let due = full_pass(&f, grace).await;
    assert_eq!(due, vec![("o1".to_string(), "gone 3".to_string())]);
    let inbox = f.inbox("w1");
    let done = f
        .store
        .requeue_orphan("o1", "gone 3", "w1", &inbox, TTL, TTL, grace)
        .await
        .unwrap();
    assert!(matches!(done, OrphanRequeue::Ok { .. }));
    let record: Option<String> = f
        .store
        .client
        .hget(f.store.maps.jobs_map().keys_info().hash.as_str(), "o1")
        .await
        .unwrap();
    assert_eq!(record, None, "the dead owner's record dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_sweep_removes_only_guards_past_their_deadline() {
    let f = fixture().await;
    f.register("w1").await;
    f.admitted("live", "w1").await;
    f.store
        .maps
        .pending_map()
        .set("stale", "4 1000 -/0")
        .await
        .unwrap();
    let mut removed = Vec::new();
    let mut cursor = SCAN_START.to_string();
    loop {
        let page = f.store.sweep_pending(&cursor, 1).await.unwrap();
        removed.extend(page.keys);
        cursor = page.cursor;
        if cursor == SCAN_START {
            break;
        }
    }
    assert_eq!(removed, vec!["stale".to_string()]);
    let pending = f.store.maps.pending_map().keys_info().hash.clone();
    let live: bool = f
        .store
        .client
        .hexists(pending.as_str(), "live")
        .await
        .unwrap();
    assert!(live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_pages_list_a_workers_jobs_from_redis() {
    let f = fixture().await;
    let jobs = f.store.maps.jobs_map();
    for i in 0..30 {
        let owner = if i % 3 == 0 { "w1" } else { "w2" };
        jobs.set(&format!("k{i}"), &format!("{owner} {i}"))
            .await
            .unwrap();
    }
    let mut listed = Vec::new();
    let mut cursor = SCAN_START.to_string();
    loop {
        let page = f.store.owned_page("w1", &cursor, 4).await.unwrap();
        listed.extend(page.keys);
        cursor = page.cursor;
        if cursor == SCAN_START {
            break;
        }
    }
    listed.sort();
    listed.dedup();
    let mut expected: Vec<String> = (0..30).step_by(3).map(|i| format!("k{i}")).collect();
    expected.sort();
    assert_eq!(listed, expected);
}

/// An orphan (a payload with neither owner record nor pending guard: a
/// hand-off or start Redis lost, given back by the worker that handed it
/// off) is an admitted job still owed a run, which the sweep requeues: a
/// new dispatch of its key is not admitted a second time (I3). The chaos
/// soak admitted one again 2 s after an empty restart that lost a
/// hand-off. Nor is it `exists`, which promises a started job that a
/// worker re-asserts after a loss: the dispatch waits for its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_not_admitted_again() {
    let f = fixture().await;
    f.register("w1").await;
    f.orphan("o1", "w1").await;
    let again = f.admission("o1", "w1", 7);
    assert_eq!(f.admit(&f.limits(), again).await, Admitted::Pending);
}
