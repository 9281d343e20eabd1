//! Reader: start positions, fan-out, filters, adding and removing streams,
//! Redis restart, binary payloads, malformed entries.
mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use flotilla_streaming::{AddOptions, Reader, ReaderOptions, StartPosition, TopicFilter};
use flotilla_testkit::ServerOptions;
use fred::prelude::*;
use futures::StreamExt;

#[tokio::test]
async fn start_positions() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "start");
    let a = s.add("a", "").await.unwrap();
    let b = s.add("b", "").await.unwrap();
    // the next entry gets a later millisecond than a and b
    let later = b.clone();
    flotilla_testkit::wait_until(Duration::from_secs(2), "clock moves on", || {
        let client = client.clone();
        let later = later.clone();
        async move {
            let t: Vec<String> = client
                .custom(fred::cmd!("TIME"), Vec::<String>::new())
                .await
                .unwrap();
            let ms = t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000;
            ms > later.split('-').next().unwrap().parse::<u64>().unwrap()
        }
    })
    .await
    .unwrap();
    let c = s.add("c", "").await.unwrap();
    let c_time = {
        let probe = Reader::new(
            &client,
            &[&s],
            ReaderOptions::default().start(StartPosition::Id(b.clone())),
        )
        .await
        .unwrap();
        let mut ev = probe.events();
        let e = support::next(&mut ev, "c via id").await;
        assert_eq!(e.id, c);
        probe.close().await;
        assert!(ev.next().await.is_none(), "events end on close");
        e.created_at()
    };

    let cases = [
        (StartPosition::Newest, vec![]),
        (StartPosition::Oldest, vec![a.clone(), b.clone(), c.clone()]),
        (StartPosition::Id(a.clone()), vec![b.clone(), c.clone()]),
        (StartPosition::Time(c_time), vec![c.clone()]),
    ];
    let mut readers = Vec::new();
    for (start, _) in &cases {
        let r = Reader::new(
            &client,
            &[&s],
            ReaderOptions::default().start(start.clone()),
        )
        .await
        .unwrap();
        let ev = r.events();
        readers.push((r, ev));
    }
    let d = s.add("d", "").await.unwrap();
    for ((_, expected), (reader, events)) in cases.iter().zip(readers.iter_mut()) {
        let mut want = expected.clone();
        want.push(d.clone());
        for id in want {
            let e = support::next(events, "start position").await;
            assert_eq!(e.id, id);
        }
        reader.close().await;
    }
}

#[tokio::test]
async fn every_reader_and_subscriber_sees_every_event() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "fanout");
    let r1 = Reader::new(&client, &[&s], ReaderOptions::default())
        .await
        .unwrap();
    let r2 = Reader::new(&client, &[&s], ReaderOptions::default().max_events(7))
        .await
        .unwrap();
    let mut subs = vec![r1.events(), r1.events(), r2.events()];
    let mut ids = Vec::new();
    for i in 0..200 {
        ids.push(s.add("e", i.to_string()).await.unwrap());
    }
    for sub in &mut subs {
        for (i, id) in ids.iter().enumerate() {
            let e = support::next(sub, "fan-out").await;
            assert_eq!(&e.id, id);
            assert_eq!(e.payload, i.to_string());
            assert_eq!(e.stream, s.name());
        }
    }
    r1.close().await;
    r2.close().await;
}

#[tokio::test]
async fn topic_filters() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "topics");
    let filters = [
        (
            TopicFilter::All,
            vec!["none", "eu.paid", "us.paid", "eu.new"],
        ),
        (TopicFilter::Exact("eu.paid".into()), vec!["eu.paid"]),
        (
            TopicFilter::Pattern("eu.*".into()),
            vec!["eu.paid", "eu.new"],
        ),
        (
            TopicFilter::Pattern("??.paid".into()),
            vec!["eu.paid", "us.paid"],
        ),
        (TopicFilter::predicate(|t| t.is_none()), vec!["none"]),
    ];
    let mut readers = Vec::new();
    for (f, _) in &filters {
        let r = Reader::new(&client, &[&s], ReaderOptions::default().topic(f.clone()))
            .await
            .unwrap();
        let ev = r.events();
        readers.push((r, ev));
    }
    s.add("none", "").await.unwrap();
    for t in ["eu.paid", "us.paid", "eu.new"] {
        s.add_with(t, "", AddOptions::default().topic(t))
            .await
            .unwrap();
    }
    s.add("end", "").await.unwrap();
    s.add_with("end", "", AddOptions::default().topic("end"))
        .await
        .unwrap();
    for ((f, want), (r, ev)) in filters.iter().zip(readers.iter_mut()) {
        for name in want {
            let e = support::next(ev, "filtered").await;
            assert_eq!(&e.name, name, "filter {f:?}");
        }
        r.close().await;
        let rest: Vec<_> = ev.collect().await;
        assert!(
            rest.iter().all(|e| e.name == "end"),
            "filter {f:?} leaked {rest:?}"
        );
    }
}

