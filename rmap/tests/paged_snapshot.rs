//! A map larger than a snapshot page is read in pages while writers go on
//! (`MapOptions::snapshot_page`): the replica ends equal to Redis, whether
//! the changes made between pages were sets, new keys or deletes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use flotilla_rmap::{Map, MapEventKind, MapOptions};
use flotilla_testkit::unique_name;
use fred::prelude::*;
use futures::StreamExt;
use support::{converged, env, join};

const KEYS: usize = 3_000;
/// Small pages: the read takes many round trips, so writes land between them.
const PAGE: usize = 25;

/// Fills `name` with `KEYS` keys through one map handle.
async fn fill(map: &Map) {
    futures::stream::iter(0..KEYS)
        .map(|i| async move { map.set(&format!("k{i}"), "initial").await.unwrap() })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
}

/// Writes until `stop`: overwrites, deletes (of keys the pages may have
/// read already or not yet) and new keys. Returns how many writes it made.
fn churn(map: Map, stop: Arc<AtomicBool>, writes: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            // A spread over the whole key space, so changes hit pages both
            // before and after they are read.
            let k = (i * 7919) % KEYS;
            match i % 3 {
                0 => {
                    map.set(&format!("k{k}"), &format!("v{i}")).await.unwrap();
                }
                1 => {
                    map.delete(&format!("k{k}")).await.unwrap();
                }
                _ => {
                    map.set(&format!("new{i}"), "n").await.unwrap();
                }
            }
            writes.fetch_add(1, Ordering::Relaxed);
            i += 1;
        }
    })
}

#[tokio::test]
async fn a_map_read_in_pages_while_it_changes_ends_equal_to_redis() {
    let env = env().await;
    let name = unique_name("paged");
    let writer = join(&env.client, &name).await;
    fill(&writer).await;

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicUsize::new(0));
    let churner = churn(writer.clone(), stop.clone(), writes.clone());
    // Writes are going on before the read starts.
    while writes.load(Ordering::Relaxed) < 50 {
        tokio::task::yield_now().await;
    }
    let before = writes.load(Ordering::Relaxed);
    // A buffer no test run fills, so that a Resynced event means a resync.
    let options = MapOptions::default()
        .snapshot_page(PAGE)
        .event_buffer(1 << 20);
    let reader = Map::join(&env.client, &name, options).await.unwrap();
    let during_join = writes.load(Ordering::Relaxed) - before;
    let mut events = reader.subscribe();
    let resyncs = tokio::spawn(async move {
        let mut resyncs = 0;
        while let Some(event) = events.next().await {
            if event.kind == MapEventKind::Resynced {
                resyncs += 1;
            }
        }
        resyncs
    });
    // A resync reads in pages too.
    let before = writes.load(Ordering::Relaxed);
    reader.resync().await.unwrap();
    let during_resync = writes.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    churner.await.unwrap();

    assert!(
        during_join > 0 && during_resync > 0,
        "writes landed between pages (join: {during_join}, resync: {during_resync})"
    );
    // Equal to Redis once the last change arrived, with deleted keys gone
    // even when a page read them before their delete.
    converged(&env.client, &reader).await;
    let hash = reader.keys_info().hash.clone();
    let len: usize = env.client.hlen(hash.as_str()).await.unwrap();
    assert_eq!(reader.len(), len);
    reader.close().await;
    // The changes made during each read followed it without a gap: the
    // replica never had to read the map again on its own.
    assert_eq!(resyncs.await.unwrap(), 1, "only the resync asked for");
    writer.close().await;
}

#[tokio::test]
async fn a_map_that_fits_in_a_page_is_read_at_once() {
    let env = env().await;
    let name = unique_name("one-page");
    let writer = join(&env.client, &name).await;
    for i in 0..10 {
        writer.set(&format!("k{i}"), "v").await.unwrap();
    }
    let reader = Map::join(&env.client, &name, MapOptions::default().snapshot_page(10))
        .await
        .unwrap();
    assert_eq!(reader.len(), 10);
    converged(&env.client, &reader).await;
    assert!(matches!(
        Map::join(&env.client, &name, MapOptions::default().snapshot_page(0)).await,
        Err(flotilla_rmap::Error::InvalidOptions(_))
    ));
    reader.close().await;
    writer.close().await;
}
