//! Pool-wide sweeps on one elected node: orphaned jobs and stale pending
//! guards, read from Redis page by page.
//!
//! Every non-client-only node competes for the pool's sweeper lease (a
//! [`LeaderLease`] named [`keys::SWEEPER_LEASE`] in the pool's slot, TTL the
//! worker TTL). Only its holder sweeps, and only one page per
//! [`sweep_interval`](crate::NodeOptions::sweep_interval): an idle pool
//! costs one small script per step whatever its size, and a node that does
//! not hold the lease does no per-job work at all.
//!
//! ```text
//! every sweep_interval (at once, up to 64 steps in a row, while steps
//! find orphans to mark or requeue outside a recovery), on the lease
//! holder only:
//!   sweep_orphans.lua  HSCAN payloads (cursor, COUNT sweep_batch)
//!                      orphan? (no pending guard; no record, or its owner
//!                      not registered) → first sighting: mark "<since> <state>"
//!                      same state for orphan_grace (server time) → due
//!                      + a page of the marks (cursor, COUNT sweep_batch),
//!                      checked the same way: a key a recovery marked as it
//!                      made it an orphan is due one grace later, wherever
//!                      the pass over the payloads is
//!   for each due key,  target = ring.owner(key)
//!   32 at a time:      requeue_orphan.lua checks it all again, atomically,
//!                      then hands it off
//!   sweep_pending.lua  HSCAN pending (cursor, COUNT sweep_batch),
//!                      guards past their deadline (server time) removed
//! ```
//!
//! Correctness does not rest on the lease: every decision is a script
//! against Redis's current state, and the marks that carry the grace period
//! live in Redis, so two sweepers for a moment (a lease handed over) do
//! the same work twice at worst, and a new sweeper goes on where the marks
//! are. The lease only keeps the cost to one node. When the holder dies,
//! another node takes the lease within about a TTL (on `close`, within a
//! `cleanup_interval`) and starts its own pass.

use std::sync::Arc;

use futures::StreamExt;

use crate::keys;
use crate::leader::{LeaderLease, LeaderOptions};
use crate::node::NodeInner;
use crate::store::{Cursor, OrphanRequeue, SCAN_START};

/// Due orphans requeued at once, pipelined on the node's connection: each
/// `requeue_orphan.lua` decides for its key alone, and a recovery can leave
/// hundreds due in one step (one after the other, at a round trip each,
/// the last of 300 waited over a second).
const REQUEUES_IN_FLIGHT: usize = 32;

/// Steps taken at once, one after the other, while each finds work (new
/// orphans to mark, due ones requeued), before the sweeper waits a
/// `sweep_interval` again. After a data loss every job can be an orphan:
/// at one page per interval, 5,000 of them in pages of 500 went at 150–600
/// requeues a second, and one waited 14 s (chaos soak seed 1551). An
/// idle pool, where steps find nothing, still costs one step per interval;
/// a step that finds work it cannot do (no worker to requeue to) waits too,
/// and so does every step while the pool recovers from a loss (the
/// workers' re-assertions need Redis then, and nothing is due).
const CATCH_UP_STEPS: usize = 64;

/// Where the sweeper is in each hash.
#[derive(Debug, Clone)]
struct Cursors {
    payloads: Cursor,
    marks: Cursor,
    pending: Cursor,
}

impl Default for Cursors {
    fn default() -> Self {
        Cursors {
            payloads: SCAN_START.into(),
            marks: SCAN_START.into(),
            pending: SCAN_START.into(),
        }
    }
}

