//! Workers: run the jobs the ring assigns them, reading their inbox.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use dashmap::DashMap;
use flotilla_streaming::{Event, StartPosition};
use fred::types::Value;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::codec::{self, EV_MESSAGE, EV_NOTIFY, EV_START, EV_STOP, KeyedRequest, StartEntry};
use crate::error::{Error, Result};
use crate::handler::{Handler, Job, guarded};
use crate::node::{Node, NodeInner};

/// A request is forwarded at most this many times when views of the ring
/// disagree; then the receiving worker takes it.
const MAX_HOPS: u8 = 3;

/// A worker: runs the jobs whose keys the ring assigns it.
///
/// Created on a node with [`Worker::new`]; removed with
/// [`Node::remove_worker`] (its jobs move to other workers) or when the
/// node closes.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<WorkerInner>,
    node: Node,
}

/// A job running on this worker.
#[derive(Debug, Clone)]
pub(crate) struct LocalJob {
    pub(crate) token: u64,
    pub(crate) created_at_ms: u64,
    pub(crate) payload: Bytes,
    /// The encoded job body, to restore the payload after data loss.
    pub(crate) raw_body: Bytes,
}

/// State of a worker shared with the node's tasks.
pub(crate) struct WorkerInner {
    pub(crate) id: String,
    node: Weak<NodeInner>,
    pub(crate) handler: Arc<dyn Handler>,
    tx: mpsc::Sender<Event>,
    /// Jobs running here.
    pub(crate) jobs: DashMap<String, LocalJob>,
    /// Jobs stopped on lease loss, to resume once the lease is back.
    pub(crate) suspended: Mutex<HashMap<String, LocalJob>>,
    /// Serialises job operations (start, stop, handoff, suspend) so that a
    /// key is never started and handed off at the same time.
    pub(crate) ops: Mutex<()>,
    /// Set while the node's lease is lost: no job may start, and one that
    /// started meanwhile is stopped at once.
    pub(crate) lease_lost: std::sync::atomic::AtomicBool,
    pub(crate) cancel: CancellationToken,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.inner.id)
            .field("jobs", &self.inner.jobs.len())
            .finish()
    }
}

impl Worker {
    /// Registers a worker on `node` running `handler`, and returns once the
    /// pool can route jobs to it.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] on a client-only node, [`Error::Closed`],
    /// [`Error::ShuttingDown`], Redis errors.
    pub async fn new(node: &Node, handler: impl Handler) -> Result<Worker> {
        let inner = &node.inner;
        if inner.options.client_only {
            return Err(Error::InvalidOptions {
                option: "client_only",
                reason: "a client-only node cannot host workers".into(),
            });
        }
        inner.check_open()?;
        let id = format!("w-{}", uuid::Uuid::new_v4().simple());
        let (tx, rx) = mpsc::channel(4096);
        let worker = Arc::new(WorkerInner {
            id: id.clone(),
            node: Arc::downgrade(inner),
            handler: Arc::new(handler),
            tx,
            jobs: DashMap::new(),
            suspended: Mutex::new(HashMap::new()),
            ops: Mutex::new(()),
            lease_lost: std::sync::atomic::AtomicBool::new(false),
            cancel: inner.cancel.child_token(),
        });
        inner.workers.insert(id.clone(), worker.clone());
        let inbox = inner.inbox(&id)?;
        if let Err(e) = async {
            inner
                .reader
                .add_stream(&inbox, Some(StartPosition::Oldest))
                .await?;
            inner.register_worker(&id).await?;
            inner
                .maps
                .workers
                .wait_for(inner.options.dispatch_timeout, |m| m.contains_key(&id))
                .await?;
            Ok::<(), Error>(())
        }
        .await
        {
            inner.workers.remove(&id);
            let _ = inner.reader.remove_stream(inbox.name()).await;
            return Err(e);
        }
        inner.refresh_ring();
        let task_worker = worker.clone();
        inner.tasks.spawn(task_worker.run(rx));
        tracing::info!(pool = %inner.pool, node = %inner.id, worker = %id, "worker joined");
        metrics::counter!("flotilla_pool_workers_joined_total").increment(1);
        Ok(Worker {
            inner: worker,
            node: node.clone(),
        })
    }

    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Keys of the jobs running on this worker.
    pub fn job_keys(&self) -> Vec<String> {
        self.inner.jobs.iter().map(|e| e.key().clone()).collect()
    }

