//! An operator drains workers of the busiest process through a dispatching
//! node (`Node::drain_worker`), and undrains them later: the jobs move off
//! through the safe hand-off and come back by the rebalance, while the
//! other faults of the schedule, and with half the drains a live partition
//! of the drained process, land on the moves.

use std::time::Duration;

use rand::Rng;
use rand::seq::SliceRandom;
use tokio::time::Instant;

use super::faults::SILENT_FAILURES;
use super::{ChaosError, Run};
use crate::ledger::FaultKind;

/// How long an undrain is retried while Redis refuses it (faults overlap):
/// a worker left drained for good would take no job for the rest of the run.
const UNDRAIN_FOR: Duration = Duration::from_secs(30);

impl Run {
    /// [`FaultKind::Drain`]: one worker, or every worker, of the busiest
    /// process drained; with half the drains the process's link fails
    /// (refused, black-holed or frozen) 0–½ TTL later, while it hands its
    /// jobs off, and heals 2 TTLs after; else the drain holds 1–3 TTLs.
    /// Then the workers are undrained. Returns the process's pid.
    pub(super) async fn drain_busiest(
        &mut self,
        since: Instant,
        recovered: &mut Option<Duration>,
    ) -> Result<Option<u32>, ChaosError> {
        self.fleet.refresh();
        let Some(pid) = self.fleet.busiest_up() else {
            return Ok(None);
        };
        let node = self
            .load
            .node(self.rng.random_range(0..self.load.node_count()));
        let mut ids: Vec<String> = node
            .pool_workers()
            .into_iter()
            .filter(|w| w.pid == pid && !w.drained && !w.cleaning)
            .map(|w| w.id)
            .collect();
        if ids.is_empty() {
            return Ok(None);
        }
        ids.shuffle(&mut self.rng);
        if self.rng.random_bool(0.5) {
            ids.truncate(1);
        }
        let ttl = self.options.ttl;
        self.record(FaultKind::Drain, Some(pid), false);
        for id in &ids {
            if let Err(e) = node.drain_worker(id).await {
                tracing::warn!(worker = %id, error = %e, "chaos: drain failed");
            }
        }
        tracing::info!(pid, workers = ids.len(), "chaos: workers drained");
        if !self.options.sentinel && self.rng.random_bool(0.5) {
            let wait = self.rng.random_range(Duration::ZERO..=ttl / 2);
            self.observe(since, Instant::now() + wait, false, recovered)
                .await;
            let mode = SILENT_FAILURES[self.rng.random_range(0..SILENT_FAILURES.len())];
            self.degrade_link(FaultKind::Cut, pid, mode);
            let cut_at = Instant::now();
            self.observe(since, cut_at + ttl * 2, false, recovered)
                .await;
            self.heal_link(FaultKind::Cut, pid);
        } else {
            let hold = self.rng.random_range(ttl..=ttl * 3);
            self.observe(since, since + hold, false, recovered).await;
        }
        for id in &ids {
            self.undrain(&node, id).await;
        }
        self.record(FaultKind::Drain, Some(pid), true);
        Ok(Some(pid))
    }

    /// Undrains `id`, retrying while Redis refuses (up to [`UNDRAIN_FOR`]);
    /// a worker Redis no longer knows (it left, or the mark went with
    /// Redis's data) needs nothing.
    async fn undrain(&self, node: &flotilla_pool::Node, id: &str) {
        let until = Instant::now() + UNDRAIN_FOR;
        loop {
            match node.undrain_worker(id).await {
                Ok(_) | Err(flotilla_pool::Error::UnknownWorker(_)) => return,
                Err(e) if Instant::now() < until => {
                    tracing::debug!(worker = %id, error = %e, "chaos: undrain failed; again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    tracing::warn!(worker = %id, error = %e, "chaos: undrain failed; the worker stays drained");
                    return;
                }
            }
        }
    }
}
