//! The job lifecycle's scripts (`job_ended.lua`, `job_restart.lua`,
//! `job_forget_failed.lua`, `job_mark_failed.lua`) and the failures hash
//! they write.

use std::time::Duration;

use fred::types::Value;

use super::PoolStore;
use super::call::{bounded, status_reply, unknown_status};
use crate::error::{Error, Result};
use crate::keys;

/// Longest error text kept in a failure record.
const MAX_ERROR_LEN: usize = 512;

/// What `job_restart.lua` did with a failed run's restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restarted {
    /// The next run, with this token.
    Token(u64),
    /// Redis names another run of the key (or none): nothing changed.
    Elsewhere,
    /// The pool recovers from a data loss or a rollback (or Redis is
    /// behind what the caller has seen): nothing changed; the record may be
    /// one the lost writes had replaced.
    Recovering,
}

/// What `job_ended.lua` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndRecorded {
    /// The job left the pool; every run of the key up to token
    /// `ended_at` (the tombstone issued at the end, above any run issued
    /// before it: a move a rollback took back too) is over.
    Finished { ended_at: u64 },
    /// Restart number `failures` after `delay`.
    Restarting { failures: u32, delay: Duration },
    /// Failed for good after `failures` failures; every run up to
    /// `ended_at` is over, as for [`EndRecorded::Finished`].
    Failed { failures: u32, ended_at: u64 },
    /// Redis names another run of the key: nothing changed.
    Moved,
    /// The run went on past its worker's lease and the pool recovers (or
    /// Redis went back to a state older than the node has seen): nothing
    /// changed; asked again later.
    Retry,
}

/// How a run ended, as `job_ended.lua` takes it.
pub(crate) enum EndArgs<'a> {
    Finished,
    Failed {
        error: &'a str,
        /// The run lasted long enough to start the count over.
        reset: bool,
        /// Backoff delays before restarts 1, 2, …
        delays_ms: &'a [u64],
    },
}

/// One line, at most [`MAX_ERROR_LEN`] bytes.
fn record_text(error: &str) -> String {
    let mut text = error.replace(['\r', '\n'], " ");
    if text.len() > MAX_ERROR_LEN {
        let mut cut = MAX_ERROR_LEN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

impl PoolStore {
    fn failures_keys(&self) -> Vec<String> {
        let mut k = self.maps.base_keys();
        k.push(keys::failures(&self.pool));
        k
    }

    /// Records the end of run `token` of `key` on `worker`. `past_lease`:
    /// the run went on past the worker's lease (it may have been moved);
    /// its end then waits for the end of a recovery (`worker_ttl`: the
    /// window a script that finds the pool's epoch gone opens).
    pub(crate) async fn record_job_end(
        &self,
        key: &str,
        worker: &str,
        token: u64,
        end: EndArgs<'_>,
        past_lease: bool,
        worker_ttl: Duration,
    ) -> Result<EndRecorded> {
        const WHAT: &str = "job_ended reply";
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
                let delays: Vec<String> = delays_ms.iter().map(u64::to_string).collect();
                args.extend([
                    Value::from("failed"),
                    Value::from(record_text(error)),
                    Value::from(if reset { "reset" } else { "chain" }),
                    Value::from(delays.join(" ")),
                ]);
            }
        }
        args.extend([
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(if past_lease {
                self.revision_floor()
            } else {
                String::new()
            }),
        ]);
        let mut keys = self.failures_keys();
        keys.push(self.maps.keepalive_revision_key());
        let reply: Value = self
            .scripts
            .job_ended
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let (status, rest) = status_reply(WHAT, reply)?;
        let int = |i: usize| {
            rest.get(i)
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::Malformed {
                    what: WHAT,
                    reason: format!("{status} without field {i}"),
                })
        };
        Ok(match status.as_str() {
            "finished" => EndRecorded::Finished { ended_at: int(0)? },
            "moved" => EndRecorded::Moved,
            "retry" => EndRecorded::Retry,
            "failed" => EndRecorded::Failed {
                failures: int(0)? as u32,
                ended_at: int(1)?,
            },
            "restarting" => EndRecorded::Restarting {
                failures: int(0)? as u32,
                delay: Duration::from_millis(int(1)?),
            },
            other => return Err(unknown_status(WHAT, other)),
        })
    }

    /// Gives the failed run `token` of `key` on `worker` its next run
    /// (`worker_ttl`: the recovery window a script that finds the pool's
    /// epoch gone opens).
    pub(crate) async fn restart_job(
        &self,
        key: &str,
        worker: &str,
        token: u64,
        worker_ttl: Duration,
    ) -> Result<Restarted> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(worker),
            Value::from(token.to_string()),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
        ]);
        let mut keys = self.failures_keys();
        keys.push(self.maps.keepalive_revision_key());
        let reply: i64 = self
            .scripts
            .job_restart
            .run(&self.client, keys, args, self.timeout)
            .await?;
        Ok(match reply {
            -1 => Restarted::Recovering,
            0 => Restarted::Elsewhere,
            token => Restarted::Token(token as u64),
        })
    }

    /// The failure record, owner record and pending guard of `key`, read in
    /// that order (a run that moves on after the first read shows in the
    /// next).
    pub(crate) async fn job_records(
        &self,
        key: &str,
    ) -> Result<(Option<String>, Option<String>, Option<String>)> {
        use fred::prelude::HashesInterface;
        const WHAT: &str = "job status";
        let failure: Option<String> = bounded(
            self.timeout,
            WHAT,
            self.client.hget(keys::failures(&self.pool), key),
        )
        .await?;
        let jobs = self.maps.jobs_keys.hash.clone();
        let owner: Option<String> =
            bounded(self.timeout, WHAT, self.client.hget(jobs, key)).await?;
        let pending = self.maps.pending_keys.hash.clone();
        let guard: Option<String> =
            bounded(self.timeout, WHAT, self.client.hget(pending, key)).await?;
        Ok((failure, owner, guard))
    }

    /// Removes the record of `key` if it failed for good; whether it had.
    pub(crate) async fn forget_failed_job(&self, key: &str) -> Result<bool> {
        let mut args = self.maps.base_args();
        args.push(Value::from(key));
        let removed: u64 = self
            .scripts
            .job_forget_failed
            .run(&self.client, self.failures_keys(), args, self.timeout)
            .await?;
        Ok(removed == 1)
    }

    /// Records that run `token` of `key` failed for good after `failures`
    /// failures in a row, unless the key runs or waits for a start (a new
    /// dispatch); whether it was recorded. For an end made to stand on a
    /// promoted primary, which lost the record the end wrote.
    pub(crate) async fn mark_failed_job(
        &self,
        key: &str,
        failures: u32,
        token: u64,
        error: &str,
    ) -> Result<bool> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(failures.to_string()),
            Value::from(token.to_string()),
            Value::from(record_text(error)),
        ]);
        let recorded: u64 = self
            .scripts
            .job_mark_failed
            .run(&self.client, self.failures_keys(), args, self.timeout)
            .await?;
        Ok(recorded == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts_are_one_bounded_line() {
        assert_eq!(record_text("a\nb\r\nc"), "a b  c");
        let long = "é".repeat(400);
        let t = record_text(&long);
        assert!(t.len() <= MAX_ERROR_LEN && t.is_char_boundary(t.len()));
    }
}
