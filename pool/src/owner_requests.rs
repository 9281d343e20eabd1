//! Requests for the worker that runs a job (stop, notify), routed to it
//! through Redis, and the stop that waits for that worker's answer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::Server;
use tokio::time::Instant;

use crate::codec::{self, EV_STOP, KeyedRequest, ReplyTo};
use crate::error::{Error, Result};
use crate::lifecycle::FinalEnd;
use crate::node::NodeInner;
use crate::options::ScheduleFence;
use crate::primary_check::Judged;
use crate::store;

/// Where a stop or notify request went.
pub(crate) enum Routed {
    /// Queued in the owner's inbox.
    Queued,
    /// The job is admitted or being moved but not started: nowhere to go yet.
    Pending,
    /// A stop of an orphaned job (payload kept for the orphan sweep, no
    /// owner): ended by the routing script itself, which left this fencing
    /// token as its tombstone.
    Stopped(u64),
    /// A stop of a key Redis knows nothing of: the routing script left this
    /// fencing token as its tombstone.
    NotFound(u64),
}

/// Paces retries of a request for a job that is between owners: 5 ms,
/// doubling up to 200 ms, until the request's deadline.
pub(crate) struct SettlePause {
    attempts: u32,
    timeout: Duration,
    /// When the request gives up ([`Error::Timeout`]).
    pub(crate) deadline: Instant,
}

impl SettlePause {
    /// Paces a request that gives up `timeout` from now.
    pub(crate) fn new(timeout: Duration) -> Self {
        SettlePause {
            attempts: 0,
            timeout,
            deadline: Instant::now() + timeout,
        }
    }

    /// Waits before the next attempt; [`Error::Timeout`] when that would
    /// pass the deadline.
    pub(crate) async fn wait(&mut self) -> Result<()> {
        let delay =
            Duration::from_millis(5 << self.attempts.min(5)).min(Duration::from_millis(200));
        self.attempts += 1;
        if Instant::now() + delay >= self.deadline {
            return Err(Error::Timeout(self.timeout));
        }
        tokio::time::sleep(delay).await;
        Ok(())
    }
}

