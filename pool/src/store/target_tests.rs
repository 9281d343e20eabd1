//! Who a job or an entry may be moved to (`handoff.lua`,
//! `requeue_orphan.lua`, `move_entry.lua`): a worker that reads its inbox,
//! i.e. that renewed within a TTL and since the pool last found Redis's
//! data lost or gone back in time. A
//! registration a rollback brought back, of a worker whose process has
//! left, is no target: a job handed to it would start nowhere until a
//! cleanup found the worker dead (chaos soak seed 804).

use super::*;
use crate::store::OrphanRequeue;

/// Server time in ms, as the scripts read it.
async fn server_now_ms(f: &Fixture) -> u64 {
    call::server_time_ms(&f.store.client).await.unwrap()
}

/// Workers and their inboxes, as a rebalance asks about them.
fn asked(f: &Fixture, workers: &[&str]) -> Vec<(String, String)> {
    workers
        .iter()
        .map(|w| (w.to_string(), f.inbox(w)))
        .collect()
}

/// A store with worker "w1" running job "r", and worker `other`
/// registered.
async fn r_runs_on_w1_beside(other: &str) -> Fixture {
    let f = fixture().await;
    f.register("w1").await;
    f.register(other).await;
    let stored = codec::stored(0, &body("r"));
    f.store
        .reassert("r", "w1", 7, stored, Reassert::Running, TTL)
        .await
        .unwrap();
    f
}

#[tokio::test]
async fn a_job_goes_only_to_a_worker_that_renewed_since_the_last_loss() {
    let f = &r_runs_on_w1_beside("w-back").await;
    let s = &f.store;
    // Redis went back to a moment when "w-back" was registered: its record
    // and its last renewal, a second before now, are back; its process has
    // left. A script then finds the loss and opens the recovery window, and
    // "w1", alive, registers again.
    let before_loss = server_now_ms(f).await - 1_000;
    s.maps
        .keepalive
        .set("w-back", &before_loss.to_string())
        .await
        .unwrap();
    s.begin_recovery(TTL).await.unwrap();
    f.register("w1").await;

    let asked = asked(f, &["w-back", "w1"]);
    assert_eq!(
        s.targets_current(&asked, TTL)
            .await
            .unwrap()
            .iter()
            .map(Option::is_some)
            .collect::<Vec<_>>(),
        vec![false, true],
        "who a rebalance would stop a job for"
    );
    assert_eq!(
        f.handoff("r", "w1", "w-back", None).await,
        Handoff::NoTarget,
        "handed to a worker that has shown no life since the loss"
    );
    // A worker that registered after the loss is a target.
    f.register("w2").await;
    assert!(
        matches!(f.handoff("r", "w1", "w2", None).await, Handoff::Ok { .. }),
        "not handed to a live worker"
    );
}

