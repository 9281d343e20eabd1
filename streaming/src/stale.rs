//! Taking over a stale sink member: its pending events are claimed first,
//! then its consumer is deleted. Whether the member is stale is decided by
//! a script in Redis on Redis server time (`scripts/claim_stale_member.lua`)
//! at each step, never from this member's replica of the members map, which
//! can lag (after a reconnect, a Redis restart or a rollback): the replica
//! only picks which members are worth asking about.

use std::sync::LazyLock;

use fred::error::{Error as RedisError, ErrorKind};
use fred::types::Value;
use fred::types::scripts::Script;

use crate::Error;
use crate::event::parse_entries;
use crate::sink::Shared;

static CLAIM_STALE_MEMBER: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(include_str!("scripts/claim_stale_member.lua")));

/// Entries claimed per script call.
const PAGE: u64 = 100;
/// Script calls per member, stream and round, so one round's work is
/// bounded; what is left is taken over at the next round.
const MAX_PAGES: usize = 20;

/// What became of a member's consumer on one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeOver {
    /// Redis says the member is alive: nothing changed.
    Alive,
    /// The member was stale: its events were claimed and its consumer
    /// deleted (or it had none).
    Removed,
    /// The member was stale but still has pending events (round bound
    /// reached, or this sink is closing).
    Unfinished,
}

/// Claims `consumer`'s pending events on stream `name` (key `key`) to this
/// member, delivering them, and deletes the consumer — each step only if
/// Redis says the member is stale.
pub(crate) async fn take_over(
    shared: &Shared,
    name: &str,
    key: &str,
    consumer: &str,
) -> Result<TakeOver, Error> {
    let keys = vec![key.to_string(), shared.members.hash_key().to_string()];
    let args = vec![
        shared.group.clone(),
        consumer.to_string(),
        shared.member_id.clone(),
        shared.options.member_ttl.as_millis().to_string(),
        PAGE.to_string(),
    ];
    for _ in 0..MAX_PAGES {
        let reply: Value = CLAIM_STALE_MEMBER
            .evalsha_with_reload(&shared.client, keys.clone(), args.clone())
            .await?;
        let mut parts = reply.into_array().into_iter();
        match parts.next().and_then(|v| v.as_string()).as_deref() {
            Some("alive") => {
                tracing::debug!(sink = %shared.group, stream = %name, member = %consumer,
                    "member looked stale locally but is alive in Redis");
                return Ok(TakeOver::Alive);
            }
            Some("gone") => return Ok(TakeOver::Removed),
            Some("deleted") => {
                tracing::info!(sink = %shared.group, stream = %name, consumer = %consumer, "removed stale sink member");
                return Ok(TakeOver::Removed);
            }
            Some("claimed") => {
                let entries = parse_entries(parts.next().unwrap_or(Value::Null));
                tracing::info!(sink = %shared.group, stream = %name, from = %consumer, count = entries.len(), "claimed a stale member's events");
                if !shared.deliver(name, key, entries).await {
                    return Ok(TakeOver::Unfinished);
                }
            }
            other => {
                return Err(RedisError::new(
                    ErrorKind::Parse,
                    format!("unexpected reply of the stale member script: {other:?}"),
                )
                .into());
            }
        }
    }
    Ok(TakeOver::Unfinished)
}
