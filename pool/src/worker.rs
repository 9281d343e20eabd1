//! Workers: run the jobs the ring assigns them, reading their inbox.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use dashmap::DashMap;
use flotilla_streaming::{Event, StartPosition};
use fred::types::Value;
use tokio::sync::{Mutex, RwLock, mpsc};
use tokio_util::sync::CancellationToken;

use crate::codec::{self, EV_NOTIFY, EV_START, KeyedRequest, StartEntry};
use crate::error::{Error, Result};
use crate::handler::{Handler, Job, guarded};
use crate::lanes::{Delivery, InboxEvent, LANE_QUEUE, LANES, SeenEntries, lane_of};
use crate::node::{Node, NodeInner};
use crate::start_record::StartRecord;

/// A request is forwarded at most this many times when views of the ring
/// disagree; then the receiving worker takes it.
pub(crate) const MAX_HOPS: u8 = 3;

/// A worker: runs the jobs whose keys the ring assigns it.
///
/// Created on a node with [`Worker::new`]; removed with
/// [`Node::remove_worker`] (its jobs move to other workers) or when the
/// node closes.
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Arc<WorkerInner>,
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
    /// One queue per lane (see [`crate::lanes`]).
    lanes: Vec<mpsc::Sender<Delivery>>,
    /// Jobs running here.
    pub(crate) jobs: DashMap<String, LocalJob>,
    /// Jobs stopped on lease loss, to resume once the lease is back.
    pub(crate) suspended: Mutex<HashMap<String, LocalJob>>,
    /// Job operations on single keys (start, stop, handoff) share it;
    /// operations on every job of the worker (re-assert, resume, retire)
    /// hold it exclusively.
    pub(crate) ops: RwLock<()>,
    /// Per-stripe locks: a key's operations hold its stripe's lock, so a
    /// key is never started and handed off at the same time.
    key_locks: Vec<Mutex<()>>,
    /// Inbox entries in flight or just handled (see [`WorkerInner::rewind`]).
    seen: SeenEntries,
    /// Pacing of inbox rewinds after failed events.
    rewind: RewindState,
    /// Set while the node's lease is lost: no job may start, and one that
    /// started meanwhile is stopped at once.
    pub(crate) lease_lost: std::sync::atomic::AtomicBool,
    /// The node's [`stop_timeout`](crate::NodeOptions::stop_timeout).
    stop_timeout: Duration,
    /// Runs stopped here on request (see [`crate::tombstones`]).
    pub(crate) stopped: crate::tombstones::StopTombstones,
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
        if let Some(budget) = handler.stop_budget()
            && budget > inner.options.stop_timeout
        {
            return Err(Error::InvalidOptions {
                option: "stop_timeout",
                reason: format!(
                    "the handler's own stop timeout {budget:?} exceeds the node's stop_timeout {:?} \
                     (NodeOptions::stop_timeout, bounded by the stop margin)",
                    inner.options.stop_timeout
                ),
            });
        }
        let id = format!("w-{}", uuid::Uuid::new_v4().simple());
        let (lanes, lane_queues): (Vec<_>, Vec<_>) =
            (0..LANES).map(|_| mpsc::channel(LANE_QUEUE)).unzip();
        let worker = Arc::new(WorkerInner {
            id: id.clone(),
            node: Arc::downgrade(inner),
            handler: Arc::new(handler),
            lanes,
            jobs: DashMap::new(),
            suspended: Mutex::new(HashMap::new()),
            ops: RwLock::new(()),
            key_locks: (0..LANES).map(|_| Mutex::new(())).collect(),
            seen: SeenEntries::default(),
            rewind: RewindState::default(),
            lease_lost: std::sync::atomic::AtomicBool::new(false),
            stop_timeout: inner.options.stop_timeout,
            stopped: crate::tombstones::StopTombstones::default(),
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
        for (lane, queue) in lane_queues.into_iter().enumerate() {
            inner.tasks.spawn(worker.clone().run_lane(lane, queue));
        }
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
        let options = &self.inner.options;
        let until =
            tokio::time::Instant::now() + options.worker_shutdown_ttl + options.redis_timeout;
        self.inner.retire_worker(&inner, true, until).await
    }
}

/// Pacing of inbox rewinds: at most one scheduled at a time, with a delay
/// that doubles while events keep failing.
#[derive(Debug, Default)]
struct RewindState {
    scheduled: std::sync::atomic::AtomicBool,
    failures: std::sync::atomic::AtomicU32,
}

