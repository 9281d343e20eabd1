//! Options of a [`ClusterLock`](super::ClusterLock).

use std::time::Duration;

use crate::error::{Error, Result};

/// Options of a [`ClusterLock`](super::ClusterLock).
///
/// Public fields with their defaults documented; [`Default`] is the only
/// place the defaults live. The builder methods are shorthands.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use flotilla_pool::LockOptions;
///
/// let options = LockOptions::default()
///     .ttl(Duration::from_secs(5))
///     .owner_id("scheduler-a");
/// assert!(options.validate().is_ok());
/// assert_eq!(options.effective_min_refresh_interval(), Duration::from_millis(500));
/// ```
#[derive(Debug, Clone)]
pub struct LockOptions {
    /// How long the lock lives in Redis without a refresh. A crashed holder
    /// blocks others for at most this long.
    ///
    /// Default: 30 s.
    pub ttl: Duration,
    /// Hash tag the lock's keys live under. `Some(pool)` puts a pool-owned
    /// lock in the pool's cluster slot; `None` gives the lock its own tag.
    ///
    /// Default: `None`.
    pub hash_tag: Option<String>,
    /// The owner id written into the holder record (shown by
    /// [`ClusterLock::info`](super::ClusterLock::info) and in
    /// [`Error::LockHeld`]).
    ///
    /// Default: a random UUID, fresh for every `LockOptions::default()`.
    pub owner_id: String,
    /// Longest wait between two attempts of
    /// [`ClusterLock::acquire`](super::ClusterLock::acquire). Attempts back
    /// off exponentially (with jitter) from a tenth of this up to it, and
    /// never wait past the holder's remaining TTL.
    ///
    /// Default: 100 ms.
    pub retry_interval: Duration,
    /// A [`LockGuard::refresh`](super::LockGuard::refresh) within this long
    /// of the last successful one returns `Ok` without calling Redis, so a
    /// hot loop cannot flood Redis. `None` means `ttl / 10`.
    ///
    /// Default: `None` (`ttl / 10`).
    pub min_refresh_interval: Option<Duration>,
    /// Upper bound of every Redis round trip. When Redis does not answer in
    /// time the call fails with [`Error::Unavailable`].
    ///
    /// Default: 2 s.
    pub op_timeout: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            hash_tag: None,
            owner_id: uuid::Uuid::new_v4().to_string(),
            retry_interval: Duration::from_millis(100),
            min_refresh_interval: None,
            op_timeout: Duration::from_secs(2),
        }
    }
}

impl LockOptions {
    /// Sets [`ttl`](Self::ttl).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets [`hash_tag`](Self::hash_tag).
    #[must_use]
    pub fn hash_tag(mut self, tag: impl Into<String>) -> Self {
        self.hash_tag = Some(tag.into());
        self
    }

    /// Sets [`owner_id`](Self::owner_id).
    #[must_use]
    pub fn owner_id(mut self, owner: impl Into<String>) -> Self {
        self.owner_id = owner.into();
        self
    }

    /// Sets [`retry_interval`](Self::retry_interval).
    #[must_use]
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Sets [`min_refresh_interval`](Self::min_refresh_interval).
    #[must_use]
    pub fn min_refresh_interval(mut self, interval: Duration) -> Self {
        self.min_refresh_interval = Some(interval);
        self
    }

    /// Sets [`op_timeout`](Self::op_timeout).
    #[must_use]
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// The refresh rate limit in effect: `min_refresh_interval` or `ttl / 10`.
    pub fn effective_min_refresh_interval(&self) -> Duration {
        self.min_refresh_interval.unwrap_or(self.ttl / 10)
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when `ttl` is under 10 ms or over one day,
    /// `retry_interval` or `op_timeout` is zero, `min_refresh_interval` is
    /// not below `ttl`; [`Error::InvalidName`] when `owner_id` or `hash_tag`
    /// breaks the naming rule.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < Duration::from_millis(10) || self.ttl > Duration::from_secs(86_400) {
            return Err(invalid("ttl", "must be between 10 ms and one day"));
        }
        if self.retry_interval.is_zero() {
            return Err(invalid("retry_interval", "must be greater than zero"));
        }
        if self.op_timeout.is_zero() {
            return Err(invalid("op_timeout", "must be greater than zero"));
        }
        if self.effective_min_refresh_interval() >= self.ttl {
            return Err(invalid("min_refresh_interval", "must be less than ttl"));
        }
        crate::keys::check_name("owner id", &self.owner_id)?;
        if let Some(tag) = &self.hash_tag {
            crate::keys::check_name("hash tag", tag)?;
        }
        Ok(())
    }
}

fn invalid(option: &'static str, reason: &str) -> Error {
    Error::InvalidOptions {
        option,
        reason: reason.to_string(),
    }
}
