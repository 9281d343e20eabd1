//! A cleanup that finds no other worker in its ring waits a while for one
//! before it releases a dead worker's jobs. Right after Redis refused
//! writes (or was out of reach) for over a TTL, every worker looks dead at
//! once and cleaners claim them all, which empties their rings until the
//! live workers' renewals clear those claims. A job released then waits
//! for the orphan sweep, a grace later, with Redis its only holder (chaos
//! soak seed 1439: a dead worker's 18 jobs released 100 ms after Redis took
//! writes again, lost to an empty restart 1.4 s later).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_hands_jobs_to_a_worker_whose_claim_clears_soon() {
    let server = RedisServer::start().unwrap();
    let (client, a, b, wa, wb, _) = two_nodes(&server, "empty-ring").await;
    let key = key_placed_on(&a, &wa).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    assert!(wa.inner.jobs.remove(&key).is_some(), "the job runs on wa");

    // `wa` is dead; `wb` only looks it (a claim made in a spell of refused
    // writes, which its next renewal would clear), so `b`'s ring is empty.
    // Right after a renewal of `b`: the next comes a third of a TTL later.
    wait_until(Duration::from_secs(10), "b just renewed", || {
        let fresh = b.inner.last_renewal.borrow().elapsed() < Duration::from_millis(300);
        async move { fresh }
    })
    .await
    .unwrap();
    let now_ms = crate::store::call::server_time_ms(&client).await.unwrap();
    let cleanup = &b.inner.store.maps.cleanup;
    let claim = format!("{} {now_ms}", b.inner.id);
    cleanup.set(wa.id(), &claim).await.unwrap();
    cleanup
        .set(wb.id(), &format!("n-elsewhere {now_ms}"))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(5),
        "b's ring shows no worker but wa",
        || {
            b.inner.refresh_ring();
            let empty = b.inner.ring.load().owner_excluding(&key, wa.id()).is_none();
            async move { empty }
        },
    )
    .await
    .unwrap();
    // The claim on `wb` goes a moment after the cleanup of `wa` begins.
    let clearing = {
        let b = b.clone();
        let wb_id = wb.id().to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            b.inner.store.maps.cleanup.delete(&wb_id).await.unwrap();
        })
    };
    assert_eq!(
        b.inner.clean_worker(wa.id()).await.unwrap(),
        crate::cleanup::Claim::Held
    );
    clearing.await.unwrap();
    // Handed to `wb`, not left to the orphan sweep: a guard for its start.
    let guard: Option<String> = client
        .hget(
            b.inner.store.maps.pending_map().keys_info().hash.as_str(),
            key.as_str(),
        )
        .await
        .unwrap();
    let started = wb.job_token(&key).is_some();
    assert!(
        guard.is_some() || started,
        "the cleanup released the job to the orphan sweep instead of handing it to wb"
    );
    wait_until(Duration::from_secs(5), "the job runs on wb", || async {
        wb.job_token(&key).is_some()
    })
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
