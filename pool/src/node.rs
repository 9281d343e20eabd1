//! A process's handle on a pool: joins the pool's maps, reads its workers'
//! inboxes and its reply stream, and owns every background task.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use dashmap::DashMap;
use flotilla_streaming::{Reader, ReaderOptions, StartPosition, Stream, StreamOptions};
use fred::prelude::*;
use tokio::sync::{Mutex, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::Reply;
use crate::error::{Error, Result};
use crate::keys::{self, SHUTDOWN_FLAG};
use crate::options::NodeOptions;
use crate::routing::Ring;
use crate::store::PoolStore;
use crate::worker::WorkerInner;

/// A process's handle on a pool.
///
/// Cheap to clone; every clone is the same node. Dispatch from any node;
/// host workers with [`Worker::new`](crate::Worker::new) unless the node is
/// client-only. Call [`Node::close`] before the process exits so that its
/// jobs move to other workers at once rather than after the worker TTL.
///
/// ```no_run
/// use flotilla_pool::{Node, NodeOptions, TaskHandler, Worker};
///
/// # async fn demo(client: fred::prelude::Client) -> Result<(), flotilla_pool::Error> {
/// let node = Node::join(&client, "billing", NodeOptions::default()).await?;
/// let _worker = Worker::new(&node, TaskHandler::new(|job, cancel| async move {
///     cancel.cancelled().await; // run until stopped
///     let _ = job;
///     Ok(())
/// })).await?;
/// node.dispatch_job("customer-42", &b"payload"[..]).await?;
/// node.stop_job("customer-42").await?;
/// node.close().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<NodeInner>,
}

