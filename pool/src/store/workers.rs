//! Workers' records: registration (`register.lua`), keep-alives
//! (`keepalive.lua`), re-assertion and resumption of their jobs
//! (`reassert.lua`, `resume.lua`), cleanup of dead ones
//! (`claim_cleanup.lua`, `remove_worker.lua`), drain marks
//! (`drain_worker.lua`), and recovery after Redis went back in time
//! (`begin_recovery.lua`, `release_stale.lua`, `release_owner.lua`).

use std::time::Duration;

use bytes::Bytes;
use fred::types::Value;

use super::PoolStore;
use super::call::{self, status_reply};
use crate::error::Result;
use crate::keys;

/// One job of a re-assertion (`reassert.lua`).
pub(crate) struct ReassertJob<'a> {
    /// Job key.
    pub(crate) key: &'a str,
    /// The run's fencing token.
    pub(crate) token: u64,
    /// The job's stored payload (`"<admitted> <body>"`), restored if
    /// missing.
    pub(crate) stored: Bytes,
    /// Whether the run goes on or is held suspended.
    pub(crate) state: Reassert,
}

/// Whether a re-asserted job runs here or was suspended on lease loss.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reassert {
    Running,
    Suspended,
}

/// What `reassert.lua` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reasserted {
    /// The worker owns the job (again).
    Ok,
    /// Another start of the job is newer: it is not the worker's.
    Lost,
    /// A newer admission or hand-off of the job, not started yet (its
    /// pending guard), holds it: it is not the worker's, and Redis alone
    /// holds the job until that start.
    Pending,
    /// A newer token was issued and Redis shows neither its run nor its
    /// pending start, only the payload: an orphan (another worker gave it
    /// back after a loss took its start). It is not the worker's, and
    /// Redis may hold the only copy.
    Unclaimed,
    /// Payload restored, ownership not taken (the orphan sweep requeues
    /// it).
    Orphaned,
    /// A run or pending start of an *older* dispatch (admitted at this
    /// stamp, µs) holds the job with a newer token: the state Redis went
    /// back to. That dispatch is marked over, and this run's payload takes
    /// its place when its run ends; the caller stops that run. Not the
    /// worker's meanwhile.
    Superseded(u64),
}

impl Reasserted {
    /// The script's word for this outcome (for logs).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Lost => "lost",
            Self::Pending => "pending",
            Self::Unclaimed => "unclaimed",
            Self::Orphaned => "orphaned",
            Self::Superseded(_) => "superseded",
        }
    }

    /// Reads one of `reassert.lua`'s statuses.
    fn parse(status: &str) -> Result<Self> {
        Ok(match status {
            "ok" => Self::Ok,
            "lost" => Self::Lost,
            "pending" => Self::Pending,
            "unclaimed" => Self::Unclaimed,
            "orphaned" => Self::Orphaned,
            other => match call::superseded(other) {
                Some(older) => Self::Superseded(older),
                None => return Err(call::unknown_status("reassert reply", other)),
            },
        })
    }
}

/// Compares with the script's word.
impl PartialEq<&str> for Reasserted {
    fn eq(&self, word: &&str) -> bool {
        self.as_str() == *word
    }
}

/// What `resume.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resumed {
    /// The job is the worker's again, with this new fencing token.
    Token(u64),
    /// Another worker owns the job, or nobody does.
    Moved,
    /// Still recorded as the worker's, but a cleanup claim on the worker
    /// holds it back: the cleaner may be moving it.
    Claimed,
    /// Recorded as the worker's, but the pool recovers from a data loss or
    /// a rollback: the record may be one the lost writes had replaced (the
    /// job moved, and its new owner has not re-asserted it yet).
    Recovering,
}

call::status!(
    /// Why `resume.lua` refused.
    ResumeRefused, "resume reply" {
        /// Another worker owns the job, or nobody does.
        Moved = "moved",
        /// A cleanup claim on the worker holds the job back.
        Claimed = "claimed",
        /// The pool recovers: asked again once it has.
        Recovering = "recovering",
    }
);

call::status!(
    /// What `remove_worker.lua` did.
    Removed, "remove_worker reply" {
        /// Removed.
        Ok = "ok",
        /// Entries are left in the inbox: move them first.
        InboxNotEmpty = "inbox_not_empty",
        /// A cleanup's claim on the worker is not the cleaner's any more
        /// (the worker came back, or another node took the claim over).
        NotClaimed = "not_claimed",
    }
);

