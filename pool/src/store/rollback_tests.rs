//! What a worker's rollback recovery writes: a stop it carried out stands
//! again (`stop_stands.lua`).

use super::*;

#[tokio::test]
async fn a_stop_stands_again_over_an_older_state_but_not_over_a_newer_run() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    // The older state shows the stopped run pending (admitted, not started).
    let stopped = f.admitted("s1", "w1").await;
    assert_eq!(
        s.stop_stands("s1", stopped).await.unwrap(),
        StopStands::Removed
    );
    let (_, record, guard) = s.job_records("s1").await.unwrap();
    assert!(record.is_none() && guard.is_none(), "{record:?} {guard:?}");
    // No copy of the stopped run re-asserts over it.
    let stored = codec::stored(0, &body("s1"));
    assert_eq!(
        s.reassert("s1", "w1", stopped, stored, Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Lost
    );
    // A dispatch after the stop (a newer token) is left alone.
    let newer = f.admitted("s2", "w1").await;
    assert_eq!(
        s.stop_stands("s2", newer - 1).await.unwrap(),
        StopStands::Newer
    );
    assert!(s.job_records("s2").await.unwrap().2.is_some(), "guard kept");
    assert_eq!(s.stop_stands("nothing", 5).await.unwrap(), StopStands::None);
}
