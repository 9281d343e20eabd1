//! Workers: run the jobs the ring assigns them, reading their inbox.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use flotilla_streaming::{Event, StartPosition};
use tokio::sync::{Mutex, RwLock, mpsc};
use tokio_util::sync::CancellationToken;

use crate::codec::{self, EV_NOTIFY, KeyedRequest};
use crate::error::{Error, Result};
use crate::handler::{Handler, Job, guarded};
use crate::lanes::{Delivery, InboxEvent, LANE_QUEUE, SeenEntries, lane_of};
use crate::node::{Node, NodeInner};
use crate::rewind::RewindState;
use crate::store::{Moved, Requeue};

/// A request is forwarded at most this many times when views of the ring
/// disagree; then the receiving worker takes it.
pub(crate) const MAX_HOPS: u8 = 3;

/// A worker: runs the jobs whose keys the ring assigns it.
///
/// Created on a node with [`Worker::new`]; removed with
/// [`Node::remove_worker`] (its jobs move to other workers) or when the
/// node closes.
///
/// ```no_run
/// # async fn run(node: flotilla_pool::Node) -> Result<(), flotilla_pool::Error> {
/// use flotilla_pool::{TaskHandler, Worker};
///
/// let worker = Worker::new(&node, TaskHandler::new(|job, cancel| async move {
///     println!("{} runs here with token {}", job.key, job.fencing_token);
///     cancel.cancelled().await;
///     Ok(())
/// }))
/// .await?;
/// println!("worker {} runs {:?}", worker.id(), worker.job_keys());
/// node.remove_worker(&worker).await?; // its jobs move to the other workers
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Arc<WorkerInner>,
    node: Node,
}

