//! A sink's member keep-alive registry.
//!
//! One hash per sink (`keys::sink_members_key`), field = member id, value =
//! Redis server time (ms) of the member's last renewal, written by a script
//! that reads `TIME`. Kept behind this small interface so it can move onto
//! a replicated map (`flotilla-rmap`) without touching the sink.

use std::collections::HashMap;
use std::sync::LazyLock;

use fred::prelude::*;
use fred::types::Value;
use fred::types::scripts::Script;

use crate::Error;

static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/member_renew.lua")));
static LIST: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/members_list.lua")));
static REMOVE_IF: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/member_remove_if.lua")));

/// The members of one sink.
#[derive(Debug, Clone)]
pub(crate) struct Members {
    client: Client,
    key: String,
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
    pub(crate) fn new(client: &Client, key: String) -> Self {
        Members {
            client: client.clone(),
            key,
        }
    }

    /// Writes `member`'s keep-alive (server time).
    pub(crate) async fn renew(&self, member: &str) -> Result<(), Error> {
        let _: Value = RENEW
            .evalsha_with_reload(
                &self.client,
                vec![self.key.clone()],
                vec![member.to_string()],
            )
            .await?;
        Ok(())
    }

    /// Reads every member with the server time.
    pub(crate) async fn view(&self) -> Result<MemberView, Error> {
        let reply: Value = LIST
            .evalsha_with_reload(&self.client, vec![self.key.clone()], Vec::<String>::new())
            .await?;
        let mut parts = reply.into_array().into_iter();
        let now_ms = parts.next().and_then(|v| v.as_u64()).unwrap_or(0);
        let mut members = HashMap::new();
        let mut flat = parts
            .next()
            .map(Value::into_array)
            .unwrap_or_default()
            .into_iter();
        while let (Some(k), Some(v)) = (flat.next(), flat.next()) {
            if let (Some(k), Some(v)) = (k.as_string(), v.as_string()) {
                if let Ok(ms) = v.parse() {
                    members.insert(k, ms);
                }
            }
        }
        Ok(MemberView { now_ms, members })
    }

    /// Removes `member` if its keep-alive is still `expected_ms`.
    pub(crate) async fn remove_if(&self, member: &str, expected_ms: u64) -> Result<bool, Error> {
        let removed: i64 = REMOVE_IF
            .evalsha_with_reload(
                &self.client,
                vec![self.key.clone()],
                vec![member.to_string(), expected_ms.to_string()],
            )
            .await?;
        Ok(removed == 1)
    }

    /// Removes `member` unconditionally.
    pub(crate) async fn remove(&self, member: &str) -> Result<(), Error> {
        let _: i64 = self.client.hdel(self.key.as_str(), member).await?;
        Ok(())
    }
}