/// State shared by a node's handles and tasks.
pub(crate) struct NodeInner {
    pub(crate) pool: String,
    pub(crate) id: String,
    pub(crate) options: NodeOptions,
    /// The pool in Redis: client, maps, scripts.
    pub(crate) store: PoolStore,
    pub(crate) host: String,
    pub(crate) pid: u32,
    /// Active workers as this node sees them.
    pub(crate) ring: ArcSwap<Ring>,
    /// Drained workers (registered, not being cleaned up, out of the ring),
    /// as this node sees them: their jobs move elsewhere.
    pub(crate) drained: ArcSwap<std::collections::HashSet<String>>,
    /// Bumped whenever `ring` changes.
    pub(crate) ring_version: watch::Sender<u64>,
    /// Dispatchers waiting for a worker's reply, by request id.
    pub(crate) waiters: DashMap<u64, oneshot::Sender<Reply>>,
    /// The next request id; see [`first_request_id`].
    pub(crate) next_request: AtomicU64,
    pub(crate) reply_stream: Stream,
    pub(crate) reader: Reader,
    /// Workers hosted here.
    pub(crate) workers: DashMap<String, Arc<WorkerInner>>,
    /// Stream handles of inboxes (any worker's), cached.
    pub(crate) inboxes: DashMap<String, Stream>,
    pub(crate) tasks: TaskTracker,
    pub(crate) cancel: CancellationToken,
    pub(crate) closed: AtomicBool,
    /// Cancelled when the close that set `closed` has ended (or was
    /// dropped): a second `close` waits for it.
    pub(crate) close_done: CancellationToken,
    /// When the node last (re)connected to Redis: it judges nobody dead for
    /// one TTL after that.
    pub(crate) connected_at: Mutex<Instant>,
    /// Server time bounded on this process's clock: cleanup judges
    /// liveness by it too, so a step of the server's clock judges nobody
    /// dead.
    pub(crate) server_clock: crate::server_clock::ServerClockFloor,
    /// The Redis server holding the pool's keys and the pool's epoch, as
    /// last read (`None`: not read yet).
    pub(crate) server_seen: Mutex<Option<crate::store::ServerIdentity>>,
    /// Redis refused this node's user the run id (`INFO`): warned once.
    pub(crate) identity_refused: AtomicBool,
    /// Bumped on every reconnect: the server identity task checks the run
    /// id then.
    pub(crate) reconnects: watch::Sender<u64>,
    /// A renewal found a worker Redis forgot: the server identity task
    /// checks the pool's generation at once.
    pub(crate) identity_wanted: tokio::sync::Notify,
    /// Redis answered that a worker of this node is not registered (a
    /// claim found it gone): the renewal loop renews at once rather than
    /// at its next period, so that a worker Redis forgot with its data is
    /// registered again and re-asserts its jobs, of which this process
    /// holds the only copy until then, a renewal period sooner.
    pub(crate) renewal_wanted: tokio::sync::Notify,
    /// Bumped when a reconnect finds a new server run id (a restart or a
    /// failover, which may have lost writes): the rollback task recovers.
    pub(crate) server_restarts: watch::Sender<u64>,
    /// When the identity check last opened (or found open) the recovery
    /// window for a new server, on this process's monotonic clock: the
    /// recovery that follows at once need not open it again.
    pub(crate) window_opened_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Recoveries from Redis going back in time this node began (the
    /// rollback task's count, read by tests).
    pub(crate) recoveries_begun: AtomicU64,
    /// When the last successful keep-alive renewal was sent (the start of
    /// the node's lease), on this process's monotonic clock; the lease
    /// watchdog waits on its changes.
    pub(crate) last_renewal: tokio::sync::watch::Sender<Instant>,
    /// Server time (ms) of the last renewal whose reply this node heard,
    /// refused or not (0: none yet): sent with each renewal, so that Redis
    /// stops counting the renewals of a node that hears nothing.
    pub(crate) renewal_heard_ms: std::sync::atomic::AtomicU64,
    /// Set by the lease watchdog when the lease lapsed (jobs suspended),
    /// cleared by the renewal that resumes them.
    pub(crate) lease_suspended: AtomicBool,
    /// Set by the renewal that ends a lease loss: the resume task then
    /// resumes every worker, not only those holding suspended jobs.
    pub(crate) resume_everyone: AtomicBool,
    /// Woken by every successful renewal: the resume task restarts the
    /// suspended jobs still this node's (off the renewal loop, which a
    /// resume of many jobs must not delay).
    pub(crate) resume_wanted: tokio::sync::Notify,
    /// A job began running on a worker the ring no longer names (its start
    /// was under way when the ring changed): the rebalance task runs a pass
    /// at its next tick.
    pub(crate) rebalance_due: AtomicBool,
    /// Held while every job is stopped on lease loss, and while a resume
    /// takes a worker's suspended jobs: neither sees half of the other.
    pub(crate) lease_transition: Mutex<()>,
    /// Whether entries read now can start before being claimed.
    pub(crate) freshness: crate::freshness::Freshness,
    /// Records the starts of fresh entries in batches.
    pub(crate) recorder: crate::recorder::StartRecorder,
    /// Admits dispatches in batches.
    pub(crate) admitter: crate::admission::Admitter,
    /// Event counts for the history stream.
    pub(crate) history: Arc<crate::history::Counters>,
    /// Stops this node's `stop_job` calls were answered `Ok` for: made to
    /// stand again after Redis goes back in time, also where the worker that
    /// carried one out is gone by then.
    pub(crate) stops_requested: crate::tombstones::StopTombstones,
    /// What this node's cleanups of dead workers found lately: runs that
    /// had left a worker before its cleanup are ended if Redis goes back
    /// to a state showing them there again (see `cleaned.rs`).
    pub(crate) cleaned: crate::cleaned::CleanedWorkers,
    /// Metric handles labelled with the pool.
    pub(crate) metrics: crate::metrics::PoolMetrics,
    /// Set when this node runs [`Node::shutdown`]: its own shutdown watch
    /// then leaves the closing to that call.
    pub(crate) shutting_down_here: AtomicBool,
    /// Set when [`Node::connect`] built the client: closing quits it.
    pub(crate) owns_client: AtomicBool,
    /// Behind Sentinel: asks the Sentinels after each renewal and each
    /// stop answer whether its server is still the primary.
    pub(crate) primary_check: Option<Arc<crate::primary_check::PrimaryCheck>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("pool", &self.inner.pool)
            .field("id", &self.inner.id)
            .field("workers", &self.inner.workers.len())
            .field("closed", &self.inner.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl Node {
    /// Joins `pool`: joins its replicated maps, starts reading this node's
    /// reply stream, and starts the keep-alive, cleanup and rebalance tasks.
    ///
    /// The client is shared (its commands are multiplexed). The node opens
    /// two more connections itself, whatever its worker count: one
    /// subscriber shared by its replicated maps, and one for the blocking
    /// read of its reply stream and all its workers' inboxes. Behind
    /// Sentinel, a node with workers also keeps one connection to each
    /// Sentinel, asked after each lease renewal whether the server it ran
    /// on is still the primary (a renewal on a primary that stalled
    /// through its failover does not count); a client-only node opens
    /// them at its first [`Node::stop_job`], whose answers are checked the
    /// same way.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad pool name, [`Error::InvalidOptions`],
    /// [`Error::ShuttingDown`] when the pool is being shut down, and Redis
    /// errors.
    pub async fn join(client: &Client, pool: &str, options: NodeOptions) -> Result<Node> {
        keys::check_name("pool name", pool)?;
        options.validate()?;
        crate::client::check_client(client, &options).await?;
        crate::client::check_eviction(client, &options).await?;
        let id = options
            .node_id
            .clone()
            .unwrap_or_else(|| format!("n-{}", uuid::Uuid::new_v4().simple()));
        let store =
            PoolStore::join(client, pool, options.redis_timeout, options.mirror_jobs).await?;
        if store.maps.shutdown.contains_key(SHUTDOWN_FLAG) {
            store.maps.close().await;
            return Err(Error::ShuttingDown(pool.to_string()));
        }
        match store.create_epoch(options.worker_ttl).await {
            Ok(true) => tracing::warn!(
                pool,
                "Redis lost the pool's data while it kept running (a FLUSHALL?): \
                 nothing is admitted while the pool recovers"
            ),
            Ok(false) => {}
            Err(e) => {
                store.maps.close().await;
                return Err(e);
            }
        }
        // Known from the start, so that the first restart is seen as one
        // (by the node's check after a reconnect, and by its scripts).
        let server_seen = match store.server_identity(options.worker_ttl).await {
            Ok(server) => {
                store.note_server(server.clone());
                Some(server)
            }
            Err(_) => None,
        };
        let reply_stream = Stream::new(
            client,
            &keys::node_replies(&id),
            StreamOptions::default().hash_tag(pool),
        )?;
        let reader = Reader::new(
            client,
            &[&reply_stream],
            ReaderOptions {
                start: StartPosition::Newest,
                block: Duration::from_secs(5),
                max_events: 1000,
                buffer: 8192,
                ..ReaderOptions::default()
            },
        )
        .await?;
        // The first renewal's reference: until a renewal is heard, the
        // join's own server time (0, no reference, if it cannot be read).
        let joined_server_ms = store.server_time_ms().await.unwrap_or(0);
        // Steps of the server's clock below a twentieth of a TTL pass: the
        // lease's stop leaves a sixth of a TTL before anyone may claim.
        let server_clock = crate::server_clock::ServerClockFloor::new(
            options.worker_ttl * 2,
            options.worker_ttl / 20,
        );
        if joined_server_ms > 0 {
            server_clock.record(joined_server_ms, Instant::now());
        }
        let (ring_version, _) = watch::channel(0);
        let (recorder, recorder_queue) = crate::batch::Batcher::new();
        let (admitter, admission_queue) = crate::batch::Batcher::new();
        let limits = crate::store::AdmitLimits {
            node: id.clone(),
            max_queued: options.max_queued_jobs,
            pending_ttl: options.pending_ttl(),
            worker_ttl: options.worker_ttl,
        };
        // Renewals and stop answers are checked with the Sentinels; a
        // client-only node holds no lease and connects at its first stop.
        let primary_check = crate::primary_check::PrimaryCheck::for_client(
            client,
            options.redis_timeout.min(options.worker_ttl / 6),
        )
        .map(Arc::new);
        let inner = Arc::new(NodeInner {
            pool: pool.to_string(),
            id,
            options,
            store,
            host: hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown".into()),
            pid: std::process::id(),
            ring: ArcSwap::from_pointee(Ring::default()),
            drained: ArcSwap::from_pointee(Default::default()),
            ring_version,
            waiters: DashMap::new(),
            next_request: AtomicU64::new(first_request_id()),
            reply_stream,
            reader,
            workers: DashMap::new(),
            inboxes: DashMap::new(),
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
            closed: AtomicBool::new(false),
            close_done: CancellationToken::new(),
            connected_at: Mutex::new(Instant::now()),
            server_clock,
            server_seen: Mutex::new(server_seen),
            identity_refused: AtomicBool::new(false),
            reconnects: watch::Sender::new(0),
            identity_wanted: tokio::sync::Notify::new(),
            renewal_wanted: tokio::sync::Notify::new(),
            server_restarts: watch::Sender::new(0),
            window_opened_at: std::sync::Mutex::new(None),
            recoveries_begun: AtomicU64::new(0),
            last_renewal: tokio::sync::watch::Sender::new(Instant::now()),
            renewal_heard_ms: AtomicU64::new(joined_server_ms),
            lease_suspended: AtomicBool::new(false),
            resume_everyone: AtomicBool::new(false),
            resume_wanted: tokio::sync::Notify::new(),
            rebalance_due: AtomicBool::new(false),
            lease_transition: Mutex::new(()),
            freshness: crate::freshness::Freshness::default(),
            recorder,
            admitter,
            history: Default::default(),
            stops_requested: Default::default(),
            cleaned: Default::default(),
            metrics: crate::metrics::PoolMetrics::new(pool),
            shutting_down_here: AtomicBool::new(false),
            owns_client: AtomicBool::new(false),
            primary_check,
        });
        inner.refresh_ring();
        inner.record_node_info().await;
        if let Some(check) = inner.primary_check.clone() {
            if !inner.options.client_only {
                check.start();
            }
            let cancel = inner.cancel.clone();
            inner.tasks.spawn(async move {
                cancel.cancelled().await;
                check.close().await;
            });
        }
        inner.spawn_tasks();
        crate::history::spawn_flusher(
            &inner.tasks,
            inner.cancel.clone(),
            inner.store.clone(),
            inner.id.clone(),
            inner.history.clone(),
        );
        inner.tasks.spawn(crate::admission::admit_batches(
            inner.store.clone(),
            inner.cancel.clone(),
            limits,
            admission_queue,
        ));
        if !inner.options.client_only {
            inner.tasks.spawn(crate::recorder::record_batches(
                inner.store.clone(),
                inner.cancel.clone(),
                inner.options.worker_ttl,
                recorder_queue,
            ));
        }
        tracing::info!(pool, node = %inner.id, "node joined pool");
        inner.metrics.nodes_joined.increment(1);
        Ok(Node { inner })
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The pool's name.
    pub fn pool(&self) -> &str {
        &self.inner.pool
    }

    /// The options this node runs with.
    pub fn options(&self) -> &NodeOptions {
        &self.inner.options
    }

    /// Whether [`close`](Node::close) or [`shutdown`](Node::shutdown) ran.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// The worker that owns `key` under this node's current view of the
    /// pool, or `None` when no worker is active.
    pub fn placement(&self, key: &str) -> Option<String> {
        self.inner.ring.load().owner(key).map(str::to_string)
    }

    /// Ids of the workers hosted on this node.
    pub fn workers(&self) -> Vec<String> {
        self.inner.workers.iter().map(|w| w.key().clone()).collect()
    }

    /// Stops this node's workers, hands their jobs to other workers (or
    /// leaves them for the next worker when none remains), removes the
    /// workers and their inboxes, and ends every background task. What the
    /// workers remember of jobs they passed on, their recent stops, and the
    /// stops this node asked for lately are left with the workers that stay
    /// first (they give the jobs back, or make the stops stand, after a
    /// loss of Redis's data), and the close waits until those have read it.
    /// The workers all leave the ring first and then retire together: a
    /// job moves once, to a worker of another node, and the close takes
    /// one round of stops whatever the number of workers. Idempotent: a
    /// call while another close runs (a pool shutdown closes every node on
    /// its own) returns once that close has ended, so a process that exits
    /// after it leaves nothing behind (a demo worker process exited while
    /// the shutdown's close still ran, and the pool's shutdown waited its
    /// 10 s deadline for the node's entry). Returns within `worker_shutdown_ttl + redis_timeout` even while
    /// Redis is down: the handlers are stopped all the same, and
    /// what Redis did not take is requeued by the cleanup of the dead
    /// workers after their TTL.
    ///
    /// # Errors
    /// Redis errors while handing jobs over (the jobs are then requeued by
    /// the cleanup of the dead worker after its TTL; nothing is lost).
    pub async fn close(&self) -> Result<()> {
        let options = &self.inner.options;
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            let bound = options.worker_shutdown_ttl + options.redis_timeout;
            let _ = tokio::time::timeout(bound, self.inner.close_done.cancelled()).await;
            return Ok(());
        }
        let _ended = self.inner.close_done.clone().drop_guard();
        let until = Instant::now() + options.worker_shutdown_ttl + options.redis_timeout;
        let workers: Vec<Arc<WorkerInner>> = self
            .inner
            .workers
            .iter()
            .map(|w| w.value().clone())
            .collect();
        let inner = &self.inner;
        // Every worker leaves the ring before any hands its jobs on: a job
        // handed to another worker of this node would be stopped and moved
        // again at once. Then they retire together, so the close takes one
        // round of stops and hand-offs, not one per worker. A worker that
        // could not leave here tries again in its retirement (and, failing
        // that, stops its jobs without handing them over).
        let stops_from = until.checked_sub(options.stop_timeout).unwrap_or(until);
        futures::future::join_all(workers.iter().map(|w| async move {
            if let Err(e) = inner.leave_ring(&w.id, stops_from).await {
                tracing::debug!(worker = %w.id, error = %e, "leaving the ring on close failed");
            }
        }))
        .await;
        inner.refresh_ring();
        let mut first_error = None;
        let retired =
            futures::future::join_all(workers.iter().map(|w| inner.retire_worker(w, true, until)))
                .await;
        for (worker, result) in workers.iter().zip(retired) {
            if let Err(e) = result {
                tracing::warn!(worker = %worker.id, error = %e, "handing over jobs on close failed");
                first_error.get_or_insert(e);
            }
        }
        // The stops this node asked for go on being made to stand after a
        // rollback by the workers that stay: the workers that carried them
        // out may die without a close.
        // Each ended a whole dispatch, or the key's: one not of a single
        // dispatch ends what was admitted before its tombstone.
        let stops: Vec<(String, u64, Option<u64>)> = self
            .inner
            .stops_requested
            .recent_ends(crate::handoffs::ENDS_REMEMBERED)
            .into_iter()
            .map(|(key, token, dispatch)| (key, token, Some(dispatch.unwrap_or(token))))
            .collect();
        if !stops.is_empty() {
            let memory = crate::handoffs::Handoffs::default();
            crate::custody::remember_stops(&memory, stops);
            let entrust_until = until.checked_sub(options.redis_timeout).unwrap_or(until);
            self.inner
                .entrust_memory(&self.inner.id, &memory, entrust_until)
                .await;
        }
        let _ = tokio::time::timeout_at(until, self.inner.stop_tasks()).await;
        let _ = tokio::time::timeout_at(until, async {
            let _ = self
                .inner
                .store
                .maps
                .nodes
                .delete(&self.inner.id)
                .await
                .map_err(|e| tracing::debug!(error = %e, "removing node entry failed"));
            let _ = self.inner.store.forget_node(&self.inner.id).await;
            let _ = self.inner.reply_stream.destroy().await;
        })
        .await;
        let _ = tokio::time::timeout_at(until, self.inner.store.maps.close()).await;
        if self.inner.owns_client.load(Ordering::Acquire) {
            let _ = tokio::time::timeout_at(until, self.inner.store.client.quit()).await;
        }
        tracing::info!(pool = %self.inner.pool, node = %self.inner.id, "node closed");
        first_error.map_or(Ok(()), Err)
    }

    /// Stops every job on every node of the pool and deletes the pool's
    /// keys. Nodes see the shutdown flag, stop their jobs (without handing
    /// them over) and close (their handles then answer
    /// [`Error::Closed`](crate::Error::Closed)); this call waits for their
    /// workers and then the nodes to go (each up to the worker shutdown TTL)
    /// and then deletes every `fl:{pool}:*` key.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn shutdown(&self) -> Result<()> {
        let inner = &self.inner;
        inner.shutting_down_here.store(true, Ordering::Release);
        inner
            .store
            .maps
            .shutdown
            .set(SHUTDOWN_FLAG, &inner.id)
            .await?;
        tracing::info!(pool = %inner.pool, node = %inner.id, "pool shutdown requested");
        // Our own workers stop here; other nodes react to the flag.
        inner.stop_for_shutdown().await;
        let deadline = inner.options.worker_shutdown_ttl;
        let maps = inner.store.maps.clone();
        let gone = maps.workers.wait_for(deadline, |m| m.is_empty()).await;
        if gone.is_err() {
            tracing::warn!(pool = %inner.pool, "workers still registered at the shutdown deadline; deleting anyway");
        }
        // Other live nodes close on the flag; one still open could write
        // again after the keys are gone. Entries of nodes silent for a TTL
        // (killed processes) are not waited for.
        let now = inner.store.server_time_ms().await?;
        let ttl = inner.options.worker_ttl.as_millis() as u64;
        let live: Vec<String> = maps
            .nodes
            .snapshot()
            .iter()
            .filter(|(node, last)| {
                **node != inner.id
                    && last
                        .parse::<u64>()
                        .is_ok_and(|last| now.saturating_sub(last) <= ttl)
            })
            .map(|(node, _)| node.clone())
            .collect();
        let closed = maps
            .nodes
            .wait_for(deadline, |m| live.iter().all(|n| !m.contains_key(n)))
            .await;
        if closed.is_err() {
            tracing::warn!(pool = %inner.pool, "nodes still open at the shutdown deadline; deleting anyway");
        }
        self.close().await?;
        inner.store.delete_pool_keys().await
    }
}

impl NodeInner {
    /// The inbox stream of any worker (cached handle).
    pub(crate) fn inbox(&self, worker: &str) -> Result<Stream> {
        if let Some(s) = self.inboxes.get(worker) {
            return Ok(s.clone());
        }
        let s = Stream::new(
            &self.store.client,
            &keys::worker_inbox(worker),
            StreamOptions::default().hash_tag(&self.pool),
        )?;
        self.inboxes.insert(worker.to_string(), s.clone());
        Ok(s)
    }

    /// The reply stream key of `node`.
    pub(crate) fn reply_key(&self, node: &str) -> Result<String> {
        if node == self.id {
            return Ok(self.reply_stream.key().to_string());
        }
        Ok(Stream::new(
            &self.store.client,
            &keys::node_replies(node),
            StreamOptions::default().hash_tag(&self.pool),
        )?
        .key()
        .to_string())
    }

    /// A fresh request id (never 0, which means "no reply") and the
    /// receiver of its reply.
    pub(crate) fn register_waiter(&self) -> (u64, oneshot::Receiver<Reply>) {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.insert(id, tx);
        (id, rx)
    }

    /// Whether the start entry `entry_id` may start before being claimed
    /// (see [`crate::freshness`]).
    pub(crate) fn start_is_fresh(&self, entry_id: &str) -> bool {
        let lease_since = *self.last_renewal.borrow();
        self.freshness.is_fresh(
            entry_id,
            lease_since,
            self.options.lease_stop_after,
            self.options.dispatch_timeout + self.options.ack_grace,
        )
    }

    /// Whether the node's lease on its jobs holds now, by its own monotonic
    /// clock. Checked right before every start, so a process that resumes
    /// after a pause longer than the lease starts nothing even before its
    /// lease watchdog has run.
    pub(crate) fn lease_valid(&self) -> bool {
        self.options.lease_policy != crate::options::LeasePolicy::StopJobs
            || self.last_renewal.borrow().elapsed() < self.options.lease_stop_after
    }

    /// Whether the node (re)connected less than one TTL ago.
    pub(crate) async fn recently_connected(&self) -> bool {
        self.connected_at.lock().await.elapsed() < self.options.worker_ttl
    }
}

/// Where a node's request ids start: at random, below 2^62. A node that
/// comes back under the id it had (`NodeOptions::node_id`) reads the same
/// reply stream, where answers to its earlier run's requests can still
/// arrive (a stop that took a while, a start read late); counting from 1
/// again, it took them for answers to its own new requests (a `stop_job`
/// returned before the job stopped). Two runs' ranges overlap only if one
/// of them draws within its request count of the other: about 2^-30 for a
/// run of 2^32 requests.
fn first_request_id() -> u64 {
    (uuid::Uuid::new_v4().as_u64_pair().0 >> 2).max(1)
}
