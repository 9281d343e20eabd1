//! What Redis knows about a lock's holder.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::types::Value;

use crate::error::Result;
use crate::store::call::{string_at, u64_at};

/// A lock's holder record as stored in Redis, read by
/// [`ClusterLock::info`](super::ClusterLock::info) and
/// [`LeaderLease::holder`](crate::LeaderLease::holder).
///
/// Times are **Redis server time** (from `TIME` inside the scripts), so
/// records written by different machines compare without trusting their
/// clocks. Use [`heartbeat_age`](Self::heartbeat_age) rather than comparing
/// with the local wall clock.
///
/// # Examples
/// ```no_run
/// # async fn demo(lock: flotilla_pool::ClusterLock) -> flotilla_pool::Result<()> {
/// if let Some(info) = lock.info().await? {
///     println!("held by {info}; last heartbeat {:?} ago", info.heartbeat_age());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The holder's owner id ([`LockOptions::owner_id`](super::LockOptions::owner_id)).
    pub owner_id: String,
    /// Host name of the holder's machine.
    pub host: String,
    /// Process id of the holder (0 if the record did not carry one).
    pub pid: u32,
    /// When the holder acquired the lock (server time, ms since the epoch).
    pub acquired_at_ms: u64,
    /// When the holder last refreshed the lock (server time, ms since the epoch).
    pub heartbeat_at_ms: u64,
    /// The fencing token of this acquisition.
    pub token: u64,
    /// How long the lock lives without another refresh.
    pub ttl_remaining: Duration,
    /// Server time when this record was read (ms since the epoch).
    pub server_time_ms: u64,
}

impl LockInfo {
    /// Parses `lock_info.lua`'s reply; `None` when the lock is free.
    pub(crate) fn from_reply(name: &str, reply: Value) -> Result<Option<Self>> {
        let values: Vec<Value> = match reply {
            Value::Null => return Ok(None),
            Value::Array(values) if values.is_empty() => return Ok(None),
            Value::Array(values) => values,
            other => {
                return Err(crate::error::Error::Malformed {
                    what: "lock holder record",
                    reason: format!("expected an array, got {other:?}"),
                });
            }
        };
        const WHAT: &str = "lock holder record";
        let pttl = values.get(6).and_then(Value::as_i64).unwrap_or(0);
        Ok(Some(Self {
            name: name.to_string(),
            owner_id: string_at(&values, 0),
            host: string_at(&values, 1),
            pid: string_at(&values, 2).parse().unwrap_or(0),
            acquired_at_ms: u64_at(&values, 3, WHAT)?,
            heartbeat_at_ms: u64_at(&values, 4, WHAT)?,
            token: u64_at(&values, 5, WHAT)?,
            ttl_remaining: Duration::from_millis(pttl.max(0).unsigned_abs()),
            server_time_ms: u64_at(&values, 7, WHAT)?,
        }))
    }

    /// When the holder acquired the lock, as a `SystemTime` (server clock).
    pub fn acquired_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.acquired_at_ms)
    }

    /// When the holder last refreshed the lock, as a `SystemTime` (server clock).
    pub fn heartbeat_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.heartbeat_at_ms)
    }

    /// How long ago the last heartbeat was, by the server's clock alone.
    pub fn heartbeat_age(&self) -> Duration {
        Duration::from_millis(self.server_time_ms.saturating_sub(self.heartbeat_at_ms))
    }

    /// How long the holder has held the lock, by the server's clock alone.
    pub fn held_for(&self) -> Duration {
        Duration::from_millis(self.server_time_ms.saturating_sub(self.acquired_at_ms))
    }
}

impl fmt::Display for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on host {} (pid {}, token {}, held for {} ms, last heartbeat {} ms ago, expires in {} ms)",
            self.owner_id,
            self.host,
            self.pid,
            self.token,
            self.held_for().as_millis(),
            self.heartbeat_age().as_millis(),
            self.ttl_remaining.as_millis(),
        )
    }
}