call::status!(
    /// What `drain_worker.lua` did to a worker's drain mark.
    DrainMark, "drain_worker reply" {
        /// The mark was set (or cleared).
        Changed = "changed",
        /// The mark was set (or cleared) already.
        Unchanged = "unchanged",
        /// The worker is not registered.
        Unknown = "unknown",
        /// The worker's record is not a JSON object: left alone.
        Malformed = "malformed",
    }
);

call::status!(
    /// The state of a cleanup claim on a worker (`claim_cleanup.lua`).
    ClaimStatus, "claim_cleanup reply" {
        /// The worker is dead; the claim is the caller's.
        Claimed = "claimed",
        /// The worker is dead; a stale claim was taken over.
        TakenOver = "taken_over",
        /// The worker's keep-alive is within the TTL.
        Alive = "alive",
        /// Another node cleans the worker up.
        ClaimedByOther = "claimed_by_other",
        /// The worker is not registered.
        Gone = "gone",
        /// The pool recovers from a data loss or a rollback: no cleanup is
        /// claimed until every node has made its stops stand again.
        Recovering = "recovering",
    }
);

/// A claim on the cleanup of a worker, and how long it was silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadWorkerClaim {
    pub(crate) status: ClaimStatus,
    pub(crate) silent_ms: u64,
}

call::status!(
    /// What `recovery_mark.lua` did.
    RecoveryMark, "recovery_mark reply" {
        /// The node's mark holds the recovery window open for a TTL.
        Set = "set",
        /// The node's mark is gone.
        Cleared = "cleared",
        /// Not set: the window began more than 10 TTLs ago.
        Late = "late",
    }
);

call::status!(
    /// What `begin_recovery.lua` did.
    Recovery, "begin_recovery reply" {
        /// The recovery window opened.
        Opened = "opened",
        /// A window was open already.
        Open = "open",
    }
);

call::status!(
    /// What `release_stale.lua` did.
    #[allow(clippy::enum_variant_names)] // `Released::Released`: the script's word
    Released, "release_stale reply" {
        /// The record and the payload are gone.
        Released = "released",
        /// The record is gone; the payload stays, an orphan, because a
        /// newer run of the key was issued since (the key's fencing
        /// counter is above the record's token; `release_stale.lua` only).
        Kept = "kept",
        /// The record changed since it was read: left alone.
        Changed = "changed",
        /// The cleaner's claim on the worker is gone (the worker renewed,
        /// or another cleaner took over): left alone
        /// (`release_owner.lua` only).
        ClaimLost = "claim_lost",
    }
);

/// What a renewal of keep-alives found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Renewal {
    /// Redis server time (ms) of the renewal.
    pub(crate) server_ms: u64,
    /// The workers Redis does not know (not renewed).
    pub(crate) unknown: Vec<String>,
    /// The workers renewed under another node's cleanup claim: their
    /// cleaner may be moving their inbox entries, so they start nothing.
    pub(crate) claimed: Vec<String>,
    /// Nothing was renewed: the node had heard no reply for over a TTL
    /// (see `keepalive.lua`).
    pub(crate) unheard: bool,
}

