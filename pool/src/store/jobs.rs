//! Moving jobs and requests between workers: a stop or notify routed to
//! the job's owner (`to_owner.lua`), a stop recorded (`stopped.lua`), a job
//! handed to another worker (`handoff.lua`), an inbox entry moved
//! (`move_entry.lua`).

use std::time::Duration;

use bytes::Bytes;
use fred::types::Value;

use super::PoolStore;
use super::call::{self, status_reply, u64_at};
use crate::error::{Error, Result};
use crate::keys;

/// A request for the worker that runs a job (`to_owner.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnerRequest<'a> {
    /// The worker expected to run it (`-`: not known).
    pub(crate) owner: &'a str,
    /// That worker's inbox.
    pub(crate) owner_inbox: &'a str,
    /// The event name (`stop`, `notify`).
    pub(crate) event: &'a str,
    /// Only the job of this dispatch (its payload's creation time, ms).
    pub(crate) dispatch: Option<u64>,
    /// For a stop: the least server time (ms) it can be now by the
    /// caller's clock (`server_clock.rs`), with which the script judges
    /// the owner dead.
    pub(crate) server_floor_ms: Option<u64>,
    /// A schedule leader's request (its lease's lock key and fencing
    /// token): refused ([`Routed::NotLeader`]) unless the lock still
    /// carries the token, atomically with the routing.
    pub(crate) leader: Option<(&'a str, u64)>,
}

/// Where `to_owner.lua` put a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Routed {
    /// Queued in the owner's inbox.
    Queued,
    /// The job is admitted or being moved but not started: nowhere to go
    /// yet.
    Pending,
    /// A stop of an orphaned job (payload kept for the orphan sweep, no
    /// owner), of a run on a worker Redis judges dead, or of an unclaimed
    /// start of one dispatch: ended by the script itself, which left this
    /// fencing token as its tombstone.
    Stopped(u64),
    /// No such job. A stop left this fencing token as its tombstone (a
    /// notify leaves none).
    NotFound(Option<u64>),
    /// Another worker owns the job now (`"-"`: none).
    Moved(String),
    /// The request's schedule leader was deposed: nothing was done.
    NotLeader,
}

/// A stop a worker carried out, for `stopped.lua`.
pub(crate) struct StopDone<'a> {
    /// Job key.
    pub(crate) key: &'a str,
    /// The worker.
    pub(crate) worker: &'a str,
    /// The worker's inbox.
    pub(crate) inbox: &'a str,
    /// The stop request's entry in the inbox.
    pub(crate) entry_id: &'a str,
    /// Reply stream key and request id, if someone waits.
    pub(crate) reply: Option<(&'a str, u64)>,
    /// The token of the run of the key the worker ran or held (suspended),
    /// if any: a record naming a worker that held none is stale (`Retry`
    /// while the pool recovers); with no record at all, the worker's stop
    /// of this run is `Retry` with the run's token in the reply.
    pub(crate) held: Option<u64>,
    /// The recovery window after a data loss.
    pub(crate) worker_ttl: Duration,
    /// The token of the run the stop was sent for, if the router knew it:
    /// a newer recorded run makes it `Retry`.
    pub(crate) target: Option<u64>,
    /// The token of the worker's own run of the key that it left going on
    /// because the stop was sent for an older run: `Retry` as well, and the
    /// record (which may still name the older run, after Redis went back in
    /// time) is kept for the run's re-assertion.
    pub(crate) kept: Option<u64>,
    /// Whether the worker held the run (`held`) past its lease (suspended,
    /// or running after the lease lapsed): a cleanup may have moved it on
    /// writes Redis lost since (`Retry` while the pool recovers).
    pub(crate) held_past_lease: bool,
    /// For a stop of one dispatch, that dispatch's admission stamp (µs):
    /// the stop ended it alone, not a newer dispatch of the key that a
    /// worker may hold after Redis lost its admission.
    pub(crate) dispatch: Option<u64>,
}

