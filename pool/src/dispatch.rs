//! Dispatching: admission of a job at its owner, stop and notify requests
//! routed to the owner, keyed messages, and payload reads.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::codec::{self, EV_MESSAGE, EV_NOTIFY, JobBodyRef, KeyedRequest, Reply};
use crate::error::{Error, Result};
use crate::keys::{self, SHUTDOWN_FLAG, check_name};
use crate::node::{Node, NodeInner};
use crate::options::DispatchOptions;
use crate::owner_requests::{Routed, SettlePause};
use crate::store::{self, Admitted};

/// The first pause before a dispatch looks again at another dispatch's
/// admission that has not started yet; it doubles up to
/// [`PENDING_POLL_MAX`]. Starts take a millisecond or two.
const PENDING_POLL_MIN: Duration = Duration::from_millis(2);

/// The longest pause between two looks at a pending admission.
const PENDING_POLL_MAX: Duration = Duration::from_millis(50);

/// The pause before a dispatch admits again while the pool recovers from
/// a loss of Redis's data (the recovery lasts at least a worker TTL).
const RECOVERING_POLL: Duration = Duration::from_millis(100);

impl Node {
    /// Starts job `key` on the worker that owns it, and returns once that
    /// worker's handler `start` returned `Ok`.
    ///
    /// Admission is atomic on Redis: of many concurrent dispatches of one
    /// key, from any number of nodes, exactly one is admitted (I3).
    ///
    /// # Errors
    /// [`Error::JobExists`] when the key runs; a dispatch that finds the
    /// key admitted, requeued or moving between workers but not started
    /// yet, or orphaned (owed a run by the orphan sweep), waits for its
    /// start, up to the dispatch timeout: `JobExists` once it started, or,
    /// when it failed or Redis lost it, this dispatch's own admission (so
    /// `JobExists`, like `Ok`, means a job that ran and runs until
    /// stopped);
    /// [`Error::StartFailed`] with the handler's error;
    /// [`Error::WorkerAtCapacity`] when the owner refused for capacity;
    /// [`Error::NoActiveWorker`]
    /// when no worker joined within the dispatch timeout; [`Error::PoolFull`];
    /// [`Error::Timeout`] when the worker did not answer within the dispatch
    /// timeout (the job may still start), also while the pool recovers from
    /// a loss of its Redis data or Redis going back in time (admission
    /// resumes at least one worker TTL after the loss is noticed, and only
    /// once every node that noticed it has had its workers re-assert their
    /// jobs; a dispatch whose admission Redis lost before its start was
    /// recorded is admitted again then, and answers `JobExists` when its run
    /// was re-asserted, `Ok` when that run has ended meanwhile);
    /// [`Error::Closed`];
    /// [`Error::ShuttingDown`]; [`Error::InvalidName`];
    /// [`Error::PayloadTooLarge`]; [`Error::Unavailable`] / [`Error::Redis`].
    ///
    /// The payload is any bytes, borrowed or owned (`&[u8]`, `&str`,
    /// `Vec<u8>`, `String`, `Bytes`, …); it is copied once, so a borrow
    /// need not outlive the call.
    pub async fn dispatch_job(&self, key: &str, payload: impl AsRef<[u8]>) -> Result<()> {
        self.dispatch_job_with(key, payload, &DispatchOptions::default())
            .await
    }