    /// The fencing token of a job running on this worker.
    pub fn job_token(&self, key: &str) -> Option<u64> {
        self.inner.jobs.get(key).map(|j| j.token)
    }

    /// The node hosting this worker.
    pub fn node(&self) -> &Node {
        &self.node
    }
}

impl Node {
    /// Removes `worker`: its jobs are stopped and handed to other workers,
    /// its queued events move with them, then it is unregistered.
    ///
    /// # Errors
    /// Redis errors while handing over (the cleanup of the worker after its
    /// TTL then finishes the job; nothing is lost).
    pub async fn remove_worker(&self, worker: &Worker) -> Result<()> {
        let Some(inner) = self
            .inner
            .workers
            .get(&worker.inner.id)
            .map(|w| w.value().clone())
        else {
            return Ok(());
        };
        self.inner.retire_worker(&inner, true).await
    }
}

impl WorkerInner {
    pub(crate) fn node(&self) -> Option<Arc<NodeInner>> {
        self.node.upgrade()
    }

    /// Hands an inbox event to the worker's task (backpressure when full).
    pub(crate) async fn deliver(&self, event: Event) {
        if self.tx.send(event).await.is_err() {
            tracing::debug!(worker = %self.id, "worker task gone; event left in inbox");
        }
    }

    async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<Event>) {
        loop {
            let event = tokio::select! {
                _ = self.cancel.cancelled() => return,
                e = rx.recv() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            let Some(node) = self.node() else { return };
            let _guard = self.ops.lock().await;
            if self.cancel.is_cancelled() {
                return;
            }
            let result = match event.name.as_str() {
                EV_START => self.on_start(&node, &event).await,
                EV_STOP => self.on_stop(&node, &event).await,
                EV_NOTIFY | EV_MESSAGE => self.on_keyed(&node, &event).await,
                other => {
                    tracing::warn!(worker = %self.id, id = %event.id, event = other, "unknown inbox event dead-lettered");
                    self.drop_entry(&node, &event.id).await
                }
            };
            if let Err(e) = result {
                // The entry stays in the inbox; it is retried when the worker
                // re-reads it or moved by the cleanup if the worker dies.
                tracing::warn!(worker = %self.id, id = %event.id, error = %e, "inbox event failed");
            }
        }
    }

    async fn drop_entry(&self, node: &NodeInner, id: &str) -> Result<()> {
        node.inbox(&self.id)?.remove(&[id]).await?;
        Ok(())
    }

    /// Where a request for `key` should go instead of here, if anywhere.
    fn forward_target(&self, node: &NodeInner, key: &str, hops: u8) -> Option<String> {
        if hops >= MAX_HOPS {
            return None;
        }
        let ring = node.ring.load();
        match ring.owner(key) {
            Some(owner) if owner != self.id => Some(owner.to_string()),
            _ => None,
        }
    }

    #[tracing::instrument(name = "start", skip_all, fields(worker = %self.id))]
    async fn on_start(&self, node: &NodeInner, event: &Event) -> Result<()> {
        let entry = match StartEntry::parse(&event.payload) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(id = %event.id, error = %e, "malformed start entry dead-lettered");
                return self.drop_entry(node, &event.id).await;
            }
        };
        let key = entry.body.key.clone();
        tracing::Span::current().record("key", key.as_str());
        if let Some(target) = self.forward_target(node, &key, entry.hops) {
            match node
                .move_entry(&self.id, &target, &event.id, EV_START, entry.forwarded())
                .await?
                .as_str()
            {
                "ok" | "gone" => return Ok(()),
                _ => node.refresh_ring(), // target left: run it here
            }
        }
        if self.jobs.contains_key(&key) {
            // Started again while running here: stop the old run first so
            // the key never runs twice.
            let _ = guarded("stop", self.handler.stop(&key)).await;
            self.jobs.remove(&key);
        }
        if self.lease_lost.load(std::sync::atomic::Ordering::Acquire) {
            // Without a lease nothing starts; the entry stays in the inbox
            // and is read again once the lease is back (or moved by cleanup).
            return Err(Error::Unavailable(fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                "lease lost",
            )));
        }
        let job = Job {
            key: key.clone(),
            payload: Bytes::from(entry.body.payload.clone()),
            created_at: SystemTime::UNIX_EPOCH + Duration::from_millis(entry.created_at_ms),
            fencing_token: entry.token,
        };
        let (reply_key, request) = match &entry.reply {
            Some(r) => (node.reply_key(&r.node)?, r.request),
            None => (node.inbox(&self.id)?.key().to_string(), 0),
        };
        let mut keys = node.maps.base_keys();
        keys.push(node.inbox(&self.id)?.key().to_string());
        keys.push(reply_key);
        let mut args = node.maps.base_args();
        args.extend([
            Value::from(key.as_str()),
            Value::from(entry.token.to_string()),
        ]);
        match guarded("start", self.handler.start(job.clone())).await {
            Err(message) => {
                tracing::info!(key, error = %message, "handler refused to start job");
                metrics::counter!("flotilla_pool_start_failed_total").increment(1);
                args.extend([
                    Value::from(event.id.as_str()),
                    Value::from(request.to_string()),
                    Value::from(message),
                ]);
                let _: Value = node
                    .scripts
                    .start_failed
                    .run(&node.client, keys, args)
                    .await?;
                Ok(())
            }
            Ok(()) => {
                self.jobs.insert(
                    key.clone(),
                    LocalJob {
                        token: entry.token,
                        created_at_ms: entry.created_at_ms,
                        payload: job.payload.clone(),
                        raw_body: entry.raw_body.clone(),
                    },
                );
                args.extend([
                    Value::from(self.id.as_str()),
                    Value::from(event.id.as_str()),
                    Value::from(request.to_string()),
                ]);
                let status: String = match node.scripts.started.run(&node.client, keys, args).await
                {
                    Ok(s) => s,
                    Err(e) => {
                        // Not recorded: stop it so that a retry cannot run it twice.
                        let _ = guarded("stop", self.handler.stop(&key)).await;
                        self.jobs.remove(&key);
                        return Err(e);
                    }
                };
                if status != "ok" {
                    tracing::info!(key, status, "start not recorded; stopping the local run");
                    let _ = guarded("stop", self.handler.stop(&key)).await;
                    self.jobs.remove(&key);
                } else if self.lease_lost.load(std::sync::atomic::Ordering::Acquire) {
                    // The lease lapsed while recording: stop now, resume later.
                    let _ = guarded("stop", self.handler.stop(&key)).await;
                    if let Some((k, job)) = self.jobs.remove(&key) {
                        self.suspended.lock().await.insert(k, job);
                    }
                } else {
                    tracing::debug!(key, token = entry.token, "job started");
                    metrics::counter!("flotilla_pool_jobs_started_total").increment(1);
                }
                Ok(())
            }
        }
    }

    #[tracing::instrument(name = "stop", skip_all, fields(worker = %self.id))]
    async fn on_stop(&self, node: &NodeInner, event: &Event) -> Result<()> {
        let req: KeyedRequest = match codec::decode("stop request", &event.payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(id = %event.id, error = %e, "malformed stop request dead-lettered");
                return self.drop_entry(node, &event.id).await;
            }
        };
        if self.jobs.remove(&req.key).is_some()
            && let Err(e) = guarded("stop", self.handler.stop(&req.key)).await
        {
            tracing::warn!(key = %req.key, error = %e, "handler stop failed; job dropped anyway");
        }
        self.suspended.lock().await.remove(&req.key);
        let (reply_key, request) = match &req.reply {
            Some(r) => (node.reply_key(&r.node)?, r.request),
            None => (node.inbox(&self.id)?.key().to_string(), 0),
        };
        let mut keys = node.maps.base_keys();
        keys.push(node.inbox(&self.id)?.key().to_string());
        keys.push(reply_key);
        let mut args = node.maps.base_args();
        args.extend([
            Value::from(req.key.as_str()),
            Value::from(self.id.as_str()),
            Value::from(event.id.as_str()),
            Value::from(request.to_string()),
        ]);
        let _: String = node.scripts.stopped.run(&node.client, keys, args).await?;
        metrics::counter!("flotilla_pool_jobs_stopped_total").increment(1);
        Ok(())
    }

    async fn on_keyed(&self, node: &NodeInner, event: &Event) -> Result<()> {
        let req: KeyedRequest = match codec::decode("keyed request", &event.payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(id = %event.id, error = %e, "malformed request dead-lettered");
                return self.drop_entry(node, &event.id).await;
            }
        };
        let payload = Bytes::from(req.payload.clone());
        let result = if event.name == EV_NOTIFY {
            if !self.jobs.contains_key(&req.key) && req.hops < MAX_HOPS {
                let owner = node
                    .maps
                    .jobs
                    .get(&req.key)
                    .and_then(|v| crate::maps::job_owner(&v).map(|(w, _)| w.to_string()));
                if let Some(owner) = owner.filter(|o| *o != self.id) {
                    let fwd = codec::encode(&KeyedRequest {
                        hops: req.hops + 1,
                        ..req.clone()
                    });
                    let moved = node
                        .move_entry(&self.id, &owner, &event.id, EV_NOTIFY, fwd)
                        .await?;
                    if moved == "ok" || moved == "gone" {
                        return Ok(());
                    }
                }
            }
            guarded("notify", self.handler.notify(&req.key, payload)).await
        } else {
            if let Some(target) = self.forward_target(node, &req.key, req.hops) {
                let fwd = codec::encode(&KeyedRequest {
                    hops: req.hops + 1,
                    ..req.clone()
                });
                let moved = node
                    .move_entry(&self.id, &target, &event.id, EV_MESSAGE, fwd)
                    .await?;
                if moved == "ok" || moved == "gone" {
                    return Ok(());
                }
            }
            guarded("message", self.handler.message(&req.key, payload)).await
        };
        if let Err(e) = result {
            tracing::warn!(key = %req.key, event = %event.name, error = %e, "handler failed; message dropped");
        }
        self.drop_entry(node, &event.id).await
    }
}

