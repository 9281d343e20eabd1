//! Keep-alive renewals (`keepalive.lua`): what a renewal of a deaf node
//! renews, and how many change messages a renewal of many workers sends.

use super::*;

/// A renewal from a node that has heard no reply for over a TTL (its
/// link fails one way) renews nothing; one that heard a reply within the
/// TTL renews as usual.
#[tokio::test]
async fn a_renewal_of_a_node_that_hears_nothing_renews_nothing() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let ttl_ms = TTL.as_millis() as u64;
    let first = s
        .keepalive("n-test", TTL, 0, ["w1".to_string()])
        .await
        .unwrap();
    assert!(!first.unheard);
    let ka_hash = s.maps.keepalive.keys_info().hash.clone();
    let stamp = || async {
        let v: Option<String> = s.client.hget(ka_hash.as_str(), "w1").await.unwrap();
        v
    };
    let renewed = stamp().await;
    assert_eq!(renewed, Some(first.server_ms.to_string()));

    let heard_long_ago = first.server_ms - ttl_ms - 1;
    let refused = s
        .keepalive("n-test", TTL, heard_long_ago, ["w1".to_string()])
        .await
        .unwrap();
    assert!(refused.unheard, "renewed for a node deaf for over a TTL");
    assert!(refused.unknown.is_empty(), "{:?}", refused.unknown);
    assert!(refused.server_ms >= first.server_ms);
    assert_eq!(stamp().await, renewed, "the keep-alive moved on");

    let heard_recently = refused.server_ms - ttl_ms + 1_000;
    let renewal = s
        .keepalive("n-test", TTL, heard_recently, ["w1".to_string()])
        .await
        .unwrap();
    assert!(!renewal.unheard);
    assert_eq!(stamp().await, Some(renewal.server_ms.to_string()));
}

#[tokio::test]
async fn a_renewal_publishes_one_message_per_map_whatever_the_worker_count() {
    let f = &fixture().await;
    let s = &f.store;
    let workers: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    for w in &workers {
        f.register(w).await;
    }
    let revision = |key: String| async move {
        let rev: Option<String> = fred::prelude::KeysInterface::get(&s.client, key)
            .await
            .unwrap();
        rev.and_then(|r| r.parse::<u64>().ok()).unwrap_or(0)
    };
    let ka_rev = s.maps.keepalive.keys_info().revision.clone();
    let nodes_rev = s.maps.nodes.keys_info().revision.clone();
    // A first renewal creates the nodes map's revision (it starts at server
    // time); the second is measured.
    s.keepalive("n-test", TTL, 0, workers.clone())
        .await
        .unwrap();
    let (ka_before, nodes_before) = (
        revision(ka_rev.clone()).await,
        revision(nodes_rev.clone()).await,
    );
    let renewal = s
        .keepalive("n-test", TTL, 0, workers.clone())
        .await
        .unwrap();
    assert!(renewal.unknown.is_empty(), "{:?}", renewal.unknown);
    // Every publish bumps its map's revision by one.
    assert_eq!(revision(ka_rev).await, ka_before + 1, "keepalive map");
    assert_eq!(revision(nodes_rev).await, nodes_before + 1, "nodes map");
    let now = renewal.server_ms.to_string();
    s.maps
        .keepalive
        .wait_for(Duration::from_secs(10), |m| {
            workers
                .iter()
                .all(|w| m.get(w).as_deref() == Some(now.as_str()))
        })
        .await
        .expect("the replica applies the batched renewal");
}
