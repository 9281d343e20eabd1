//! A sink's member keep-alive registry: a replicated map
//! (`flotilla-rmap`) named `sink:<sink>` with the sink's hash tag; field =
//! member id, value = Redis server time (ms, from `TIME` on the node that
//! owns the tag's slot) of the member's last renewal. Reads are local.

use std::collections::HashMap;

use flotilla_rmap::{Map, MapOptions};
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::{Error, keys};

/// The members of one sink.
#[derive(Debug, Clone)]
pub(crate) struct Members {
    client: Client,
    map: Map,
    slot: u16,
}

/// A snapshot of the members: server time and each member's keep-alive.
#[derive(Debug, Default)]
pub(crate) struct MemberView {
    pub(crate) now_ms: u64,
    pub(crate) members: HashMap<String, u64>,
}

impl MemberView {
    /// Whether `member` renewed within `ttl_ms` of now.
    pub(crate) fn is_live(&self, member: &str, ttl_ms: u64) -> bool {
        self.members
            .get(member)
            .is_some_and(|&t| t.saturating_add(ttl_ms) >= self.now_ms)
    }
}

impl Members {
    /// Joins the registry of sink `sink` (hash tag `tag`).
    pub(crate) async fn join(client: &Client, sink: &str, tag: &str) -> Result<Self, Error> {
        let map = Map::join(
            client,
            &keys::sink_members_map(sink),
            MapOptions::default().hash_tag(tag),
        )
        .await?;
        let slot = fred::util::redis_keyslot(format!("{{{tag}}}").as_bytes());
        Ok(Members {
            client: client.clone(),
            map,
            slot,
        })
    }

    /// The Redis hash holding the keep-alives (for scripts that decide on
    /// them in Redis; rmap owns the name).
    pub(crate) fn hash_key(&self) -> &str {
        &self.map.keys_info().hash
    }

    /// Redis server time in ms, from the node holding the registry.
    async fn now_ms(&self) -> Result<u64, Error> {
        let cmd = CustomCommand::new("TIME", ClusterHash::Custom(self.slot), false);
        let t: Vec<Value> = self.client.custom(cmd, Vec::<String>::new()).await?;
        let part = |i: usize| t.get(i).and_then(Value::as_u64).unwrap_or(0);
        Ok(part(0) * 1000 + part(1) / 1000)
    }

    /// Writes `member`'s keep-alive (server time).
    pub(crate) async fn renew(&self, member: &str) -> Result<(), Error> {
        let now = self.now_ms().await?;
        self.map.set(member, &now.to_string()).await?;
        Ok(())
    }

    /// Every member (local replica) with the server time.
    pub(crate) async fn view(&self) -> Result<MemberView, Error> {
        let now_ms = self.now_ms().await?;
        let members = self
            .map
            .snapshot()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.parse().ok()?)))
            .collect();
        Ok(MemberView { now_ms, members })
    }

    /// Removes `member` if its keep-alive is still `expected_ms`.
    pub(crate) async fn remove_if(&self, member: &str, expected_ms: u64) -> Result<bool, Error> {
        Ok(self
            .map
            .test_and_delete(member, &expected_ms.to_string())
            .await?)
    }

    /// Removes `member` unconditionally.
    pub(crate) async fn remove(&self, member: &str) -> Result<(), Error> {
        self.map.delete(member).await?;
        Ok(())
    }

    /// Leaves the replicated map.
    pub(crate) async fn close(&self) {
        self.map.close().await;
    }
}