impl PoolStore {
    /// Registers (or re-registers) worker `id` with its `info` (a JSON
    /// object); returns the server time (ms) of the registration.
    pub(crate) async fn register(&self, id: &str, info: &str) -> Result<Option<u64>> {
        let ka = self.maps.keepalive.keys_info();
        let mut keys = self.maps.base_keys();
        keys.push(ka.hash.clone());
        keys.push(ka.revision.clone());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(id),
            Value::from(info),
            Value::from(ka.channel.clone()),
        ]);
        self.scripts
            .register
            .run(&self.client, keys, args, self.timeout)
            .await
    }

    /// Renews the keep-alives of `node` and its `workers`; `heard_ms` is the
    /// server time of the last renewal whose reply the node heard (0: none
    /// yet), and Redis renews nothing when it is over a TTL old.
    pub(crate) async fn keepalive(
        &self,
        node: &str,
        worker_ttl: Duration,
        heard_ms: u64,
        workers: impl IntoIterator<Item = String>,
    ) -> Result<Renewal> {
        let ka = self.maps.keepalive.keys_info();
        let nodes = self.maps.nodes.keys_info();
        let cleanup = self.maps.cleanup.keys_info();
        let mut keys = self.maps.base_keys();
        keys.extend([
            ka.hash.clone(),
            ka.revision.clone(),
            nodes.hash.clone(),
            nodes.revision.clone(),
            cleanup.hash.clone(),
            cleanup.revision.clone(),
        ]);
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(ka.channel.clone()),
            Value::from(nodes.channel.clone()),
            Value::from(node),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(cleanup.channel.clone()),
            Value::from(heard_ms.to_string()),
        ]);
        args.extend(workers.into_iter().map(Value::from));
        let reply: Vec<Value> = self
            .scripts
            .keepalive
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let server_ms = reply
            .first()
            .and_then(|v| v.as_string())
            .and_then(|s| s.parse().ok())
            .unwrap_or_default();
        // The refusal is the integer 0 in place of the lists.
        let unheard = matches!(reply.get(1), Some(Value::Integer(_)));
        let ids = |at: usize| -> Vec<String> {
            match reply.get(at) {
                Some(Value::Array(ids)) => ids.iter().filter_map(|v| v.as_string()).collect(),
                _ => Vec::new(),
            }
        };
        let (unknown, claimed) = (ids(1), ids(2));
        Ok(Renewal {
            server_ms,
            unknown,
            claimed,
            unheard,
        })
    }

    /// Re-asserts that `worker` runs (or holds suspended) job `key` with
    /// `token`; `stored` is the job's stored payload, restored if missing.
    pub(crate) async fn reassert(
        &self,
        key: &str,
        worker: &str,
        token: u64,
        stored: Bytes,
        state: Reassert,
        worker_ttl: Duration,
    ) -> Result<Reasserted> {
        let job = ReassertJob {
            key,
            token,
            stored,
            state,
        };
        let mut outcomes = self.reassert_batch(worker, vec![job], worker_ttl).await?;
        Ok(outcomes.remove(0))
    }

    /// Re-asserts every job of `jobs` for `worker` in one call of
    /// `reassert.lua`, each as [`reassert`](Self::reassert) would; one
    /// outcome per job, in order.
    pub(crate) async fn reassert_batch(
        &self,
        worker: &str,
        jobs: Vec<ReassertJob<'_>>,
        worker_ttl: Duration,
    ) -> Result<Vec<Reasserted>> {
        const WHAT: &str = "reassert reply";
        let count = jobs.len();
        let suspended = if self.diverged() {
            "yielding"
        } else {
            "suspended"
        };
        let mut args = self.maps.base_args();
        args.reserve(2 + 4 * count);
        args.push(Value::from(worker));
        args.push(Value::from(worker_ttl.as_millis().to_string()));
        for job in jobs {
            args.extend([
                Value::from(job.key),
                Value::from(job.token.to_string()),
                Value::Bytes(job.stored),
                Value::from(match job.state {
                    Reassert::Running => "running",
                    Reassert::Suspended => suspended,
                }),
            ]);
        }
        let mut keys = self.maps.base_keys();
        keys.push(keys::orphan_marks(&self.pool));
        let statuses: Vec<Value> = self
            .scripts
            .reassert
            .run(&self.client, keys, args, self.timeout)
            .await?;
        call::statuses(WHAT, count, &statuses, Reasserted::parse)
    }

    /// Takes job `key` back for `worker` with a new token, if it still owns
    /// it, no cleaner claimed the worker and the pool is not recovering
    /// (`worker_ttl`: the recovery window a script that finds the pool's
    /// epoch gone opens).
    pub(crate) async fn resume(
        &self,
        key: &str,
        worker: &str,
        worker_ttl: Duration,
    ) -> Result<Resumed> {
        let mut keys = self.maps.base_keys();
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(self.maps.keepalive_revision_key());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(worker),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
        ]);
        let reply: Value = self
            .scripts
            .resume
            .run(&self.client, keys, args, self.timeout)
            .await?;
        if let Some(token) = reply.as_u64() {
            return Ok(Resumed::Token(token));
        }
        let word = reply.as_string().unwrap_or_default();
        match ResumeRefused::parse(&word)? {
            ResumeRefused::Moved => Ok(Resumed::Moved),
            ResumeRefused::Claimed => Ok(Resumed::Claimed),
            ResumeRefused::Recovering => Ok(Resumed::Recovering),
        }
    }

    /// Takes the cleanup claim on `worker` for `node` if Redis says it is
    /// dead (keep-alive older than `worker_ttl` on server time).
    pub(crate) async fn claim_cleanup(
        &self,
        worker: &str,
        node: &str,
        worker_ttl: Duration,
        floor_ms: u64,
    ) -> Result<DeadWorkerClaim> {
        const WHAT: &str = "claim_cleanup reply";
        let cleanup = self.maps.cleanup.keys_info();
        let mut keys = self.maps.base_keys();
        keys.extend([
            self.maps.keepalive.keys_info().hash.clone(),
            cleanup.hash.clone(),
            cleanup.revision.clone(),
            self.maps.keepalive_revision_key(),
        ]);
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(cleanup.channel.as_str()),
            Value::from(worker),
            Value::from(node),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
            Value::from(floor_ms.to_string()),
        ]);
        let reply: Value = self
            .scripts
            .claim_cleanup
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let (status, rest) = status_reply(WHAT, reply)?;
        Ok(DeadWorkerClaim {
            status: ClaimStatus::parse(&status)?,
            silent_ms: rest.first().and_then(Value::as_u64).unwrap_or(0),
        })
    }

    /// Removes `worker`'s registration, keep-alive, cleanup claim and inbox
    /// (stream key `inbox`) once the inbox is empty.
    pub(crate) async fn remove_worker(
        &self,
        worker: &str,
        inbox: &str,
        cleaner: Option<&str>,
    ) -> Result<Removed> {
        let ka = self.maps.keepalive.keys_info();
        let cl = self.maps.cleanup.keys_info();
        let mut keys = self.maps.base_keys();
        keys.extend([
            ka.hash.clone(),
            ka.revision.clone(),
            cl.hash.clone(),
            cl.revision.clone(),
            inbox.to_string(),
        ]);
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(ka.channel.clone()),
            Value::from(cl.channel.clone()),
            Value::from(worker),
            Value::from(cleaner.unwrap_or("")),
        ]);
        let status: String = self
            .scripts
            .remove_worker
            .run(&self.client, keys, args, self.timeout)
            .await?;
        Removed::parse(&status)
    }

    /// Sets (`drain`) or clears the drain mark of `worker` in its record.
    pub(crate) async fn set_drained(&self, worker: &str, drain: bool) -> Result<DrainMark> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(worker),
            Value::from(if drain { "drain" } else { "undrain" }),
        ]);
        let status: String = self
            .scripts
            .drain_worker
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        DrainMark::parse(&status)
    }

    /// Opens the recovery window of `worker_ttl` (Redis went back in time).
    pub(crate) async fn begin_recovery(&self, worker_ttl: Duration) -> Result<Recovery> {
        let args = self.maps.base_args_with_ttl(worker_ttl);
        let status: String = self
            .scripts
            .begin_recovery
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        Recovery::parse(&status)
    }

    /// Sets (`reconciling`) or clears node `node`'s recovery mark, which
    /// holds the recovery window open for `worker_ttl` from now (see
    /// `recovery_mark.lua`).
    pub(crate) async fn recovery_mark(
        &self,
        node: &str,
        worker_ttl: Duration,
        reconciling: bool,
    ) -> Result<RecoveryMark> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(node),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(if reconciling { "set" } else { "clear" }),
        ]);
        let status: String = self
            .scripts
            .recovery_mark
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        RecoveryMark::parse(&status)
    }

    /// Drops the jobs-map `record` of job `key` (and its payload, unless a
    /// newer run of the key was issued since) if it is unchanged.
    pub(crate) async fn release_stale(
        &self,
        key: &str,
        record: &str,
        handed_on: bool,
    ) -> Result<Released> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(record),
            Value::from_static_str(if handed_on { "handed" } else { "" }),
        ]);
        let status: String = self
            .scripts
            .release_stale
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        Released::parse(&status)
    }

    /// Drops `worker`'s ownership of job `key`, keeping its payload for the
    /// orphan sweep, if Redis still records `worker` as its owner and, for
    /// a cleanup on node `cleaner`, its claim on `worker` is still its own.
    pub(crate) async fn release_owner(
        &self,
        key: &str,
        worker: &str,
        cleaner: Option<&str>,
    ) -> Result<Released> {
        let mut keys = self.maps.base_keys();
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(worker),
            Value::from(cleaner.unwrap_or("")),
        ]);
        let status: String = self
            .scripts
            .release_owner
            .run(&self.client, keys, args, self.timeout)
            .await?;
        Released::parse(&status)
    }
}
