//! Re-assertion: a worker tells Redis which jobs it runs or holds
//! suspended, after Redis lost its data or went back in time, or when a
//! job's record no longer names it (`scripts/reassert.lua`). Until then
//! the worker is the only holder of each such job, so a worker with many
//! jobs re-asserts them in batches, a few calls in flight: a crash soon
//! after the loss (a restart, then a crash) finds them re-asserted.

use std::time::Duration;

use futures::StreamExt;

use crate::codec;
use crate::error::{Error, Result};
use crate::node::NodeInner;
use crate::store::{Reassert, ReassertJob, Reasserted};
use crate::worker::{LocalJob, WorkerInner};

/// Jobs re-asserted in one call of `reassert.lua`: a few milliseconds of
/// Redis's time per call at most, while a call per job cost Redis several
/// times the work and a worker with 500 jobs 100–300 ms to re-assert them
/// all on a busy machine.
const REASSERT_BATCH: usize = 64;

/// Payload bytes in one call at most (a job larger than this goes alone):
/// Redis reads a call whole before it runs it, and a batch of large
/// payloads would hold the server for as long as it copies them.
const REASSERT_BATCH_BYTES: usize = 1 << 20;

/// Batches in flight at once (pipelined on the node's connection).
const REASSERT_CALLS_IN_FLIGHT: usize = 4;