#[tokio::test]
async fn add_and_remove_streams_while_running() {
    let (_server, client) = support::redis().await;
    let s1 = support::stream(&client, "run1");
    let s2 = support::stream(&client, "run2");
    let block = Duration::from_secs(5);
    let reader = Reader::new(&client, &[&s1], ReaderOptions::default().block(block))
        .await
        .unwrap();
    let mut ev = reader.events();
    s1.add("one", "").await.unwrap();
    assert_eq!(support::next(&mut ev, "s1").await.name, "one");
    // the reader is now blocked on s1 alone; adding s2 must not wait for the block
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = Instant::now();
    reader.add_stream(&s2, None).await.unwrap();
    s2.add("two", "").await.unwrap();
    let e = support::next(&mut ev, "s2").await;
    let took = t0.elapsed();
    assert_eq!((e.name.as_str(), e.stream.as_str()), ("two", s2.name()));
    assert!(
        took < Duration::from_millis(500),
        "add_stream took {took:?}"
    );
    // many streams in one reader
    let many: Vec<_> = (0..50)
        .map(|i| support::stream(&client, &format!("many{i}")))
        .collect();
    for s in &many {
        reader.add_stream(s, None).await.unwrap();
    }
    for s in &many {
        s.add("m", "").await.unwrap();
    }
    let mut seen = HashSet::new();
    for _ in 0..50 {
        seen.insert(support::next(&mut ev, "many").await.stream);
    }
    assert_eq!(seen.len(), 50);
    reader.remove_stream(s1.name()).await.unwrap();
    s1.add("gone", "").await.unwrap();
    s2.add("three", "").await.unwrap();
    assert_eq!(support::next(&mut ev, "after remove").await.name, "three");
    support::none_within(&mut ev, Duration::from_millis(200)).await;
    assert!(!reader.streams().contains(&s1.name().to_string()));
    reader.close().await;
    assert!(reader.add_stream(&s1, None).await.is_err());
}

#[tokio::test]
async fn binary_payloads_round_trip() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "bin");
    let reader = Reader::new(&client, &[&s], ReaderOptions::default())
        .await
        .unwrap();
    let mut ev = reader.events();
    let all: Vec<u8> = (0..=255u8).collect();
    let payloads = [
        vec![],
        all.clone(),
        vec![0xc3, 0x28, 0xff, 0x00],
        vec![0u8; 100_000],
    ];
    for p in &payloads {
        s.add("bin", p.clone()).await.unwrap();
    }
    for p in &payloads {
        let e = support::next(&mut ev, "binary").await;
        assert_eq!(&e.payload[..], &p[..]);
    }
    reader.close().await;
}

#[tokio::test]
async fn malformed_entries_are_skipped() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "bad");
    let reader = Reader::new(&client, &[&s], ReaderOptions::default())
        .await
        .unwrap();
    let mut ev = reader.events();
    let _: String = client
        .xadd(s.key(), false, None, "*", vec![("foo", "bar")])
        .await
        .unwrap();
    let _: String = client
        .xadd(s.key(), false, None, "*", vec![("n", "no-payload")])
        .await
        .unwrap();
    let _: String = client
        .xadd(
            s.key(),
            false,
            None,
            "*",
            vec![
                ("n", Value::Bytes(vec![0xff, 0xfe].into())),
                ("p", "x".into()),
            ],
        )
        .await
        .unwrap();
    let good = s.add("good", "ok").await.unwrap();
    let e = support::next(&mut ev, "good after bad").await;
    assert_eq!(e.id, good);
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_redis_restart() {
    let (mut server, client) = support::redis_with(ServerOptions::default().aof(true)).await;
    let s = support::stream(&client, "restart");
    let reader = Reader::new(
        &client,
        &[&s],
        ReaderOptions::default().block(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let mut ev = reader.events();
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(s.add("e", i.to_string()).await.unwrap());
    }
    for id in &ids[..] {
        assert_eq!(&support::next(&mut ev, "before").await.id, id);
    }
    server.restart().unwrap();
    let mut after = Vec::new();
    for i in 50..100 {
        let id = loop {
            match s.add("e", i.to_string()).await {
                Ok(id) => break id,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        after.push(id);
    }
    for id in &after {
        let e = support::next(&mut ev, "after restart").await;
        assert_eq!(&e.id, id, "no loss, no repeat");
    }
    reader.close().await;
}