call::status!(
    /// What `stopped.lua` recorded.
    Stopped, "stopped reply" {
        /// Ownership and payload removed, dispatcher answered.
        Ok = "ok",
        /// The job moved on, or Redis has no record of the run stopped
        /// here (or only a stale one): the dispatcher sends the request
        /// again.
        Retry = "retry",
    }
);

/// Who moves a job with `handoff.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mover<'a> {
    /// Its owner, running it under a lease that holds (a rebalance, a
    /// close, a restart that failed), or the orphan sweep.
    Owner,
    /// Its owner, which held it past its lease (a close of a job stopped
    /// on a lease loss): a cleanup may have moved the job meanwhile, on
    /// writes a rollback took back. Refused (`recovering`) while the pool
    /// recovers, and on a state older than this node has seen (a rollback
    /// it has not noticed yet, which opens the window).
    OwnerPastLease,
    /// A cleanup on node `.0` moves a dead worker's job; its claim on the
    /// worker must still be its own. Refused (`recovering`) as
    /// [`OwnerPastLease`](Self::OwnerPastLease) is: a cleanup claimed before
    /// a rollback may have moved jobs the older state shows with the dead
    /// worker again, and the older counter would issue their tokens again.
    Cleaner(&'a str),
}

impl<'a> Mover<'a> {
    /// The owner, or the cleanup on node `cleaner`.
    pub(crate) fn owner_or(cleaner: Option<&'a str>) -> Self {
        cleaner.map_or(Mover::Owner, Mover::Cleaner)
    }
}

/// What `handoff.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// Moved, with a new token.
    Ok { token: u64 },
    /// The job is not the expected owner's (or not an orphan).
    NotOwner,
    /// The target is not registered, is being cleaned up or drained, or
    /// does not read its inbox: silent for over a TTL, or no renewal since
    /// the pool last found its data lost (a registration a rollback brought
    /// back).
    NoTarget,
    /// The job has no payload any more.
    NoPayload,
    /// A cleaner's or an orphan's move of a dispatch marked over (a stop
    /// `stop_job` was answered for, or a worker's end of the dispatch,
    /// made to stand again after Redis went back in time, found a newer
    /// run of it: see `dispatch_over` in `scripts/base.lua`): the dispatch
    /// was ended instead, its record, guard and payload removed.
    Ended,
    /// The pool recovers from a data loss: orphans wait, and so do a job
    /// its owner held past its lease ([`Mover::OwnerPastLease`]) and a
    /// cleaner's moves ([`Mover::Cleaner`]).
    Recovering,
    /// A cleanup's claim on the expected owner is not the cleaner's any
    /// more (the worker came back, or another cleaner took over): the
    /// cleaner moves nothing more of that worker.
    ClaimLost,
}

impl Handoff {
    fn parse(reply: Value) -> Result<Self> {
        const WHAT: &str = "handoff reply";
        let (status, rest) = status_reply(WHAT, reply)?;
        Ok(match status.as_str() {
            "ok" => Handoff::Ok {
                token: u64_at(&rest, 0, WHAT)?,
            },
            "not_owner" => Handoff::NotOwner,
            "no_target" => Handoff::NoTarget,
            "no_payload" => Handoff::NoPayload,
            "ended" => Handoff::Ended,
            "recovering" => Handoff::Recovering,
            "claim_lost" => Handoff::ClaimLost,
            other => return Err(call::unknown_status(WHAT, other)),
        })
    }
}

call::status!(
    /// What `move_entry.lua` did.
    Moved, "move_entry reply" {
        /// Moved.
        Ok = "ok",
        /// The target is not registered (or is being cleaned up).
        NoTarget = "no_target",
        /// The entry is no longer in the source inbox.
        Gone = "gone",
        /// A cleaner's move of a start of a dispatch marked over (see
        /// [`Handoff::Ended`]): the entry, its guard and the payload were
        /// removed instead.
        Ended = "ended",
        /// A cleanup's claim on the source worker is not the cleaner's any
        /// more: the entry stays.
        ClaimLost = "claim_lost",
        /// A cleaner's move while the pool recovers from a data loss or a
        /// rollback, or on a state older than the cleaner has seen: the
        /// entry stays (see [`Mover::Cleaner`]).
        Recovering = "recovering",
    }
);