impl NodeInner {
    /// Re-asserts `jobs` in batches of [`REASSERT_BATCH`] (fewer when
    /// their payloads are large), several calls in flight (each script
    /// decides for each key alone). Returns the
    /// outcome of every job whose batch Redis answered, and the first
    /// error: one batch failing does not hide what the others found, and
    /// its jobs stay as they were, for the next attempt.
    pub(crate) async fn reassert_many(
        &self,
        worker: &WorkerInner,
        jobs: Vec<(String, LocalJob)>,
        state: Reassert,
    ) -> (Vec<(String, Reasserted)>, Option<Error>) {
        let batches =
            crate::batch::bounded(jobs, REASSERT_BATCH, REASSERT_BATCH_BYTES, |(key, job)| {
                key.len() + job.raw_body.len()
            });
        let answers: Vec<Result<Vec<(String, Reasserted)>>> = futures::stream::iter(batches)
            .map(|batch| self.reassert_batch(worker, batch, state))
            .buffer_unordered(REASSERT_CALLS_IN_FLIGHT)
            .collect()
            .await;
        let mut outcomes = Vec::with_capacity(answers.len() * REASSERT_BATCH);
        let mut first_error = None;
        for answer in answers {
            match answer {
                Ok(batch) => outcomes.extend(batch),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        (outcomes, first_error)
    }

    /// One call of `reassert.lua` for `batch`; each outcome as
    /// [`reassert`](Self::reassert) gives it.
    async fn reassert_batch(
        &self,
        worker: &WorkerInner,
        batch: Vec<(String, LocalJob)>,
        state: Reassert,
    ) -> Result<Vec<(String, Reasserted)>> {
        let jobs = batch
            .iter()
            .map(|(key, job)| ReassertJob {
                key,
                token: job.token,
                stored: codec::stored(job.admitted, &job.raw_body),
                state,
            })
            .collect();
        let outcomes = self
            .store
            .reassert_batch(&worker.id, jobs, self.options.worker_ttl)
            .await?;
        Ok(batch
            .into_iter()
            .zip(outcomes)
            .map(|((key, job), outcome)| {
                self.after_reassert(worker, &key, &job, outcome);
                (key, outcome)
            })
            .collect())
    }

    /// Re-asserts one job `key` that `worker` runs or holds (`state`).
    pub(crate) async fn reassert(
        &self,
        worker: &WorkerInner,
        key: &str,
        job: &LocalJob,
        state: Reassert,
    ) -> Result<Reasserted> {
        let outcome = self
            .store
            .reassert(
                key,
                &worker.id,
                job.token,
                codec::stored(job.admitted, &job.raw_body),
                state,
                self.options.worker_ttl,
            )
            .await?;
        self.after_reassert(worker, key, job, outcome);
        Ok(outcome)
    }

    /// What the worker keeps of a job it re-asserted, by the outcome.
    fn after_reassert(&self, worker: &WorkerInner, key: &str, job: &LocalJob, outcome: Reasserted) {
        if outcome == Reasserted::Lost {
            // Given up to a newer run that Redis records elsewhere, or that
            // ended. The answer may come from a primary that stalled
            // through its failover and is demoted next, its writes gone:
            // the promoted side then records the job here, and nobody there
            // runs it (chaos soak seed 1562: 34 jobs). Remembered as a
            // hand-off under the next token, so that releasing that record
            // as stale leaves the payload for the orphan sweep
            // (`release_stale.lua`); a newer run that ended is settled as
            // ended within a round (`handoffs_ended.lua`) and the payload
            // then goes with the record.
            let given_up = crate::handoffs::HandedOff::of(key, job.token + 1, job);
            if self.store.diverged() {
                // This node wrote to a primary that stalled through its
                // failover: the answer is the promoted side's, and a second
                // failover may promote a replica of the stalled branch,
                // which records the run here (chaos soak seed 1605: eight
                // jobs released with their payloads, then admitted again as
                // new). Remembered only to keep that payload: the token is
                // the stalled branch's and says nothing of this side's.
                worker
                    .handed_off
                    .record_yielded(given_up, self.orphan_exposure());
            } else {
                worker
                    .handed_off
                    .record_orphan(given_up, self.orphan_exposure());
            }
        }
        if let Reasserted::Superseded(older) = outcome {
            // Kept as for a newer admission not started yet (below): Redis
            // holds this dispatch only in the field that waits for the
            // older run's end, and a second loss takes that too.
            worker.handed_off.record_orphan(
                crate::handoffs::HandedOff::of(key, job.token + 1, job),
                self.orphan_exposure(),
            );
            if let Some(node) = worker.node() {
                node.stop_superseded(key, job.token, older);
            }
        }
        if matches!(outcome, Reasserted::Pending | Reasserted::Unclaimed) {
            if outcome == Reasserted::Pending {
                tracing::info!(key, worker = %worker.id, token = job.token, "re-asserted job gives way to a newer admission not started yet; kept until it starts");
            } else {
                tracing::info!(key, worker = %worker.id, token = job.token, "re-asserted job gives way to a newer token nobody runs or starts yet; kept until it starts");
            }
            // Given way to a newer admission or hand-off that has not
            // started (or to an orphan another worker gave back, whose
            // process may die before the sweep requeues it): until it
            // does, Redis holds the only copy, and a second loss (a
            // restart, a rollback) would take it. Kept as
            // a hand-off is (`handoffs.rs`), under the next token: any
            // token issued since this run's (that admission's, a stop's
            // tombstone) is at least that, so the payload is given back
            // only when Redis holds nothing newer than this run.
            worker.handed_off.record_orphan(
                crate::handoffs::HandedOff::of(key, job.token + 1, job),
                self.orphan_exposure(),
            );
        }
        if outcome == Reasserted::Orphaned {
            // Redis now holds the only copy, until the sweep requeued it
            // and a worker started it: a second loss before then would take
            // it, so the worker keeps it to give back (`handoffs.rs`).
            worker.handed_off.record_orphan(
                crate::handoffs::HandedOff::of(key, job.token, job),
                self.orphan_exposure(),
            );
        }
    }

    /// How long a job left to the orphan sweep may depend on Redis alone:
    /// its grace, counted from when the pool has recovered (a few TTLs at
    /// most), then a sweep step or two and the new owner's start.
    pub(crate) fn orphan_exposure(&self) -> Duration {
        self.options.orphan_grace + self.options.worker_ttl * 4 + self.options.sweep_interval * 2
    }
}
