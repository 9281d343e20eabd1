//! The pool's Redis protocol, in one place: the replicated maps a node
//! joins, every Lua script of the pool with one typed method each (KEYS
//! and ARGV are built here alone, from named arguments), the replies
//! parsed once into enums (a status a script does not return is an
//! [`Error::Malformed`](crate::error::Error::Malformed)), and the few plain
//! commands the pool sends.
//!
//! ```text
//! dispatch, worker, cleanup, lease,      PoolStore::admit / claim_start / handoff / …
//! rebalance, membership, rollback,  ──▶  (KEYS + ARGV by position, one timed call,  ──▶ Redis
//! admission and start batches            reply → enum, unknown → Malformed)
//!                        locks, tickers ──▶ call::script (the same timed runner)
//! ```
//!
//! The scripts (`scripts/*.lua`) are the functions of one Redis function
//! library whose top level is the rmap and streaming preludes and
//! `scripts/base.lua` (`registry.rs`); base.lua's header names the KEYS and
//! ARGV every script shares, and each script's header the ones of its own,
//! which the method of the same name follows.

mod admit;
pub(crate) mod call;
mod custody;
mod jobs;
mod lifecycle;
mod maps;
mod reads;
pub(crate) mod records;
mod registry;
mod stands;
mod starts;
mod sweep;
#[cfg(test)]
mod tests;
mod workers;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;

pub(crate) use admit::{Admission, AdmitLimits, Admitted, Forgot};
pub(crate) use custody::Entrusted;
pub(crate) use jobs::{
    Dropped, EntryMove, Handoff, Moved, Mover, OwnerRequest, Receiver, Requeue, Routed, StopDone,
};
pub(crate) use lifecycle::{EndArgs, EndRecorded, Restarted};
pub(crate) use maps::PoolMaps;
pub(crate) use stands::{HandoffStands, StopKind, StopStands};
pub(crate) use starts::{Answer, Claimed, StartKept, StartToRecord};
pub(crate) use sweep::{Cursor, OrphanRequeue, START as SCAN_START};
pub(crate) use workers::{
    ClaimStatus, DeadWorkerClaim, DrainMark, Reassert, ReassertJob, Reasserted, RecoveryMark,
    Released, Removed, Renewal, Resumed,
};

use crate::error::Result;
use crate::keys;
use call::bounded;
use registry::Scripts;

/// Every node shares the compiled scripts (the same text, the same SHA).
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(Scripts::new);

/// A node's handle on its pool in Redis: client, the pool's maps, the
/// scripts and the deadline of every call. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct PoolStore {
    pub(crate) client: Client,
    pub(crate) pool: Arc<str>,
    pub(crate) maps: PoolMaps,
    scripts: &'static Scripts,
    /// Deadline of every call (the node's `redis_timeout`).
    pub(crate) timeout: Duration,
    /// The server this node last checked (`went_back` in the scripts
    /// compares it); `None` until the first check.
    known_server: Arc<std::sync::Mutex<Option<ServerIdentity>>>,
    /// Until when suspended jobs re-assert yielding (`reassert.lua`
    /// 'yielding': never over another run's record or guard). Set when the
    /// node learns that a server it wrote to was a primary that stalled
    /// through its failover: tokens it took there came from that server's
    /// clock on a branch the promoted side never saw, so a larger one says
    /// nothing about which run is newer.
    diverged_until: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

/// An identity read by `server_identity_since` (`server_id.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdentityRead {
    /// The server read.
    pub(crate) server: ServerIdentity,
    /// The caller named another server, and the recovery window was opened
    /// by the read (or found open).
    pub(crate) window_opened: bool,
}

/// Who the Redis server holding the pool's keys is (`server_id.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerIdentity {
    /// Changes when the server restarts or another one takes over.
    pub(crate) run_id: String,
    /// The generation of the pool's data: made when missing, so it changes
    /// when Redis lost the pool's data, also on a server that kept running
    /// (a `FLUSHALL`, deleted keys), which no run id shows.
    pub(crate) generation: String,
}

impl PoolStore {
    /// Has suspended jobs re-assert yielding for `window` from now (see
    /// `PoolStore::diverged_until`).
    pub(crate) fn diverged_for(&self, window: Duration) {
        let until = tokio::time::Instant::now() + window;
        let mut at = self
            .diverged_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *at = Some(at.map_or(until, |t| t.max(until)));
    }

