//! A job's life after its start: it may **finish** (the key leaves the
//! pool and can be dispatched again at once) or **fail** (it is restarted
//! after an exponential backoff, and marked failed after too many
//! consecutive failures).
//!
//! A handler reports the end through the [`JobOutcome`] of its [`Job`]
//! ([`Job::outcome`]); [`TaskHandler`](crate::TaskHandler) does it for its
//! tasks (`Ok` → finished, `Err` or panic → failed). Both handler kinds take
//! this one path: the report goes to the worker, which records it in Redis
//! (`scripts/job_ended.lua`) only while Redis still names it the owner of
//! that very run, so a late report of a stopped or moved run is ignored.
//!
//! A restart stays on the worker (same placement) and gets a new fencing
//! token from Redis (`scripts/job_restart.lua`), again only while Redis
//! names the worker the owner. While a job waits to restart, the pool
//! treats it as running: `dispatch_job` answers `JobExists`, `stop_job`
//! stops it for good, and if its worker dies the cleanup restarts it
//! elsewhere, once.

pub(crate) mod failures;
mod restart;
mod status;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backon::BackoffBuilder;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub(crate) use restart::{FinalEnd, WorkerLifecycle};
pub use status::JobStatus;

use crate::error::{Error, Result};

/// When and how often a failed job is restarted.
///
/// Delays grow exponentially from `first_delay` by `factor`, capped at
/// `max_delay`, with random jitter (each delay is stretched by up to 100%,
/// then capped). After `max_failures` consecutive failures the job is
/// marked failed: it is not restarted, and [`Node::job_status`] reports
/// it until it is stopped or dispatched again. A run that lasted
/// `reset_after` before failing starts the count over.
///
/// Set per pool with [`NodeOptions::restart_policy`] (applied by the
/// worker that runs the job) or per dispatch with
/// [`DispatchOptions::restart_policy`].
///
/// [`Node::job_status`]: crate::Node::job_status
/// [`NodeOptions::restart_policy`]: crate::NodeOptions::restart_policy
/// [`DispatchOptions::restart_policy`]: crate::DispatchOptions::restart_policy
///
/// ```
/// use flotilla_pool::RestartPolicy;
/// use std::time::Duration;
///
/// let policy = RestartPolicy::default()
///     .first_delay(Duration::from_millis(200))
///     .max_delay(Duration::from_secs(30))
///     .max_failures(5);
/// assert!(policy.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RestartPolicy {
    /// Delay before the first restart (before jitter). Default: 500 ms, so
    /// the first restart comes within 1 s.
    pub first_delay: Duration,
    /// Longest delay between restarts. Default: 60 s.
    pub max_delay: Duration,
    /// Growth of the delay per failure. Default: 2.
    pub factor: f32,
    /// Consecutive failures after which the job is marked failed and not
    /// restarted (1: never restart). Default: 10.
    pub max_failures: u32,
    /// A run that lasted this long before failing counts as the first
    /// failure again. Default: 10 min.
    pub reset_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(60),
            factor: 2.0,
            max_failures: 10,
            reset_after: Duration::from_secs(600),
        }
    }
}

impl RestartPolicy {
    /// The most `max_failures` may be.
    pub const MAX_FAILURES: u32 = 1_000;

    /// Sets [`first_delay`](Self::first_delay).
    #[must_use]
    pub fn first_delay(mut self, delay: Duration) -> Self {
        self.first_delay = delay;
        self
    }

    /// Sets [`max_delay`](Self::max_delay).
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Sets [`factor`](Self::factor).
    #[must_use]
    pub fn factor(mut self, factor: f32) -> Self {
        self.factor = factor;
        self
    }

    /// Sets [`max_failures`](Self::max_failures).
    #[must_use]
    pub fn max_failures(mut self, failures: u32) -> Self {
        self.max_failures = failures;
        self
    }

    /// Sets [`reset_after`](Self::reset_after).
    #[must_use]
    pub fn reset_after(mut self, after: Duration) -> Self {
        self.reset_after = after;
        self
    }

    /// Checks the policy.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero or out-of-range field, a
    /// `max_delay` below `first_delay`, or a `factor` below 1.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: &str| {
            Err(Error::InvalidOptions {
                option: "restart_policy",
                reason: reason.to_string(),
            })
        };
        if self.first_delay.is_zero() || self.first_delay > Duration::from_secs(86_400) {
            return bad("first_delay must be within 1 ns..=1 day");
        }
        if self.max_delay < self.first_delay || self.max_delay > Duration::from_secs(86_400) {
            return bad("max_delay must be at least first_delay and at most 1 day");
        }
        if !(self.factor >= 1.0 && self.factor <= 100.0) {
            return bad("factor must be within 1..=100");
        }
        if self.max_failures == 0 || self.max_failures > Self::MAX_FAILURES {
            return bad("max_failures must be within 1..=1000");
        }
        if self.reset_after.is_zero() {
            return bad("reset_after must not be zero");
        }
        Ok(())
    }

    /// The delays before restarts 1, 2, … `max_failures - 1`, in ms,
    /// jittered (backon's exponential backoff), each capped at `max_delay`.
    pub(crate) fn delays_ms(&self) -> Vec<u64> {
        let restarts = self.max_failures.saturating_sub(1) as usize;
        backon::ExponentialBuilder::new()
            .with_min_delay(self.first_delay)
            .with_max_delay(self.max_delay)
            .with_factor(self.factor)
            .with_jitter()
            .with_max_times(restarts)
            .build()
            .map(|d| d.min(self.max_delay).as_millis().max(1) as u64)
            .collect()
    }
}

