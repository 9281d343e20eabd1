//! Options of a pool node. Defaults live in `impl Default` only.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::lifecycle::RestartPolicy;

/// What a worker does when it could not renew its keep-alive (its lease on
/// its jobs) for [`NodeOptions::lease_stop_after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeasePolicy {
    /// Stop every job before the lease can lapse, so no other worker can
    /// start them while they still run here (invariant I1 without relying on
    /// downstream fencing). Jobs are restarted, with a new fencing token,
    /// once renewal succeeds again and the pool still assigns them here.
    #[default]
    StopJobs,
    /// Keep running and rely on fencing tokens downstream to reject the
    /// stale owner once another worker took the job.
    KeepRunning,
}

/// Options for [`Node::join`](crate::Node::join).
///
/// ```
/// use std::time::Duration;
/// use flotilla_pool::NodeOptions;
///
/// let options = NodeOptions::default()
///     .worker_ttl(Duration::from_secs(10))
///     .max_payload_size(64 * 1024);
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeOptions {
    /// A client-only node dispatches but hosts no worker and runs no
    /// cleanup. Default: `false`.
    pub client_only: bool,
    /// How long a worker may go without renewing its keep-alive before any
    /// node may declare it dead and move its jobs. Renewals happen every
    /// TTL/3. Default: 30 s.
    pub worker_ttl: Duration,
    /// A worker that has not renewed for this long, by its own monotonic
    /// clock since the last successful renewal was sent, stops its jobs
    /// (with [`LeasePolicy::StopJobs`]). Must be below `worker_ttl`; the
    /// margin `worker_ttl - lease_stop_after` must cover the handler's
    /// `stop` time. Default: 2/3 of `worker_ttl` (20 s).
    pub lease_stop_after: Duration,
    /// What to do on lease loss. Default: [`LeasePolicy::StopJobs`].
    pub lease_policy: LeasePolicy,
    /// The longest one handler `stop` may take (on lease loss, a rebalance,
    /// `close`, `stop_job`). Past it the pool reports the overrun and counts
    /// the job as stopped (see [`Handler::stop`](crate::Handler::stop)). On
    /// lease loss every job of the node stops at once, each within this
    /// budget, so the rule that keeps I1 is
    /// `stop_timeout <= (worker_ttl - lease_stop_after) * 4/5`: the stop
    /// margin must hold the budget plus a fifth of slack for timers and
    /// scheduling. [`validate`](Self::validate) refuses anything else.
    /// Default: half the margin, `worker_ttl / 6` (5 s).
    pub stop_timeout: Duration,
    /// How long `close` waits for local handlers to stop. Default: 30 s.
    pub worker_shutdown_ttl: Duration,
    /// How long a dispatch may stay pending (admitted, not yet started)
    /// before it is treated as stale and requeued. Counted on Redis server
    /// time from admission, on top of `dispatch_timeout`. Default: 20 s.
    pub ack_grace: Duration,
    /// Most events queued in one worker inbox; a dispatch to a fuller inbox
    /// fails with [`Error::PoolFull`]. `0` means no limit. Default: 10,000.
    pub max_queued_jobs: u64,
    /// How long `dispatch_job`, `stop_job` wait for the worker's answer
    /// (and for a first worker when none is active). Default: 10 s.
    pub dispatch_timeout: Duration,
    /// Largest accepted payload. Default: 1 MiB.
    pub max_payload_size: usize,
    /// A payload without pending dispatch and without an owner (or whose
    /// owner is not registered) is requeued when the sweep finds it still
    /// orphaned, in the same state, this long after it first saw it so
    /// (Redis server time). Default: 2 × `worker_ttl`.
    pub orphan_grace: Duration,
    /// Period of the dead-worker check, which every node runs on the
    /// (small) membership maps; Redis decides who is dead. A dead worker is
    /// found between one TTL and one TTL plus this period after its last
    /// renewal. Default: `worker_ttl` / 4.
    pub cleanup_interval: Duration,
    /// Period of one step of the pool-wide sweeps (orphans, stale pending
    /// guards). They run on one node only, the holder of the pool's sweeper
    /// lease, and each step reads one page of about
    /// [`sweep_batch`](Self::sweep_batch) keys from Redis, so a pass over
    /// the pool takes `jobs / sweep_batch` steps (200,000 jobs: 400 steps,
    /// 400 s with the defaults) and an idle pool costs one small script per
    /// step, whatever its size: with 200,000 jobs a step costs Redis about
    /// 2 ms (Redis 7.0), which keeps an idle pool well under 1% of a core.
    /// A key orphaned for `orphan_grace` is requeued within two passes after
    /// that. While steps find orphans (first seen, or requeued) the next
    /// one follows at once, up to 64 in a row, except while the pool
    /// recovers from a loss (its workers re-assert then): after Redis lost its data
    /// and every job is an orphan, a pass marks them all in moments and
    /// the requeues follow one grace later, not one page per interval.
    /// Default: 1 s.
    pub sweep_interval: Duration,
    /// Keys read per sweep step (the `COUNT` of each `HSCAN` page; Redis
    /// may return a few more). Between 1 and 10,000. Default: 500.
    pub sweep_batch: usize,
    /// Whether this node keeps a replica of the pool's jobs and pending
    /// maps (every job's owner and every pending dispatch, updated on every
    /// change). Default: `false`.
    ///
    /// A replica costs the node CPU and Redis network output on *every*
    /// dispatch in the pool, so each mirroring process lowers the pool's
    /// throughput. Turn it on where a pool-wide view without a Redis round
    /// trip is worth that: inspectors, dashboards, applications that read
    /// [`Node::job_keys`] or [`Node::job_owner`] for other nodes' jobs. A
    /// node that does not mirror still knows its own workers' jobs;
    /// [`Node::job_keys`] and [`Node::job_owner`] then answer from this
    /// node's workers only, and [`Node::lookup_job_owner`] and
    /// [`Node::lookup_job_keys`] ask Redis. It sees Redis go back in time
    /// as a mirroring node does, in its scripts (the server's run id
    /// against the one it last read, and the keep-alive map's revision)
    /// and after every reconnect (the run id); only the jobs map's revision
    /// is not compared (see the pool README, Guarantees).
    ///
    /// [`Node::job_keys`]: crate::Node::job_keys
    /// [`Node::job_owner`]: crate::Node::job_owner
    /// [`Node::lookup_job_owner`]: crate::Node::lookup_job_owner
    /// [`Node::lookup_job_keys`]: crate::Node::lookup_job_keys
    pub mirror_jobs: bool,
    /// Fixed node id; `None` generates a unique one. Default: `None`.
    /// It must be unique among the pool's live nodes. A process may come
    /// back under the id it had before (a pod name) once the earlier one
    /// has exited: it shares that run's reply stream, and answers still on
    /// their way to the earlier run are told apart from its own (each run
    /// numbers its requests from a random start).
    pub node_id: Option<String>,
    /// Longest wait for Redis to answer one of the pool's calls (scripts,
    /// payload reads); past it the call fails with
    /// [`Error::Unavailable`](crate::Error::Unavailable), so callers fail fast
    /// while Redis is unreachable whatever the client's own timeouts.
    /// Default: 5 s.
    pub redis_timeout: Duration,
    /// How this node's workers restart jobs that fail (unless the dispatch
    /// set its own, [`DispatchOptions::restart_policy`]). Default:
    /// [`RestartPolicy::default`] (first restart within 1 s, doubling up to
    /// 60 s, failed after 10 failures in a row).
    pub restart_policy: RestartPolicy,
    /// How many keys each worker of this node handles at the same time.
    /// A worker's inbox events go to lanes by their key: the events of one
    /// key in inbox order, those of different lanes concurrently, so a
    /// handler `start` or `stop` that takes a while holds up the other keys
    /// of its lane only. Raise it when starts or stops wait on something
    /// (a connection, a warm-up): with 16 lanes and 1 s starts, a worker
    /// starts about 16 jobs a second. Each lane is one task and a queue of
    /// up to 512 events. Between 1 and 4,096. Default: 16.
    pub worker_lanes: usize,
}

