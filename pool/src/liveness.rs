//! Finding dead workers and stale nodes: each node's periodic pass over
//! the membership maps (`cleanup.rs` cleans a worker found dead).
//!
//! A worker is dead once its keep-alive (server time) is older than the
//! TTL, judged by the smaller of the server's clock and this node's bound
//! of it (`server_clock.rs`): silent for a TTL on both. The replicas only
//! pick candidates; `claim_cleanup.lua` decides on Redis's keep-alive.
//! The pass reads only the small membership maps, so an idle node does no
//! per-job work.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use fred::prelude::*;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::node::NodeInner;
use crate::store::records::WorkerEntry;

/// Dead workers one node cleans at once.
const CLEANUPS_IN_FLIGHT: usize = 8;

impl NodeInner {
    /// Runs [`check_dead_workers`](Self::check_dead_workers) every
    /// `cleanup_interval` until the node closes.
    pub(crate) async fn cleanup_loop(self: Arc<Self>) {
        let mut interval = tokio::time::interval(self.options.cleanup_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = interval.tick() => {}
            }
            if let Err(e) = self.check_dead_workers().await {
                tracing::warn!(node = %self.id, error = %e, "dead-worker check failed");
            }
        }
    }

    /// One pass over the membership maps: dead workers, stale nodes.
    pub(crate) async fn check_dead_workers(&self) -> Result<()> {
        // Server time first: the call waits out a Redis restart, and the
        // reconnect it needed must count before anyone is judged dead (the
        // keep-alives Redis restored from an older state look stale).
        let now = self.store.server_time_ms().await?;
        self.server_clock.record(now, tokio::time::Instant::now());
        if self.recently_connected().await {
            return Ok(());
        }
        // Silent for a TTL on the node's own clock too: a step of the
        // server's clock makes nobody look silent (`server_clock`).
        let judged = self.server_clock.judged_now(now);
        self.clean_dead_workers(judged).await;
        Ok(())
    }

    async fn clean_dead_workers(&self, now: u64) {
        let ttl = self.options.worker_ttl.as_millis() as u64;
        let keepalive = self.store.maps.keepalive.snapshot();
        let silent: Vec<String> = self
            .store
            .maps
            .workers
            .snapshot()
            .iter()
            .filter(|(worker, raw)| {
                let created = WorkerEntry::parse(raw)
                    .and_then(|w| w.created_at_ms)
                    .unwrap_or(0);
                let last = keepalive
                    .get(*worker)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(created);
                !self.workers.contains_key(*worker) && now.saturating_sub(last) > ttl
            })
            .map(|(worker, _)| worker.clone())
            .collect();
        // The workers of a dead process die together: cleaned one after the
        // other, the last would wait for all the others' hand-offs.
        let candidates = silent.len();
        let failed: Vec<(String, Error)> = futures::stream::iter(silent)
            .map(|worker| async move {
                // A reconnect since the pass began (Redis restarted, perhaps
                // from an older state): judge nobody dead for a TTL.
                if self.recently_connected().await {
                    return None;
                }
                // The replica only picks candidates: the script decides on
                // the keep-alive in Redis, so a stale replica judges nobody
                // dead.
                match self.clean_if_dead(&worker).await {
                    Ok(_) => None,
                    Err(e) => Some((worker, e)),
                }
            })
            .buffer_unordered(CLEANUPS_IN_FLIGHT)
            .filter_map(std::future::ready)
            .collect()
            .await;
        // One line per pass, not per worker: while Redis refuses writes
        // every candidate fails the same way at every pass.
        if let Some((worker, error)) = failed.first() {
            tracing::warn!(
                failed = failed.len(),
                candidates,
                worker,
                %error,
                "dead-worker cleanups failed or incomplete; will retry (worker, error: the first)"
            );
        }
        // Nodes silent for two TTLs: drop their entry and reply stream.
        for (node, raw) in self.store.maps.nodes.snapshot().iter() {
            let last: u64 = raw.parse().unwrap_or(0);
            if *node != self.id
                && now.saturating_sub(last) > 2 * ttl
                && let Ok(true) = self.store.maps.nodes.test_and_delete(node, raw).await
            {
                if let Ok(key) = self.reply_key(node) {
                    let _: std::result::Result<i64, _> = self.store.client.del(key).await;
                }
                let _ = self.store.forget_node(node).await;
                tracing::info!(node, "stale node removed");
            }
        }
    }

    /// Notes which of this node's workers a renewal found under another
    /// node's cleanup claim (`claimed`): those start nothing until a
    /// renewal finds the claim gone. Their cleaner may be moving their
    /// inbox entries, and a fresh entry read before the move would start
    /// here while its moved copy starts elsewhere. Once a claim is gone,
    /// entries appended before then are not fresh any more: one read
    /// while it stood may have been moved since, and is claimed in Redis
    /// before it starts.
    pub(crate) fn note_cleanup_claims(&self, claimed: &[String]) {
        let mut cleared = Vec::new();
        for worker in self.workers.iter() {
            let now = claimed.iter().any(|id| id == worker.key());
            let was = worker.cleanup_claimed.swap(now, Ordering::SeqCst);
            if now && !was {
                tracing::warn!(
                    node = %self.id,
                    worker = %worker.key(),
                    running = worker.jobs.len(),
                    "a cleanup claim stands on a live worker: it starts nothing until the claim is gone"
                );
            } else if was && !now {
                tracing::info!(node = %self.id, worker = %worker.key(), "the cleanup claim on the worker is gone");
                cleared.push(worker.value().clone());
            }
        }
        if !cleared.is_empty() {
            self.freshness.invalidate("cleanup claim gone");
        }
        // The entries refused meanwhile wait in the inbox: read at once,
        // not after the delay their failures grew.
        for worker in cleared {
            worker.rewind_soon(self);
        }
    }
}
