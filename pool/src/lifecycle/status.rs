//! [`JobStatus`]: where a job is in its life, read from Redis.

use std::time::SystemTime;

use super::failures::{FailureRecord, FailureState};
use crate::error::Result;
use crate::node::Node;

/// Where a job is in its life, as Redis records it
/// ([`Node::job_status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobStatus {
    /// Admitted, not started yet (or being moved between workers).
    Pending,
    /// Runs on `worker` with fencing `token`, after `failures` consecutive
    /// failures (0 for a run that did not follow a failure).
    Running {
        /// Owner worker id.
        worker: String,
        /// Fencing token of the run.
        token: u64,
        /// Consecutive failures before this run.
        failures: u32,
    },
    /// Failed `failures` times in a row; restarts on `worker` at
    /// `restart_at` (Redis server time).
    Restarting {
        /// Owner worker id.
        worker: String,
        /// Consecutive failures so far.
        failures: u32,
        /// When the restart is due.
        restart_at: SystemTime,
        /// The last run's error.
        last_error: String,
    },
    /// Failed too often: not restarted. Shown until the key is stopped or
    /// dispatched again.
    Failed {
        /// Consecutive failures.
        failures: u32,
        /// When it was marked failed.
        failed_at: SystemTime,
        /// The last run's error.
        last_error: String,
    },
}

impl Node {
    /// Where job `key` is in its life: pending, running, waiting to
    /// restart after a failure, or failed; `None` for a key the pool does
    /// not know. Read from Redis (not this node's replica).
    ///
    /// # Errors
    /// [`Error::Unavailable`](crate::Error::Unavailable) and other Redis
    /// errors; [`Error::InvalidName`](crate::Error::InvalidName) for a bad
    /// key.
    pub async fn job_status(&self, key: &str) -> Result<Option<JobStatus>> {
        crate::keys::check_name("job key", key)?;
        let (record, owner, pending) = self.inner.store.job_records(key).await?;
        let record = record.and_then(|r| {
            let parsed = FailureRecord::parse(&r);
            if parsed.is_none() {
                tracing::error!(key, record = %r, "malformed failure record ignored");
                self.inner.metrics.malformed_records.increment(1);
            }
            parsed
        });
        Ok(status_of(
            owner.as_deref().and_then(crate::store::records::job_owner),
            pending.is_some(),
            record,
        ))
    }
}

/// Combines the three records of a key into its status.
fn status_of(
    owner: Option<(&str, u64)>,
    pending: bool,
    record: Option<FailureRecord>,
) -> Option<JobStatus> {
    if let Some((worker, token)) = owner {
        let same_run = record.as_ref().filter(|r| r.token == token);
        return Some(match same_run {
            Some(r) if r.state == FailureState::Restarting => JobStatus::Restarting {
                worker: worker.to_string(),
                failures: r.failures,
                restart_at: r.at,
                last_error: r.last_error.clone(),
            },
            Some(r) if r.state == FailureState::Running => JobStatus::Running {
                worker: worker.to_string(),
                token,
                failures: r.failures,
            },
            _ => JobStatus::Running {
                worker: worker.to_string(),
                token,
                failures: 0,
            },
        });
    }
    if pending {
        return Some(JobStatus::Pending);
    }
    match record {
        Some(r) if r.state == FailureState::Failed => Some(JobStatus::Failed {
            failures: r.failures,
            failed_at: r.at,
            last_error: r.last_error,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(s: &str) -> Option<FailureRecord> {
        FailureRecord::parse(s)
    }

    #[test]
    fn the_records_of_a_key_combine_into_its_status() {
        assert_eq!(status_of(None, false, None), None);
        assert_eq!(status_of(None, true, None), Some(JobStatus::Pending));
        assert!(matches!(
            status_of(Some(("w", 9)), false, rec("restarting 2 9 1000 boom")),
            Some(JobStatus::Restarting { failures: 2, ref last_error, .. }) if last_error == "boom"
        ));
        assert!(matches!(
            status_of(Some(("w", 10)), false, rec("running 2 10 1000 boom")),
            Some(JobStatus::Running {
                failures: 2,
                token: 10,
                ..
            })
        ));
        // A record of an older run (the job moved on since) is stale.
        assert!(matches!(
            status_of(Some(("w", 11)), false, rec("restarting 2 9 1000 boom")),
            Some(JobStatus::Running {
                failures: 0,
                token: 11,
                ..
            })
        ));
        assert!(matches!(
            status_of(None, false, rec("failed 10 9 1000 boom")),
            Some(JobStatus::Failed { failures: 10, .. })
        ));
        // Dispatched again after failing: the new run wins.
        assert_eq!(
            status_of(None, true, rec("failed 10 9 1000 boom")),
            Some(JobStatus::Pending)
        );
        assert_eq!(status_of(None, false, rec("restarting 1 9 1000 x")), None);
    }
}