    /// Like [`dispatch_job`](Self::dispatch_job), with options.
    ///
    /// With [`DispatchOptions::idempotency_window`], a key admitted (by a
    /// dispatch with a window) less than a window ago is refused with
    /// [`Error::AlreadyDispatched`], even after that job finished: many
    /// concurrent or late callers that each want "the successor" started
    /// start it once. The check and the marker are part of the one
    /// admission script, on Redis server time. A job that is still running
    /// or pending gets [`Error::JobExists`] as usual (a pending one once
    /// it started). A start refused by
    /// the handler ([`Error::StartFailed`]) removes its marker again.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use flotilla_pool::{DispatchOptions, Error, Node};
    ///
    /// # async fn demo(node: Node) -> flotilla_pool::Result<()> {
    /// let once = DispatchOptions::default().idempotency_window(Duration::from_secs(600));
    /// match node.dispatch_job_with("validate-run-7", &b""[..], &once).await {
    ///     Ok(()) => println!("started the successor"),
    ///     Err(Error::JobExists(_) | Error::AlreadyDispatched { .. }) => {} // someone else did
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`dispatch_job`](Self::dispatch_job), plus
    /// [`Error::AlreadyDispatched`] and [`Error::InvalidOptions`].
    // DEBUG, not INFO: a span per dispatch costs a service that logs at
    // INFO several µs of CPU per job.
    #[tracing::instrument(name = "dispatch", level = "debug", skip(self, payload, options), fields(pool = %self.inner.pool))]
    pub async fn dispatch_job_with(
        &self,
        key: &str,
        payload: impl AsRef<[u8]>,
        options: &DispatchOptions,
    ) -> Result<()> {
        let started = Instant::now();
        let result = self.inner.dispatch(key, payload.as_ref(), options).await;
        let m = &self.inner.metrics;
        match &result {
            Ok(()) => &m.dispatch_ok,
            Err(Error::JobExists(_)) => &m.dispatch_exists,
            Err(Error::AlreadyDispatched { .. }) => &m.dispatch_recent,
            Err(_) => &m.dispatch_error,
        }
        .increment(1);
        self.inner.history.dispatched(result.is_ok());
        m.dispatch_seconds.record(started.elapsed().as_secs_f64());
        result
    }

    /// Stops job `key` and returns once its owner's handler `stop` returned.
    /// A job waiting to restart after a failure is stopped for good; the
    /// record of a job that failed for good is removed.
    /// A job admitted but not started yet, or being moved to another worker,
    /// is stopped as soon as it runs (the request is sent again meanwhile);
    /// so is one that Redis forgot with its data, once its worker re-asserts
    /// it (within the recovery window: at least one worker TTL, and until
    /// every node that noticed the loss has reconciled its workers). A run
    /// its worker held suspended (its lease had lapsed) and stops during
    /// that window is answered once the window is over: a cleanup may have
    /// moved the job on writes Redis lost, and that run must have ended
    /// first (a [`Error::Timeout`] meanwhile if the window outlasts the
    /// dispatch timeout; the stop itself holds). A job whose worker Redis
    /// judges dead (silent for over the worker TTL on server time, as a
    /// cleanup judges it) is stopped in Redis at once, without waiting for
    /// that worker's answer or a cleanup: its lease lapsed with its
    /// silence, so its run has ended.
    ///
    /// # Errors
    /// [`Error::JobNotFound`] when no job with this key runs or waits to;
    /// [`Error::Timeout`] when it did not start (or its owner did not
    /// answer) within the dispatch timeout; [`Error::Closed`], Redis errors.
    #[tracing::instrument(name = "stop_job", level = "debug", skip(self), fields(pool = %self.inner.pool))]
    pub async fn stop_job(&self, key: &str) -> Result<()> {
        self.inner.check_open()?;
        check_name("job key", key)?;
        self.inner.stop_key(key, None, None).await
    }

    /// Sends `payload` to the handler's `notify` on the worker running job
    /// `key`. Returns once the message is queued at that worker; for a job
    /// admitted but not started yet, once it started and the message is
    /// queued.
    ///
    /// # Errors
    /// [`Error::JobNotFound`], [`Error::Timeout`] (the job did not start
    /// within the dispatch timeout), [`Error::PayloadTooLarge`],
    /// [`Error::Closed`], Redis errors.
    pub async fn notify_worker(&self, key: &str, payload: impl AsRef<[u8]>) -> Result<()> {
        self.inner.check_open()?;
        check_name("job key", key)?;
        let payload = self
            .inner
            .check_payload(Bytes::copy_from_slice(payload.as_ref()))?;
        let body = codec::encode(&KeyedRequest {
            key: key.to_string(),
            payload: payload.to_vec(),
            reply: None,
            hops: 0,
        });
        let mut pause = SettlePause::new(self.inner.options.dispatch_timeout);
        loop {
            match self
                .inner
                .to_owner(key, EV_NOTIFY, body.clone(), None, None)
                .await?
            {
                Routed::Pending => pause.wait().await?,
                Routed::NotFound(_) => return Err(Error::JobNotFound(key.to_string())),
                Routed::Queued | Routed::Stopped(_) => return Ok(()),
            }
        }
    }

    /// Sends `payload` to the handler's `message` on the worker that owns
    /// `key` under the ring (no job needed). Returns once queued.
    ///
    /// # Errors
    /// [`Error::NoActiveWorker`], [`Error::InvalidName`],
    /// [`Error::PayloadTooLarge`], [`Error::Closed`], Redis errors.
    pub async fn dispatch_message(&self, key: &str, payload: impl AsRef<[u8]>) -> Result<()> {
        self.inner.check_open()?;
        check_name("message key", key)?;
        let payload = self
            .inner
            .check_payload(Bytes::copy_from_slice(payload.as_ref()))?;
        let deadline = Instant::now() + self.inner.options.dispatch_timeout;
        let owner = self.inner.wait_for_owner(key, deadline).await?;
        let body = codec::encode(&KeyedRequest {
            key: key.to_string(),
            payload: payload.to_vec(),
            reply: None,
            hops: 0,
        });
        let inbox = self.inner.inbox(&owner)?;
        // Fail fast like every other call while Redis does not answer (I7).
        store::call::within(
            self.inner.options.redis_timeout,
            "message",
            inbox.add(EV_MESSAGE, body),
        )
        .await?;
        Ok(())
    }

    /// The payload of a running or pending job, read from Redis.
    ///
    /// # Errors
    /// [`Error::InvalidName`], Redis errors, [`Error::Malformed`].
    pub async fn job_payload(&self, key: &str) -> Result<Option<Bytes>> {
        check_name("job key", key)?;
        match self.inner.store.payload(key).await? {
            None => Ok(None),
            Some(raw) => Ok(Some(Bytes::from(codec::parse_stored(&raw)?.1.payload))),
        }
    }
}

