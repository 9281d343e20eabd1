//! Failure records of jobs that failed (see the pool README's "Job
//! lifecycle"): restarting after a backoff, or failed for good.

use fred::prelude::*;

use crate::error::{Result, from_redis};
use crate::keys;
use crate::lifecycle::failures::{FailureRecord, FailureState};

/// Where a failing job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobFailureState {
    /// Run `token` failed; it restarts at `at_ms`.
    Restarting,
    /// Restart `token` runs, after `failures` failures in a row.
    Running,
    /// Failed for good at `at_ms`: not restarted.
    Failed,
}

impl JobFailureState {
    /// `restarting`, `running` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobFailureState::Restarting => "restarting",
            JobFailureState::Running => "running",
            JobFailureState::Failed => "failed",
        }
    }
}

/// A job's failure record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobFailure {
    /// Job key.
    pub key: String,
    /// Where it stands.
    pub state: JobFailureState,
    /// Consecutive failures.
    pub failures: u32,
    /// The run the record is about: for `Restarting` the run that failed,
    /// for `Running` the restart. A record whose token differs from the
    /// owner record's is stale (the job moved on since).
    pub token: u64,
    /// Server time (ms): when the restart is due, or when it failed.
    pub at_ms: u64,
    /// The last run's error.
    pub last_error: String,
}

impl JobFailure {
    fn from_record(key: String, r: FailureRecord) -> JobFailure {
        JobFailure {
            key,
            state: match r.state {
                FailureState::Restarting => JobFailureState::Restarting,
                FailureState::Running => JobFailureState::Running,
                FailureState::Failed => JobFailureState::Failed,
            },
            failures: r.failures,
            token: r.token,
            at_ms: r
                .at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            last_error: r.last_error,
        }
    }
}

fn decode(key: String, value: &str) -> Option<JobFailure> {
    match FailureRecord::parse(value) {
        Some(r) => Some(JobFailure::from_record(key, r)),
        None => {
            tracing::error!(key, record = value, "malformed failure record skipped");
            None
        }
    }
}

/// The failure record of `key`, if it has one.
///
/// # Errors
/// Redis errors.
pub async fn job_failure(client: &Client, pool: &str, key: &str) -> Result<Option<JobFailure>> {
    crate::keys::check_name("pool name", pool)?;
    let raw: Option<String> = client
        .hget(keys::failures(pool), key)
        .await
        .map_err(from_redis)?;
    Ok(raw.and_then(|v| decode(key.to_string(), &v)))
}

/// Every failure record of the pool, by key (a malformed record is logged
/// and left out).
///
/// # Errors
/// Redis errors.
pub async fn job_failures(client: &Client, pool: &str) -> Result<Vec<JobFailure>> {
    crate::keys::check_name("pool name", pool)?;
    let raw: std::collections::HashMap<String, String> = client
        .hgetall(keys::failures(pool))
        .await
        .map_err(from_redis)?;
    let mut out: Vec<JobFailure> = raw.into_iter().filter_map(|(k, v)| decode(k, &v)).collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}
