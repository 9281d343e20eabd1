//! Stale sink members: whether a member is stale is decided in Redis on
//! Redis server time, never from a member's (possibly lagging) replica of
//! the members map; a really dead member's events are still claimed.
mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use flotilla_rmap::MapKeys;
use flotilla_streaming::{Sink, SinkOptions, StartPosition, Stream};
use flotilla_testkit::{unique_name, wait_until};
use fred::prelude::*;
use fred::types::Value;
use support::mute_proxy::MuteProxy;

/// The Redis hash of a sink's members (rmap owns the layout).
fn members_hash(sink: &str, stream: &Stream) -> String {
    MapKeys::new(&format!("sink:{sink}"), Some(stream.hash_tag()))
        .expect("valid map name")
        .hash
}

/// Redis server time in ms.
async fn server_ms(client: &Client) -> u64 {
    let t: Vec<Value> = client
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .expect("TIME");
    let part = |i: usize| t.get(i).and_then(Value::as_u64).expect("TIME part");
    part(0) * 1000 + part(1) / 1000
}

/// Pending entries of one consumer.
async fn pending_of(client: &Client, key: &str, group: &str, consumer: &str) -> usize {
    let v: Value = client
        .xpending(key, group, ("-", "+", 1000, consumer))
        .await
        .expect("XPENDING");
    v.into_array().len()
}

/// Events from the oldest entry; the ack grace is far longer than any test,
/// so only stale-member cleanup can move an event to another member.
fn opts(ttl: Duration) -> SinkOptions {
    SinkOptions::default()
        .start(StartPosition::Oldest)
        .member_ttl(ttl)
        .ack_grace(Duration::from_secs(120))
        .block(Duration::from_millis(200))
}

/// A's replica of the members map stops hearing changes (its pub/sub
/// connection is held back by a proxy, its commands still work), so it
/// soon says B is stale, while B keeps renewing in Redis and holds events
/// it has read and not acked yet. A must neither take B's events nor
/// delete B's consumer; B acks them itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lagging_replica_does_not_take_a_live_members_events() {
    let (server, client) = support::redis().await;
    let proxy = MuteProxy::start(server.addr()).await;
    let client_a = flotilla_testkit::client(&proxy.url())
        .await
        .expect("connect through the proxy");
    let s = support::stream(&client, "lag");
    let name = unique_name("sink");
    let ttl = Duration::from_millis(600);

    let b = Sink::join(&client, &name, &[&s], opts(ttl)).await.unwrap();
    let b_id = b.member_id().to_string();
    let mut b_events = b.events();
    let mut ids = HashSet::new();
    for i in 0..20 {
        ids.insert(s.add("e", i.to_string()).await.unwrap());
    }
    let mut held = Vec::new();
    while held.len() < ids.len() {
        held.push(support::next(&mut b_events, "B reads").await);
    }

    // A joins (its replica loads B's keep-alive), then hears nothing more.
    let a = Sink::join(&client_a, &name, &[&s], opts(ttl))
        .await
        .unwrap();
    proxy.mute();
    let t0 = Instant::now();
    let mut a_events = a.events();
    // A's claim rounds run every ttl/3; from ttl on, its replica says B is
    // stale. Watch well past that (rmap's own revision check would only
    // heal the replica after ~10 s).
    support::none_within(&mut a_events, ttl * 5).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "window too long");

    // B is alive in Redis: renewed within the ttl by server time.
    let renewed: Option<String> = client.hget(members_hash(&name, &s), &b_id).await.unwrap();
    let renewed: u64 = renewed.expect("B registered").parse().unwrap();
    assert!(server_ms(&client).await <= renewed + ttl.as_millis() as u64);
    // B still owns its consumer and every event it read.
    assert!(
        support::consumer_names(&client, s.key(), &name)
            .await
            .contains(&b_id),
        "B's consumer was deleted while B was alive"
    );
    assert_eq!(pending_of(&client, s.key(), &name, &b_id).await, ids.len());
    for e in &held {
        b.ack(e).await.expect("B acks its own events");
    }
    assert_eq!(support::pending_count(&client, s.key(), &name).await, 0);
    support::none_within(&mut a_events, Duration::from_millis(100)).await;

    proxy.unmute();
    drop(a_events);
    a.close().await;
    b.close().await;
}

/// A member that stops renewing (dropped without close) while holding
/// unacked events: a live member claims them long before the ack grace,
/// and the dead member's consumer and registration are removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_members_events_are_claimed_and_it_is_removed() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "dead");
    let name = unique_name("sink");
    let ttl = Duration::from_millis(600);

    let d = Sink::join(&client, &name, &[&s], opts(ttl)).await.unwrap();
    let d_id = d.member_id().to_string();
    let mut d_events = d.events();
    let mut ids = HashSet::new();
    for i in 0..250 {
        ids.insert(s.add("e", i.to_string()).await.unwrap());
    }
    for _ in 0..ids.len() {
        support::next(&mut d_events, "D reads").await;
    }
    drop(d_events);
    drop(d);
    let t0 = Instant::now();

    let a = Sink::join(&client, &name, &[&s], opts(ttl)).await.unwrap();
    let mut a_events = a.events();
    let mut got = HashSet::new();
    while got.len() < ids.len() {
        let e = support::next(&mut a_events, "A claims D's events").await;
        assert!(ids.contains(&e.id));
        assert!(got.insert(e.id.clone()), "{} delivered twice", e.id);
        a.ack(&e).await.unwrap();
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "claimed after {:?}",
        t0.elapsed()
    );
    assert_eq!(support::pending_count(&client, s.key(), &name).await, 0);
    wait_until(
        Duration::from_secs(5),
        "D's consumer and registration removed",
        || async {
            let registered: bool = client
                .hexists(members_hash(&name, &s), &d_id)
                .await
                .unwrap();
            !registered
                && !support::consumer_names(&client, s.key(), &name)
                    .await
                    .contains(&d_id)
        },
    )
    .await
    .unwrap();
    a.close().await;
}

/// A consumer that never registered as a member (its registration is
/// gone, say) and has been idle longer than the member ttl is stale too:
/// its events are claimed and its consumer deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_unregistered_consumers_events_are_claimed() {
    let (_server, client) = support::redis().await;
    let s = support::stream(&client, "ghost");
    let name = unique_name("sink");
    let ttl = Duration::from_millis(300);
    let _: Value = client
        .xgroup_create(s.key(), name.as_str(), "0", true)
        .await
        .unwrap();
    let mut ids = HashSet::new();
    for i in 0..5 {
        ids.insert(s.add("e", i.to_string()).await.unwrap());
    }
    let _: Value = client
        .xreadgroup(name.as_str(), "ghost", Some(100), None, false, s.key(), ">")
        .await
        .unwrap();
    assert_eq!(pending_of(&client, s.key(), &name, "ghost").await, 5);

    let a = Sink::join(&client, &name, &[&s], opts(ttl)).await.unwrap();
    let mut a_events = a.events();
    let mut got = HashSet::new();
    while got.len() < ids.len() {
        let e = support::next(&mut a_events, "A claims the ghost's events").await;
        assert!(got.insert(e.id.clone()), "{} delivered twice", e.id);
        a.ack(&e).await.unwrap();
    }
    assert_eq!(got, ids);
    wait_until(Duration::from_secs(5), "ghost consumer removed", || async {
        !support::consumer_names(&client, s.key(), &name)
            .await
            .contains(&"ghost".to_string())
    })
    .await
    .unwrap();
    a.close().await;
}
