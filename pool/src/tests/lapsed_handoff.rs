//! A rebalance hand-off of a job its worker ran past its lease.
//!
//! A worker whose lease lapsed (its process paused, its link cut) may have
//! been cleaned up meanwhile, and its job moved, run and stopped elsewhere.
//! After a rollback that its node has not noticed yet, Redis can name the
//! worker the job's owner again, so the record no longer shows the move.
//! A hand-off made on that record issues a new run of a job that was
//! stopped (chaos soak seed 1406: job-0423 handed on 60 ms after its
//! worker's process came back from a pause and Redis from a rollback, and
//! started again after its stop had been answered `Ok`). A job run under a
//! lease that held cannot have been moved, and its record is its own.

use fred::prelude::HashesInterface;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_run_past_its_lease_is_not_handed_off_by_a_rebalance() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("lapsed-handoff");
    let (client, a, b, wa, wb, _handler_a) = two_nodes(&server, &name).await;
    // A key the ring places on wb that runs on wa, and that Redis records
    // as wa's: as a job whose worker was cleaned up while paused, and
    // which a rollback named wa's again.
    let key = key_placed_on(&a, &wb).await;
    let job = local_job(&key, 7);
    let jobs_hash = a.inner.store.maps.jobs_map().keys_info().hash.clone();
    let record = format!("{} 7", wa.id());
    let _: i64 = client
        .hset(&jobs_hash, (key.as_str(), record.as_str()))
        .await
        .unwrap();
    let _: i64 = client
        .hset(
            crate::keys::payloads(&name),
            (key.as_str(), crate::codec::stored(0, &job.raw_body)),
        )
        .await
        .unwrap();
    wa.inner.jobs.insert(key.clone(), job);
    // The process was paused past its lease; the watchdog has not acted
    // yet.
    wa.inner.lease_lost.store(true, Ordering::Release);

    a.inner.hand_off_local(&wa.inner, &key).await;

    let owner: Option<String> = client.hget(&jobs_hash, key.as_str()).await.unwrap();
    assert_eq!(
        owner.as_deref(),
        Some(record.as_str()),
        "handed on from a record the lapsed lease cannot vouch for"
    );
    let inbox = b.inner.inbox(wb.id()).unwrap();
    assert_eq!(inbox.len().await.unwrap(), 0, "a start entry at wb");
    assert!(
        wa.inner.runs_or_holds(&key).await,
        "the job is still wa's to settle once its lease is back"
    );
    wa.inner.lease_lost.store(false, Ordering::Release);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
