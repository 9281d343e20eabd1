//! Sink: exactly-one delivery across members, redelivery after the grace
//! period, stale members, hand-over on close, streams added and removed,
//! Redis restart, malformed entries.
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_streaming::{Event, Sink, SinkOptions, StartPosition, Stream};
use flotilla_testkit::{ServerOptions, wait_until};
use fred::prelude::*;
use futures::StreamExt;

type Seen = Arc<Mutex<HashMap<String, Vec<String>>>>;

/// Consumes and acks every event of `sink`, recording id → members.
fn consume(sink: Arc<Sink>, seen: Seen) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = sink.events();
        while let Some(e) = events.next().await {
            sink.ack(&e).await.expect("ack");
            seen.lock()
                .unwrap()
                .entry(e.id.clone())
                .or_default()
                .push(sink.member_id().to_string());
        }
    })
}

fn opts() -> SinkOptions {
    SinkOptions::default().start(StartPosition::Oldest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_members_share_10k_events_exactly_once() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "fanin");
    let name = flotilla_testkit::unique_name("sink");
    let seen: Seen = Arc::default();
    let mut sinks = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let sink = Arc::new(
            Sink::join(&client, &name, &[&s], opts().max_events(50))
                .await
                .unwrap(),
        );
        tasks.push(consume(sink.clone(), seen.clone()));
        sinks.push(sink);
    }
    let mut ids = HashSet::new();
    for chunk in 0..100 {
        let adds = (0..100).map(|i| s.add("e", format!("{chunk}-{i}")));
        for id in futures::future::try_join_all(adds).await.unwrap() {
            ids.insert(id);
        }
    }
    assert_eq!(ids.len(), 10_000);
    wait_until(
        Duration::from_secs(20),
        "all 10,000 events consumed",
        || async { seen.lock().unwrap().len() == 10_000 },
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(5), "nothing pending", || async {
        support::pending_count(&client, s.key(), &name).await == 0
    })
    .await
    .unwrap();
    let seen = seen.lock().unwrap().clone();
    let mut per_member: HashMap<String, usize> = HashMap::new();
    for (id, members) in &seen {
        assert!(ids.contains(id));
        assert_eq!(members.len(), 1, "{id} delivered to {members:?}");
        *per_member.entry(members[0].clone()).or_default() += 1;
    }
    assert_eq!(per_member.len(), 3, "every member got work: {per_member:?}");
    for sink in &sinks {
        sink.close().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        support::consumer_names(&client, s.key(), &name)
            .await
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unacked_events_go_to_another_member() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "grace");
    let name = flotilla_testkit::unique_name("sink");
    let o = opts()
        .ack_grace(Duration::from_millis(500))
        .member_ttl(Duration::from_millis(900))
        .block(Duration::from_millis(300));
    // C reads, never acks and is dropped without close; then A reads and
    // never acks (but stays alive).
    let c = Sink::join(&client, &name, &[&s], o.clone()).await.unwrap();
    let c_id = c.member_id().to_string();
    let mut c_events = c.events();
    let mut c_ids = HashSet::new();
    for i in 0..10 {
        c_ids.insert(s.add("c", i.to_string()).await.unwrap());
    }
    for _ in 0..10 {
        assert!(c_ids.contains(&support::next(&mut c_events, "C reads").await.id));
    }
    drop(c);
    drop(c_events);
    let a = Sink::join(&client, &name, &[&s], o.clone()).await.unwrap();
    let mut a_events = a.events();
    let mut a_ids = HashSet::new();
    for i in 0..10 {
        a_ids.insert(s.add("a", i.to_string()).await.unwrap());
    }
    let mut a_got = HashSet::new();
    while !a_ids.is_subset(&a_got) {
        a_got.insert(support::next(&mut a_events, "A reads").await.id);
    }

    let b = Arc::new(Sink::join(&client, &name, &[&s], o.clone()).await.unwrap());
    let seen: Seen = Arc::default();
    let task = consume(b.clone(), seen.clone());
    wait_until(
        Duration::from_secs(10),
        "B gets A's and C's events",
        || async { seen.lock().unwrap().len() == 20 },
    )
    .await
    .unwrap();
    let got: HashSet<String> = seen.lock().unwrap().keys().cloned().collect();
    assert_eq!(got, a_ids.union(&c_ids).cloned().collect());
    assert_eq!(support::pending_count(&client, s.key(), &name).await, 0);
    // C (dropped) is removed; A (alive) keeps its consumer
    wait_until(Duration::from_secs(10), "C's consumer removed", || async {
        !support::consumer_names(&client, s.key(), &name)
            .await
            .contains(&c_id)
    })
    .await
    .unwrap();
    assert!(
        support::consumer_names(&client, s.key(), &name)
            .await
            .contains(&a.member_id().to_string())
    );
    let members_key = flotilla_rmap::MapKeys::new(&format!("sink:{name}"), Some(s.hash_tag()))
        .unwrap()
        .hash;
    wait_until(
        Duration::from_secs(10),
        "stale member left the registry",
        || async {
            let members: HashMap<String, String> = client.hgetall(&members_key).await.unwrap();
            !members.contains_key(&c_id)
        },
    )
    .await
    .unwrap();
    let members: HashMap<String, String> = client.hgetall(&members_key).await.unwrap();
    assert!(members.contains_key(a.member_id()) && members.contains_key(b.member_id()));
    drop(a_events);
    a.close().await;
    b.close().await;
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn close_hands_pending_events_over() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "handover");
    let name = flotilla_testkit::unique_name("sink");
    let o = opts()
        .ack_grace(Duration::from_secs(3))
        .member_ttl(Duration::from_secs(3));
    let a = Sink::join(&client, &name, &[&s], o.clone()).await.unwrap();
    let mut a_events = a.events();
    let mut ids = HashSet::new();
    for i in 0..5 {
        ids.insert(s.add("e", i.to_string()).await.unwrap());
    }
    for _ in 0..5 {
        support::next(&mut a_events, "A reads").await;
    }
    let b = Arc::new(Sink::join(&client, &name, &[&s], o).await.unwrap());
    let seen: Seen = Arc::default();
    let task = consume(b.clone(), seen.clone());
    let t0 = Instant::now();
    let a_id = a.member_id().to_string();
    a.close().await;
    assert!(a_events.next().await.is_none(), "A's events end on close");
    wait_until(
        Duration::from_secs(10),
        "B gets A's pending events",
        || async { seen.lock().unwrap().len() == 5 },
    )
    .await
    .unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "handed over before the grace period: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        seen.lock().unwrap().keys().cloned().collect::<HashSet<_>>(),
        ids
    );
    assert!(
        !support::consumer_names(&client, s.key(), &name)
            .await
            .contains(&a_id)
    );
    b.close().await;
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_added_and_removed_while_running() {
    let (_server, client) = support::redis().await;
    let tag = flotilla_testkit::unique_name("tag");
    let mk = |n: &str| {
        Stream::new(
            &client,
            n,
            flotilla_streaming::StreamOptions::default().hash_tag(tag.clone()),
        )
        .unwrap()
    };
    let s1 = mk("one");
    let s2 = mk("two");
    let name = flotilla_testkit::unique_name("sink");
    let sink = Sink::join(&client, &name, &[&s1], opts()).await.unwrap();
    let mut ev = sink.events();
    s1.add("a", "").await.unwrap();
    let e = support::next(&mut ev, "s1").await;
    sink.ack(&e).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = Instant::now();
    sink.add_stream(&s2).await.unwrap();
    s2.add("b", "").await.unwrap();
    let e = support::next(&mut ev, "s2").await;
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "add_stream took {:?}",
        t0.elapsed()
    );
    assert_eq!(e.stream, s2.name());
    sink.ack(&e).await.unwrap();
    sink.remove_stream(s1.name()).await.unwrap();
    s1.add("gone", "").await.unwrap();
    s2.add("c", "").await.unwrap();
    let e = support::next(&mut ev, "after remove").await;
    assert_eq!(e.name, "c");
    sink.ack(&e).await.unwrap();
    support::none_within(&mut ev, Duration::from_millis(200)).await;
    sink.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn survives_redis_restart_without_losing_acked_progress() {
    let (mut server, client) = support::redis_with(ServerOptions::default().aof(true)).await;
    let s = support::stream(&client, "restart");
    let name = flotilla_testkit::unique_name("sink");
    let sink = Arc::new(
        Sink::join(
            &client,
            &name,
            &[&s],
            opts().block(Duration::from_millis(500)),
        )
        .await
        .unwrap(),
    );
    let seen: Seen = Arc::default();
    let task = consume(sink.clone(), seen.clone());
    for i in 0..50 {
        s.add("e", i.to_string()).await.unwrap();
    }
    wait_until(Duration::from_secs(5), "first 50", || async {
        seen.lock().unwrap().len() == 50
    })
    .await
    .unwrap();
    server.restart().unwrap();
    for i in 50..100 {
        while s.add("e", i.to_string()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    wait_until(Duration::from_secs(10), "all 100", || async {
        seen.lock().unwrap().len() == 100
    })
    .await
    .unwrap();
    for (id, members) in seen.lock().unwrap().iter() {
        assert_eq!(members.len(), 1, "{id} delivered again after restart");
    }
    assert_eq!(support::pending_count(&client, s.key(), &name).await, 0);
    sink.close().await;
    task.await.unwrap();
}

#[tokio::test]
async fn malformed_entries_are_acked_and_skipped() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "bad");
    let name = flotilla_testkit::unique_name("sink");
    let sink = Sink::join(&client, &name, &[&s], opts()).await.unwrap();
    let mut ev = sink.events();
    let _: String = client
        .xadd(s.key(), false, None, "*", vec![("junk", "1")])
        .await
        .unwrap();
    let good = s.add("good", &b"\xff\x00"[..]).await.unwrap();
    let e: Event = support::next(&mut ev, "good").await;
    assert_eq!(e.id, good);
    assert_eq!(&e.payload[..], b"\xff\x00");
    sink.ack(&e).await.unwrap();
    assert_eq!(support::pending_count(&client, s.key(), &name).await, 0);
    sink.close().await;
}
