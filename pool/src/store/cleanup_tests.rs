//! The dead-worker cleanup while the pool recovers from a data loss or a
//! rollback (`claim_cleanup.lua`): no cleanup is claimed until every node
//! has made its stops stand.

use super::*;

#[tokio::test]
async fn no_cleanup_is_claimed_while_the_pool_recovers() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    s.maps.keepalive.set("w1", "1000").await.unwrap(); // silent for ages
    // The older state Redis went back to may show the dead worker owning a
    // run stopped since, whose stop is not made to stand yet.
    s.begin_recovery(TTL).await.unwrap();
    let claim = s.claim_cleanup("w1", "n-test", TTL).await.unwrap();
    assert_eq!(claim.status, ClaimStatus::Recovering);
    assert!(claim.silent_ms > TTL.as_millis() as u64, "{claim:?}");
    assert_eq!(s.maps.cleanup.get("w1"), None, "no claim taken");
}