impl NodeInner {
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.store.maps.shutdown.contains_key(SHUTDOWN_FLAG) {
            return Err(Error::ShuttingDown(self.pool.clone()));
        }
        Ok(())
    }

    fn check_payload(&self, payload: Bytes) -> Result<Bytes> {
        self.check_payload_size(payload.len())?;
        Ok(payload)
    }

    fn check_payload_size(&self, size: usize) -> Result<()> {
        if size > self.options.max_payload_size {
            return Err(Error::PayloadTooLarge {
                size,
                limit: self.options.max_payload_size,
            });
        }
        Ok(())
    }

    async fn dispatch(&self, key: &str, payload: &[u8], options: &DispatchOptions) -> Result<()> {
        self.check_open()?;
        check_name("job key", key)?;
        options.validate()?;
        self.check_payload_size(payload.len())?;
        // The key's idempotency marker, only for a dispatch with a window.
        let window = options.idempotency_window.map(|w| {
            (
                keys::dispatched(&self.pool, key),
                w.as_millis().max(1) as u64,
            )
        });
        let schedule = options.schedule.as_ref().map(|fence| {
            (
                fence.token,
                fence.record_key.clone(),
                fence.lock_key.clone(),
            )
        });
        let deadline = Instant::now() + self.options.dispatch_timeout;
        // The payload's one copy: straight into the encoded body.
        let body = codec::encode(&JobBodyRef {
            key,
            payload,
            restart: options.restart_policy,
        });
        let mut pending_polls = 0u32;
        // The run an earlier admission of this dispatch started, when its
        // start was answered `recovering`.
        let mut started: Option<u64> = None;
        loop {
            let owner = self.wait_for_owner(key, deadline).await?;
            let inbox = self.inbox(&owner)?.key().to_string();
            let (request, rx) = self.register_waiter();
            let admission = store::Admission {
                key: key.to_string(),
                body: body.clone(),
                owner: owner.clone(),
                inbox,
                request,
                window: window.clone(),
                schedule: schedule.clone(),
                started,
            };
            let admitted = match self.admitter.submit(admission).await {
                Ok(admitted) => admitted,
                Err(e) => {
                    self.waiters.remove(&request);
                    return Err(e);
                }
            };
            match admitted {
                Admitted::Ok { token } => {
                    tracing::debug!(key, owner = %owner, "job admitted");
                    let reply = self.await_reply(request, rx, deadline).await?;
                    if reply.status == "recovering" {
                        // Redis lost this admission before the start was
                        // recorded: the run goes on, but until its worker
                        // re-asserts it that worker holds the job's only
                        // copy. Admit again once the pool has recovered
                        // (`JobExists` then names that run, re-asserted),
                        // unless that run has ended by then (`Ended`).
                        started = started.max(Some(token));
                        self.pause_while_recovering(key, deadline).await?;
                        continue;
                    }
                    return match reply.status.as_str() {
                        "ok" => Ok(()),
                        "failed" => {
                            if let Some((marker, _)) = &window {
                                self.unmark(marker, token).await;
                            }
                            Err(crate::error::start_refused(key, reply.message))
                        }
                        "superseded" => Err(Error::JobExists(key.to_string())),
                        other => Err(Error::Malformed {
                            what: "dispatch reply",
                            reason: format!("unknown status {other:?}"),
                        }),
                    };
                }
                Admitted::Exists => {
                    self.waiters.remove(&request);
                    return Err(Error::JobExists(key.to_string()));
                }
                Admitted::Ended => {
                    // This dispatch's run started (its start was recorded)
                    // and has ended since: the dispatch is done.
                    self.waiters.remove(&request);
                    tracing::info!(
                        key,
                        token = started,
                        "the run this dispatch started through a data loss has ended; not admitted again"
                    );
                    return Ok(());
                }
                Admitted::Pending => {
                    // Another dispatch's admission, not started yet: it may
                    // still fail or be lost with Redis's recent writes.
                    // `JobExists` promises a job that runs, so wait for it
                    // to start (then `exists`), or to vanish (then this
                    // dispatch is admitted itself).
                    self.waiters.remove(&request);
                    let pause = PENDING_POLL_MIN * 2u32.saturating_pow(pending_polls.min(5));
                    pending_polls += 1;
                    let pause = pause.min(PENDING_POLL_MAX);
                    if Instant::now() + pause >= deadline {
                        return Err(Error::Timeout(self.options.dispatch_timeout));
                    }
                    tokio::time::sleep(pause).await;
                }
                Admitted::Recent(retry_after) => {
                    self.waiters.remove(&request);
                    return Err(Error::AlreadyDispatched {
                        key: key.to_string(),
                        retry_after,
                    });
                }
                Admitted::NotLeader => {
                    self.waiters.remove(&request);
                    let name = options.schedule.as_ref().map(|f| f.name.clone());
                    return Err(Error::NotLeader(name.unwrap_or_default()));
                }
                Admitted::Full(len) => {
                    self.waiters.remove(&request);
                    return Err(Error::PoolFull(len));
                }
                Admitted::Recovering => {
                    // Redis lost the pool's data: workers are re-asserting
                    // their jobs. Admit nothing until they are done.
                    self.waiters.remove(&request);
                    self.pause_while_recovering(key, deadline).await?;
                }
                Admitted::NoWorker => {
                    // Our view of the ring is behind: the owner left or is
                    // being cleaned. Wait for the view to move, then retry.
                    self.waiters.remove(&request);
                    self.refresh_ring();
                    let mut version = self.ring_version.subscribe();
                    if Instant::now() >= deadline {
                        return Err(Error::NoActiveWorker(self.pool.clone()));
                    }
                    let _ =
                        tokio::time::timeout(Duration::from_millis(50), version.changed()).await;
                }
            }
        }
    }

    /// A pause before a dispatch admits again while the pool recovers from
    /// a loss of Redis's data; `Timeout` when the deadline comes first.
    async fn pause_while_recovering(&self, key: &str, deadline: Instant) -> Result<()> {
        tracing::debug!(key, "pool recovering from data loss; waiting");
        if Instant::now() + RECOVERING_POLL >= deadline {
            return Err(Error::Timeout(self.options.dispatch_timeout));
        }
        tokio::time::sleep(RECOVERING_POLL).await;
        Ok(())
    }

    /// Removes the idempotency marker of a refused start (best effort: a
    /// marker left behind only delays a retry until the window ends).
    async fn unmark(&self, marker: &str, token: u64) {
        let result = self
            .store
            .unmark(marker, token, self.options.dispatch_timeout)
            .await;
        if let Err(error) = result {
            tracing::warn!(pool = %self.pool, marker, %error, "could not remove the idempotency marker of a refused start");
        }
    }

    /// The ring owner of `key`, waiting until `deadline` for a worker.
    pub(crate) async fn wait_for_owner(&self, key: &str, deadline: Instant) -> Result<String> {
        let mut version = self.ring_version.subscribe();
        loop {
            if let Some(owner) = self.ring.load().owner(key) {
                return Ok(owner.to_string());
            }
            // The ring is built from the membership replicas; rebuilt here
            // too, a dispatch never waits on a ring that missed a change
            // the replicas already hold.
            self.refresh_ring();
            if let Some(owner) = self.ring.load().owner(key) {
                return Ok(owner.to_string());
            }
            if tokio::time::timeout_at(deadline, version.changed())
                .await
                .is_err()
            {
                return Err(Error::NoActiveWorker(self.pool.clone()));
            }
        }
    }

    /// Waits for the reply to `request` until `deadline`.
    pub(crate) async fn await_reply(
        &self,
        request: u64,
        rx: tokio::sync::oneshot::Receiver<Reply>,
        deadline: Instant,
    ) -> Result<Reply> {
        let cancel = self.cancel.clone();
        let result = tokio::select! {
            r = tokio::time::timeout_at(deadline, rx) => r,
            _ = cancel.cancelled() => {
                self.waiters.remove(&request);
                return Err(Error::Closed);
            }
        };
        match result {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                self.waiters.remove(&request);
                Err(Error::Timeout(self.options.dispatch_timeout))
            }
        }
    }
}
