//! Leader leases: one leader among many processes for a name.
//!
//! A [`LeaderLease`] is a [`ClusterLock`] plus a background task that keeps
//! trying to take it and, once it holds it, renews it every TTL/3. The
//! application follows leadership through a `watch` channel
//! ([`LeaderLease::subscribe`], [`LeaderLease::wait_until_leader`]).
//!
//! * **Step down before anyone else can lead.** The lease is renewed from
//!   this process's monotonic clock; if renewals fail (Redis unreachable,
//!   partition), the leader reports `false` at *(last successful renewal
//!   sent) plus TTL minus margin*, before the lock can expire in Redis and
//!   another process take over. Leadership is never decided by PIDs or wall clocks.
//! * **Fast hand-over.** [`LeaderLease::close`] (or dropping the lease) steps
//!   down and deletes the lock; followers poll every
//!   [`LeaderOptions::follower_poll`] (default 250 ms), so a rolling deploy
//!   hands over in well under a second instead of waiting for the TTL.
//! * **Inspectable.** [`LeaderLease::holder`] returns the holder's id, host,
//!   pid, acquired-at and heartbeat-at (Redis server time) and fencing token;
//!   [`LeaderLease::try_become_leader`] returns [`Error::LockHeld`] naming
//!   the current leader.
//!
//! # Examples
//! ```no_run
//! use std::time::Duration;
//! use flotilla_pool::{LeaderLease, LeaderOptions};
//!
//! # async fn demo(client: fred::prelude::Client) -> flotilla_pool::Result<()> {
//! let lease = LeaderLease::start(&client, "scheduler", LeaderOptions::default()).await?;
//! lease.wait_until_leader().await?;
//! let mut leadership = lease.subscribe();
//! tokio::select! {
//!     _ = leadership.wait_for(|leader| !*leader) => eprintln!("lost leadership"),
//!     _ = async { /* run the scheduler */ } => {}
//! }
//! lease.close().await?; // hand over at once
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::Client;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::lock::{ClusterLock, LockGuard, LockInfo, LockOptions};

/// Options of a [`LeaderLease`].
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use flotilla_pool::LeaderOptions;
///
/// let options = LeaderOptions::default().ttl(Duration::from_secs(3));
/// assert!(options.validate().is_ok());
/// assert_eq!(options.effective_heartbeat_interval(), Duration::from_secs(1));
/// ```
#[derive(Debug, Clone)]
pub struct LeaderOptions {
    /// Lifetime of the lease in Redis without a renewal. A crashed leader is
    /// replaced within about this long.
    ///
    /// Default: 15 s.
    pub ttl: Duration,
    /// How often the leader renews. `None` means `ttl / 3`.
    ///
    /// Default: `None` (`ttl / 3`).
    pub heartbeat_interval: Option<Duration>,
    /// A leader that could not renew steps down this long before its local
    /// deadline (last successful renewal sent + `ttl`). Must cover the time
    /// the application needs to stop leader-only work. `None` means
    /// `ttl / 5`.
    ///
    /// Default: `None` (`ttl / 5`).
    pub step_down_margin: Option<Duration>,
    /// How often a follower tries to take the lease, and how soon a leader
    /// retries a failed renewal. Capped at the heartbeat interval.
    ///
    /// Default: 250 ms.
    pub follower_poll: Duration,
    /// Upper bound of every Redis round trip.
    ///
    /// Default: 2 s.
    pub op_timeout: Duration,
    /// Hash tag of the lease's keys (e.g. the pool's name, so a pool's
    /// scheduler lease lives in the pool's cluster slot).
    ///
    /// Default: `None`.
    pub hash_tag: Option<String>,
    /// The id this process is known by in the holder record.
    ///
    /// Default: a random UUID.
    pub owner_id: String,
}

impl Default for LeaderOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(15),
            heartbeat_interval: None,
            step_down_margin: None,
            follower_poll: Duration::from_millis(250),
            op_timeout: Duration::from_secs(2),
            hash_tag: None,
            owner_id: uuid::Uuid::new_v4().to_string(),
        }
    }
}

impl LeaderOptions {
    /// Sets [`ttl`](Self::ttl).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets [`heartbeat_interval`](Self::heartbeat_interval).
    #[must_use]
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// Sets [`step_down_margin`](Self::step_down_margin).
    #[must_use]
    pub fn step_down_margin(mut self, margin: Duration) -> Self {
        self.step_down_margin = Some(margin);
        self
    }