impl Default for NodeOptions {
    fn default() -> Self {
        let ttl = Duration::from_secs(30);
        NodeOptions {
            client_only: false,
            worker_ttl: ttl,
            lease_stop_after: ttl * 2 / 3,
            lease_policy: LeasePolicy::StopJobs,
            stop_timeout: ttl / 6,
            worker_shutdown_ttl: Duration::from_secs(30),
            ack_grace: Duration::from_secs(20),
            max_queued_jobs: 10_000,
            dispatch_timeout: Duration::from_secs(10),
            max_payload_size: 1024 * 1024,
            orphan_grace: ttl * 2,
            cleanup_interval: ttl / 4,
            sweep_interval: Duration::from_secs(1),
            sweep_batch: 500,
            mirror_jobs: false,
            node_id: None,
            redis_timeout: Duration::from_secs(5),
            restart_policy: RestartPolicy::default(),
            worker_lanes: 16,
        }
    }
}

impl NodeOptions {
    /// How long a pending guard holds a key for its dispatch: the dispatch
    /// timeout and the grace for the start's answer.
    pub(crate) fn pending_ttl(&self) -> Duration {
        self.dispatch_timeout + self.ack_grace
    }

    /// Makes the node client-only (dispatch only).
    pub fn client_only(mut self, on: bool) -> Self {
        self.client_only = on;
        self
    }