impl NodeInner {
    /// Stops job `key` (see [`crate::Node::stop_job`]) and returns once its
    /// owner's handler `stop` returned. `dispatch`: only the job of that
    /// dispatch (its payload's creation time, ms), wherever it runs now;
    /// another dispatch of the key, or none, is [`Error::JobNotFound`].
    /// `leader`: a schedule's stop, refused with [`Error::NotLeader`] once
    /// its leader is deposed (checked as each attempt is routed).
    pub(crate) async fn stop_key(
        self: &Arc<Self>,
        key: &str,
        dispatch: Option<u64>,
        leader: Option<&ScheduleFence>,
    ) -> Result<()> {
        let mut pause = SettlePause::new(self.options.dispatch_timeout);
        // A worker stopped its run of the key though Redis had lost the
        // run's record (`stopped.lua`): the stop is done, and a later
        // "not found" only says nothing else runs the key.
        let mut stopped_here = false;
        loop {
            // Behind Sentinel, the server asked: an answer from a primary
            // the Sentinels no longer name is asked again (`primary_check`).
            let asked = self.commands_server();
            let (request, rx) = self.register_waiter();
            let body = codec::encode(&KeyedRequest {
                key: key.to_string(),
                payload: Vec::new(),
                reply: Some(ReplyTo {
                    node: self.id.clone(),
                    request,
                }),
                hops: 0,
            });
            match self.to_owner(key, EV_STOP, body, dispatch, leader).await {
                Ok(Routed::Queued) => {}
                Ok(Routed::Stopped(token)) => {
                    self.waiters.remove(&request);
                    if !self.stop_answer_stands(asked.as_ref()).await {
                        pause.wait().await?;
                        continue;
                    }
                    self.remember_stop(key, token, dispatch);
                    self.count_stop(dispatch);
                    return Ok(());
                }
                Ok(Routed::Pending) => {
                    // Admitted or being moved, not started yet: stop it once
                    // it runs rather than report it missing.
                    self.waiters.remove(&request);
                    pause.wait().await?;
                    continue;
                }
                Ok(Routed::NotFound(token)) => {
                    self.waiters.remove(&request);
                    if !self.stop_answer_stands(asked.as_ref()).await {
                        pause.wait().await?;
                        continue;
                    }
                    // Not found now; but a worker cut off from Redis while
                    // Redis lost its data may hold a suspended copy, and
                    // another loss may take the tombstone that keeps it out:
                    // made to stand again then, like a stop answered `Ok`.
                    self.remember_stop(key, token, dispatch);
                    return self.not_found_after(key, stopped_here, dispatch).await;
                }
                Err(Error::JobNotFound(_)) => {
                    self.waiters.remove(&request);
                    if !self.stop_answer_stands(asked.as_ref()).await {
                        pause.wait().await?;
                        continue;
                    }
                    return self.not_found_after(key, stopped_here, dispatch).await;
                }
                Err(e) => {
                    self.waiters.remove(&request);
                    return Err(e);
                }
            }
            let reply = self.await_reply(request, rx, pause.deadline).await?;
            if matches!(reply.status.as_str(), "ok" | "not_found")
                && !self.stop_answer_stands(asked.as_ref()).await
            {
                // The worker that answered did stop its run, if it had
                // one; the job may still run on the promoted side.
                stopped_here |= reply.status == "ok";
                pause.wait().await?;
                continue;
            }
            match reply.status.as_str() {
                "ok" => {
                    // "ok <token>": the stopped run's token (older workers
                    // answer "ok" alone; nothing to remember then).
                    if let Ok(token) = reply.message.parse::<u64>() {
                        self.remember_stop(key, token, dispatch);
                    }
                    return Ok(());
                }
                "not_found" => {
                    // "not_found <token>", from workers of earlier versions
                    // (this one answers `retry` and leaves the tombstone to
                    // the next routing): remembered like a stop answered
                    // `Ok` (see above).
                    if let Ok(token) = reply.message.parse::<u64>() {
                        self.remember_stop(key, token, dispatch);
                    }
                    if stopped_here {
                        return Ok(());
                    }
                    return Err(Error::JobNotFound(key.to_string()));
                }
                // The job moved on before the request got there, or the
                // worker stopped its run ("retry <token>") but Redis had
                // lost the run's record: again, for whatever runs it now.
                "retry" => {
                    if let Ok(token) = reply.message.parse::<u64>() {
                        self.remember_stop(key, token, dispatch);
                        stopped_here = true;
                    }
                    pause.wait().await?;
                }
                other => {
                    return Err(Error::Malformed {
                        what: "stop reply",
                        reason: format!("unknown status {other:?}"),
                    });
                }
            }
        }
    }

    /// Remembers a stop this node was answered for, to make it stand again
    /// after Redis went back in time: a stop of one dispatch (`dispatch`)
    /// ends that dispatch alone, not a newer one whose runs took tokens
    /// below the stop's (see `stop_stands.lua`).
    fn remember_stop(&self, key: &str, token: u64, dispatch: Option<u64>) {
        match dispatch.filter(|d| codec::stamp_is_exact(*d)) {
            Some(admitted) => self.stops_requested.record_dispatch(key, token, admitted),
            None => self.stops_requested.record(key, token),
        }
    }

    /// Counts a stop `stop_job` asked for (not the end of a run made to
    /// stand, which names its dispatch).
    fn count_stop(&self, dispatch: Option<u64>) {
        if dispatch.is_none() {
            self.metrics.jobs_stopped.increment(1);
            self.history.count(crate::history::PoolEvent::Stop);
        }
    }

