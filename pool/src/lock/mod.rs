//! Distributed locks on Redis with fencing tokens.
//!
//! A [`ClusterLock`] names one lock; [`ClusterLock::try_acquire`] and
//! [`ClusterLock::acquire`] hand out a [`LockGuard`] that the owner refreshes
//! and releases (dropping it releases too). Every step is one Lua script:
//! there is no check-then-set from Rust.
//!
//! * **Expiry.** The holder record lives under a Redis TTL, so a crashed
//!   holder blocks others for at most [`LockOptions::ttl`].
//! * **Fencing.** Every acquisition gets a token from a counter that does not
//!   expire with the lock; tokens strictly increase, so downstream storage can
//!   refuse a stale holder.
//! * **Owner only.** Refresh and release check the acquisition's lease id
//!   inside the script; anyone else gets [`Error::NotLockOwner`] and nothing
//!   changes.
//! * **Local deadline.** A guard considers itself held until *the moment its
//!   last successful acquire or refresh request was sent* plus the TTL, by
//!   the process's monotonic clock. Redis started the TTL later than that, so
//!   the guard gives up no later than Redis does. Wall clocks are never
//!   compared. Redis itself expires the record on its host's wall clock,
//!   though: a forward step of that clock (an NTP step, a resumed virtual
//!   machine) ends the TTL early, and another process may acquire while
//!   the guard still counts itself the holder. The fencing token is what
//!   refuses the earlier holder then.
//!
//! # When Redis is unreachable
//! `try_acquire`, `acquire` and `refresh` fail with [`Error::Unavailable`]
//! within [`LockOptions::op_timeout`]. A current holder keeps its lock until
//! its local deadline, then [`LockGuard::is_held`] turns `false` and
//! [`LockGuard::lost`] completes: stop the protected work then. An acquire
//! whose answer never arrived may still have taken the lock in Redis; a
//! clean-up release for that attempt is queued behind it, and at worst the
//! lock expires after its TTL.
//!
//! # Examples
//! ```no_run
//! use std::time::Duration;
//! use flotilla_pool::{ClusterLock, LockOptions};
//!
//! # async fn demo(client: fred::prelude::Client) -> flotilla_pool::Result<()> {
//! let lock = ClusterLock::new(&client, "nightly-report", LockOptions::default().ttl(Duration::from_secs(10)))?;
//! let guard = lock.acquire(Duration::from_secs(5)).await?;
//! println!("running with fencing token {}", guard.token());
//! guard.refresh().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod guard;
mod info;
mod options;
pub(crate) mod script;

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use fred::prelude::Client;
use fred::types::Value;
use tokio::time::Instant;
use tracing::Instrument;

pub use guard::LockGuard;
pub use info::LockInfo;
pub use options::LockOptions;

use crate::error::{Error, Result};
use crate::keys::{self, check_name};
use crate::store::call::{self, string_at, u64_at};

/// A named distributed lock. Cheap to clone; clones share the name, options
/// and client.
///
/// # Examples
/// ```no_run
/// use flotilla_pool::{ClusterLock, Error, LockOptions};
///
/// # async fn demo(client: fred::prelude::Client) -> flotilla_pool::Result<()> {
/// let lock = ClusterLock::new(&client, "execution-42", LockOptions::default())?;
/// match lock.try_acquire().await {
///     Ok(guard) => { /* only this process runs execution 42 */ guard.release().await?; }
///     Err(Error::LockHeld { holder, .. }) => println!("someone else runs it: {holder}"),
///     Err(other) => return Err(other),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClusterLock {
    shared: Arc<Shared>,
}

/// What a lock and its guards share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) key: String,
    fencing_key: String,
    pub(crate) options: LockOptions,
    host: String,
    pid: u32,
}

/// Result of one acquisition attempt.
enum Attempt {
    Acquired(LockGuard),
    Held { holder: String, ttl: Duration },
}

/// An acquisition whose answer has not arrived. If it is dropped armed (the
/// call timed out, failed on the connection or was cancelled), the request
/// may still take the lock in Redis, so a release for its lease id is
/// queued behind it.
struct PendingAcquire<'a> {
    shared: &'a Arc<Shared>,
    lease: String,
    armed: bool,
}