call::status!(
    /// What `drop_entry.lua` did.
    Dropped, "drop_entry reply" {
        /// Dropped.
        Ok = "ok",
        /// The entry is no longer in the inbox.
        Gone = "gone",
        /// A cleanup's claim on the worker is not the cleaner's any more:
        /// the entry stays.
        ClaimLost = "claim_lost",
    }
);

/// What a move of an inbox entry requeues (`Default`: nothing, a
/// forward).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Requeue<'a> {
    /// The job key of a start entry a cleaner or a leaving worker moves (it
    /// gets a new fencing token).
    pub(crate) key: Option<&'a str>,
    /// This node's id when a cleanup moves a dead worker's entry: the claim
    /// on the worker must still be its own.
    pub(crate) cleaner: Option<&'a str>,
}

/// The worker a job is handed to, its inbox stream key, and the least
/// server time (ms) it can be now by the caller's own clock (`None`:
/// unknown), by which with `TIME` the worker's silence is judged (see
/// `server_clock.rs`: a forward step of the server's clock must not make
/// every worker look silent until it renews).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Receiver<'a> {
    pub(crate) worker: &'a str,
    pub(crate) inbox: &'a str,
    pub(crate) floor_ms: Option<u64>,
}

/// One inbox entry to move from one worker's inbox to another's.
#[derive(Debug, Clone)]
pub(crate) struct EntryMove<'a> {
    /// The source worker and its inbox stream key.
    pub(crate) from: &'a str,
    pub(crate) from_inbox: &'a str,
    /// The target worker and its inbox stream key.
    pub(crate) to: &'a str,
    pub(crate) to_inbox: &'a str,
    /// The entry's id, event name and (new) payload.
    pub(crate) id: &'a str,
    pub(crate) name: &'a str,
    pub(crate) payload: Bytes,
    /// What the move requeues.
    pub(crate) requeue: Requeue<'a>,
    /// The worker TTL: a target silent for longer takes no entry.
    pub(crate) worker_ttl: Duration,
    /// How long a start a cleaner moves may wait for its new owner's claim
    /// (its pending guard's fresh deadline).
    pub(crate) pending_ttl: Duration,
    /// The least server time (ms) it can be now by the caller's own clock
    /// (`None`: unknown): see [`Receiver`].
    pub(crate) floor_ms: Option<u64>,
}

impl PoolStore {
    /// Queues `event` with `body` at `owner` (`"-"`: none known), the owner
    /// of job `key` as the caller's replica says. Redis below the highest
    /// jobs-map revision this node saw went back in time: `Pending`.
    #[cfg(test)]
    pub(crate) async fn to_owner(
        &self,
        key: &str,
        owner: &str,
        owner_inbox: &str,
        event: &str,
        body: Bytes,
        worker_ttl: Duration,
    ) -> Result<Routed> {
        let request = OwnerRequest {
            owner,
            owner_inbox,
            event,
            dispatch: None,
            server_floor_ms: None,
            leader: None,
        };
        self.to_owner_of(key, request, body, worker_ttl).await
    }

