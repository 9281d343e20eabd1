//! Streams across Redis going back in time: a reader whose cursor is past
//! the restored stream reads on from its newest entry instead of stalling;
//! behind Sentinel, a sink and a reader carry on across a failover (`SIGKILL`
//! of the primary), every event added after it delivered, acked events
//! delivered at most once more.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_streaming::{Reader, ReaderOptions, Sink, SinkOptions, StartPosition};
use flotilla_testkit::{Sentinels, wait_until};
use fred::prelude::*;
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_reads_on_when_the_stream_goes_back_past_its_cursor() {
    let (mut server, client) = support::redis().await;
    let s = support::stream(&client, "goes-back");
    let reader = Reader::new(
        &client,
        &[&s],
        ReaderOptions::default().block(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let mut ev = reader.events();
    let first = s.add("e", "kept").await.unwrap();
    assert_eq!(support::next(&mut ev, "kept").await.id, first);
    let snapshot = tokio::task::block_in_place(|| server.save_snapshot()).unwrap();
    // An entry with an id far ahead (as from a primary whose clock ran
    // ahead), read, then lost with the rollback.
    let ahead = format!("{}-0", u64::MAX / 2);
    let _: String = client
        .xadd(s.key(), false, None, ahead.as_str(), vec![("junk", "1")])
        .await
        .unwrap();
    let lost = s.add("e", "lost").await.unwrap();
    assert_eq!(support::next(&mut ev, "lost").await.id, lost); // the cursor is past now
    tokio::task::block_in_place(|| server.roll_back(&snapshot)).unwrap();
    let after = loop {
        match s.add("e", "after").await {
            Ok(id) => break id,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let e = support::next(&mut ev, "entry added after the rollback").await;
    assert_eq!(e.id, after);
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_sink_and_reader_carry_on() {
    let mut ha = tokio::task::block_in_place(Sentinels::start)
        .expect("redis-sentinel must be installed (apt-get install redis-sentinel redis-server)");
    let client = flotilla_testkit::client(&ha.url()).await.unwrap();
    let s = support::stream(&client, "failover");
    let reader = Reader::new(
        &client,
        &[&s],
        ReaderOptions::default().block(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let mut read = reader.events();
    let name = flotilla_testkit::unique_name("sink");
    let sink = Arc::new(
        Sink::join(
            &client,
            &name,
            &[&s],
            SinkOptions::default()
                .start(StartPosition::Oldest)
                .block(Duration::from_millis(500))
                .ack_grace(Duration::from_secs(2)),
        )
        .await
        .unwrap(),
    );
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let consumer = {
        let (sink, seen) = (sink.clone(), seen.clone());
        tokio::spawn(async move {
            let mut events = sink.events();
            while let Some(e) = events.next().await {
                // An ack lost with the failover is fine: the event comes back once.
                let _ = sink.ack(&e).await;
                *seen.lock().unwrap().entry(e.id.clone()).or_default() += 1;
            }
        })
    };
    let mut before = Vec::new();
    for i in 0..30 {
        before.push(s.add("e", i.to_string()).await.unwrap());
    }
    for id in &before {
        assert_eq!(&support::next(&mut read, "before").await.id, id);
    }
    wait_until(Duration::from_secs(5), "sink got the first 30", || async {
        seen.lock().unwrap().len() == 30
    })
    .await
    .unwrap();

    let old = ha.kill_primary().unwrap();
    let promoted =
        tokio::task::block_in_place(|| ha.wait_for_failover(old, Duration::from_secs(20)));
    promoted.unwrap();
    let mut after = Vec::new();
    for i in 30..60 {
        let id = loop {
            match s.add("e", i.to_string()).await {
                Ok(id) => break id,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        after.push(id);
    }
    for id in &after {
        let e = support::next(&mut read, "after the failover").await;
        assert_eq!(&e.id, id, "the reader neither skips nor repeats");
    }
    wait_until(
        Duration::from_secs(15),
        "sink got every event after the failover",
        || {
            let done = after.iter().all(|id| seen.lock().unwrap().contains_key(id));
            async move { done }
        },
    )
    .await
    .unwrap();
    for (id, n) in seen.lock().unwrap().iter() {
        assert!(*n <= 2, "{id} delivered {n} times");
        if after.contains(id) {
            assert_eq!(*n, 1, "{id}, added after the failover, delivered {n} times");
        }
    }
    sink.close().await;
    reader.close().await;
    consumer.await.unwrap();
}
