//! The failures hash (`fl:{pool}:failures`, job key → failure record) and
//! the lifecycle scripts' calls: argument positions and replies live here
//! only.

use std::time::{Duration, SystemTime};

use fred::types::Value;

use crate::error::{Error, Result};
use crate::node::NodeInner;
use crate::scripts::status_reply;

/// Longest error text kept in a failure record.
const MAX_ERROR_LEN: usize = 512;

/// State of a failure record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureState {
    /// Run `token` failed; restart due at `at`.
    Restarting,
    /// Restart `token` runs after `failures` failures.
    Running,
    /// Failed for good at `at`.
    Failed,
}

/// A decoded failure record: `"<state> <n> <token> <at_ms> <error>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailureRecord {
    pub(crate) state: FailureState,
    pub(crate) failures: u32,
    pub(crate) token: u64,
    pub(crate) at: SystemTime,
    pub(crate) last_error: String,
}

impl FailureRecord {
    /// Parses a record; `None` (logged by the caller) if it is malformed.
    pub(crate) fn parse(value: &str) -> Option<FailureRecord> {
        let mut parts = value.splitn(5, ' ');
        let state = match parts.next()? {
            "restarting" => FailureState::Restarting,
            "running" => FailureState::Running,
            "failed" => FailureState::Failed,
            _ => return None,
        };
        let failures = parts.next()?.parse().ok()?;
        let token = parts.next()?.parse().ok()?;
        let at_ms: u64 = parts.next()?.parse().ok()?;
        Some(FailureRecord {
            state,
            failures,
            token,
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms),
            last_error: parts.next().unwrap_or("").to_string(),
        })
    }
}

/// What `job_ended.lua` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndRecorded {
    /// The job left the pool.
    Finished,
    /// Restart number `failures` after `delay`.
    Restarting { failures: u32, delay: Duration },
    /// Failed for good after `failures` failures.
    Failed { failures: u32 },
    /// Redis names another run of the key: nothing changed.
    Moved,
}

/// How a run ended, as `job_ended.lua` takes it.
pub(crate) enum EndArgs<'a> {
    Finished,
    Failed {
        error: &'a str,
        reset: bool,
        delays_ms: &'a [u64],
    },
}

fn int(v: Option<&Value>) -> Option<u64> {
    v.and_then(|v| v.as_u64())
}

impl NodeInner {
    fn failures_keys(&self) -> Vec<String> {
        let mut keys = self.maps.base_keys();
        keys.push(crate::keys::failures(&self.pool));
        keys
    }

    /// Records the end of run `token` of `key` on `worker`
    /// (`scripts/job_ended.lua`).
    pub(crate) async fn record_job_end(
        &self,
        key: &str,
        worker: &str,
        token: u64,
        end: EndArgs<'_>,
    ) -> Result<EndRecorded> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(worker),
            Value::from(token.to_string()),
        ]);
        match end {
            EndArgs::Finished => args.extend([
                Value::from("finished"),
                Value::from(""),
                Value::from("chain"),
                Value::from(""),
            ]),
            EndArgs::Failed {
                error,
                reset,
                delays_ms,
            } => {
                let mut error = error.replace(['\r', '\n'], " ");
                if error.len() > MAX_ERROR_LEN {
                    let mut cut = MAX_ERROR_LEN;
                    while !error.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    error.truncate(cut);
                }
                let delays: Vec<String> = delays_ms.iter().map(u64::to_string).collect();
                args.extend([
                    Value::from("failed"),
                    Value::from(error),
                    Value::from(if reset { "reset" } else { "chain" }),
                    Value::from(delays.join(" ")),
                ]);
            }
        }
        let reply: Value = self
            .scripts
            .job_ended
            .run(&self.client, self.failures_keys(), args)
            .await?;
        let (status, rest) = status_reply(reply)?;
        let malformed = || Error::Malformed {
            what: "job_ended reply",
            reason: format!("{status} {rest:?}"),
        };
        Ok(match status.as_str() {
            "finished" => EndRecorded::Finished,
            "moved" => EndRecorded::Moved,
            "failed" => EndRecorded::Failed {
                failures: int(rest.first()).ok_or_else(malformed)? as u32,
            },
            "restarting" => EndRecorded::Restarting {
                failures: int(rest.first()).ok_or_else(malformed)? as u32,
                delay: Duration::from_millis(int(rest.get(1)).ok_or_else(malformed)?),
            },
            _ => return Err(malformed()),
        })
    }

    /// Gives the failed run `token` of `key` on `worker` its next run
    /// (`scripts/job_restart.lua`): the new token, or `None` when Redis
    /// names another run.
    pub(crate) async fn restart_job(
        &self,
        key: &str,
        worker: &str,
        token: u64,
    ) -> Result<Option<u64>> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(worker),
            Value::from(token.to_string()),
        ]);
        let new_token: u64 = self
            .scripts
            .job_restart
            .run(&self.client, self.failures_keys(), args)
            .await?;
        Ok((new_token != 0).then_some(new_token))
    }
}

impl NodeInner {
    /// Removes the record of `key` if it failed for good
    /// (`scripts/job_forget_failed.lua`); whether it had.
    pub(crate) async fn forget_failed_job(&self, key: &str) -> Result<bool> {
        let mut args = self.maps.base_args();
        args.push(Value::from(key));
        let removed: u64 = self
            .scripts
            .job_forget_failed
            .run(&self.client, self.failures_keys(), args)
            .await?;
        Ok(removed == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_records_round_trip_their_fields() {
        let r =
            FailureRecord::parse("restarting 3 1795368799924451 1795368800000 boom: a b").unwrap();
        assert_eq!(r.state, FailureState::Restarting);
        assert_eq!((r.failures, r.token), (3, 1_795_368_799_924_451));
        assert_eq!(r.last_error, "boom: a b");
        assert_eq!(
            r.at,
            SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_368_800_000)
        );
        assert_eq!(
            FailureRecord::parse("failed 10 5 6 ").unwrap().last_error,
            ""
        );
        for bad in [
            "",
            "weird 1 2 3 x",
            "failed x 2 3 e",
            "failed 1 1.7e15 3 e",
            "running 1 2",
        ] {
            assert!(FailureRecord::parse(bad).is_none(), "{bad}");
        }
    }
}