impl ClusterLock {
    /// Creates a handle on the lock `name`. Does not talk to Redis.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty, longer than 128 bytes or
    /// contains `{`, `}` or control characters; [`Error::InvalidOptions`]
    /// when [`LockOptions::validate`] refuses the options.
    pub fn new(client: &Client, name: &str, options: LockOptions) -> Result<Self> {
        check_name("lock name", name)?;
        options.validate()?;
        let tag = options.hash_tag.as_deref();
        let shared = Shared {
            client: client.clone(),
            name: name.to_string(),
            key: keys::lock(tag, name),
            fencing_key: keys::lock_fencing(tag, name),
            host: hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown".to_string()),
            pid: std::process::id(),
            options,
        };
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The owner id written into the holder record.
    pub fn owner_id(&self) -> &str {
        &self.shared.options.owner_id
    }

    /// The options the lock was created with.
    pub fn options(&self) -> &LockOptions {
        &self.shared.options
    }

    /// Takes the lock if it is free; one Redis round trip.
    ///
    /// # Errors
    /// * [`Error::LockHeld`] naming the holder (owner id, host, pid, token,
    ///   remaining TTL) when someone holds the lock — including this owner
    ///   through another guard: locks are not re-entrant;
    /// * [`Error::Unavailable`] when Redis does not answer within
    ///   [`LockOptions::op_timeout`];
    /// * [`Error::Redis`] / [`Error::Malformed`] when Redis answers wrongly.
    ///
    /// # Cancel safety
    /// Cancelling the call queues a release of this attempt, so a lock taken
    /// by a cancelled attempt is freed (or expires after its TTL).
    pub async fn try_acquire(&self) -> Result<LockGuard> {
        match self.attempt().await? {
            Attempt::Acquired(guard) => Ok(guard),
            Attempt::Held { holder, .. } => Err(Error::LockHeld {
                name: self.shared.name.clone(),
                holder,
            }),
        }
    }

    /// Takes the lock, waiting up to `timeout` for it to become free.
    ///
    /// Attempts back off exponentially with jitter, never waiting longer
    /// than [`LockOptions::retry_interval`] nor past the holder's remaining
    /// TTL, so a crashed holder's lock is taken within TTL plus one retry
    /// interval.
    ///
    /// # Errors
    /// * [`Error::Timeout`] when the lock stayed held for `timeout`;
    /// * [`Error::Unavailable`] as soon as one attempt cannot reach Redis
    ///   within [`LockOptions::op_timeout`];
    /// * [`Error::Redis`] / [`Error::Malformed`] when Redis answers wrongly.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, timeout: Duration) -> Result<LockGuard> {
        let started = Instant::now();
        let deadline = started + timeout;
        let retry = self.shared.options.retry_interval;
        let mut backoff = ExponentialBuilder::new()
            .with_min_delay((retry / 10).max(Duration::from_millis(1)))
            .with_max_delay(retry)
            .with_jitter()
            .without_max_times()
            .build();
        loop {
            match self.attempt().await? {
                Attempt::Acquired(guard) => {
                    metrics::histogram!("flotilla_lock_acquire_wait_seconds", "lock" => self.shared.name.clone())
                        .record(started.elapsed().as_secs_f64());
                    return Ok(guard);
                }
                Attempt::Held { ttl, .. } => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::Timeout(timeout));
                    }
                    let mut wait = backoff.next().unwrap_or(retry);
                    if !ttl.is_zero() {
                        // Wake right after the holder's TTL runs out.
                        wait = wait.min(ttl + Duration::from_millis(1));
                    }
                    tokio::time::sleep(wait.min(deadline - now)).await;
                }
            }
        }
    }

    /// Reads the holder record: owner id, host, pid, acquired-at and
    /// heartbeat-at (server time), token and remaining TTL. `None` when the
    /// lock is free.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when Redis does not answer within
    /// [`LockOptions::op_timeout`]; [`Error::Redis`] / [`Error::Malformed`]
    /// when Redis answers wrongly.
    pub async fn info(&self) -> Result<Option<LockInfo>> {
        let s = &self.shared;
        let reply: Value = call::script(
            &s.client,
            &script::INFO,
            "lock info",
            vec![s.key.clone()],
            Vec::<String>::new(),
            s.options.op_timeout,
        )
        .await?;
        LockInfo::from_reply(&s.name, reply)
    }

    /// One acquisition attempt.
    async fn attempt(&self) -> Result<Attempt> {
        let s = &self.shared;
        let span =
            tracing::debug_span!("lock_acquire", lock = %s.name, owner = %s.options.owner_id);
        async {
            let mut pending = PendingAcquire {
                shared: s,
                lease: uuid::Uuid::new_v4().to_string(),
                armed: true,
            };
            let sent = Instant::now();
            let ttl_ms = s.options.ttl.as_millis().to_string();
            let result: Result<Vec<Value>> = call::script(
                &s.client,
                &script::ACQUIRE,
                "lock acquire",
                vec![s.key.clone(), s.fencing_key.clone()],
                vec![
                    s.options.owner_id.clone(),
                    pending.lease.clone(),
                    s.host.clone(),
                    s.pid.to_string(),
                    ttl_ms,
                ],
                s.options.op_timeout,
            )
            .await;
            let reply = match result {
                Ok(reply) => reply,
                // The request may still run in Redis: keep the clean-up armed.
                Err(error @ Error::Unavailable(_)) => return Err(error),
                Err(error) => {
                    pending.armed = false;
                    return Err(error);
                }
            };
            pending.armed = false;
            const WHAT: &str = "lock acquire reply";
            if u64_at(&reply, 0, WHAT)? == 1 {
                let token = u64_at(&reply, 1, WHAT)?;
                metrics::counter!("flotilla_lock_acquired_total", "lock" => s.name.clone())
                    .increment(1);
                tracing::debug!(token, "lock acquired");
                let lease = std::mem::take(&mut pending.lease);
                return Ok(Attempt::Acquired(LockGuard::new(
                    Arc::clone(s),
                    lease,
                    token,
                    sent,
                )));
            }
            metrics::counter!("flotilla_lock_contended_total", "lock" => s.name.clone())
                .increment(1);
            let ttl_ms = reply.get(5).and_then(Value::as_i64).unwrap_or(0).max(0);
            let ttl = Duration::from_millis(ttl_ms.unsigned_abs());
            let holder = format!(
                "{} on host {} (pid {}, token {}, expires in {} ms)",
                string_at(&reply, 1),
                string_at(&reply, 2),
                string_at(&reply, 3),
                string_at(&reply, 4),
                ttl.as_millis()
            );
            Ok(Attempt::Held { holder, ttl })
        }
        .instrument(span)
        .await
    }
}