    /// [`to_owner`](Self::to_owner), reaching only the job of
    /// `request.dispatch` when set (its payload's creation time, ms): any
    /// other dispatch of the key, or none, is [`Routed::NotFound`]`(None)`.
    pub(crate) async fn to_owner_of(
        &self,
        key: &str,
        request: OwnerRequest<'_>,
        body: Bytes,
        worker_ttl: Duration,
    ) -> Result<Routed> {
        let OwnerRequest {
            owner,
            owner_inbox,
            event,
            dispatch,
            server_floor_ms,
            leader,
        } = request;
        const WHAT: &str = "to_owner reply";
        let mut keys = self.maps.base_keys();
        keys.push(owner_inbox.to_string());
        keys.push(self.maps.keepalive_revision_key());
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        if let Some((lock, _)) = leader {
            keys.push(lock.to_string());
        }
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(owner),
            Value::from(event),
            Value::Bytes(body),
            Value::from(keys::INBOX_MAXLEN.to_string()),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
            Value::from(dispatch.unwrap_or(0).to_string()),
            Value::from(server_floor_ms.map(|ms| ms.to_string()).unwrap_or_default()),
            Value::from(
                leader
                    .map(|(_, token)| token.to_string())
                    .unwrap_or_default(),
            ),
        ]);
        let reply: Value = self
            .scripts
            .to_owner
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let (status, rest) = status_reply(WHAT, reply)?;
        let token = || {
            rest.first()
                .and_then(Value::as_string)
                .and_then(|t| t.parse().ok())
        };
        Ok(match status.as_str() {
            "ok" => Routed::Queued,
            "pending" => Routed::Pending,
            "stopped" => Routed::Stopped(token().ok_or_else(|| Error::Malformed {
                what: WHAT,
                reason: "a stop without its tombstone token".into(),
            })?),
            "not_found" => Routed::NotFound(token()),
            "not_leader" => Routed::NotLeader,
            "moved" => Routed::Moved(
                rest.first()
                    .and_then(Value::as_string)
                    .unwrap_or_else(|| "-".into()),
            ),
            other => return Err(call::unknown_status(WHAT, other)),
        })
    }

    /// Records that a worker stopped a job on request (see [`StopDone`]).
    pub(crate) async fn stopped(&self, done: StopDone<'_>) -> Result<Stopped> {
        let (reply_key, request) = done.reply.unwrap_or((done.inbox, 0));
        let mut keys = self.maps.base_keys();
        keys.push(done.inbox.to_string());
        keys.push(reply_key.to_string());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(done.key),
            Value::from(done.worker),
            Value::from(done.entry_id),
            Value::from(request.to_string()),
            Value::from(done.held.unwrap_or(0).to_string()),
            Value::from(done.worker_ttl.as_millis().to_string()),
            Value::from(done.target.unwrap_or(0).to_string()),
            Value::from(done.kept.unwrap_or(0).to_string()),
            Value::from(if done.held_past_lease { "1" } else { "0" }),
            Value::from(done.dispatch.unwrap_or(0).to_string()),
        ]);
        let status: String = self
            .scripts
            .stopped
            .run(&self.client, keys, args, self.timeout)
            .await?;
        Stopped::parse(&status)
    }

    /// Hands job `key`, owned by `from` (`"-"`: an orphan), to `to`. With
    /// `cleaner` (a cleanup moves a dead worker's job), a job moved comes
    /// with its stored payload (`"<admitted> <body>"`), for the cleaner to
    /// remember. See [`Mover`] for what each mover may move.
    pub(crate) async fn handoff(
        &self,
        key: &str,
        from: &str,
        to: Receiver<'_>,
        pending_ttl: Duration,
        worker_ttl: Duration,
        mover: Mover<'_>,
    ) -> Result<(Handoff, Option<Bytes>)> {
        let mut keys = self.maps.base_keys();
        keys.push(to.inbox.to_string());
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        keys.push(self.maps.keepalive_revision_key());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(from),
            Value::from(to.worker),
            Value::from(pending_ttl.as_millis().to_string()),
            Value::from(keys::INBOX_MAXLEN.to_string()),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(match mover {
                Mover::Cleaner(node) => node,
                _ => "",
            }),
            Value::from(match mover {
                Mover::OwnerPastLease | Mover::Cleaner(_) => self.revision_floor(),
                Mover::Owner => String::new(),
            }),
            Value::from(to.floor_ms.map(|ms| ms.to_string()).unwrap_or_default()),
        ]);
        let reply: Value = self
            .scripts
            .handoff
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let stored = match &reply {
            Value::Array(items) => items
                .get(2)
                .and_then(Value::as_bytes)
                .map(Bytes::copy_from_slice),
            _ => None,
        };
        Ok((Handoff::parse(reply)?, stored))
    }

    /// Which of `workers` (each with its inbox stream key) a job may be
    /// handed to now (`targets_current.lua`): each reads its inbox and
    /// renewed since the pool last found its data lost. For each, `None`
    /// (not a target now) or the number of entries in its inbox. A hint for
    /// whom to stop a job for, and how many at once: `handoff` checks again.
    pub(crate) async fn targets_current(
        &self,
        workers: &[(String, String)],
        worker_ttl: Duration,
    ) -> Result<Vec<Option<u64>>> {
        const WHAT: &str = "targets_current reply";
        let mut keys = self.maps.base_keys();
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        keys.extend(workers.iter().map(|(_, inbox)| inbox.clone()));
        let mut args = self.maps.base_args_with_ttl(worker_ttl);
        args.extend(workers.iter().map(|(w, _)| Value::from(w.as_str())));
        let reply: Value = self
            .scripts
            .targets_current
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let lengths = match reply {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => {
                return Err(Error::Malformed {
                    what: WHAT,
                    reason: format!("expected an array, got {other:?}"),
                });
            }
        };
        if lengths.len() != workers.len() {
            return Err(Error::Malformed {
                what: WHAT,
                reason: format!("{} answers for {} workers", lengths.len(), workers.len()),
            });
        }
        lengths
            .iter()
            .map(|v| match v.as_i64() {
                Some(-1) => Ok(None),
                Some(n) if n >= 0 => Ok(Some(n as u64)),
                _ => Err(Error::Malformed {
                    what: WHAT,
                    reason: format!("expected -1 or an inbox length, got {v:?}"),
                }),
            })
            .collect()
    }

    /// Moves one inbox entry to another worker's inbox (the status alone).
    #[cfg(test)]
    pub(crate) async fn move_entry(&self, entry: EntryMove<'_>) -> Result<Moved> {
        Ok(self.move_entry_token(entry).await?.0)
    }

    /// Moves one inbox entry to another worker's inbox; with the new token
    /// of a start a cleaner moved.
    pub(crate) async fn move_entry_token(
        &self,
        entry: EntryMove<'_>,
    ) -> Result<(Moved, Option<u64>)> {
        let mut keys = self.maps.base_keys();
        keys.push(entry.from_inbox.to_string());
        keys.push(entry.to_inbox.to_string());
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        keys.push(self.maps.keepalive_revision_key());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(entry.id),
            Value::from(entry.name),
            Value::Bytes(entry.payload),
            Value::from(entry.to),
            Value::from(keys::INBOX_MAXLEN.to_string()),
            Value::from(entry.requeue.key.unwrap_or("")),
            Value::from(entry.requeue.cleaner.unwrap_or("")),
            Value::from(entry.from),
            Value::from(entry.worker_ttl.as_millis().to_string()),
            Value::from(if entry.requeue.cleaner.is_some() {
                self.revision_floor()
            } else {
                String::new()
            }),
            Value::from(entry.pending_ttl.as_millis().to_string()),
            Value::from(entry.floor_ms.map(|ms| ms.to_string()).unwrap_or_default()),
        ]);
        let reply: String = self
            .scripts
            .move_entry
            .run(&self.client, keys, args, self.timeout)
            .await?;
        match reply.split_once(' ') {
            Some(("ok", token)) => {
                let token = token.parse().map_err(|_| crate::error::Error::Malformed {
                    what: "move_entry reply",
                    reason: format!("not a token: {token:?}"),
                })?;
                Ok((Moved::Ok, Some(token)))
            }
            _ => Ok((Moved::parse(&reply)?, None)),
        }
    }

    /// Drops entry `id` of `worker`'s inbox (nobody can take it, or it
    /// cannot be read). `cleaner`: this node's id when a cleanup drops a
    /// dead worker's entry; nothing is dropped once its claim is gone.
    pub(crate) async fn drop_entry(
        &self,
        worker: &str,
        inbox: &str,
        id: &str,
        cleaner: Option<&str>,
    ) -> Result<Dropped> {
        let mut keys = self.maps.base_keys();
        keys.push(inbox.to_string());
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(id),
            Value::from(cleaner.unwrap_or("")),
            Value::from(worker),
        ]);
        let status: String = self
            .scripts
            .drop_entry
            .run(&self.client, keys, args, self.timeout)
            .await?;
        Dropped::parse(&status)
    }
}