    /// Sets the worker TTL, and with it the derived defaults:
    /// `lease_stop_after` = 2/3 TTL, `stop_timeout` = TTL/6,
    /// `orphan_grace` = 2 TTL, `cleanup_interval` = TTL/4. Set those after
    /// this call to override.
    pub fn worker_ttl(mut self, ttl: Duration) -> Self {
        self.worker_ttl = ttl;
        self.lease_stop_after = ttl * 2 / 3;
        self.stop_timeout = ttl / 6;
        self.orphan_grace = ttl * 2;
        self.cleanup_interval = ttl / 4;
        self
    }

    /// Sets when a worker that cannot renew stops its jobs.
    pub fn lease_stop_after(mut self, after: Duration) -> Self {
        self.lease_stop_after = after;
        self
    }

    /// Sets the longest wait for one handler `stop`.
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }

    /// The stop margin: from the last renewal sent to the earliest moment
    /// another worker may start this node's jobs, minus the time this node
    /// waits before stopping them (`worker_ttl - lease_stop_after`).
    pub fn stop_margin(&self) -> Duration {
        self.worker_ttl.saturating_sub(self.lease_stop_after)
    }

    /// The largest `stop_timeout` the stop margin holds: four fifths of it
    /// (the fifth left covers timer lateness and scheduling).
    pub fn max_stop_timeout(&self) -> Duration {
        self.stop_margin() * 4 / 5
    }

    /// Sets the lease policy.
    pub fn lease_policy(mut self, policy: LeasePolicy) -> Self {
        self.lease_policy = policy;
        self
    }

    /// Sets how long `close` waits for handlers to stop.
    pub fn worker_shutdown_ttl(mut self, ttl: Duration) -> Self {
        self.worker_shutdown_ttl = ttl;
        self
    }

    /// Sets the pending-dispatch grace period.
    pub fn ack_grace(mut self, grace: Duration) -> Self {
        self.ack_grace = grace;
        self
    }

    /// Sets the per-inbox queue limit (`0`: none).
    pub fn max_queued_jobs(mut self, max: u64) -> Self {
        self.max_queued_jobs = max;
        self
    }

    /// Sets the dispatch timeout.
    pub fn dispatch_timeout(mut self, timeout: Duration) -> Self {
        self.dispatch_timeout = timeout;
        self
    }

    /// Sets the payload size limit.
    pub fn max_payload_size(mut self, bytes: usize) -> Self {
        self.max_payload_size = bytes;
        self
    }

    /// Sets the orphan grace period.
    pub fn orphan_grace(mut self, grace: Duration) -> Self {
        self.orphan_grace = grace;
        self
    }

    /// Sets the cleanup sweep period.
    pub fn cleanup_interval(mut self, interval: Duration) -> Self {
        self.cleanup_interval = interval;
        self
    }

    /// Sets [`sweep_interval`](Self::sweep_interval).
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Sets [`sweep_batch`](Self::sweep_batch).
    pub fn sweep_batch(mut self, keys: usize) -> Self {
        self.sweep_batch = keys;
        self
    }

    /// Sets [`mirror_jobs`](Self::mirror_jobs).
    pub fn mirror_jobs(mut self, mirror: bool) -> Self {
        self.mirror_jobs = mirror;
        self
    }

    /// Sets a fixed node id.
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = Some(id.into());
        self
    }

    /// Sets the longest wait for one Redis call.
    pub fn redis_timeout(mut self, timeout: Duration) -> Self {
        self.redis_timeout = timeout;
        self
    }

    /// Sets [`restart_policy`](Self::restart_policy).
    pub fn restart_policy(mut self, policy: RestartPolicy) -> Self {
        self.restart_policy = policy;
        self
    }

    /// Sets [`worker_lanes`](Self::worker_lanes).
    pub fn worker_lanes(mut self, lanes: usize) -> Self {
        self.worker_lanes = lanes;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] naming the first bad option.
    pub fn validate(&self) -> Result<()> {
        let bad = |option, reason: &str| {
            Err(Error::InvalidOptions {
                option,
                reason: reason.to_string(),
            })
        };
        if self.worker_ttl < Duration::from_millis(300) {
            return bad("worker_ttl", "must be at least 300 ms");
        }
        self.restart_policy.validate()?;
        if self.lease_stop_after.is_zero() || self.lease_stop_after >= self.worker_ttl {
            return bad(
                "lease_stop_after",
                "must be above zero and below worker_ttl",
            );
        }
        if self.stop_timeout.is_zero() {
            return bad("stop_timeout", "must be above zero");
        }
        if self.lease_policy == LeasePolicy::StopJobs && self.stop_timeout > self.max_stop_timeout()
        {
            return Err(Error::InvalidOptions {
                option: "stop_timeout",
                reason: format!(
                    "{:?} does not fit the stop margin: worker_ttl {:?} - lease_stop_after {:?} = {:?}, \
                     of which at most 4/5 ({:?}) may go to stopping jobs; lower stop_timeout or \
                     lease_stop_after, or raise worker_ttl",
                    self.stop_timeout,
                    self.worker_ttl,
                    self.lease_stop_after,
                    self.stop_margin(),
                    self.max_stop_timeout()
                ),
            });
        }
        if self.dispatch_timeout.is_zero() {
            return bad("dispatch_timeout", "must be above zero");
        }
        if self.redis_timeout.is_zero() {
            return bad("redis_timeout", "must be above zero");
        }
        if self.cleanup_interval.is_zero() {
            return bad("cleanup_interval", "must be above zero");
        }
        if self.sweep_interval.is_zero() {
            return bad("sweep_interval", "must be above zero");
        }
        if !(1..=10_000).contains(&self.sweep_batch) {
            return bad("sweep_batch", "must be between 1 and 10,000");
        }
        if !(1..=4096).contains(&self.worker_lanes) {
            return bad("worker_lanes", "must be between 1 and 4,096");
        }
        if self.max_payload_size == 0 || self.max_payload_size > 512 * 1024 * 1024 {
            return bad("max_payload_size", "must be between 1 byte and 512 MiB");
        }
        if let Some(id) = &self.node_id
            && let Err(reason) = flotilla_rmap::check_name(id)
        {
            return bad("node_id", reason);
        }
        Ok(())
    }
}