#[tokio::test]
async fn a_job_goes_to_no_worker_silent_for_over_a_ttl() {
    let f = &r_runs_on_w1_beside("w-dead").await;
    let s = &f.store;
    // Its process died a TTL ago; no cleanup has removed it yet.
    let silent_since = server_now_ms(f).await - TTL.as_millis() as u64 - 1_000;
    s.maps
        .keepalive
        .set("w-dead", &silent_since.to_string())
        .await
        .unwrap();
    assert_eq!(
        f.handoff("r", "w1", "w-dead", None).await,
        Handoff::NoTarget
    );
    // Nor is an entry forwarded to it.
    f.admitted("q", "w1").await;
    let queued = f.entry_ids("w1").await[0].clone();
    assert_eq!(f.move_entry(&queued, "w1", "w-dead").await, Moved::NoTarget);
    f.register("w2").await;
    assert_eq!(f.move_entry(&queued, "w1", "w2").await, Moved::Ok);

    // Nor is an orphan requeued to it.
    f.orphan("o", "w1").await;
    let grace = Duration::from_millis(1);
    let inbox = f.inbox("w-dead");
    let due = loop {
        let page = s
            .sweep_orphans(SCAN_START, SCAN_START, 100, grace, TTL, u64::MAX)
            .await
            .unwrap();
        if page.due.iter().any(|(k, _)| k == "o") {
            break page.due;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(due.contains(&("o".to_string(), "-".to_string())), "{due:?}");
    assert_eq!(
        s.requeue_orphan("o", "-", "w-dead", &inbox, TTL, TTL, grace, u64::MAX)
            .await
            .unwrap(),
        OrphanRequeue::NoTarget
    );
    let inbox = f.inbox("w1");
    assert!(matches!(
        s.requeue_orphan("o", "-", "w1", &inbox, TTL, TTL, grace, u64::MAX)
            .await
            .unwrap(),
        OrphanRequeue::Ok { .. }
    ));
}

/// After a forward step of the server's wall clock every keep-alive looks
/// a step old until its worker renews. A caller that bounds server time on
/// its own clock (`server_clock.rs`) judges the target's silence by that
/// bound too, as a cleanup's claim is judged: a cleanup's hand-offs are not
/// refused until every target has renewed (chaos soak seed 1613: a killed
/// process's jobs waited a renewal period, and an empty restart took those
/// not moved yet).
#[tokio::test]
async fn a_target_silent_only_by_a_stepped_clock_takes_a_job_from_a_caller_that_knows_the_time() {
    let f = &r_runs_on_w1_beside("w2").await;
    let s = &f.store;
    // The server's clock stepped two TTLs ahead since "w2" last renewed,
    // a second ago by the caller's clock.
    let step = 2 * TTL.as_millis() as u64;
    let renewed = server_now_ms(f).await - step - 1_000;
    s.maps
        .keepalive
        .set("w2", &renewed.to_string())
        .await
        .unwrap();
    let inbox = &f.inbox("w2");
    let hand = |floor_ms| async move {
        let to = Receiver {
            worker: "w2",
            inbox,
            floor_ms,
        };
        s.handoff("r", "w1", to, TTL, TTL, Mover::Owner)
            .await
            .unwrap()
            .0
    };
    // By `TIME` alone, "w2" is silent for over two TTLs; so it is by a bound of
    // the caller's that shows it silent for over a TTL.
    assert_eq!(hand(None).await, Handoff::NoTarget);
    let late = renewed + TTL.as_millis() as u64 + 1_000;
    assert_eq!(hand(Some(late)).await, Handoff::NoTarget);
    // By the caller's clock, server time is at most a second past the
    // renewal: "w2" takes the job.
    let moved = hand(Some(renewed + 1_000)).await;
    assert!(matches!(moved, Handoff::Ok { .. }), "{moved:?}");

    // The same for an entry moved on (a cleanup's, a forward).
    f.admitted("q", "w1").await;
    let queued = f.entry_ids("w1").await[0].clone();
    assert_eq!(
        f.move_entry_judged(&queued, "w1", "w2", Some(late)).await,
        Moved::NoTarget
    );
    assert_eq!(
        f.move_entry_judged(&queued, "w1", "w2", Some(renewed + 1_000))
            .await,
        Moved::Ok
    );
}

#[tokio::test]
async fn a_target_is_answered_with_the_entries_queued_in_its_inbox() {
    let f = &r_runs_on_w1_beside("w2").await;
    let s = &f.store;
    let queued = |n: usize| async move {
        for i in 0..n {
            let _: String = s
                .client
                .xadd(
                    f.inbox("w2"),
                    false,
                    None,
                    "*",
                    vec![("start", format!("e{i}"))],
                )
                .await
                .unwrap();
        }
    };
    queued(3).await;
    assert_eq!(
        s.targets_current(&asked(f, &["w2", "w-none"]), TTL)
            .await
            .unwrap(),
        vec![Some(3), None],
        "a rebalance stops jobs for an owner by how many entries wait for it"
    );
    queued(2).await;
    assert_eq!(
        s.targets_current(&asked(f, &["w2"]), TTL).await.unwrap(),
        vec![Some(5)]
    );
}