/// How a run ended on its own.
#[derive(Debug, Clone)]
pub(crate) enum RunEnd {
    /// The job is done.
    Finished,
    /// The run failed with this error.
    Failed(String),
}

/// A report sent by a [`JobOutcome`] to its worker.
#[derive(Debug)]
pub(crate) struct Ended {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) ran: Duration,
    pub(crate) end: RunEnd,
}

/// Reports how a job's run ended on its own — finished, or failed — to the
/// worker that runs it. Get it with [`Job::outcome`](crate::Job::outcome);
/// clones share one report: only the first call counts.
///
/// Do not report a run that ended because the pool stopped it (`stop`):
/// such a run ends by the stop. A report for a run the pool no longer
/// gives this worker (stopped, moved, restarted since) is ignored.
///
/// ```
/// use flotilla_pool::Job;
///
/// fn on_done(job: &Job, result: Result<(), String>) {
///     let outcome = job.outcome();
///     match result {
///         Ok(()) => outcome.finished(),            // the key leaves the pool
///         Err(e) => outcome.failed(e),             // restarted after a backoff
///     }
/// }
/// # let _ = on_done;
/// ```
#[derive(Clone)]
pub struct JobOutcome {
    to_worker: Option<mpsc::UnboundedSender<Ended>>,
    key: String,
    token: u64,
    since: tokio::time::Instant,
    reported: Arc<AtomicBool>,
}

impl fmt::Debug for JobOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobOutcome")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("reported", &self.reported.load(Ordering::Relaxed))
            .finish()
    }
}

impl JobOutcome {
    /// A handle for a run of `key` with `token` on a worker.
    pub(crate) fn new(to_worker: mpsc::UnboundedSender<Ended>, key: &str, token: u64) -> Self {
        JobOutcome {
            to_worker: Some(to_worker),
            key: key.to_string(),
            token,
            since: tokio::time::Instant::now(),
            reported: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A handle that reports nowhere (a job not handed out by a worker).
    pub(crate) fn detached(key: &str, token: u64) -> Self {
        JobOutcome {
            to_worker: None,
            key: key.to_string(),
            token,
            since: tokio::time::Instant::now(),
            reported: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The job is done: it leaves the pool (owner record and payload), and
    /// its key can be dispatched again at once.
    pub fn finished(&self) {
        self.send(RunEnd::Finished);
    }

    /// The run failed: the job is restarted after a backoff, or marked
    /// failed once it failed [`max_failures`](RestartPolicy::max_failures)
    /// times in a row.
    pub fn failed(&self, error: impl fmt::Display) {
        self.send(RunEnd::Failed(error.to_string()));
    }

    /// Whether a report was made through this handle or a clone of it.
    pub fn is_reported(&self) -> bool {
        self.reported.load(Ordering::Acquire)
    }

    fn send(&self, end: RunEnd) {
        if self.reported.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(to_worker) = &self.to_worker else {
            return;
        };
        let ended = Ended {
            key: self.key.clone(),
            token: self.token,
            ran: self.since.elapsed(),
            end,
        };
        if to_worker.send(ended).is_err() {
            tracing::debug!(key = %self.key, "job outcome after its worker closed; ignored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_jittered_and_capped() {
        let policy = RestartPolicy::default()
            .first_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(1_000))
            .max_failures(8);
        let d = policy.delays_ms();
        assert_eq!(d.len(), 7);
        assert!((100..=200).contains(&d[0]), "{d:?}");
        assert!((400..=800).contains(&d[2]), "{d:?}");
        assert!(d.iter().all(|ms| *ms <= 1_000), "{d:?}");
        assert_eq!(RestartPolicy::default().delays_ms().len(), 9);
        assert!(
            RestartPolicy::default()
                .max_failures(1)
                .delays_ms()
                .is_empty()
        );
    }

    #[test]
    fn bad_policies_are_refused() {
        let ok = RestartPolicy::default();
        assert!(ok.validate().is_ok());
        for bad in [
            ok.first_delay(Duration::ZERO),
            ok.max_delay(Duration::from_millis(1)),
            ok.factor(0.5),
            ok.factor(f32::NAN),
            ok.max_failures(0),
            ok.max_failures(RestartPolicy::MAX_FAILURES + 1),
            ok.reset_after(Duration::ZERO),
        ] {
            assert!(
                matches!(
                    bad.validate(),
                    Err(Error::InvalidOptions {
                        option: "restart_policy",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn only_the_first_report_counts() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let outcome = JobOutcome::new(tx, "k", 7);
        let clone = outcome.clone();
        clone.failed("boom");
        outcome.finished();
        assert!(outcome.is_reported());
        let first = rx.try_recv().unwrap();
        assert_eq!((first.key.as_str(), first.token), ("k", 7));
        assert!(matches!(first.end, RunEnd::Failed(ref e) if e == "boom"));
        assert!(rx.try_recv().is_err());
        JobOutcome::detached("k", 1).finished(); // goes nowhere, no panic
    }
}
