//! Operator actions on any worker of the pool, from any node (a client-only
//! one too): drain a worker, undrain it, and remove a dead worker now.
//!
//! Drain. The mark is a field of the worker's record in the `workers` map
//! (`drained_at_ms`, see `keys.rs`), set by one script. Every node mirrors
//! that map, so every node's ring leaves the worker out as soon as its
//! replica has the change, and the scripts that give a worker a job
//! (admission, handoff, inbox moves) refuse a drained one whatever a
//! node's replica says. The worker's own node then sees its worker out of
//! the ring and hands each job on by the rebalance path: stop here first,
//! then one script moves ownership with a new fencing token and enqueues
//! the start at the new owner (I1, I2). With no other active worker the
//! jobs stay where they run (a drain never stops a job that has nowhere to
//! go) and move as soon as a worker joins or is undrained; dispatches wait
//! for an active worker as they do in an empty pool.
//!
//! ```text
//! drain_worker(W) ─▶ drain_worker.lua: workers[W].drained_at_ms = now
//!                        │ (replicated to every node)
//!      every node: ring without W ─▶ no dispatch, requeue, forward to W
//!      W's node:   rebalance ─▶ stop job on W ─▶ handoff.lua ─▶ new owner
//! ```
//!
//! Remove a dead worker. The same cleanup the nodes run on their own one
//! TTL after a worker's last keep-alive, run now: `claim_cleanup.lua`
//! decides on the keep-alive in Redis (server time), so a live worker is
//! refused however stale the caller's replica is; then the worker's jobs
//! and inbox entries are requeued to live workers and its entries removed.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::keys;
use crate::node::Node;
use crate::store::records::WorkerEntry;
use crate::store::{ClaimStatus, DrainMark};

/// What [`Node::remove_dead_worker`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerRemoval {
    /// This call claimed the cleanup: the worker's jobs and queued events
    /// were requeued to live workers and the worker removed.
    Removed {
        /// Time since the worker's last keep-alive (Redis server time).
        silent: Duration,
    },
    /// Another node is cleaning the worker up already (its jobs are
    /// moving); nothing was done here. Also when this call's claim was
    /// lost on the way (the worker came back, or another node took the
    /// claim over): what is left of the worker is theirs.
    InProgress,
    /// The pool is recovering from a Redis data loss or rollback (the
    /// recovery window, about one worker TTL): nothing was done, or the
    /// cleanup stopped where the recovery began; call again after it, or
    /// let the nodes' own cleanup take the worker then.
    Recovering,
}

impl Node {
    /// Drains worker `worker_id` (hosted on any node): from now on no job
    /// is dispatched, requeued or forwarded to it, on any node, and its
    /// node hands every job it runs to other workers through the safe
    /// handoff (stopped there before it starts elsewhere, new fencing
    /// token). Returns `true` when this call set the mark, `false` when the
    /// worker was drained already. Returns once the mark is in Redis; the
    /// jobs move within moments (watch [`Node::pool_workers`]).
    ///
    /// With no other active worker in the pool, the drained worker's jobs
    /// keep running where they are and move as soon as a worker joins or is
    /// undrained; new dispatches wait for an active worker meanwhile (and
    /// fail with [`Error::NoActiveWorker`] after their timeout).
    ///
    /// The mark lives in the worker's registration and goes with it; it is
    /// lost if Redis loses its data (the worker registers again undrained).
    ///
    /// # Errors
    /// [`Error::UnknownWorker`] when no such worker is registered,
    /// [`Error::InvalidName`] for a bad id, [`Error::Malformed`] when its
    /// record does not decode, Redis errors.
    pub async fn drain_worker(&self, worker_id: &str) -> Result<bool> {
        self.set_drained(worker_id, true).await
    }

    /// Undrains worker `worker_id`: it is back in the ring and takes its
    /// share of jobs again (rebalancing moves about 1/N of the jobs to it).
    /// Returns `true` when this call cleared the mark, `false` when the
    /// worker was not drained.
    ///
    /// # Errors
    /// As [`Node::drain_worker`].
    pub async fn undrain_worker(&self, worker_id: &str) -> Result<bool> {
        self.set_drained(worker_id, false).await
    }

    async fn set_drained(&self, worker_id: &str, drain: bool) -> Result<bool> {
        keys::check_name("worker id", worker_id)?;
        let mark = self.inner.store.set_drained(worker_id, drain).await?;
        match mark {
            DrainMark::Changed => {
                tracing::info!(pool = %self.inner.pool, worker = worker_id, drain, "drain mark changed");
                // Our own view follows before we answer, so that this
                // node routes by the new mark at once (bounded: a replica
                // that lags resynchronises on its own).
                let applied = |m: &flotilla_rmap::Map| {
                    m.get(worker_id)
                        .and_then(|raw| WorkerEntry::parse(&raw))
                        .is_none_or(|w| w.drained_at_ms.is_some() == drain)
                };
                let _ = self
                    .inner
                    .store
                    .maps
                    .workers
                    .wait_for(self.inner.options.redis_timeout, applied)
                    .await;
                self.inner.refresh_ring();
                Ok(true)
            }
            DrainMark::Unchanged => Ok(false),
            DrainMark::Unknown => Err(Error::UnknownWorker(worker_id.to_string())),
            DrainMark::Malformed => Err(Error::Malformed {
                what: "worker record",
                reason: format!("the record of worker {worker_id:?} is not a JSON object"),
            }),
        }
    }

    /// Removes worker `worker_id` now if Redis says it is dead: its last
    /// keep-alive is older than this node's `worker_ttl` by Redis server
    /// time (pass the TTL the pool's workers run with), held back, as every
    /// cleanup, to this node's own bound of server time, so that a step of
    /// the server's clock makes nobody look silent. A node that joined
    /// after such a step knows only the server's time since (a `poolctl`
    /// command joins just before it calls this): after a step, call it from
    /// a node that has been up for two TTLs, or wait two TTLs. Runs the cleanup
    /// every node runs on its own after that TTL: claims it, requeues the
    /// worker's jobs and unprocessed inbox events to live workers (each job
    /// once, with a new fencing token), removes its registration,
    /// keep-alive and inbox.
    ///
    /// A worker that stopped renewing has stopped its own jobs by then
    /// (its lease lapsed before the TTL), so the requeued jobs never run
    /// twice.
    ///
    /// # Errors
    /// [`Error::WorkerAlive`] when Redis holds a keep-alive within the TTL
    /// (nothing is done), [`Error::UnknownWorker`] when no such worker is
    /// registered, [`Error::InvalidName`] for a bad id, Redis errors (the
    /// claim then stays, and any node takes the cleanup over after a TTL).
    pub async fn remove_dead_worker(&self, worker_id: &str) -> Result<WorkerRemoval> {
        keys::check_name("worker id", worker_id)?;
        let claim = self.inner.clean_if_dead(worker_id).await?;
        let silent = Duration::from_millis(claim.silent_ms);
        match claim.status {
            ClaimStatus::Claimed | ClaimStatus::TakenOver => Ok(WorkerRemoval::Removed { silent }),
            ClaimStatus::ClaimedByOther => Ok(WorkerRemoval::InProgress),
            ClaimStatus::Recovering => Ok(WorkerRemoval::Recovering),
            ClaimStatus::Alive => Err(Error::WorkerAlive {
                worker: worker_id.to_string(),
                silent,
            }),
            ClaimStatus::Gone => Err(Error::UnknownWorker(worker_id.to_string())),
        }
    }
}