impl RewindState {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    /// The delay before the next rewind, or `None` if one is scheduled.
    fn schedule(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering::AcqRel;
        if self.scheduled.swap(true, AcqRel) {
            return None;
        }
        let n = self.failures.fetch_add(1, AcqRel).min(6);
        Some((Self::FIRST * 2u32.pow(n)).min(Self::MAX))
    }

    fn started(&self) {
        self.scheduled
            .store(false, std::sync::atomic::Ordering::Release);
    }

    fn succeeded(&self) {
        self.failures.store(0, std::sync::atomic::Ordering::Release);
    }
}

impl WorkerInner {
    pub(crate) fn node(&self) -> Option<Arc<NodeInner>> {
        self.node.upgrade()
    }

    /// Re-asserts a run whose start Redis lost (data loss, or Redis went
    /// back in time): takes ownership unless a newer start exists, in which
    /// case the run here stops. Errors leave it to the re-assertion that
    /// follows re-registration or the rollback recovery.
    async fn reassert_start(&self, node: &NodeInner, key: &str) {
        let Some(job) = self.jobs.get(key).map(|j| j.clone()) else {
            return;
        };
        match node
            .reassert(self, key, &job, crate::lease::Reassert::Running)
            .await
        {
            Ok(s) if s == "ok" => {}
            Ok(status) => {
                tracing::info!(key, status, "a newer start exists; stopping the local run");
                if self.jobs.remove(key).is_some() {
                    let _ = self.stop_handler(key).await;
                }
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "re-asserting a start failed; retried on recovery")
            }
        }
    }

    /// Runs the handler's `stop` for `key`, bounded by the node's
    /// `stop_timeout` (an overrun counts as stopped and is reported).
    pub(crate) async fn stop_handler(&self, key: &str) -> std::result::Result<(), String> {
        crate::handler::stop_within(self.stop_timeout, key, self.handler.stop(key)).await
    }

    /// Hands an inbox event to the lane of its key (backpressure when the
    /// lane is full).
    pub(crate) async fn deliver(&self, event: Event) {
        if !self.seen.admit(&event.id) {
            return; // read again by a rewind while still queued or just done
        }
        let delivery = Delivery::parse(event);
        if self.lanes[delivery.lane()].send(delivery).await.is_err() {
            tracing::debug!(worker = %self.id, "worker task gone; event left in inbox");
        }
    }

    /// Locks the stripe of `key` for a single-key job operation; the caller
    /// holds `ops` shared.
    pub(crate) async fn lock_key(&self, key: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.key_locks[lane_of(key)].lock().await
    }

    async fn run_lane(self: Arc<Self>, lane: usize, mut queue: mpsc::Receiver<Delivery>) {
        loop {
            let Delivery { event, parsed } = tokio::select! {
                _ = self.cancel.cancelled() => return,
                d = queue.recv() => match d {
                    Some(d) => d,
                    None => return,
                },
            };
            let Some(node) = self.node() else { return };
            let _ops = self.ops.read().await;
            let _key = self.key_locks[lane].lock().await;
            if self.cancel.is_cancelled() {
                return;
            }
            let id = event.id.clone();
            let result = match parsed {
                InboxEvent::Start(entry) => self.on_start(&node, &event, entry).await,
                InboxEvent::Stop(req) => self.on_stop(&node, &event, req).await,
                InboxEvent::Keyed(req) => self.on_keyed(&node, &event, req).await,
                InboxEvent::Malformed(e) => {
                    tracing::warn!(worker = %self.id, id = %event.id, event = %event.name, error = %e, "malformed inbox event dead-lettered");
                    metrics::counter!("flotilla_pool_dead_letters_total").increment(1);
                    self.drop_entry(&node, &event.id).await
                }
            };
            match result {
                Ok(()) => {
                    self.seen.finished(&id);
                    self.rewind.succeeded();
                }
                Err(e) => {
                    // The entry stays in the inbox: read it again later (or
                    // the cleanup moves it if this worker dies).
                    tracing::warn!(worker = %self.id, id, error = %e, "inbox event failed; will read it again");
                    self.seen.failed(&id);
                    self.clone().rewind(&node);
                }
            }
        }
    }

    /// Events that failed since the last one that succeeded, and whether a
    /// rewind is waiting to run.
    #[cfg(test)]
    pub(crate) fn rewind_state(&self) -> (u32, bool) {
        use std::sync::atomic::Ordering::Acquire;
        (
            self.rewind.failures.load(Acquire),
            self.rewind.scheduled.load(Acquire),
        )
    }

    /// Reads the inbox again after the shortest delay (the lease is back).
    pub(crate) fn rewind_soon(self: &Arc<Self>, node: &NodeInner) {
        self.rewind.succeeded();
        self.clone().rewind(node);
    }

    /// Reads the inbox again from its oldest entry, after a delay that grows
    /// while events keep failing (100 ms doubling up to 5 s). Entries still
    /// there are the ones not handled yet; those queued or just finished
    /// are skipped by `seen`. Without a lease nothing is re-read: resuming
    /// after the lease is back rewinds every worker.
    pub(crate) fn rewind(self: Arc<Self>, node: &NodeInner) {
        let Some(delay) = self.rewind.schedule() else {
            return; // one is already on its way
        };
        node.tasks.spawn(async move {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            self.rewind.started();
            let Some(node) = self.node() else { return };
            if self.lease_lost.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            let result = match node.inbox(&self.id) {
                Ok(inbox) => node
                    .reader
                    .add_stream(&inbox, Some(StartPosition::Oldest))
                    .await
                    .map_err(Error::from),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(worker = %self.id, error = %e, "re-reading the inbox failed");
            }
        });
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
    pub(crate) async fn on_start(
        &self,
        node: &NodeInner,
        event: &Event,
        entry: StartEntry,
    ) -> Result<()> {
        let key = entry.body.key.clone();
        tracing::Span::current().record("key", key.as_str());
        if let Some(target) = self.forward_target(node, &key, entry.hops) {
            match node
                .move_entry(
                    &self.id,
                    &target,
                    &event.id,
                    EV_START,
                    entry.forwarded(),
                    None,
                )
                .await?
                .as_str()
            {
                "ok" | "gone" => return Ok(()),
                _ => node.refresh_ring(), // target left: run it here
            }
        }
        let start = StartRecord::new(node, &self.id, event, &entry)?;
        if self.stopped.covers(&key, entry.token) {
            // A start this worker ran and then stopped on request, back in
            // its inbox because Redis went back in time: the stop stands.
            tracing::info!(
                key,
                token = entry.token,
                "start of a run stopped here already; dropped"
            );
            let _ = start.finish(node, "superseded").await?;
            return Ok(());
        }
        if let Some(running) = self.jobs.get(&key).map(|j| j.token)
            && running >= entry.token
        {
            if running > entry.token {
                // An older start that was moved on and came back: the key
                // runs here already.
                let _ = start.finish(node, "superseded").await?;
                return Ok(());
            }
            // This very start, read again by a rewind because recording it
            // failed: record it now (it may be recorded already).
            let status = start.record(node).await?;
            if status == "recovering" {
                self.reassert_start(node, &key).await;
            } else if status != "ok" {
                tracing::warn!(key, status, "start not kept; stopping the local run");
                let _ = self.stop_handler(&key).await;
                self.jobs.remove(&key);
            }
            return Ok(());
        }
        let superseded = node.maps.jobs.get(&key).is_some_and(|v| {
            crate::maps::job_owner(&v).is_some_and(|(w, t)| w != self.id && t >= entry.token)
        });
        if superseded {
            // Another worker runs this key with a token at least as new (a
            // start that was moved on while this process was cut off or
            // paused). The claim below would refuse it too; the replica
            // saves the round trip.
            tracing::info!(
                key,
                token = entry.token,
                "stale start dropped: the key runs elsewhere"
            );
            let _ = start.finish(node, "superseded").await?;
            return Ok(());
        }
        if self.jobs.contains_key(&key) {
            // Started again while running here: stop the old run first so
            // the key never runs twice.
            let _ = self.stop_handler(&key).await;
            self.jobs.remove(&key);
        }
        if self.lease_lost.load(std::sync::atomic::Ordering::Acquire) || !node.lease_valid() {
            // Without a lease nothing starts; the entry stays in the inbox
            // and is read again once the lease is back (or moved by cleanup).
            // The clock check catches a process resumed after a long pause
            // before its lease watchdog could run.
            return Err(Error::Unavailable(fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                "lease lost",
            )));
        }
        // An entry that may be stale is claimed in Redis before the
        // handler runs: only the worker whose claim is accepted starts the
        // key, whatever its replica says. A fresh one cannot be stale and
        // is recorded after the start (see `freshness.rs`).
        let fresh = node.start_is_fresh(&event.id);
        if !fresh {
            metrics::counter!("flotilla_pool_start_claims_total").increment(1);
            let claim: String = node
                .scripts
                .claim_start
                .run(&node.client, start.claim_keys(node), start.args(node))
                .await?;
            if claim != "ok" {
                tracing::info!(key, token = entry.token, claim, "start not claimed");
                return Ok(());
            }
        }
        let job = Job {
            key: key.clone(),
            payload: Bytes::from(entry.body.payload.clone()),
            created_at: SystemTime::UNIX_EPOCH + Duration::from_millis(entry.created_at_ms),
            fencing_token: entry.token,
        };
        match guarded("start", self.handler.start(job.clone())).await {
            Err(message) => {
                tracing::info!(key, error = %message, "handler refused to start job");
                metrics::counter!("flotilla_pool_start_failed_total").increment(1);
                let mut args = start.args(node);
                args.push(Value::from(message));
                let _: Value = node
                    .scripts
                    .start_failed
                    .run(&node.client, start.keys(node), args)
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
                // A lease loss while the handler started: the watchdog's
                // stop may have missed this job (inserted after it looked),
                // and recording the start may wait on an unreachable Redis
                // for a long time. Stop it now; it resumes with the others.
                if self.lease_lost.load(std::sync::atomic::Ordering::SeqCst)
                    && let Some((k, job)) = self.jobs.remove(&key)
                {
                    let _ = self.stop_handler(&k).await;
                    self.suspended.lock().await.insert(k, job);
                }
                // On an error the outcome is unknown (the script may have
                // run, removing the entry): the job keeps running, and if
                // the entry is still there the rewind records it then.
                // Stopping instead would lose a job that Redis records as
                // running here.
                let status = if fresh {
                    start.record(node).await?
                } else {
                    start.finish(node, "ok").await?
                };
                if status == "recovering" {
                    // Redis lost its data or went back in time since the
                    // entry was written: the run stays and is re-asserted
                    // now (and again when the worker registers again).
                    tracing::warn!(key, "start lost with Redis's data; re-asserting it");
                    self.reassert_start(node, &key).await;
                } else if status != "ok" {
                    tracing::warn!(
                        key,
                        status,
                        "start not kept (superseded, or the worker is being cleaned up); stopping the local run"
                    );
                    let _ = self.stop_handler(&key).await;
                    self.jobs.remove(&key);
                } else if self.lease_lost.load(std::sync::atomic::Ordering::SeqCst) {
                    // The lease lapsed while recording: stop now (unless the
                    // watchdog or the check above did), resume later.
                    if let Some((k, job)) = self.jobs.remove(&key) {
                        let _ = self.stop_handler(&k).await;
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

    async fn on_stop(&self, node: &NodeInner, event: &Event, req: KeyedRequest) -> Result<()> {
        if let Some((_, job)) = self.jobs.remove(&req.key) {
            self.stopped.record(&req.key, job.token);
            if let Err(e) = self.stop_handler(&req.key).await {
                tracing::warn!(key = %req.key, error = %e, "handler stop failed; job dropped anyway");
            }
        }
        if let Some(job) = self.suspended.lock().await.remove(&req.key) {
            self.stopped.record(&req.key, job.token);
        }
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

    async fn on_keyed(&self, node: &NodeInner, event: &Event, req: KeyedRequest) -> Result<()> {
        let payload = Bytes::from(req.payload.clone());
        let notify = event.name == EV_NOTIFY;
        // A notification goes to the job's owner, a message to the key's
        // owner under the ring.
        let target = if notify {
            (!self.jobs.contains_key(&req.key) && req.hops < MAX_HOPS)
                .then(|| {
                    node.maps
                        .jobs
                        .get(&req.key)
                        .and_then(|v| crate::maps::job_owner(&v).map(|(w, _)| w.to_string()))
                })
                .flatten()
                .filter(|owner| *owner != self.id)
        } else {
            self.forward_target(node, &req.key, req.hops)
        };
        if let Some(target) = target {
            let fwd = codec::encode(&KeyedRequest {
                hops: req.hops + 1,
                ..req.clone()
            });
            let moved = node
                .move_entry(&self.id, &target, &event.id, &event.name, fwd, None)
                .await?;
            if moved == "ok" || moved == "gone" {
                return Ok(());
            }
        }
        let result = if notify {
            guarded("notify", self.handler.notify(&req.key, payload)).await
        } else {
            guarded("message", self.handler.message(&req.key, payload)).await
        };
        if let Err(e) = result {
            tracing::warn!(key = %req.key, event = %event.name, error = %e, "handler failed; message dropped");
        }
        self.drop_entry(node, &event.id).await
    }
}