    /// Sets [`follower_poll`](Self::follower_poll).
    #[must_use]
    pub fn follower_poll(mut self, poll: Duration) -> Self {
        self.follower_poll = poll;
        self
    }

    /// Sets [`op_timeout`](Self::op_timeout).
    #[must_use]
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
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

    /// The renewal interval in effect.
    pub fn effective_heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval.unwrap_or(self.ttl / 3)
    }

    /// The step-down margin in effect.
    pub fn effective_step_down_margin(&self) -> Duration {
        self.step_down_margin.unwrap_or(self.ttl / 5)
    }

    /// The follower poll interval in effect (capped at the heartbeat).
    pub fn effective_follower_poll(&self) -> Duration {
        self.follower_poll.min(self.effective_heartbeat_interval())
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the heartbeat does not fit before the
    /// step-down point (`heartbeat_interval + step_down_margin < ttl` is
    /// required), `follower_poll` is zero, or the underlying
    /// [`LockOptions`] are invalid; [`Error::InvalidName`] for a bad
    /// `owner_id` or `hash_tag`.
    pub fn validate(&self) -> Result<()> {
        self.lock_options().validate()?;
        let heartbeat = self.effective_heartbeat_interval();
        if heartbeat.is_zero() {
            return Err(invalid("heartbeat_interval", "must be greater than zero"));
        }
        if heartbeat + self.effective_step_down_margin() >= self.ttl {
            return Err(invalid(
                "heartbeat_interval",
                "heartbeat_interval + step_down_margin must be less than ttl",
            ));
        }
        if self.follower_poll.is_zero() {
            return Err(invalid("follower_poll", "must be greater than zero"));
        }
        Ok(())
    }

    fn lock_options(&self) -> LockOptions {
        let heartbeat = self.effective_heartbeat_interval();
        LockOptions {
            ttl: self.ttl,
            hash_tag: self.hash_tag.clone(),
            owner_id: self.owner_id.clone(),
            retry_interval: self.effective_follower_poll().max(Duration::from_millis(1)),
            min_refresh_interval: Some(heartbeat / 4),
            op_timeout: self.op_timeout,
        }
    }
}

fn invalid(option: &'static str, reason: &str) -> Error {
    Error::InvalidOptions {
        option,
        reason: reason.to_string(),
    }
}

/// Leadership of one name among all processes that start a lease for it.
///
/// The background task is owned by the lease: [`close`](Self::close) stops
/// it and releases the lock; dropping the lease does the same in the
/// background.
///
/// # Examples
/// ```no_run
/// # async fn demo(client: fred::prelude::Client) -> flotilla_pool::Result<()> {
/// use flotilla_pool::{Error, LeaderLease, LeaderOptions};
///
/// let lease = LeaderLease::start(&client, "billing-cron", LeaderOptions::default()).await?;
/// match lease.try_become_leader().await {
///     Ok(()) => println!("leading"),
///     Err(Error::LockHeld { holder, .. }) => println!("not leading; the leader is {holder}"),
///     Err(other) => return Err(other),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaderLease {
    lock: ClusterLock,
    leader: watch::Receiver<bool>,
    /// Fencing token of the latest acquisition (0: none yet).
    token: Arc<AtomicU64>,
    requests: mpsc::Sender<oneshot::Sender<Result<()>>>,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<()>>>,
}

/// The background task's state.
struct Runner {
    lock: ClusterLock,
    leader: watch::Sender<bool>,
    token: Arc<AtomicU64>,
    requests: mpsc::Receiver<oneshot::Sender<Result<()>>>,
    cancel: CancellationToken,
    heartbeat: Duration,
    margin: Duration,
    poll: Duration,
    guard: Option<LockGuard>,
    /// Whether the last attempt failed on Redis (to log transitions once).
    failing: bool,
}