    /// Whether suspended jobs re-assert yielding now.
    pub(crate) fn diverged(&self) -> bool {
        self.diverged_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| tokio::time::Instant::now() < t)
    }

    /// Joins the maps of `pool` (the jobs and pending maps only when
    /// `mirror_jobs`).
    pub(crate) async fn join(
        client: &Client,
        pool: &str,
        timeout: Duration,
        mirror_jobs: bool,
    ) -> Result<Self> {
        let maps = PoolMaps::join(client, pool, mirror_jobs).await?;
        Ok(PoolStore {
            client: client.clone(),
            pool: Arc::from(pool),
            maps,
            scripts: &SCRIPTS,
            timeout,
            known_server: Arc::default(),
            diverged_until: Arc::default(),
        })
    }

    /// The highest revisions this node has seen (see
    /// [`PoolMaps::seen_revisions`]): scripts that admit, route or record
    /// starts pass them, so the first of them after Redis went back in time
    /// opens the recovery window itself, before any replica noticed (see
    /// `went_back` in `scripts/base.lua`).
    pub(crate) fn revision_floor(&self) -> String {
        let known = self.known_server.lock().unwrap_or_else(|e| e.into_inner());
        match known.as_ref() {
            Some(server) => format!("{} {}", self.maps.seen_revisions(), server.run_id),
            None => format!("{} -", self.maps.seen_revisions()),
        }
    }

    /// Records the server this node checked last (its scripts then compare
    /// Redis with it).
    pub(crate) fn note_server(&self, server: ServerIdentity) {
        *self.known_server.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
    }

    /// The server this node noted last (see [`Self::note_server`]), read
    /// without waiting for an identity check under way.
    pub(crate) fn noted_server(&self) -> Option<ServerIdentity> {
        self.known_server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Creates the pool's epoch unless it exists (see `recovering` in
    /// `scripts/base.lua`): created with the pool, gone when Redis loses its
    /// data. A join that finds it gone on a server that held it (a
    /// `FLUSHALL`) opens the recovery window instead (`create_epoch.lua`);
    /// returns whether it did.
    pub(crate) async fn create_epoch(&self, worker_ttl: Duration) -> Result<bool> {
        let args = self.maps.base_args_with_ttl(worker_ttl);
        let opened: i64 = self
            .scripts
            .create_epoch
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        Ok(opened == 1)
    }

    /// Records `node`'s `info` (a JSON object) with its join time on server
    /// time, for inspectors.
    pub(crate) async fn record_node(&self, node: &str, info: &str) -> Result<()> {
        let _: u64 = self
            .scripts
            .node_info
            .run(
                &self.client,
                vec![keys::node_info(&self.pool)],
                vec![
                    fred::types::Value::from(node),
                    fred::types::Value::from(info),
                ],
                self.timeout,
            )
            .await?;
        Ok(())
    }

    /// The identity of the Redis server holding the pool's keys: a new run
    /// id means that server restarted or another took over, and may have
    /// lost writes. When the pool's scripts last ran on another server and
    /// none has seen the change yet, this opens the recovery window for
    /// `worker_ttl` (see `server_id.lua`).
    pub(crate) async fn server_identity(&self, worker_ttl: Duration) -> Result<ServerIdentity> {
        Ok(self.server_identity_since(worker_ttl, None).await?.server)
    }

    /// [`server_identity`](Self::server_identity), for a caller that
    /// checked `known` last: when the server is not that one (another run
    /// id or generation), the same call opens the recovery window for
    /// `worker_ttl` (or finds it open), as
    /// [`begin_recovery`](Self::begin_recovery) would.
    pub(crate) async fn server_identity_since(
        &self,
        worker_ttl: Duration,
        known: Option<&ServerIdentity>,
    ) -> Result<IdentityRead> {
        const WHAT: &str = "server_id reply";
        let mut args = self.maps.base_args_with_ttl(worker_ttl);
        args.push(fred::types::Value::from(
            known.map_or_else(String::new, |k| format!("{} {}", k.run_id, k.generation)),
        ));
        let reply: String = self
            .scripts
            .server_id
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        let malformed = || crate::error::Error::Malformed {
            what: WHAT,
            reason: format!("{reply:?}"),
        };
        let (identity, window) = reply.rsplit_once(' ').ok_or_else(malformed)?;
        let (run_id, generation) = identity.split_once(' ').ok_or_else(malformed)?;
        if run_id.is_empty() || generation.is_empty() {
            return Err(malformed());
        }
        let window_opened = match window {
            "opened" | "open" => true,
            "-" => false,
            _ => return Err(malformed()),
        };
        Ok(IdentityRead {
            server: ServerIdentity {
                run_id: run_id.to_string(),
                generation: generation.to_string(),
            },
            window_opened,
        })
    }

    /// Removes `node`'s info (it left, or was found gone).
    pub(crate) async fn forget_node(&self, node: &str) -> Result<()> {
        let _: i64 = bounded(
            self.timeout,
            "forget node",
            self.client.hdel(keys::node_info(&self.pool), node),
        )
        .await?;
        Ok(())
    }

    /// The stored payload (`"<admitted> <body>"`) of a running or pending
    /// job.
    pub(crate) async fn payload(&self, key: &str) -> Result<Option<Bytes>> {
        bounded(
            self.timeout,
            "read payload",
            self.client.hget(self.maps.payloads_key(), key),
        )
        .await
    }

    /// Redis server time in ms.
    pub(crate) async fn server_time_ms(&self) -> Result<u64> {
        call::server_time_ms(&self.client).await
    }

    /// Deletes every key of the pool, by SCAN pages.
    pub(crate) async fn delete_pool_keys(&self) -> Result<()> {
        let pattern = keys::pool_pattern(&self.pool);
        let mut cursor = "0".to_string();
        loop {
            let (next, found): (String, Vec<String>) = self
                .client
                .scan_page(cursor.clone(), pattern.clone(), Some(500), None)
                .await
                .map_err(call::from_redis)?;
            if !found.is_empty() {
                let _: i64 = self.client.del(found).await.map_err(call::from_redis)?;
            }
            if next == "0" {
                break;
            }
            cursor = next;
        }
        // The server remembers the pools whose epoch it held, to tell a
        // loss from a new pool at the next join; this one is gone on
        // purpose.
        let _: i64 = self
            .scripts
            .forget_pool
            .run(
                &self.client,
                self.maps.base_keys(),
                self.maps.base_args(),
                self.timeout,
            )
            .await?;
        Ok(())
    }
}
