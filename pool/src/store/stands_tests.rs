//! What a worker's reconcile releases after Redis went back in time
//! (`release_stale.lua`): a stale record naming it, and the payload with
//! it unless the job may still need it.

use super::*;

/// A record Redis went back to, of a job its worker passed on since,
/// goes without the job's payload even where the key's counter does not
/// show the hand-off (made on a primary that stalled through its
/// failover): the payload may be the job's only copy.
#[tokio::test]
async fn a_record_of_a_job_passed_on_since_goes_without_its_payload() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    for (key, handed_on, expected) in [
        ("passed", true, Released::Kept),
        ("stopped", false, Released::Released),
    ] {
        let token = f.admitted(key, "w1").await;
        s.maps.pending_map().delete(key).await.unwrap();
        let record = format!("w1 {token}");
        s.maps.jobs_map().set(key, &record).await.unwrap();
        assert_eq!(
            s.release_stale(key, &record, handed_on).await.unwrap(),
            expected,
            "{key}"
        );
        assert!(
            s.job_records(key).await.unwrap().1.is_none(),
            "{key}: record gone"
        );
        assert_eq!(
            s.payload(key).await.unwrap().is_some(),
            handed_on,
            "{key}: payload"
        );
    }
}
