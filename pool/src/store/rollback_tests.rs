//! What a worker's rollback recovery writes: a stop it carried out stands
//! again (`stop_stands.lua`), and a job it handed off comes back as an
//! orphan where nothing newer happened to it (`handoff_stands.lua`).

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

#[tokio::test]
async fn a_hand_off_stands_again_only_where_nothing_newer_happened() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let stored = |key: &str| codec::stored(0, &body(key));
    // Redis went back to before the hand-off and before the job: nothing of
    // it is left. Its payload comes back, once.
    assert_eq!(
        s.handoff_stands("h1", 50, stored("h1")).await.unwrap(),
        HandoffStands::Restored
    );
    assert!(s.payload("h1").await.unwrap().is_some());
    assert_eq!(
        s.handoff_stands("h1", 50, stored("h1")).await.unwrap(),
        HandoffStands::Kept
    );
    // Pending (admitted again, or the hand-off's own guard survived): kept.
    let admitted = f.admitted("h2", "w1").await;
    assert_eq!(
        s.handoff_stands("h2", admitted, stored("h2"))
            .await
            .unwrap(),
        HandoffStands::Kept
    );
    // A newer token was issued since the hand-off (a stop's tombstone, a
    // newer start): nothing comes back.
    let newer = f.admitted("h3", "w1").await;
    s.stop_stands("h3", newer).await.unwrap();
    assert_eq!(
        s.handoff_stands("h3", newer - 1, stored("h3"))
            .await
            .unwrap(),
        HandoffStands::Superseded
    );
    assert!(s.payload("h3").await.unwrap().is_none());
}