impl LeaderLease {
    /// Starts competing for leadership of `name`: makes a first attempt
    /// right away, then keeps trying in a background task, and renews every
    /// heartbeat once leading.
    ///
    /// # Errors
    /// [`Error::InvalidName`] / [`Error::InvalidOptions`] for a bad name or
    /// options; [`Error::Redis`] when Redis refuses the first attempt (e.g.
    /// missing ACL permissions). An unreachable Redis is not an error here:
    /// the lease keeps trying.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn start(client: &Client, name: &str, options: LeaderOptions) -> Result<Self> {
        options.validate()?;
        let lock = ClusterLock::new(client, name, options.lock_options())?;
        let (leader_tx, leader_rx) = watch::channel(false);
        let (request_tx, request_rx) = mpsc::channel(8);
        let cancel = CancellationToken::new();
        let token = Arc::new(AtomicU64::new(0));
        let mut runner = Runner {
            lock: lock.clone(),
            leader: leader_tx,
            token: Arc::clone(&token),
            requests: request_rx,
            cancel: cancel.clone(),
            heartbeat: options.effective_heartbeat_interval(),
            margin: options.effective_step_down_margin(),
            poll: options.effective_follower_poll(),
            guard: None,
            failing: false,
        };
        match runner.attempt().await {
            Ok(()) | Err(Error::LockHeld { .. } | Error::Unavailable(_)) => {}
            Err(error) => return Err(error),
        }
        let task = tokio::spawn(runner.run());
        Ok(Self {
            lock,
            leader: leader_rx,
            token,
            requests: request_tx,
            cancel,
            task: Some(task),
        })
    }

    /// The lease's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The owner id this process competes under.
    pub fn owner_id(&self) -> &str {
        self.lock.owner_id()
    }

    /// Whether this process leads right now.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// The fencing token of the current leadership while this process
    /// leads, `None` otherwise. Tokens strictly increase with every
    /// acquisition of the lease by anyone, so storage (or a script that
    /// compares it with the lease's holder record) can refuse a deposed
    /// leader.
    pub fn fencing_token(&self) -> Option<u64> {
        let token = self.token.load(Ordering::Acquire);
        (self.is_leader() && token != 0).then_some(token)
    }

    /// A receiver of leadership changes: `true` while this process leads.
    /// It closes when the lease is closed.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Waits until this process leads.
    ///
    /// # Errors
    /// [`Error::Closed`] when the lease is closed before that.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_until_leader(&self) -> Result<()> {
        let mut rx = self.leader.clone();
        rx.wait_for(|leading| *leading)
            .await
            .map(|_| ())
            .map_err(|_| Error::Closed)
    }

    /// Tries to take leadership now instead of at the next poll.
    ///
    /// # Errors
    /// * [`Error::LockHeld`] naming the current leader (owner id, host, pid,
    ///   token, remaining TTL) when another process leads;
    /// * [`Error::NotLockOwner`] when this process holds the lock but has
    ///   stepped down because it cannot renew;
    /// * [`Error::Unavailable`] when Redis cannot be reached;
    /// * [`Error::Closed`] when the lease is closed.
    pub async fn try_become_leader(&self) -> Result<()> {
        if self.is_leader() {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.requests.send(tx).await.map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// The current holder of the lease as recorded in Redis (this process or
    /// another), or `None` when nobody leads.
    ///
    /// # Errors
    /// As [`ClusterLock::info`].
    pub async fn holder(&self) -> Result<Option<LockInfo>> {
        self.lock.info().await
    }

    /// Steps down (the watch turns `false` first), releases the lease so a
    /// follower takes over within its poll interval, and stops the
    /// background task.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the release could not reach Redis (the
    /// lease then expires after its TTL); [`Error::Redis`] when Redis
    /// refused it.
    pub async fn close(mut self) -> Result<()> {
        self.cancel.cancel();
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for LeaderLease {
    fn drop(&mut self) {
        // The task steps down and releases the lock on its way out.
        self.cancel.cancel();
    }
}

impl Runner {
    async fn run(mut self) -> Result<()> {
        let mut next_beat = Instant::now() + self.heartbeat;
        loop {
            if self.guard.is_none() {
                tokio::select! {
                    () = self.cancel.cancelled() => break,
                    () = tokio::time::sleep(self.poll) => {
                        let _ = self.attempt().await;
                    }
                    Some(reply) = self.requests.recv() => {
                        let _ = reply.send(self.attempt().await);
                    }
                }
                next_beat = Instant::now() + self.heartbeat;
                continue;
            }
            let Some(deadline) = self.guard.as_ref().map(LockGuard::deadline) else {
                continue;
            };
            if Instant::now() >= deadline {
                // The local deadline passed without a renewal: give the lock
                // up (a background release frees it if it is still ours).
                self.step_down("lease expired locally");
                self.guard = None;
                continue;
            }
            let step_down_at = deadline.checked_sub(self.margin).unwrap_or(deadline);
            let leading = self.is_leading();
            tokio::select! {
                () = self.cancel.cancelled() => break,
                () = tokio::time::sleep_until(next_beat) => {}
                () = tokio::time::sleep_until(step_down_at), if leading => {
                    self.step_down("cannot renew the lease");
                    continue;
                }
                Some(reply) = self.requests.recv() => {
                    let answer = if leading { Ok(()) } else { Err(Error::NotLockOwner(self.lock.name().to_string())) };
                    let _ = reply.send(answer);
                    continue;
                }
            }
            // Renew, stepping down on time even if Redis does not answer.
            let Some(guard) = self.guard.take() else {
                continue;
            };
            let sent = Instant::now();
            let result = {
                let renewal = guard.refresh();
                tokio::pin!(renewal);
                loop {
                    let leading = self.is_leading();
                    tokio::select! {
                        result = &mut renewal => break Some(result),
                        () = tokio::time::sleep_until(step_down_at), if leading => {
                            self.step_down("renewal is late");
                        }
                        () = self.cancel.cancelled() => break None,
                    }
                }
            };
            match result {
                None => {
                    self.guard = Some(guard);
                    break;
                }
                Some(Ok(())) => {
                    next_beat = sent + self.heartbeat;
                    self.failing = false;
                    if guard.is_held() && Instant::now() < guard.deadline() - self.margin {
                        self.guard = Some(guard);
                        self.set_leading(true, "renewed the lease");
                    } else {
                        self.guard = Some(guard);
                    }
                }
                Some(Err(Error::NotLockOwner(_))) => {
                    guard.disarm();
                    self.step_down("the lease was lost");
                }
                Some(Err(error)) => {
                    next_beat = Instant::now() + self.poll;
                    self.report_failure(&error);
                    self.guard = Some(guard);
                }
            }
        }
        // Shutting down: step down first, then free the lock for the next
        // leader.
        self.step_down("closing");
        match self.guard.take() {
            Some(guard) => match guard.release().await {
                Ok(()) | Err(Error::NotLockOwner(_)) => Ok(()),
                Err(error) => {
                    tracing::warn!(lease = %self.lock.name(), %error, "could not release the lease; it expires after its ttl");
                    Err(error)
                }
            },
            None => Ok(()),
        }
    }

    /// One attempt to take the lease.
    async fn attempt(&mut self) -> Result<()> {
        match self.lock.try_acquire().await {
            Ok(guard) => {
                let token = guard.token();
                self.token.store(token, Ordering::Release);
                self.guard = Some(guard);
                self.failing = false;
                tracing::info!(lease = %self.lock.name(), token, "became leader");
                self.set_leading(true, "acquired the lease");
                Ok(())
            }
            Err(error @ Error::LockHeld { .. }) => {
                self.failing = false;
                Err(error)
            }
            Err(error) => {
                self.report_failure(&error);
                Err(error)
            }
        }
    }

    fn is_leading(&self) -> bool {
        *self.leader.borrow()
    }

    fn set_leading(&self, leading: bool, why: &'static str) {
        if self.leader.send_replace(leading) != leading {
            let name = self.lock.name().to_string();
            if leading {
                metrics::counter!("flotilla_leader_elected_total", "lease" => name).increment(1);
            } else {
                metrics::counter!("flotilla_leader_stepped_down_total", "lease" => name)
                    .increment(1);
                tracing::info!(lease = %self.lock.name(), why, "stepped down");
            }
        }
    }

    fn step_down(&self, why: &'static str) {
        self.set_leading(false, why);
    }

    fn report_failure(&mut self, error: &Error) {
        if !self.failing {
            tracing::warn!(lease = %self.lock.name(), %error, "leader lease cannot reach redis; retrying");
        }
        self.failing = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_consistent() {
        let options = LeaderOptions::default();
        assert!(options.validate().is_ok());
        assert_eq!(
            options.effective_heartbeat_interval(),
            Duration::from_secs(5)
        );
        assert_eq!(options.effective_step_down_margin(), Duration::from_secs(3));
        assert_eq!(
            options.effective_follower_poll(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn heartbeat_must_fit_before_step_down() {
        let options = LeaderOptions::default()
            .ttl(Duration::from_secs(1))
            .heartbeat_interval(Duration::from_millis(900));
        assert!(matches!(
            options.validate(),
            Err(Error::InvalidOptions {
                option: "heartbeat_interval",
                ..
            })
        ));
    }
}