    /// What a stop answers when nothing runs `key` any more: `Ok` when a
    /// worker stopped a run of it on this request already. A stop of one
    /// dispatch leaves a record of a job that failed for good alone: it
    /// may be another dispatch's.
    async fn not_found_after(
        &self,
        key: &str,
        stopped_here: bool,
        dispatch: Option<u64>,
    ) -> Result<()> {
        if dispatch.is_some() {
            return match stopped_here {
                true => Ok(()),
                false => Err(Error::JobNotFound(key.to_string())),
            };
        }
        match self.forget_failed_or_not_found(key).await {
            Err(Error::JobNotFound(_)) if stopped_here => Ok(()),
            other => other,
        }
    }

    /// The end of a stop of a job that does not run: a job that failed for
    /// good is shown until stopped, and the stop removes its record (`Ok`);
    /// otherwise [`Error::JobNotFound`].
    async fn forget_failed_or_not_found(&self, key: &str) -> Result<()> {
        if self.store.forget_failed_job(key).await? {
            return Ok(());
        }
        Err(Error::JobNotFound(key.to_string()))
    }

    /// Queues `event` at the owner of job `key` (stop, notify).
    /// `dispatch`: only the job of that dispatch (its payload's creation
    /// time, ms), whatever worker runs it now. `leader`: a schedule
    /// leader's request, refused with [`Error::NotLeader`] once deposed.
    pub(crate) async fn to_owner(
        &self,
        key: &str,
        event: &str,
        body: Bytes,
        dispatch: Option<u64>,
        leader: Option<&ScheduleFence>,
    ) -> Result<Routed> {
        // The replica's owner, where the node mirrors the jobs map, is a
        // guess the script checks; without one the script names the owner
        // (one more round trip).
        let mut owner = self
            .store
            .maps
            .replica_owner(key)
            .unwrap_or_else(|| "-".to_string());
        // A stop judges the owner dead as a cleanup does (`to_owner.lua`).
        let server_floor_ms = if event == EV_STOP {
            Some(self.server_time_floor().await?)
        } else {
            None
        };
        for _ in 0..5 {
            let inbox = self.inbox(&owner)?;
            let request = store::OwnerRequest {
                owner: &owner,
                owner_inbox: inbox.key(),
                event,
                dispatch,
                server_floor_ms,
                leader: leader.map(|fence| (fence.lock_key.as_str(), fence.token)),
            };
            let routed = self
                .store
                .to_owner_of(key, request, body.clone(), self.options.worker_ttl)
                .await?;
            match routed {
                store::Routed::Queued => return Ok(Routed::Queued),
                store::Routed::Pending => return Ok(Routed::Pending),
                store::Routed::Stopped(token) => return Ok(Routed::Stopped(token)),
                store::Routed::NotFound(Some(token)) => return Ok(Routed::NotFound(token)),
                store::Routed::NotFound(None) => return Err(Error::JobNotFound(key.to_string())),
                store::Routed::Moved(now) => owner = now,
                store::Routed::NotLeader => {
                    let name = leader.map(|fence| fence.name.clone()).unwrap_or_default();
                    return Err(Error::NotLeader(name));
                }
            }
        }
        Err(Error::JobNotFound(key.to_string()))
    }