impl NodeInner {
    /// Registers (or re-registers) a worker on Redis.
    pub(crate) async fn register_worker(&self, id: &str) -> Result<()> {
        let info = serde_json::json!({
            "node": self.id,
            "host": self.host,
            "pid": self.pid,
        })
        .to_string();
        let mut keys = self.maps.base_keys();
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        keys.push(self.maps.keepalive.keys_info().revision.clone());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(id),
            Value::from(info),
            Value::from(self.maps.keepalive.keys_info().channel.clone()),
        ]);
        let _: Value = self.scripts.register.run(&self.client, keys, args).await?;
        Ok(())
    }

    /// Moves one inbox entry from `from`'s inbox to `to`'s.
    pub(crate) async fn move_entry(
        &self,
        from: &str,
        to: &str,
        id: &str,
        name: &str,
        payload: Bytes,
    ) -> Result<String> {
        let mut keys = self.maps.base_keys();
        keys.push(self.inbox(from)?.key().to_string());
        keys.push(self.inbox(to)?.key().to_string());
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(id),
            Value::from(name),
            Value::Bytes(payload),
            Value::from(to),
            Value::from(crate::dispatch::INBOX_MAXLEN.to_string()),
        ]);
        self.scripts.move_entry.run(&self.client, keys, args).await
    }

    /// Hands job `key`, owned by `from`, to `to`.
    pub(crate) async fn handoff(&self, key: &str, from: &str, to: &str) -> Result<String> {
        let mut keys = self.maps.base_keys();
        keys.push(self.inbox(to)?.key().to_string());
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        let mut args = self.maps.base_args();
        let pending_ttl =
            (self.options.dispatch_timeout + self.options.ack_grace).as_millis() as u64;
        args.extend([
            Value::from(key),
            Value::from(from),
            Value::from(to),
            Value::from(pending_ttl.to_string()),
            Value::from(crate::dispatch::INBOX_MAXLEN.to_string()),
        ]);
        let reply: Value = self.scripts.handoff.run(&self.client, keys, args).await?;
        let (status, _) = crate::scripts::status_reply(reply)?;
        if status == "ok" {
            tracing::info!(key, from, to, "job handed off");
            metrics::counter!("flotilla_pool_handoffs_total").increment(1);
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
        let _guard = worker.ops.lock().await;
        worker.cancel.cancel();
        let inbox = self.inbox(&worker.id)?;
        let _ = self.reader.remove_stream(inbox.name()).await;
        if handover {
            // Leave the ring first so that dispatchers stop sending here.
            let claim = format!("{} closing", self.id);
            let _ = self.maps.cleanup.set(&worker.id, &claim).await?;
            self.refresh_ring();
        }
        let keys: Vec<String> = worker.jobs.iter().map(|e| e.key().clone()).collect();
        for key in keys {
            if let Err(e) = guarded("stop", worker.handler.stop(&key)).await {
                tracing::warn!(key, error = %e, "handler stop failed during close");
            }
            worker.jobs.remove(&key);
            if handover {
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