/// Compiles the examples of `pool/LOCKS.md` as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../LOCKS.md")]
pub struct LocksReadme;

impl Shared {
    /// Queues a release of `lease` (fire and forget). Used by dropped guards
    /// and by acquisitions whose answer never arrived. Returns `false` when
    /// there is no tokio runtime to run it on.
    pub(crate) fn spawn_release(self: &Arc<Self>, lease: String) -> bool {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let shared = Arc::clone(self);
        // Commands on one client run in order, so this release runs after
        // any request for the same lease that is still queued. Bound it
        // generously: past the TTL the lock is gone anyway.
        let bound = (shared.options.op_timeout * 10).max(shared.options.ttl * 2);
        handle.spawn(async move {
            let result: Result<u64> = call::script(
                &shared.client,
                &script::RELEASE,
                "lock release",
                vec![shared.key.clone()],
                vec![lease],
                bound,
            )
            .await;
            match result {
                Ok(1) => tracing::debug!(lock = %shared.name, "lock released in the background"),
                Ok(_) => {}
                Err(error) => tracing::debug!(
                    lock = %shared.name, %error,
                    "background release failed; the lock expires after its ttl"
                ),
            }
        });
        true
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed && !self.shared.spawn_release(std::mem::take(&mut self.lease)) {
            tracing::warn!(
                lock = %self.shared.name,
                "acquisition abandoned outside a tokio runtime; the lock may stay held until its ttl"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("lock name", "scheduler").is_ok());
        for bad in ["", "a{b", "a}b", "a\nb", &"x".repeat(129)] {
            assert!(matches!(
                check_name("lock name", bad),
                Err(Error::InvalidName { .. })
            ));
        }
    }

    #[test]
    fn options_are_validated() {
        assert!(LockOptions::default().validate().is_ok());
        let too_short = LockOptions::default().ttl(Duration::from_millis(1));
        assert!(matches!(
            too_short.validate(),
            Err(Error::InvalidOptions { option: "ttl", .. })
        ));
        let slow_refresh = LockOptions::default()
            .ttl(Duration::from_secs(1))
            .min_refresh_interval(Duration::from_secs(1));
        assert!(matches!(
            slow_refresh.validate(),
            Err(Error::InvalidOptions {
                option: "min_refresh_interval",
                ..
            })
        ));
        assert!(LockOptions::default().owner_id("a{b}").validate().is_err());
    }
}
