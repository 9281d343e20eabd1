//! Stream: add, options, remove, len, destroy, TTL, names, Lua prelude.
mod support;

use std::time::Duration;

use flotilla_streaming::{
    AddOptions, Error, Reader, ReaderOptions, StartPosition, Stream, StreamOptions, StreamTtl,
};
use fred::prelude::*;
use fred::types::scripts::Script;

#[tokio::test]
async fn add_remove_len_destroy() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "basic");
    assert_eq!(s.len().await.unwrap(), 0);
    let a = s.add("a", "1").await.unwrap();
    let b = s.add("b", "2").await.unwrap();
    assert_eq!(s.len().await.unwrap(), 2);
    assert_eq!(s.remove(&[a.as_str(), "1-1"]).await.unwrap(), 1);
    assert_eq!(s.len().await.unwrap(), 1);
    s.destroy().await.unwrap();
    assert_eq!(s.len().await.unwrap(), 0);
    // only_if_exists on an absent stream adds nothing
    let none = s
        .add_with("c", "3", AddOptions::default().only_if_exists(true))
        .await
        .unwrap();
    assert_eq!(none, None);
    assert_eq!(s.len().await.unwrap(), 0);
    assert!(!b.is_empty());
}

#[tokio::test]
async fn key_layout_and_names() {
    let (_server, client) = support::redis().await;
    let s = Stream::new(
        &client,
        "inbox:w1",
        StreamOptions::default().hash_tag("pool"),
    )
    .unwrap();
    assert_eq!(s.key(), "fl:{pool}:stream:inbox:w1");
    let s = Stream::new(&client, "solo", StreamOptions::default()).unwrap();
    assert_eq!(s.key(), "fl:{solo}:stream");
    for bad in ["", "a{b", "c}d", "x\ny"] {
        assert!(matches!(
            Stream::new(&client, bad, StreamOptions::default()),
            Err(Error::InvalidName { .. })
        ));
    }
    assert!(Stream::new(&client, &"x".repeat(129), StreamOptions::default()).is_err());
}

#[tokio::test]
async fn max_len_trims_approximately() {
    let (_server, client) = support::redis().await;
    let name = flotilla_testkit::unique_name("trim");
    let s = Stream::new(&client, &name, StreamOptions::default().max_len(100)).unwrap();
    for i in 0..1000 {
        s.add("e", i.to_string()).await.unwrap();
    }
    let len = s.len().await.unwrap();
    assert!((100..300).contains(&len), "len {len}");
    // per-add override
    for i in 0..1000 {
        s.add_with("e", i.to_string(), AddOptions::default().max_len(10))
            .await
            .unwrap();
    }
    assert!(s.len().await.unwrap() < 120);
}

#[tokio::test]
async fn ttl_absolute_and_sliding() {
    let (_server, client) = support::redis().await;
    let abs = Stream::new(
        &client,
        &flotilla_testkit::unique_name("abs"),
        StreamOptions::default().ttl(StreamTtl::Absolute(Duration::from_secs(100))),
    )
    .unwrap();
    abs.add("a", "1").await.unwrap();
    let _: bool = client.pexpire(abs.key(), 50_000, None).await.unwrap();
    abs.add_with("a", "2", AddOptions::default().topic("t"))
        .await
        .unwrap();
    let pttl: i64 = client.pttl(abs.key()).await.unwrap();
    assert!(
        pttl <= 50_000 && pttl > 0,
        "absolute TTL must not be extended: {pttl}"
    );

    let sliding = Stream::new(
        &client,
        &flotilla_testkit::unique_name("slide"),
        StreamOptions::default().ttl(StreamTtl::Sliding(Duration::from_secs(100))),
    )
    .unwrap();
    sliding.add("a", "1").await.unwrap();
    let _: bool = client.pexpire(sliding.key(), 50_000, None).await.unwrap();
    sliding.add("a", "2").await.unwrap();
    let pttl: i64 = client.pttl(sliding.key()).await.unwrap();
    assert!(pttl > 90_000, "sliding TTL must be renewed: {pttl}");
    // only_if_exists through the script path
    sliding.destroy().await.unwrap();
    let none = sliding
        .add_with("a", "3", AddOptions::default().only_if_exists(true))
        .await
        .unwrap();
    assert_eq!(none, None);
}

#[tokio::test]
async fn lua_prelude_from_an_external_script() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "lua");
    let reader = Reader::new(
        &client,
        &[&s],
        ReaderOptions::default().start(StartPosition::Oldest),
    )
    .await
    .unwrap();
    let mut events = reader.events();
    let src = format!(
        "{}\nlocal id = stream_add(KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])\n\
         local id2 = stream_add(KEYS[1], 'plain', ARGV[2], 1000)\n\
         local absent = stream_add_if_exists(KEYS[2], 'x', 'y', 0)\n\
         local extra = stream_add(KEYS[1], 'gone', 'z', 0)\n\
         stream_remove(KEYS[1], extra)\n\
         return {{id, id2, tostring(absent)}}",
        flotilla_streaming::lua::PRELUDE
    );
    let script = Script::from_lua(src);
    let payload = bytes::Bytes::from_static(&[0xff, 0x00, 0xfe]);
    let ids: Vec<String> = script
        .evalsha_with_reload(
            &client,
            vec![s.key().to_string(), "fl:{lua-absent}:stream".to_string()],
            vec![
                Value::from("scripted"),
                Value::Bytes(payload.clone()),
                Value::from("topic-a"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(ids[2], "false");
    let e = support::next(&mut events, "scripted event").await;
    assert_eq!(
        (e.id.as_str(), e.name.as_str()),
        (ids[0].as_str(), "scripted")
    );
    assert_eq!(e.topic.as_deref(), Some("topic-a"));
    assert_eq!(e.payload, payload);
    let e = support::next(&mut events, "second scripted event").await;
    assert_eq!(
        (e.id.as_str(), e.name.as_str(), e.topic),
        (ids[1].as_str(), "plain", None)
    );
    assert_eq!(s.len().await.unwrap(), 2);
    reader.close().await;
}