/// Options of one dispatch ([`Node::dispatch_job_with`](crate::Node::dispatch_job_with)).
///
/// ```
/// use std::time::Duration;
/// use flotilla_pool::DispatchOptions;
///
/// let options = DispatchOptions::default().idempotency_window(Duration::from_secs(60));
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DispatchOptions {
    /// When set, a dispatch of a key that was admitted less than this long
    /// ago (Redis server time) by another dispatch with a window is refused
    /// with [`Error::AlreadyDispatched`] — even if that job has finished
    /// since. An admission with a window leaves a marker that expires after
    /// the window. Use one window per key: the marker lives as long as the
    /// window of the dispatch that wrote it. Dispatches without a window
    /// neither check nor write markers. Default: `None`.
    pub idempotency_window: Option<Duration>,
    /// Set by a schedule: record the admission in the schedule's job set,
    /// fenced by its leader token.
    pub(crate) schedule: Option<ScheduleFence>,
    /// How this job is restarted after failures; `None`: the policy of the
    /// node whose worker runs it ([`NodeOptions::restart_policy`]).
    /// Default: `None`.
    pub restart_policy: Option<RestartPolicy>,
}

/// What a schedule's dispatch carries so that admission records it and
/// refuses a deposed leader, atomically.
#[derive(Debug, Clone)]
pub(crate) struct ScheduleFence {
    /// The schedule's name.
    pub(crate) name: String,
    /// The schedule's job-set hash.
    pub(crate) record_key: String,
    /// The schedule's leader-lease lock key (its holder record).
    pub(crate) lock_key: String,
    /// The leader's fencing token; admission compares it with the record.
    pub(crate) token: u64,
}

