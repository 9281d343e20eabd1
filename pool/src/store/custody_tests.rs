//! The scripts a close leaves its memory with (`entrust.lua`) and looks
//! whether it was read (`entrusted_left.lua`).

use super::*;

#[tokio::test]
async fn a_keep_entry_goes_to_an_active_worker_and_counts_as_read_once_gone() {
    let f = &fixture().await;
    let s = &f.store;
    let entry = Bytes::from_static(b"\x01kept");
    // Not registered (yet): nothing is left.
    assert_eq!(
        s.entrust("w1", &f.inbox("w1"), entry.clone(), TTL)
            .await
            .unwrap(),
        Entrusted::NoTarget
    );
    f.register("w1").await;
    f.register("w2").await;
    let Entrusted::Left { id, identity } = s
        .entrust("w1", &f.inbox("w1"), entry.clone(), TTL)
        .await
        .unwrap()
    else {
        panic!("not left with an active worker");
    };
    let Entrusted::Left { id: id2, .. } =
        s.entrust("w2", &f.inbox("w2"), entry, TTL).await.unwrap()
    else {
        panic!("not left with an active worker");
    };
    assert_eq!(f.entry_ids("w1").await, std::slice::from_ref(&id));
    let left = [
        (f.inbox("w1"), id.clone(), "w1".to_string()),
        (f.inbox("w2"), id2.clone(), "w2".to_string()),
    ];
    // Both unread, their workers active; the same identity.
    let (now, unread) = s.entrusted_left(&left, TTL).await.unwrap();
    assert_eq!(now, identity);
    assert_eq!(unread, [(0, true), (1, true)]);
    // w2 leaves (a cleanup claim on itself): its entry is unread by a
    // worker that will not read it. w1 read its entry (deleted it).
    let _: i64 = s
        .client
        .hset(
            s.maps.cleanup.keys_info().hash.clone(),
            ("w2", "n-test closing"),
        )
        .await
        .unwrap();
    let _: i64 = s.client.xdel(f.inbox("w1"), &id).await.unwrap();
    assert_eq!(
        s.entrusted_left(&left, TTL).await.unwrap(),
        (identity.clone(), vec![(1, false)])
    );
    // A worker silent for over a TTL (its process died, nobody cleaned
    // it up) will not read what is left with it.
    let _: i64 = s
        .client
        .hset(s.maps.keepalive.keys_info().hash.clone(), ("w1", "0"))
        .await
        .unwrap();
    assert_eq!(
        s.entrust("w1", &f.inbox("w1"), Bytes::from_static(b"\x01kept"), TTL)
            .await
            .unwrap(),
        Entrusted::Silent
    );
    // A loss: a new identity, so a gone entry may have been taken unread.
    let _: () = s.client.flushall(false).await.unwrap();
    let (after, unread) = s.entrusted_left(&left, TTL).await.unwrap();
    assert_ne!(after, identity);
    assert!(unread.is_empty());
    // While the pool recovers from that loss, a worker Redis does not know
    // (yet) may register again within a renewal: the close waits for it.
    assert_eq!(
        s.entrust("w1", &f.inbox("w1"), Bytes::from_static(b"\x01kept"), TTL)
            .await
            .unwrap(),
        Entrusted::Recovering
    );
    // So may one known only from before the loss, silent since.
    f.register("w1").await;
    let _: i64 = s
        .client
        .hset(s.maps.keepalive.keys_info().hash.clone(), ("w1", "0"))
        .await
        .unwrap();
    assert_eq!(
        s.entrust("w1", &f.inbox("w1"), Bytes::from_static(b"\x01kept"), TTL)
            .await
            .unwrap(),
        Entrusted::Recovering
    );
    // A worker leaving (a cleanup claim) is not waited for.
    let _: i64 = s
        .client
        .hset(
            s.maps.cleanup.keys_info().hash.clone(),
            ("w2", "n-test closing"),
        )
        .await
        .unwrap();
    f.register("w2").await;
    assert_eq!(
        s.entrust("w2", &f.inbox("w2"), Bytes::from_static(b"\x01kept"), TTL)
            .await
            .unwrap(),
        Entrusted::NoTarget
    );
}
