//! The sweep scripts' statuses: an orphan is marked first and due only
//! after the grace, `requeue_orphan` checks it all again, the stale-pending
//! sweep removes only guards past their deadline, and `owned_page` lists a
//! worker's jobs from Redis.

use super::*;
use fred::types::{ClusterHash, CustomCommand};

use crate::store::{HandoffStands, OrphanRequeue, SCAN_START};

/// Runs orphan sweep steps over the whole payloads hash; the due orphans.
async fn full_pass(f: &Fixture, grace: Duration) -> Vec<(String, String)> {
    let (mut cursor, mut marks) = (SCAN_START.to_string(), SCAN_START.to_string());
    let mut due = Vec::new();
    loop {
        let page = f
            .store
            .sweep_orphans(&cursor, &marks, 2, grace, TTL, u64::MAX)
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
        .requeue_orphan("o1", "-", "w1", &inbox, TTL, TTL, grace, u64::MAX)
        .await
        .unwrap();
    assert_eq!(early, OrphanRequeue::Changed, "requeued before the grace");
    tokio::time::sleep(grace).await;
    let due = full_pass(&f, grace).await;
    assert_eq!(due, vec![("o1".to_string(), "-".to_string())]);
    // Not the state the sweep saw: nothing done.
    let other = f
        .store
        .requeue_orphan("o1", "w9 5", "w1", &inbox, TTL, TTL, grace, u64::MAX)
        .await
        .unwrap();
    assert_eq!(other, OrphanRequeue::Changed);
    let none = f
        .store
        .requeue_orphan("o1", "-", "nobody", &inbox, TTL, TTL, grace, u64::MAX)
        .await
        .unwrap();
    assert_eq!(none, OrphanRequeue::NoTarget);
    let done = f
        .store
        .requeue_orphan("o1", "-", "w1", &inbox, TTL, TTL, grace, u64::MAX)
        .await
        .unwrap();
    assert!(matches!(done, OrphanRequeue::Ok { token } if token > running));
    // Requeued: a pending guard now, so neither due nor requeued again.
    let again = f
        .store
        .requeue_orphan("o1", "-", "w1", &inbox, TTL, TTL, grace, u64::MAX)
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
        .requeue_orphan("o1", "gone 3", "w1", &inbox, TTL, TTL, grace, u64::MAX)
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
        let page = f.store.sweep_pending(&cursor, 1, u64::MAX).await.unwrap();
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

/// An orphan that a re-assertion leaves (a job suspended on lease loss
/// whose ownership Redis lost), or a hand-off given back after a loss,
/// carries its mark from that moment, and the sweep reports it one grace
/// later at its next step, wherever its pass over the payloads is. With
/// many keys a pass takes many steps: the sweep used to start the grace
/// only when its pass reached the key, and report it due at the next pass
/// that came back to it; after an empty restart, the chaos soak with 2,000
/// keys (4 steps a pass) saw such jobs stopped for up to 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_a_recovery_leaves_is_due_one_grace_later_wherever_the_pass_is() {
    let f = fixture().await;
    let s = &f.store;
    let window = Duration::from_millis(200);
    let grace = Duration::from_millis(1_000);
    f.register("w1").await;
    // Enough jobs that the payloads hash is a hash table (past
    // `hash-max-listpack-entries`, 512), paged by COUNT.
    for i in 0..600 {
        f.admitted(&format!("r{i:03}"), "w1").await;
    }
    // Redis lost the pool's epoch: the next script opens a recovery window.
    let fencing = keys::fencing(&s.pool);
    let _: i64 = s
        .client
        .hdel(fencing.as_str(), keys::EPOCH_FIELD)
        .await
        .unwrap();
    let stored = |key| codec::stored(0, &body(key));
    let suspended = Reassert::Suspended;
    let status = s
        .reassert("o1", "w1", 5_000_000, stored("o1"), suspended, window)
        .await
        .unwrap();
    assert_eq!(status, Reasserted::Orphaned);
    let given_back = s.handoff_stands("h1", 5_000_000, stored("h1")).await;
    assert_eq!(given_back.unwrap(), HandoffStands::Restored);
    let left_at = std::time::Instant::now();
    let start = page_without(&f, &["o1", "h1"]).await;
    let step = || async {
        let mut due = s
            .sweep_orphans(&start, SCAN_START, 2, grace, window, u64::MAX)
            .await
            .unwrap()
            .due;
        due.sort();
        due
    };
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    assert!(step().await.is_empty(), "due before its grace");
    tokio::time::sleep(grace.saturating_sub(left_at.elapsed())).await;
    let orphan = |key: &str| (key.to_string(), "-".to_string());
    assert_eq!(
        step().await,
        vec![orphan("h1"), orphan("o1")],
        "not due at the first step after their grace"
    );
}

/// A payloads cursor whose page (`HSCAN` … `COUNT 2`, as the sweep reads
/// it) holds none of `keys`.
async fn page_without(f: &Fixture, keys: &[&str]) -> String {
    let payloads = keys::payloads(&f.store.pool);
    let mut cursor = SCAN_START.to_string();
    loop {
        let (next, fields): (String, Vec<Bytes>) = f
            .store
            .client
            .custom(
                CustomCommand::new_static("HSCAN", ClusterHash::FirstKey, false),
                vec![payloads.as_str(), cursor.as_str(), "COUNT", "2"],
            )
            .await
            .unwrap();
        if !fields
            .iter()
            .any(|k| keys.iter().any(|key| k.as_ref() == key.as_bytes()))
        {
            return cursor;
        }
        assert_ne!(next, SCAN_START, "every page holds one of {keys:?}");
        cursor = next;
    }
}

/// Graces and deadlines are judged by the smaller of `TIME` and the
/// caller's floor (`server_clock.rs`): past them by server time alone, as
/// after a forward step of the server's clock, nothing is swept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_wait_for_the_callers_floor_too() {
    let f = fixture().await;
    f.register("w1").await;
    f.orphan("o1", "w1").await;
    let now = crate::store::call::server_time_ms(&f.store.client)
        .await
        .unwrap();
    // Marked at `now` by the first pass; a grace of 0 is over at once by
    // server time, but not by a floor a second behind the mark.
    let grace = Duration::ZERO;
    assert!(full_pass(&f, grace).await.is_empty());
    let behind = now - 1_000;
    let page = f
        .store
        .sweep_orphans(SCAN_START, SCAN_START, 100, grace, TTL, behind)
        .await
        .unwrap();
    assert!(
        page.due.is_empty(),
        "due by server time alone: {:?}",
        page.due
    );
    let inbox = f.inbox("w1");
    let early = f
        .store
        .requeue_orphan("o1", "-", "w1", &inbox, TTL, TTL, grace, behind)
        .await
        .unwrap();
    assert_eq!(
        early,
        OrphanRequeue::Changed,
        "requeued by server time alone"
    );
    assert_eq!(
        full_pass(&f, grace).await,
        vec![("o1".to_string(), "-".to_string())]
    );

    // A guard 5 s past its deadline by server time, not by the floor.
    let deadline = now - 5_000;
    f.store
        .maps
        .pending_map()
        .set("stepped", &format!("4 {deadline} -/0"))
        .await
        .unwrap();
    let kept = f
        .store
        .sweep_pending(SCAN_START, 1000, deadline - 1)
        .await
        .unwrap();
    assert!(kept.keys.is_empty(), "swept by server time alone");
    let swept = f
        .store
        .sweep_pending(SCAN_START, 1000, u64::MAX)
        .await
        .unwrap();
    assert_eq!(swept.keys, vec!["stepped".to_string()]);
}
