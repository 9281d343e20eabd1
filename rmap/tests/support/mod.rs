//! Shared helpers of the rmap integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use flotilla_rmap::{Map, MapOptions};
use flotilla_testkit::RedisServer;
use fred::prelude::Client;

/// A generous deadline for conditions that normally hold within milliseconds.
pub const DEADLINE: Duration = Duration::from_secs(10);

pub struct Env {
    pub server: RedisServer,
    pub client: Client,
}

pub async fn env() -> Env {
    let server = RedisServer::start()
        .expect("redis-server must be installed (apt-get install redis-server)");
    let client = flotilla_testkit::client(&server.url())
        .await
        .expect("connect");
    Env { server, client }
}

pub async fn join(client: &Client, name: &str) -> Map {
    Map::join(client, name, MapOptions::default())
        .await
        .expect("join")
}

/// Waits until `map` holds exactly what Redis holds.
pub async fn converged(client: &Client, map: &Map) {
    use fred::prelude::*;
    let hash = map.keys_info().hash.clone();
    let mut last = None;
    for _ in 0..2 {
        let redis: std::collections::HashMap<String, String> =
            client.hgetall(&hash).await.expect("hgetall");
        let result = map.wait_for(DEADLINE, |m| *m.snapshot() == redis).await;
        if result.is_ok() {
            return;
        }
        last = Some((redis, map.snapshot()));
    }
    panic!("replica did not converge: {last:?}");
}