/// A job running on this worker.
#[derive(Debug, Clone)]
pub(crate) struct LocalJob {
    pub(crate) token: u64,
    pub(crate) admitted: u64,
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
    /// Suspended jobs a cleanup claim on this worker holds back (asked
    /// again at every renewal): logged when one is first held and when it
    /// leaves that state, not at every renewal in between.
    pub(crate) held_back: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Outcome reports and restarts of failed jobs.
    pub(crate) lifecycle: crate::lifecycle::WorkerLifecycle,
    /// Job operations on single keys (start, stop, handoff) share it;
    /// operations on every job of the worker (re-assert, resume, retire)
    /// hold it exclusively.
    pub(crate) ops: RwLock<()>,
    /// Per-stripe locks: a key's operations hold its stripe's lock, so a
    /// key is never started and handed off at the same time.
    pub(crate) key_locks: Vec<Mutex<()>>,
    /// Inbox entries in flight or just handled (see [`WorkerInner::rewind`]).
    seen: SeenEntries,
    /// Pacing of inbox rewinds after failed events.
    pub(crate) rewind: RewindState,
    /// Set while the node's lease is lost: no job may start, and one that
    /// started meanwhile is stopped at once.
    pub(crate) lease_lost: std::sync::atomic::AtomicBool,
    /// Set while the last renewal found another node's cleanup claim on
    /// this worker: its cleaner may be moving its inbox entries (a fresh
    /// one among them), so no job starts here, whatever the lease says.
    pub(crate) cleanup_claimed: std::sync::atomic::AtomicBool,
    /// Cancelled when the lease lapses, which cancels every handler
    /// `start` under way (see [`WorkerInner::start_handler`]); replaced by
    /// a fresh one before the lease is taken as held again.
    lease_lapse: std::sync::Mutex<CancellationToken>,
    /// How many re-assertions wait for the worker's `ops` lock, and the
    /// token cancelled while any does (see
    /// [`WorkerInner::lock_for_reassertion`]).
    start_interrupt: std::sync::Mutex<(usize, CancellationToken)>,
    /// The node's [`stop_timeout`](crate::NodeOptions::stop_timeout).
    stop_timeout: Duration,
    /// Runs stopped here on request (see [`crate::tombstones`]).
    pub(crate) stopped: crate::tombstones::StopTombstones,
    /// Jobs this worker handed off lately, with their payloads: given back
    /// to Redis if it goes back in time to before a hand-off.
    pub(crate) handed_off: crate::handoffs::Handoffs,
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
        let lane_count = inner.options.worker_lanes;
        let (lanes, lane_queues): (Vec<_>, Vec<_>) =
            (0..lane_count).map(|_| mpsc::channel(LANE_QUEUE)).unzip();
        let worker = Arc::new(WorkerInner {
            id: id.clone(),
            node: Arc::downgrade(inner),
            handler: Arc::new(handler),
            lanes,
            jobs: DashMap::new(),
            suspended: Mutex::new(HashMap::new()),
            held_back: std::sync::Mutex::default(),
            lifecycle: crate::lifecycle::WorkerLifecycle::new(),
            ops: RwLock::new(()),
            key_locks: (0..lane_count).map(|_| Mutex::new(())).collect(),
            seen: SeenEntries::default(),
            rewind: RewindState::default(),
            lease_lost: std::sync::atomic::AtomicBool::new(false),
            cleanup_claimed: std::sync::atomic::AtomicBool::new(false),
            lease_lapse: std::sync::Mutex::new(CancellationToken::new()),
            start_interrupt: std::sync::Mutex::new((0, CancellationToken::new())),
            stop_timeout: inner.options.stop_timeout,
            stopped: crate::tombstones::StopTombstones::default(),
            handed_off: crate::handoffs::Handoffs::default(),
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
                .store
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
        inner.tasks.spawn(worker.clone().lifecycle_loop());
        tracing::info!(pool = %inner.pool, node = %inner.id, worker = %id, "worker joined");
        inner.metrics.workers_joined.increment(1);
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

impl WorkerInner {
    /// The lease lapsed: nothing starts from now on, and every handler
    /// `start` under way is cancelled.
    pub(crate) fn lapse_lease(&self) {
        self.lease_lost
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.lapse_token().cancel();
    }

    /// The lease holds again: starts may run (a fresh token for them to be
    /// cancelled by at the next lapse, put in place first).
    pub(crate) fn regain_lease(&self) {
        *self.lease_lapse.lock().unwrap_or_else(|e| e.into_inner()) = CancellationToken::new();
        self.lease_lost
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Cancelled when the lease lapses (a fresh one after each lapse).
    pub(crate) fn lapse_token(&self) -> CancellationToken {
        self.lease_lapse
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Cancelled while a re-assertion waits for the worker's `ops` lock
    /// (see [`lock_for_reassertion`](Self::lock_for_reassertion)): what
    /// would hold that lock long and can wait gives way.
    pub(crate) fn reassertion_token(&self) -> CancellationToken {
        self.start_interrupt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// The worker's `ops` lock, exclusively, for a re-assertion after Redis
    /// lost its data or went back in time. Every handler start runs under
    /// that lock, shared, and until the re-assertion is done this process
    /// holds the only copy of every job the worker runs: so while one
    /// waits, the starts under way, and those that begin meanwhile, are
    /// interrupted (cancelled, undone and held, as at a lease lapse), and
    /// the wait is a handler `stop` at most, not a `start` that takes
    /// seconds. `None` when the worker closes first (its close re-asserts
    /// and hands over its jobs itself).
    pub(crate) async fn lock_for_reassertion(
        &self,
    ) -> Option<tokio::sync::RwLockWriteGuard<'_, ()>> {
        {
            let mut interrupt = self
                .start_interrupt
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            interrupt.0 += 1;
            interrupt.1.cancel();
        }
        // Counted down however this ends: also when the caller drops the
        // wait (a recovery that a newer server ends), or every start of
        // the worker would be interrupted from then on.
        let _interrupting = Interrupting(self);
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => None,
            guard = self.ops.write() => Some(guard),
        }
    }

    /// Runs the handler's `start` of `job`, unless the lease lapses first.
    /// A `start` may take a while (it connects somewhere, loads state), and
    /// once the lease has lapsed another worker may take the job within
    /// the stop budget: so the start is cancelled then (its future is
    /// dropped and goes no further), and the caller has the handler's
    /// `stop` undo what it did, as the lapse does for the jobs that run.
    /// A re-assertion waiting for the worker cancels it the same way
    /// ([`lock_for_reassertion`](Self::lock_for_reassertion)).
    pub(crate) async fn start_handler(&self, job: Job) -> HandlerStart {
        let lapse = self.lapse_token();
        let interrupt = self.reassertion_token();
        let key = job.key.clone();
        tokio::select! {
            // A lapse seen first wins: the start is not polled again.
            biased;
            _ = lapse.cancelled() => {
                tracing::warn!(worker = %self.id, key, "lease lost while the handler started the job: start cancelled");
                HandlerStart::Cancelled
            }
            _ = interrupt.cancelled() => {
                tracing::info!(worker = %self.id, key, "start cancelled for a re-assertion after Redis lost data; held to resume");
                HandlerStart::Cancelled
            }
            started = guarded("start", self.handler.start(job)) => match started {
                Ok(()) => HandlerStart::Started,
                Err(message) => HandlerStart::Refused(message),
            },
        }
    }

    /// Whether this worker may start a job now: its lease is not marked
    /// lost, and the node's last renewal was sent less than
    /// `lease_stop_after` ago (the clock catches a lapse the watchdog has
    /// not acted on yet: a pause, a slow reply). Asked again after every
    /// Redis round trip that precedes a start.
    pub(crate) fn holds_lease(&self, node: &NodeInner) -> bool {
        !self.lease_lost.load(std::sync::atomic::Ordering::SeqCst) && node.lease_valid()
    }

    /// Whether a run may start here now: the lease holds, and no cleanup
    /// claim stood on the worker at the last renewal (a lease regained
    /// while a cleaner moves the worker's entries is none to start under).
    pub(crate) fn may_start(&self, node: &NodeInner) -> bool {
        self.holds_lease(node)
            && !self
                .cleanup_claimed
                .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether `key` runs here or is held suspended (a lease loss moves a
    /// job from one set to the other under the suspended set's lock, which
    /// this holds, so a job in transit is never in neither).
    pub(crate) async fn runs_or_holds(&self, key: &str) -> bool {
        let suspended = self.suspended.lock().await;
        suspended.contains_key(key) || self.jobs.contains_key(key)
    }

    pub(crate) fn node(&self) -> Option<Arc<NodeInner>> {
        self.node.upgrade()
    }

    /// Runs the handler's `stop` for `key`, bounded by the node's
    /// `stop_timeout` (an overrun counts as stopped and is reported).
    ///
    /// The stop runs as a task of its own (the node's, which its close
    /// awaits): it ends within its budget even while the caller's task
    /// waits for something else (a recovery whose mark renewal waited on a
    /// cut link left a stop it had begun unpolled for 1.35 s, soak seed
    /// 1439), or is dropped.
    pub(crate) async fn stop_handler(&self, key: &str) -> std::result::Result<(), String> {
        let node = self.node();
        let overruns = node.as_ref().map(|n| n.metrics.stop_overruns.clone());
        let overruns = overruns.unwrap_or_else(metrics::Counter::noop);
        let (handler, budget, key) = (self.handler.clone(), self.stop_timeout, key.to_string());
        let stop = async move {
            crate::handler::stop_within(budget, &key, &overruns, handler.stop(&key)).await
        };
        let stop = match node {
            Some(node) => node.tasks.spawn(stop),
            None => tokio::spawn(stop),
        };
        stop.await
            .unwrap_or_else(|e| Err(format!("handler stop task ended: {e}")))
    }

    /// Hands an inbox event to the lane of its key (backpressure when the
    /// lane is full).
    pub(crate) async fn deliver(&self, event: Event) {
        if !self.seen.admit(&event.id) {
            return; // read again by a rewind while still queued or just done
        }
        let delivery = Delivery::parse(event);
        if self.lanes[delivery.lane(self.lanes.len())]
            .send(delivery)
            .await
            .is_err()
        {
            tracing::debug!(worker = %self.id, "worker task gone; event left in inbox");
        }
    }

    /// Locks the stripe of `key` for a single-key job operation; the caller
    /// holds `ops` shared.
    pub(crate) async fn lock_key(&self, key: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.key_locks[lane_of(key, self.key_locks.len())]
            .lock()
            .await
    }

    /// `ops` shared, then the stripe of `key`: what a single-key operation
    /// off the inbox lanes holds (a hand-off, the restart of a failed run,
    /// the record of a run's end). `None` when a re-assertion comes to wait
    /// for `ops` before the stripe is free: the caller gives way and tries
    /// again later. Such operations, queued for a stripe behind handler
    /// stops and Redis calls while holding `ops`, held a re-assertion back,
    /// and until it is done this process holds the only copy of the
    /// worker's jobs (chaos soak seed 1422: hand-offs, 650 ms; seed 1449:
    /// restarts of failed runs, over 360 ms; each time the process was
    /// killed before it re-asserted).
    pub(crate) async fn lock_key_or_give_way(
        &self,
        key: &str,
    ) -> Option<(
        tokio::sync::RwLockReadGuard<'_, ()>,
        tokio::sync::MutexGuard<'_, ()>,
    )> {
        let ops = self.ops.read().await;
        // Taken with `ops` held: a re-assertion that got `ops` before this
        // call did has already renewed it.
        let reassertion = self.reassertion_token();
        let stripe = tokio::select! {
            biased;
            () = reassertion.cancelled() => None,
            guard = self.lock_key(key) => Some(guard),
        };
        stripe
            .filter(|_| !reassertion.is_cancelled())
            .map(|stripe| (ops, stripe))
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
                InboxEvent::Stop(req, target) => self.on_stop(&node, &event, req, target).await,
                InboxEvent::Keyed(req) => self.on_keyed(&node, &event, req).await,
                InboxEvent::Keep(kept) => {
                    crate::custody::keep_here(&self.handed_off, kept);
                    self.drop_entry(&node, &event.id).await
                }
                InboxEvent::Malformed(e) => {
                    tracing::warn!(worker = %self.id, id = %event.id, event = %event.name, error = %e, "malformed inbox event dead-lettered");
                    node.metrics.dead_letters.increment(1);
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

    async fn drop_entry(&self, node: &NodeInner, id: &str) -> Result<()> {
        node.inbox(&self.id)?.remove(&[id]).await?;
        Ok(())
    }

    /// Where a request for `key` should go instead of here, if anywhere.
    pub(crate) fn forward_target(&self, node: &NodeInner, key: &str, hops: u8) -> Option<String> {
        if hops >= MAX_HOPS {
            return None;
        }
        let ring = node.ring.load();
        match ring.owner(key) {
            Some(owner) if owner != self.id => Some(owner.to_string()),
            _ => None,
        }
    }

    async fn on_keyed(&self, node: &NodeInner, event: &Event, req: KeyedRequest) -> Result<()> {
        let payload = Bytes::from(req.payload.clone());
        let notify = event.name == EV_NOTIFY;
        // A notification goes to the job's owner, a message to the key's
        // owner under the ring.
        let target = if notify {
            if !self.jobs.contains_key(&req.key) && req.hops < MAX_HOPS {
                let owner = match node.store.maps.jobs {
                    Some(_) => node.store.maps.replica_owner(&req.key),
                    // No replica: Redis says (a failed read leaves the
                    // notification here, as an unknown owner does).
                    None => node
                        .store
                        .job_owner(&req.key)
                        .await
                        .ok()
                        .flatten()
                        .map(|(w, _)| w),
                };
                owner.filter(|owner| *owner != self.id)
            } else {
                None
            }
        } else {
            self.forward_target(node, &req.key, req.hops)
        };
        if let Some(target) = target {
            let fwd = codec::encode(&KeyedRequest {
                hops: req.hops + 1,
                ..req.clone()
            });
            let moved = node
                .move_entry(
                    &self.id,
                    &target,
                    &event.id,
                    &event.name,
                    fwd,
                    Requeue::default(),
                )
                .await?
                .0;
            if moved != Moved::NoTarget {
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

/// How a handler's `start` went (see [`WorkerInner::start_handler`]).
pub(crate) enum HandlerStart {
    /// It returned `Ok`: the job runs.
    Started,
    /// It returned an error (or panicked): the job does not run.
    Refused(String),
    /// The lease lapsed first, or a re-assertion after a data loss
    /// interrupted it: the start was cancelled part-way, the handler's
    /// `stop` must undo it, and the job is held like those the lapse
    /// stopped.
    Cancelled,
}

/// One wait of [`WorkerInner::lock_for_reassertion`], counted in the
/// worker's `start_interrupt` until dropped.
struct Interrupting<'a>(&'a WorkerInner);

impl Drop for Interrupting<'_> {
    fn drop(&mut self) {
        let mut interrupt = self
            .0
            .start_interrupt
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        interrupt.0 -= 1;
        if interrupt.0 == 0 {
            // Starts may run again once the lock taken is released.
            interrupt.1 = CancellationToken::new();
        }
    }
}