impl NodeInner {
    /// Competes for the sweeper lease and, while holding it, sweeps one
    /// page per `sweep_interval`. Releases the lease on shutdown.
    pub(crate) async fn sweeper_loop(self: Arc<Self>) {
        let Some(lease) = self.join_sweeper_election().await else {
            return;
        };
        let mut cursors = Cursors::default();
        let mut interval = tokio::time::interval(self.options.sweep_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leading = false;
        let mut caught_up = 0;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => break,
                _ = interval.tick() => {}
            }
            if !lease.is_leader() {
                if leading {
                    tracing::info!(node = %self.id, "no longer the pool's sweeper");
                }
                leading = false;
                continue;
            }
            if !leading {
                tracing::info!(node = %self.id, "sweeping the pool (sweeper lease taken)");
                // A new pass: the previous holder's cursors are unknown.
                cursors = Cursors::default();
                leading = true;
            }
            match self.sweep_step(&mut cursors).await {
                Ok(true) if caught_up < CATCH_UP_STEPS => {
                    caught_up += 1;
                    interval.reset_immediately();
                }
                Ok(_) => caught_up = 0,
                Err(e) => {
                    caught_up = 0;
                    tracing::warn!(node = %self.id, error = %e, "sweep step failed");
                }
            }
        }
        if let Err(e) = lease.close().await {
            tracing::debug!(node = %self.id, error = %e, "releasing the sweeper lease failed");
        }
    }

    /// Starts competing for the sweeper lease, retrying every cleanup
    /// interval while Redis refuses; `None` once the node is closing.
    async fn join_sweeper_election(&self) -> Option<LeaderLease> {
        let options = LeaderOptions::default()
            .ttl(self.options.worker_ttl)
            .follower_poll(self.options.cleanup_interval)
            .op_timeout(self.options.redis_timeout)
            .hash_tag(self.pool.clone())
            .owner_id(self.id.clone());
        loop {
            match LeaderLease::start(&self.store.client, keys::SWEEPER_LEASE, options.clone()).await
            {
                Ok(lease) => return Some(lease),
                Err(e) => {
                    tracing::warn!(node = %self.id, error = %e, "cannot join the sweeper election; retrying")
                }
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep(self.options.cleanup_interval) => {}
            }
        }
    }

    /// One step: a page of orphans (requeueing the due ones) and a page of
    /// pending guards. Returns whether it found work it could do (orphans
    /// first seen, or requeued): the next step is then taken at once.
    async fn sweep_step(&self, cursors: &mut Cursors) -> crate::error::Result<bool> {
        let options = &self.options;
        // Graces and deadlines run on this node's clock too (see
        // `server_clock.rs`).
        let floor_ms = self.server_time_floor().await?;
        let page = self
            .store
            .sweep_orphans(
                &cursors.payloads,
                &cursors.marks,
                options.sweep_batch,
                options.orphan_grace,
                options.worker_ttl,
                floor_ms,
            )
            .await?;
        cursors.payloads = page.cursor;
        cursors.marks = page.marks_cursor;
        if self.recently_connected().await {
            // Redis restarted, perhaps from an older state whose records
            // (and grace marks) workers have not re-asserted over yet:
            // requeue nothing for a TTL (nor hurry: the workers are
            // re-asserting meanwhile).
            return Ok(false);
        }
        let requeued = futures::stream::iter(page.due)
            .map(|(key, record)| async move { self.requeue_orphan(&key, &record).await })
            .buffer_unordered(REQUEUES_IN_FLIGHT)
            .filter(|requeued| std::future::ready(*requeued))
            .count()
            .await;
        let stale = self
            .store
            .sweep_pending(
                &cursors.pending,
                options.sweep_batch,
                self.server_time_floor().await?,
            )
            .await?;
        cursors.pending = stale.cursor;
        for key in stale.keys {
            tracing::info!(key, "stale pending dispatch removed");
        }
        Ok(page.marked > 0 || requeued > 0)
    }

    /// Requeues orphan `key` (seen with `record`, `"-"`: none) at its owner
    /// on this node's ring, if Redis still holds it so. Returns whether it
    /// did.
    async fn requeue_orphan(&self, key: &str, record: &str) -> bool {
        let floor_ms = match self.server_time_floor().await {
            Ok(floor) => floor,
            Err(e) => {
                tracing::warn!(key, error = %e, "orphan requeue failed");
                return false;
            }
        };
        let ring = self.ring.load_full();
        let Some(target) = ring.owner(key) else {
            return false; // no worker: it waits for the next one
        };
        let inbox = match self.inbox(target) {
            Ok(inbox) => inbox,
            Err(e) => {
                tracing::warn!(key, error = %e, "orphan requeue failed");
                return false;
            }
        };
        let options = &self.options;
        let result = self
            .store
            .requeue_orphan(
                key,
                record,
                target,
                inbox.key(),
                options.dispatch_timeout + options.ack_grace,
                options.worker_ttl,
                options.orphan_grace,
                floor_ms,
            )
            .await;
        match result {
            Ok(OrphanRequeue::Ok { token }) => {
                tracing::warn!(key, previous = %record, target, token, "orphaned job requeued");
                self.metrics.orphans_requeued.increment(1);
                return true;
            }
            Ok(OrphanRequeue::NoTarget) => self.refresh_ring(),
            Ok(OrphanRequeue::Ended) => tracing::warn!(
                key,
                "an orphan of a dispatch marked over (its stop or end made to stand again after a rollback) ended instead of requeued"
            ),
            Ok(status) => tracing::debug!(key, ?status, "orphan not requeued"),
            Err(e) => tracing::warn!(key, error = %e, "orphan requeue failed"),
        }
        false
    }
}
