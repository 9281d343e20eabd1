//! Options of a multi-home worker. Defaults live in `impl Default` only.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::options::NodeOptions;

/// Options for [`MultiHomeWorker::start`](super::MultiHomeWorker::start).
///
/// ```
/// use std::time::Duration;
/// use flotilla_pool::multihome::MultiHomeOptions;
///
/// let options = MultiHomeOptions::default()
///     .max_concurrent_jobs(Some(100))
///     .reset_after(Duration::from_secs(10));
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MultiHomeOptions {
    /// Consecutive failed Redis operations (probes, joins) after which a
    /// home's breaker opens. Default: 3.
    pub failure_threshold: u32,
    /// How long an open home is skipped before one probe (half-open) may
    /// close it again. Default: 30 s.
    pub reset_after: Duration,
    /// Hard bound on every Redis call of a home: the command timeout and
    /// connection timeout of the home's client, and the bound of each
    /// probe and join. A hung home (TCP black hole) costs at most this per
    /// call and never delays another home. Default: 5 s.
    pub poll_timeout: Duration,
    /// How often a closed home is probed (one `SET` of the published
    /// breaker state). Default: 1 s.
    pub probe_interval: Duration,
    /// Most jobs the worker runs at once over all homes, split evenly over
    /// the healthy homes; `None`: no limit. Default: `None`.
    pub max_concurrent_jobs: Option<usize>,
    /// Options of each home's node. Default: `NodeOptions::default()`.
    pub node: NodeOptions,
}

impl Default for MultiHomeOptions {
    fn default() -> Self {
        MultiHomeOptions {
            failure_threshold: 3,
            reset_after: Duration::from_secs(30),
            poll_timeout: Duration::from_secs(5),
            probe_interval: Duration::from_secs(1),
            max_concurrent_jobs: None,
            node: NodeOptions::default(),
        }
    }
}

impl MultiHomeOptions {
    /// Sets the failure threshold.
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures;
        self
    }

    /// Sets the reset period of an open breaker.
    pub fn reset_after(mut self, period: Duration) -> Self {
        self.reset_after = period;
        self
    }

    /// Sets the poll timeout.
    pub fn poll_timeout(mut self, timeout: Duration) -> Self {
        self.poll_timeout = timeout;
        self
    }

    /// Sets the probe interval.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Sets the capacity (`None`: no limit).
    pub fn max_concurrent_jobs(mut self, max: Option<usize>) -> Self {
        self.max_concurrent_jobs = max;
        self
    }

    /// Sets the options of each home's node.
    pub fn node(mut self, options: NodeOptions) -> Self {
        self.node = options;
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
        if self.failure_threshold == 0 {
            return bad("failure_threshold", "must be at least 1");
        }
        if self.reset_after.is_zero() {
            return bad("reset_after", "must be above zero");
        }
        if self.poll_timeout < Duration::from_millis(10) {
            return bad("poll_timeout", "must be at least 10 ms");
        }
        if self.probe_interval.is_zero() {
            return bad("probe_interval", "must be above zero");
        }
        if self.max_concurrent_jobs == Some(0) {
            return bad("max_concurrent_jobs", "must be at least 1 (None: no limit)");
        }
        if self.node.client_only {
            return bad("node.client_only", "a multi-home worker hosts workers");
        }
        self.node.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_documentation() {
        let o = MultiHomeOptions::default();
        assert_eq!(o.failure_threshold, 3);
        assert_eq!(o.reset_after, Duration::from_secs(30));
        assert_eq!(o.poll_timeout, Duration::from_secs(5));
        assert!(o.validate().is_ok());
    }

    #[test]
    fn bad_values_are_named() {
        let e = MultiHomeOptions::default().failure_threshold(0).validate();
        assert!(matches!(
            e,
            Err(Error::InvalidOptions {
                option: "failure_threshold",
                ..
            })
        ));
        let e = MultiHomeOptions::default()
            .max_concurrent_jobs(Some(0))
            .validate();
        assert!(matches!(
            e,
            Err(Error::InvalidOptions {
                option: "max_concurrent_jobs",
                ..
            })
        ));
    }
}
