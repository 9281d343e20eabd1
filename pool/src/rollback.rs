//! Recovery when Redis went back in time: restarted from an older snapshot
//! or AOF, or a replica promoted with lost writes. Redis is then neither
//! empty (the data-loss path of `recovering` in `scripts/base.lua` does not
//! fire: the pool's epoch is still there) nor current.
//!
//! Every node notices on its own: a resync of one of its replicas finds the
//! revision in Redis *behind* the replica (`Map::regressions`). It then
//! opens the recovery window (nothing is admitted while it lasts, as after a
//! data loss) and each of its workers reconciles Redis with what it runs:
//! it registers again if Redis forgot it, re-asserts every job it runs or
//! holds suspended (a newer fencing token wins over a stale record), and
//! releases the records that still name it for jobs it no longer runs (a
//! stop or hand-off Redis lost). Starts it already ran and stopped are
//! refused if their entries come back (`crate::tombstones`).

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::error::Result;
use crate::node::NodeInner;
use crate::worker::WorkerInner;

/// Pause between attempts when Redis is not answering yet.
const RETRY: Duration = Duration::from_millis(200);

impl NodeInner {
    /// The highest jobs-map revision seen: admissions pass it, so the first
    /// admission after Redis went back in time opens the recovery window
    /// itself, before any replica noticed.
    pub(crate) fn jobs_revision_floor(&self) -> u64 {
        self.maps.jobs.revision_high_water()
    }

    /// Watches the pool's maps for Redis going back in time and recovers.
    pub(crate) async fn rollback_loop(self: Arc<Self>) {
        let mut watched = [
            self.maps.jobs.regressions(),
            self.maps.pending.regressions(),
            self.maps.workers.regressions(),
            self.maps.keepalive.regressions(),
        ];
        loop {
            let changed =
                futures::future::select_all(watched.iter_mut().map(|rx| Box::pin(rx.changed())));
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                (result, _, _) = changed => if result.is_err() { return },
            }
            for rx in &mut watched {
                rx.borrow_and_update();
            }
            tracing::warn!(node = %self.id, "Redis went back in time: recovering");
            metrics::counter!("flotilla_pool_rollbacks_total").increment(1);
            loop {
                match self.recover_from_rollback().await {
                    Ok(()) => {
                        // Redis's older revisions are the current ones now.
                        self.maps.jobs.reset_revision_high_water();
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(node = %self.id, error = %e, "rollback recovery failed; retrying");
                        tokio::select! {
                            _ = self.cancel.cancelled() => return,
                            _ = tokio::time::sleep(RETRY) => {}
                        }
                    }
                }
            }
        }
    }

    /// Opens the recovery window, then reconciles every local worker.
    async fn recover_from_rollback(&self) -> Result<()> {
        self.freshness.invalidate("redis went back in time");
        let mut args = self.maps.base_args();
        args.push(Value::from(self.options.worker_ttl.as_millis().to_string()));
        let opened: String = self
            .scripts
            .begin_recovery
            .run(&self.client, self.maps.base_keys(), args)
            .await?;
        tracing::info!(node = %self.id, window = opened, "recovery window after a rollback");
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        for worker in workers {
            self.reconcile(&worker).await?;
        }
        Ok(())
    }

    /// Makes Redis show what `worker` runs, and nothing else.
    async fn reconcile(&self, worker: &Arc<WorkerInner>) -> Result<()> {
        if !self.maps.workers.contains_key(&worker.id) {
            // Registered after the state Redis went back to.
            return self.reregister(&worker.id).await;
        }
        let _guard = worker.ops.write().await;
        self.reassert_all(worker).await?;
        let kept = worker
            .suspended
            .lock()
            .await
            .keys()
            .cloned()
            .collect::<Vec<_>>();
        let stale: Vec<(String, String)> = self
            .maps
            .jobs
            .snapshot()
            .iter()
            .filter(|(k, v)| {
                crate::maps::job_owner(v).is_some_and(|(w, _)| w == worker.id)
                    && !worker.jobs.contains_key(*k)
                    && !kept.contains(k)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, record) in stale {
            let mut args = self.maps.base_args();
            args.extend([Value::from(key.as_str()), Value::from(record)]);
            let status: String = self
                .scripts
                .release_stale
                .run(&self.client, self.maps.base_keys(), args)
                .await?;
            tracing::info!(key, worker = %worker.id, status, "record of a job not running here after a rollback");
        }
        Ok(())
    }
}
