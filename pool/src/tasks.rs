//! The node's background tasks. Each is spawned on the node's task
//! tracker when it joins, watches the node's cancellation token, and is
//! awaited by [`stop_tasks`](NodeInner::stop_tasks) on close; a task logs
//! what fails and goes on rather than end.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use flotilla_streaming::Event;
use fred::prelude::*;
use futures::StreamExt;
use tokio::time::Instant;

use crate::codec::Reply;
use crate::keys::{self, SHUTDOWN_FLAG};
use crate::node::{Node, NodeInner};
use crate::worker::WorkerInner;

impl NodeInner {
    /// Starts every background task of the node (see the module docs).
    pub(crate) fn spawn_tasks(self: &Arc<Self>) {
        let me = self.clone();
        self.tasks.spawn(async move { me.read_loop().await });
        let me = self.clone();
        self.tasks.spawn(async move { me.ring_loop().await });
        let me = self.clone();
        self.tasks.spawn(async move { me.reconnect_loop().await });
        let me = self.clone();
        self.tasks.spawn(async move { me.shutdown_watch().await });
        let me = self.clone();
        self.tasks.spawn(async move { me.rollback_loop().await });
        let me = self.clone();
        self.tasks
            .spawn(async move { me.server_identity_loop().await });
        let me = self.clone();
        self.tasks.spawn(async move { me.renewal_loop().await });
        let me = self.clone();
        self.tasks.spawn(async move { me.lease_watchdog().await });
        let me = self.clone();
        self.tasks.spawn(async move { me.resume_loop().await });
        if !self.options.client_only {
            let me = self.clone();
            self.tasks.spawn(async move { me.cleanup_loop().await });
            let me = self.clone();
            self.tasks.spawn(async move { me.sweeper_loop().await });
            let me = self.clone();
            self.tasks.spawn(async move { me.rebalance_loop().await });
            let me = self.clone();
            self.tasks
                .spawn(async move { me.settle_handoffs_loop().await });
        }
    }

    pub(crate) async fn stop_tasks(&self) {
        self.cancel.cancel();
        self.reader.close().await;
        self.tasks.close();
        if tokio::time::timeout(Duration::from_secs(10), self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(node = %self.id, "background tasks did not end within 10 s");
        }
    }

    /// Routes every event read from the reply stream and the local inboxes.
    async fn read_loop(self: Arc<Self>) {
        let mut events = self.reader.events();
        let reply_name = self.reply_stream.name().to_string();
        loop {
            let event: Event = tokio::select! {
                _ = self.cancel.cancelled() => return,
                e = events.next() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            if event.stream == reply_name {
                let replies: Vec<&[u8]> = if event.name == crate::codec::EV_REPLIES {
                    event.payload.split(|b| *b == b'\n').collect()
                } else {
                    vec![&event.payload[..]]
                };
                for reply in replies {
                    match Reply::parse(reply) {
                        Ok(reply) => {
                            if let Some((_, tx)) = self.waiters.remove(&reply.request) {
                                let _ = tx.send(reply);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(id = %event.id, error = %e, "malformed reply skipped");
                        }
                    }
                }
                continue;
            }
            let Some(worker_id) = keys::inbox_worker(&event.stream) else {
                tracing::warn!(stream = %event.stream, "event from an unknown stream skipped");
                continue;
            };
            let worker = self.workers.get(worker_id).map(|w| w.value().clone());
            match worker {
                Some(worker) => worker.deliver(event).await,
                None => tracing::debug!(
                    worker = worker_id,
                    "event for a removed worker left in its inbox"
                ),
            }
        }
    }

    /// Keeps the ring current as workers join, leave or get cleaned.
    ///
    /// Subscribes first, then builds the ring from the replicas: a change
    /// the replicas took after the node's first ring and before these
    /// subscriptions has no event here, and a ring left without it places
    /// no key on a worker that joined meanwhile (the producer example's
    /// dispatch waited 30 s for an owner while `pool_workers()` showed two).
    pub(crate) async fn ring_loop(self: Arc<Self>) {
        let mut workers = self.store.maps.workers.subscribe();
        let mut cleanup = self.store.maps.cleanup.subscribe();
        self.refresh_ring();
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                e = workers.next() => if e.is_none() { return },
                e = cleanup.next() => if e.is_none() { return },
            }
            self.refresh_ring();
        }
    }

    /// Tracks (re)connections: after one, the node judges nobody dead for
    /// one TTL, since keep-alives could not reach Redis either.
    async fn reconnect_loop(self: Arc<Self>) {
        let mut rx = self.store.client.reconnect_rx();
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                r = rx.recv() => match r {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        *self.connected_at.lock().await = Instant::now();
                        self.freshness.invalidate("reconnected");
                        tracing::info!(node = %self.id, "reconnected to redis");
                        // Checked by its own task: its reads may wait for
                        // Redis, and the next reconnect must be recorded
                        // at once (the dead-worker check relies on it).
                        self.reconnects.send_modify(|n| *n += 1);
                    }
                    Err(_) => return,
                },
            }
        }
    }

    /// Reacts to a pool shutdown requested by any node.
    async fn shutdown_watch(self: Arc<Self>) {
        loop {
            let seen = tokio::select! {
                _ = self.cancel.cancelled() => return,
                r = self.store.maps.shutdown.wait_for(Duration::from_secs(3600), |m| m.contains_key(SHUTDOWN_FLAG)) => r,
            };
            match seen {
                Ok(()) => break,
                Err(flotilla_rmap::Error::Timeout(_)) => continue,
                Err(_) => return,
            }
        }
        if self.shutting_down_here.load(Ordering::Acquire) {
            return; // `Node::shutdown` on this node closes it
        }
        tracing::info!(node = %self.id, "pool is shutting down: stopping local jobs and closing");
        self.stop_for_shutdown().await;
        // Close the node so that it writes nothing after the keys are
        // deleted. Not a tracked task: closing waits for the tracked tasks,
        // this one among them.
        let node = Node { inner: self };
        tokio::spawn(async move {
            if let Err(e) = node.close().await {
                tracing::warn!(node = %node.inner.id, error = %e, "closing on pool shutdown failed");
            }
        });
    }

    /// Stops every local job without handing it over and removes the local
    /// workers (pool shutdown).
    pub(crate) async fn stop_for_shutdown(self: &Arc<Self>) {
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        let until = Instant::now() + self.options.worker_shutdown_ttl + self.options.redis_timeout;
        // Together: one round of stops for the node, not one per worker.
        let retired =
            futures::future::join_all(workers.iter().map(|w| self.retire_worker(w, false, until)))
                .await;
        for (worker, result) in workers.iter().zip(retired) {
            if let Err(e) = result {
                tracing::warn!(worker = %worker.id, error = %e, "removing worker on shutdown failed");
            }
        }
    }
}
