//! Shared helpers of the streaming integration tests.
#![allow(dead_code)]

pub mod mute_proxy;

use std::time::Duration;

use flotilla_streaming::{Event, Stream, StreamOptions};
use flotilla_testkit::{RedisServer, ServerOptions};
use fred::prelude::*;
use futures::StreamExt;

/// A private Redis and a connected client.
pub async fn redis() -> (RedisServer, Client) {
    redis_with(ServerOptions::default()).await
}

/// A private Redis with options and a connected client.
pub async fn redis_with(options: ServerOptions) -> (RedisServer, Client) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "flotilla_streaming=info".into()),
        )
        .with_test_writer()
        .try_init();
    let server = RedisServer::start_with(options).expect("redis-server must be installed");
    let client = flotilla_testkit::client(&server.url())
        .await
        .expect("connect");
    (server, client)
}

/// A stream with a test-unique name.
pub fn stream(client: &Client, prefix: &str) -> Stream {
    Stream::new(
        client,
        &flotilla_testkit::unique_name(prefix),
        StreamOptions::default(),
    )
    .expect("valid name")
}

/// The next event within 5 s, or a panic naming `what`.
pub async fn next<S: futures::Stream<Item = Event> + Unpin>(events: &mut S, what: &str) -> Event {
    match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
        Ok(Some(e)) => e,
        Ok(None) => panic!("{what}: events ended"),
        Err(_) => panic!("{what}: no event within 5 s"),
    }
}

/// Asserts no event arrives within `d`.
pub async fn none_within<S: futures::Stream<Item = Event> + Unpin>(events: &mut S, d: Duration) {
    if let Ok(Some(e)) = tokio::time::timeout(d, events.next()).await {
        panic!("unexpected event {e:?}");
    }
}

/// Number of pending entries of `group` on `key`.
pub async fn pending_count(client: &Client, key: &str, group: &str) -> u64 {
    let v: Value = client.xpending(key, group, ()).await.expect("XPENDING");
    v.into_array()
        .into_iter()
        .next()
        .and_then(|v| v.as_u64())
        .unwrap_or(0)
}

/// Consumer names of `group` on `key`.
pub async fn consumer_names(client: &Client, key: &str, group: &str) -> Vec<String> {
    let v: Value = client.xinfo_consumers(key, group).await.expect("XINFO");
    v.into_array()
        .into_iter()
        .filter_map(|c| {
            let mut f = c.into_array().into_iter();
            while let (Some(k), Some(v)) = (f.next(), f.next()) {
                if k.as_str().as_deref() == Some("name") {
                    return v.as_string();
                }
            }
            None
        })
        .collect()
}
