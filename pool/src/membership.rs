//! Membership: registering and retiring workers, and moving their jobs
//! and inbox entries to other workers.

use std::sync::Arc;

use bytes::Bytes;

use crate::error::Result;
use crate::node::NodeInner;
use crate::store::{EntryMove, Handoff, Moved};
use crate::worker::WorkerInner;

impl NodeInner {
    /// Registers (or re-registers) a worker on Redis.
    pub(crate) async fn register_worker(&self, id: &str) -> Result<()> {
        let info = serde_json::json!({
            "node": self.id,
            "host": self.host,
            "pid": self.pid,
        })
        .to_string();
        let sent = tokio::time::Instant::now();
        let now = self.store.register(id, &info).await?;
        if let Some(now) = now {
            self.freshness.server_time(now, sent);
        }
        Ok(())
    }

    /// Moves one inbox entry from `from`'s inbox to `to`'s.
    /// `requeued_key`: the job key of a start entry a cleaner moves (it gets
    /// a new fencing token); `None` when forwarding.
    pub(crate) async fn move_entry(
        &self,
        from: &str,
        to: &str,
        id: &str,
        name: &str,
        payload: Bytes,
        requeued_key: Option<&str>,
    ) -> Result<Moved> {
        self.store
            .move_entry(EntryMove {
                from_inbox: self.inbox(from)?.key(),
                to,
                to_inbox: self.inbox(to)?.key(),
                id,
                name,
                payload,
                requeued_key,
            })
            .await
    }

    /// Hands job `key`, owned by `from`, to `to`.
    pub(crate) async fn handoff(&self, key: &str, from: &str, to: &str) -> Result<Handoff> {
        let status = self
            .store
            .handoff(
                key,
                from,
                to,
                self.inbox(to)?.key(),
                self.options.dispatch_timeout + self.options.ack_grace,
                self.options.worker_ttl,
            )
            .await?;
        if let Handoff::Ok { .. } = status {
            tracing::info!(key, from, to, "job handed off");
            metrics::counter!("flotilla_pool_handoffs_total").increment(1);
            self.history.count(crate::history::PoolEvent::Move);
        }
        Ok(status)
    }

    /// Removes a local worker. With `handover`, its jobs and queued events
    /// move to other workers first; without, its jobs are only stopped
    /// (pool shutdown).
    pub(crate) async fn retire_worker(
        &self,
        worker: &Arc<WorkerInner>,
        handover: bool,
    ) -> Result<()> {
        let _guard = worker.ops.write().await;
        worker.cancel.cancel();
        let inbox = self.inbox(&worker.id)?;
        let _ = self.reader.remove_stream(inbox.name()).await;
        if handover {
            // Leave the ring first so that dispatchers stop sending here.
            let claim = format!("{} closing", self.id);
            let _ = self.store.maps.cleanup.set(&worker.id, &claim).await?;
            self.refresh_ring();
        }
        // Every job stops at once (each within stop_timeout), so closing a
        // worker with many jobs takes one stop, not one per job; each is
        // handed on only after its own stop returned.
        let keys: Vec<String> = worker.jobs.iter().map(|e| e.key().clone()).collect();
        let stopped: Vec<String> =
            futures::future::join_all(keys.into_iter().map(|key| async move {
                if let Err(e) = worker.stop_handler(&key).await {
                    tracing::warn!(key, error = %e, "handler stop failed during close");
                }
                worker.jobs.remove(&key);
                key
            }))
            .await;
        if handover {
            for key in stopped {
                self.requeue_job(&key, &worker.id).await;
            }
        }
        worker.suspended.lock().await.clear();
        if handover {
            self.requeue_owned_by(&worker.id).await;
            self.requeue_worker_inbox(&worker.id).await?;
        }
        self.remove_worker_entry(&worker.id).await?;
        self.workers.remove(&worker.id);
        self.refresh_ring();
        tracing::info!(worker = %worker.id, handover, "worker removed");
        Ok(())
    }
}