impl DispatchOptions {
    /// Sets [`idempotency_window`](Self::idempotency_window).
    #[must_use]
    pub fn idempotency_window(mut self, window: Duration) -> Self {
        self.idempotency_window = Some(window);
        self
    }

    /// Sets [`restart_policy`](Self::restart_policy).
    #[must_use]
    pub fn restart_policy(mut self, policy: RestartPolicy) -> Self {
        self.restart_policy = Some(policy);
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the window is under 1 ms or over
    /// 30 days.
    pub fn validate(&self) -> Result<()> {
        if let Some(window) = self.idempotency_window
            && (window < Duration::from_millis(1) || window > Duration::from_secs(30 * 86_400))
        {
            return Err(Error::InvalidOptions {
                option: "idempotency_window",
                reason: "must be between 1 ms and 30 days".to_string(),
            });
        }
        if let Some(policy) = &self.restart_policy {
            policy.validate()?;
        }
        Ok(())
    }
}

/// Options of a schedule ([`Node::schedule_with`](crate::Node::schedule_with)).
///
/// ```
/// use std::time::Duration;
/// use flotilla_pool::ScheduleOptions;
///
/// let options = ScheduleOptions::default().leader_ttl(Duration::from_secs(5));
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScheduleOptions {
    /// TTL of the schedule's leader lease: a leader that dies is replaced
    /// within about this long (plus one follower poll). Default: 15 s.
    pub leader_ttl: Duration,
    /// How often a follower tries to become leader; a leader that closes
    /// gracefully is replaced within about this long. Default: 250 ms.
    pub follower_poll: Duration,
    /// Most dispatches (or stops) of one run in flight at once.
    /// Default: 16.
    pub max_concurrent: usize,
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        ScheduleOptions {
            leader_ttl: Duration::from_secs(15),
            follower_poll: Duration::from_millis(250),
            max_concurrent: 16,
        }
    }
}

impl ScheduleOptions {
    /// Sets [`leader_ttl`](Self::leader_ttl).
    #[must_use]
    pub fn leader_ttl(mut self, ttl: Duration) -> Self {
        self.leader_ttl = ttl;
        self
    }

    /// Sets [`follower_poll`](Self::follower_poll).
    #[must_use]
    pub fn follower_poll(mut self, poll: Duration) -> Self {
        self.follower_poll = poll;
        self
    }

    /// Sets [`max_concurrent`](Self::max_concurrent).
    #[must_use]
    pub fn max_concurrent(mut self, max: usize) -> Self {
        self.max_concurrent = max;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when `max_concurrent` is zero or the
    /// leader lease options are invalid (see
    /// [`LeaderOptions::validate`](crate::LeaderOptions::validate)).
    pub fn validate(&self) -> Result<()> {
        if self.max_concurrent == 0 {
            return Err(Error::InvalidOptions {
                option: "max_concurrent",
                reason: "must be at least 1".to_string(),
            });
        }
        crate::leader::LeaderOptions::default()
            .ttl(self.leader_ttl)
            .follower_poll(self.follower_poll)
            .validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_timeout_must_fit_the_stop_margin() {
        let o = NodeOptions::default().worker_ttl(Duration::from_secs(2));
        assert_eq!(o.stop_margin().as_millis(), 666);
        assert_eq!(o.stop_timeout.as_millis(), 333);
        assert!(o.validate().is_ok());
        assert!(
            o.clone()
                .stop_timeout(o.max_stop_timeout())
                .validate()
                .is_ok()
        );
        let too_long = o
            .clone()
            .stop_timeout(o.max_stop_timeout() + Duration::from_millis(1));
        match too_long.validate() {
            Err(Error::InvalidOptions { option, reason }) => {
                assert_eq!(option, "stop_timeout");
                assert!(reason.contains("stop margin"), "{reason}");
            }
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
        // A later lease stop narrows the margin: the default budget no
        // longer fits.
        assert!(
            o.clone()
                .lease_stop_after(Duration::from_millis(1800))
                .validate()
                .is_err()
        );
        // Without stopping on lease loss there is no margin to hold.
        assert!(
            too_long
                .lease_policy(LeasePolicy::KeepRunning)
                .validate()
                .is_ok()
        );
        assert!(NodeOptions::default().validate().is_ok());
        assert_eq!(NodeOptions::default().stop_timeout, Duration::from_secs(5));
    }
}
