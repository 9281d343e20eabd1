//! The holder's side of a lock: refresh, release, local deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use fred::types::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Shared;
use super::script;
use crate::error::{Error, Result};
use crate::store::call::{self, u64_at};

/// Proof of holding a [`ClusterLock`](super::ClusterLock), returned by
/// [`try_acquire`](super::ClusterLock::try_acquire) and
/// [`acquire`](super::ClusterLock::acquire).
///
/// The guard believes it holds the lock until its **local deadline**: the
/// moment its last successful acquire or refresh request was *sent*, plus
/// the TTL, on this process's monotonic clock. Call
/// [`refresh`](Self::refresh) well before that (e.g. every TTL/3), watch
/// [`is_held`](Self::is_held) or await [`lost`](Self::lost), and pass
/// [`token`](Self::token) to storage that can fence stale writers.
///
/// Dropping a guard that was not [`release`](Self::release)d releases the
/// lock in the background (a warning is logged if no tokio runtime is
/// running; the lock then expires after its TTL).
///
/// # Examples
/// ```no_run
/// # async fn demo(lock: flotilla_pool::ClusterLock) -> flotilla_pool::Result<()> {
/// let guard = lock.try_acquire().await?;
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lock lost: stop writing"),
///     _ = async { /* protected work, refreshing now and then */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LockGuard {
    shared: Arc<Shared>,
    lease: String,
    token: u64,
    state: Mutex<State>,
    lost: watch::Sender<bool>,
    released: AtomicBool,
}

/// Timing of the last successful acquire or refresh.
#[derive(Debug, Clone, Copy)]
struct State {
    /// When the last successful request was sent.
    last_ok_sent: Instant,
    /// `last_ok_sent + ttl`.
    deadline: Instant,
}

impl LockGuard {
    pub(super) fn new(shared: Arc<Shared>, lease: String, token: u64, sent: Instant) -> Self {
        let deadline = sent + shared.options.ttl;
        Self {
            shared,
            lease,
            token,
            state: Mutex::new(State {
                last_ok_sent: sent,
                deadline,
            }),
            lost: watch::Sender::new(false),
            released: AtomicBool::new(false),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The fencing token of this acquisition. Tokens strictly increase with
    /// every acquisition of the lock, by anyone; they are kept in a counter
    /// that does not expire with the lock.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The local deadline: when this guard stops considering itself the
    /// holder unless a refresh succeeds first (monotonic clock).
    pub fn deadline(&self) -> Instant {
        self.state().deadline
    }

    /// Whether this guard still holds the lock by its local deadline and has
    /// not been told otherwise by Redis. Once `false`, it stays `false`.
    pub fn is_held(&self) -> bool {
        if *self.lost.borrow() {
            return false;
        }
        if Instant::now() >= self.deadline() {
            self.mark_lost("local deadline passed");
            return false;
        }
        true
    }

    /// Completes when the lock is lost: the local deadline passed without a
    /// successful refresh, or a refresh found someone else's record.
    ///
    /// # Cancel safety
    /// Cancel safe; call it again to keep waiting.
    pub async fn lost(&self) {
        let mut rx = self.lost.subscribe();
        loop {
            if *rx.borrow_and_update() {
                return;
            }
            let deadline = self.deadline();
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    // A refresh may have moved the deadline meanwhile.
                    if !self.is_held() {
                        return;
                    }
                }
                _ = rx.changed() => {}
            }
        }
    }

    /// Extends the lock's TTL; owner only.
    ///
    /// Rate-limited: within [`LockOptions::min_refresh_interval`](super::LockOptions::min_refresh_interval)
    /// of the last successful refresh (or the acquisition) it returns `Ok`
    /// without calling Redis.
    ///
    /// # Errors
    /// * [`Error::NotLockOwner`] when the lock is no longer this guard's:
    ///   its local deadline passed, or the record in Redis is gone or
    ///   someone else's (nothing is changed then). The guard is lost for good.
    /// * [`Error::Unavailable`] when Redis does not answer within
    ///   [`LockOptions::op_timeout`](super::LockOptions::op_timeout); the
    ///   guard keeps holding until its local deadline.
    /// * [`Error::Redis`] / [`Error::Malformed`] when Redis answers wrongly.
    pub async fn refresh(&self) -> Result<()> {
        if !self.is_held() {
            return Err(self.not_owner());
        }
        let options = &self.shared.options;
        if self.state().last_ok_sent.elapsed() < options.effective_min_refresh_interval() {
            return Ok(());
        }
        let sent = Instant::now();
        let reply: Vec<Value> = call::script(
            &self.shared.client,
            &script::REFRESH,
            "lock refresh",
            vec![self.shared.key.clone()],
            vec![self.lease.clone(), options.ttl.as_millis().to_string()],
            options.op_timeout,
        )
        .await?;
        if u64_at(&reply, 0, "lock refresh reply")? == 0 {
            self.mark_lost("lock record is gone or someone else's");
            return Err(self.not_owner());
        }
        // The answer may arrive after the local deadline: the guard already
        // reported the loss, and a loss is final.
        if !self.is_held() {
            return Err(self.not_owner());
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if sent > state.last_ok_sent {
            state.last_ok_sent = sent;
            state.deadline = sent + options.ttl;
        }
        Ok(())
    }

    /// Releases the lock; owner only.
    ///
    /// # Errors
    /// * [`Error::NotLockOwner`] when the record in Redis is gone or someone
    ///   else's; nothing is changed.
    /// * [`Error::Unavailable`] when Redis does not answer within
    ///   [`LockOptions::op_timeout`](super::LockOptions::op_timeout); the
    ///   lock then expires after its TTL.
    /// * [`Error::Redis`] when Redis answers with an error.
    pub async fn release(self) -> Result<()> {
        self.released.store(true, Ordering::SeqCst);
        let released: u64 = call::script(
            &self.shared.client,
            &script::RELEASE,
            "lock release",
            vec![self.shared.key.clone()],
            vec![self.lease.clone()],
            self.shared.options.op_timeout,
        )
        .await?;
        if released == 1 {
            metrics::counter!("flotilla_lock_released_total", "lock" => self.shared.name.clone())
                .increment(1);
            tracing::debug!(lock = %self.shared.name, token = self.token, "lock released");
            Ok(())
        } else {
            Err(self.not_owner())
        }
    }

    /// Forgets the lock without releasing it (its record is known to be
    /// gone or someone else's), so dropping the guard sends nothing.
    pub(crate) fn disarm(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn not_owner(&self) -> Error {
        Error::NotLockOwner(self.shared.name.clone())
    }

    /// Records the loss once: flips the watch, counts, logs.
    fn mark_lost(&self, why: &'static str) {
        if !self.lost.send_replace(true) && !self.released.load(Ordering::SeqCst) {
            metrics::counter!("flotilla_lock_lost_total", "lock" => self.shared.name.clone())
                .increment(1);
            tracing::warn!(lock = %self.shared.name, token = self.token, why, "lock lost");
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        if !self.shared.spawn_release(std::mem::take(&mut self.lease)) {
            tracing::warn!(
                lock = %self.shared.name,
                "lock guard dropped outside a tokio runtime; the lock stays held until its ttl"
            );
        }
    }
}