    /// Reports the end that took job `key` out of the pool, once it
    /// stands. Behind Sentinel, an end recorded on a primary the Sentinels
    /// no longer name (`asked`: the server the record went to; it stalled
    /// through its failover) may be lost with that primary's demotion,
    /// while the promoted side runs the job, moved to another worker by a
    /// cleanup meanwhile. That run of the same dispatch (`dispatch`: its
    /// payload's creation time) is then stopped where the Sentinels name
    /// the primary, and only then is the end reported. When no majority of
    /// the Sentinels names a primary (they may be failing over the very
    /// server that recorded the end), they are asked again for up to two
    /// worker TTLs before the end is made to stand that way all the same.
    /// Given up, with a warning, after [`END_STANDS_WITHIN`].
    pub(crate) async fn report_final_end(
        self: &Arc<Self>,
        key: &str,
        token: u64,
        dispatch: u64,
        asked: Option<Server>,
        end: FinalEnd,
    ) {
        let judged = self.end_judged(asked.as_ref()).await;
        if judged == Judged::Primary {
            end.report(self, key, token);
            return;
        }
        let node = self.clone();
        let key = key.to_string();
        self.tasks.spawn(async move {
            if judged == Judged::Unjudged {
                let verdict_by = Instant::now() + node.options.worker_ttl * 2;
                let judged = loop {
                    tokio::select! {
                        _ = node.cancel.cancelled() => return,
                        _ = tokio::time::sleep(END_STANDS_RETRY) => {}
                    }
                    let judged = node.end_judged(asked.as_ref()).await;
                    if judged != Judged::Unjudged || Instant::now() >= verdict_by {
                        break judged;
                    }
                };
                if judged == Judged::Primary {
                    end.report(&node, &key, token);
                    return;
                }
                tracing::debug!(
                    key,
                    token,
                    ?judged,
                    "making a run's end stand where the Sentinels name the primary"
                );
            }
            match node.stop_dispatch(&key, dispatch, END_STANDS_WITHIN).await {
                Ok(()) => {
                    node.record_final_failure(&key, token, &end).await;
                    end.report(&node, &key, token);
                }
                Err(Some(e)) => tracing::warn!(
                    key,
                    token,
                    error = %e,
                    "the end of a run recorded on a primary the Sentinels no longer \
                     name could not be made to stand: the job may run again"
                ),
                Err(None) => {}
            }
        });
    }

    /// Stops dispatch `dispatch` (its payload's creation time) of `key`
    /// wherever it runs ([`stop_key`](Self::stop_key)), asking again every
    /// [`END_STANDS_RETRY`] while it fails (the pool recovering, the run's
    /// worker not answering), for up to `within`. `Ok` once nothing of
    /// the dispatch runs; `Err(Some(_))` with the last error when `within`
    /// passed; `Err(None)` when the node closed.
    pub(crate) async fn stop_dispatch(
        self: &Arc<Self>,
        key: &str,
        dispatch: u64,
        within: Duration,
    ) -> std::result::Result<(), Option<Error>> {
        let deadline = Instant::now() + within;
        loop {
            let stopped = tokio::select! {
                _ = self.cancel.cancelled() => return Err(None),
                stopped = self.stop_key(key, Some(dispatch), None) => stopped,
            };
            match stopped {
                Ok(()) | Err(Error::JobNotFound(_)) => return Ok(()),
                Err(Error::Closed) => return Err(None),
                Err(e) if Instant::now() >= deadline => return Err(Some(e)),
                Err(e) => {
                    tracing::debug!(key, dispatch, error = %e, "stopping a dispatch: asking again");
                    tokio::select! {
                        _ = self.cancel.cancelled() => return Err(None),
                        _ = tokio::time::sleep(END_STANDS_RETRY) => {}
                    }
                }
            }
        }
    }

    /// Writes the record of a failure for good made to stand where the
    /// Sentinels name the primary: the one the end wrote may be lost with
    /// the superseded primary, and [`Node::job_status`] reads it there. A
    /// finish leaves no record.
    ///
    /// [`Node::job_status`]: crate::Node::job_status
    async fn record_final_failure(&self, key: &str, token: u64, end: &FinalEnd) {
        let FinalEnd::Failed { failures, error } = end else {
            return;
        };
        if let Err(e) = self
            .store
            .mark_failed_job(key, *failures, token, error)
            .await
        {
            tracing::warn!(key, token, error = %e, "the record of a job that failed for good could not be written again");
        }
    }
}

/// How long an end recorded on a superseded primary is made to stand.
const END_STANDS_WITHIN: Duration = Duration::from_secs(120);
/// The pause between two attempts to make an end stand.
const END_STANDS_RETRY: Duration = Duration::from_millis(500);
