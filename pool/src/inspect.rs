//! Read-only inspection of a pool's state in Redis, for tools such as
//! `poolctl`.
//!
//! The pool owns its Redis formats; this module is the one public way to
//! decode them without joining the pool. Everything here uses read
//! commands only (`HGETALL`, `HGET`, `HMGET`, `HLEN`, `SCAN`, `XLEN`,
//! `XINFO`, `TIME`, `PTTL`): inspecting a pool never writes to Redis, never
//! subscribes and never disturbs its nodes.
//!
//! * [`PoolSnapshot::read`]: workers (with keep-alive, cleanup claim and job
//!   count), nodes, jobs, pending dispatches, cleanup claims, the shutdown
//!   flag, inbox and reply stream lengths, and the Redis server time they
//!   were read at.
//! * [`job_payload`] / [`payload_summaries`]: a job's stored payload and
//!   admission time.
//! * [`job_failure`] / [`job_failures`]: jobs restarting after a failure
//!   or failed for good.
//! * [`list_pools`], [`locks`], [`streams`]: discovery by `SCAN`.
//! * [`placement`]: which worker the ring would choose for a key, and the
//!   score of every candidate.
//!
//! The maps are read one after another (pipelined), not in one atomic
//! step, so a snapshot of a busy pool may show a job whose owner has just
//! left. Times are Redis server time, so ages never compare two machines'
//! clocks.
//!
//! # Examples
//! ```no_run
//! use std::time::Duration;
//! use flotilla_pool::inspect::{self, PoolSnapshot};
//!
//! # async fn demo(client: fred::prelude::Client) -> flotilla_pool::Result<()> {
//! for pool in inspect::list_pools(&client).await? {
//!     println!("pool {} ({} keys)", pool.name, pool.keys);
//! }
//! let snap = PoolSnapshot::read(&client, "billing").await?;
//! for w in &snap.workers {
//!     let state = w.state(snap.server_time_ms, Duration::from_secs(30));
//!     println!("{} on {}: {} jobs, {}", w.id, w.host, w.jobs, state.as_str());
//! }
//! if let Some(best) = inspect::placement(&snap, "customer-42").first() {
//!     println!("customer-42 would go to {}", best.worker);
//! }
//! # Ok(()) }
//! ```

mod discover;
mod failures;
mod records;

use bytes::Bytes;
use flotilla_rmap::MapKeys;
use flotilla_streaming::{Stream, StreamOptions};
use fred::prelude::*;

use crate::error::{Error, Result, from_redis};
use crate::routing::{Ring, hash64, mix};
use crate::{codec, keys};

pub use discover::{
    ConsumerGroupInfo, LockRecord, PoolSummary, StreamDetail, list_pools, locks, streams,
};
pub use failures::{JobFailure, JobFailureState, job_failure, job_failures};
pub use records::{
    CleanupClaim, JobRecord, MalformedField, NodeRecord, PendingRecord, WorkerRecord, WorkerState,
};

use records::{Decoded, RawMap, RawMaps};

/// Most payloads fetched by one `HMGET`.
const PAYLOAD_CHUNK: usize = 32;

/// One consistent-enough read of a pool's state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolSnapshot {
    /// The pool's name.
    pub pool: String,
    /// Redis server time (ms since the epoch) when the snapshot was read.
    pub server_time_ms: u64,
    /// Registered workers, oldest registration first.
    pub workers: Vec<WorkerRecord>,
    /// Nodes with a keep-alive, by id.
    pub nodes: Vec<NodeRecord>,
    /// Running jobs, by key.
    pub jobs: Vec<JobRecord>,
    /// Admitted dispatches not yet started, by key.
    pub pending: Vec<PendingRecord>,
    /// Cleanup claims, by worker.
    pub cleanups: Vec<CleanupClaim>,
    /// The node that requested a pool shutdown, when one is under way.
    pub shutdown_requested_by: Option<String>,
    /// Each registered worker's inbox (queued events), in worker order.
    pub inboxes: Vec<StreamLength>,
    /// Each node's reply stream, in node order.
    pub reply_streams: Vec<StreamLength>,
    /// Stored payloads (running, pending and orphaned jobs).
    pub payloads: u64,
    /// Map fields that did not decode.
    pub malformed: Vec<MalformedField>,
}

/// The length of one of the pool's streams.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamLength {
    /// Worker id (inbox) or node id (reply stream).
    pub owner: String,
    /// The stream's Redis key.
    pub key: String,
    /// Entries in the stream (0 when the key does not exist).
    pub length: u64,
}

/// A job's stored payload.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredPayload {
    /// Job key.
    pub key: String,
    /// Server time (ms) of the job's first admission (`Job::created_at`).
    pub created_at_ms: u64,
    /// The opaque payload bytes.
    pub payload: Bytes,
}

/// Admission time and payload size of a job, without keeping the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PayloadSummary {
    /// Server time (ms) of the job's first admission.
    pub created_at_ms: u64,
    /// Payload size in bytes.
    pub size: usize,
}

/// One candidate of a placement: a worker and its rendezvous score for a
/// key. The highest score wins.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlacementScore {
    /// Worker id.
    pub worker: String,
    /// Rendezvous score of (key, worker).
    pub score: u64,
}

impl PoolSnapshot {
    /// Reads the pool's maps, payload count, stream lengths and the server
    /// time. A pool that does not exist reads as empty.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad pool name, [`Error::Unavailable`]
    /// or [`Error::Redis`] when Redis fails.
    pub async fn read(client: &Client, pool: &str) -> Result<PoolSnapshot> {
        crate::keys::check_name("pool name", pool)?;
        let hgetall = |map: &'static str| async move {
            let keys = MapKeys::new(map, Some(pool))?;
            let raw: RawMap = client.hgetall(keys.hash).await.map_err(from_redis)?;
            Ok::<RawMap, Error>(raw)
        };
        let (workers, keepalive, cleanup, jobs, pending, nodes, shutdown) = tokio::try_join!(
            hgetall(keys::WORKERS_MAP),
            hgetall(keys::KEEPALIVE_MAP),
            hgetall(keys::CLEANUP_MAP),
            hgetall(keys::JOBS_MAP),
            hgetall(keys::PENDING_MAP),
            hgetall(keys::NODES_MAP),
            hgetall(keys::SHUTDOWN_MAP),
        )?;
        let payloads: u64 = client
            .hlen(keys::payloads(pool))
            .await
            .map_err(from_redis)?;
        let node_info: RawMap = client
            .hgetall(keys::node_info(pool))
            .await
            .map_err(from_redis)?;
        let server_time_ms = server_time_ms(client).await?;
        let raw = RawMaps {
            workers,
            keepalive,
            cleanup,
            jobs,
            pending,
            nodes,
            node_info,
        };
        let decoded = Decoded::from_raw(&raw);
        let inbox_owners: Vec<String> = decoded.workers.iter().map(|w| w.id.clone()).collect();
        let node_owners: Vec<String> = decoded.nodes.iter().map(|n| n.id.clone()).collect();
        let (inboxes, reply_streams) = tokio::try_join!(
            stream_lengths(client, pool, &inbox_owners, keys::worker_inbox),
            stream_lengths(client, pool, &node_owners, keys::node_replies),
        )?;
        Ok(PoolSnapshot {
            pool: pool.to_string(),
            server_time_ms,
            workers: decoded.workers,
            nodes: decoded.nodes,
            jobs: decoded.jobs,
            pending: decoded.pending,
            cleanups: decoded.cleanups,
            shutdown_requested_by: shutdown.get(keys::SHUTDOWN_FLAG).cloned(),
            inboxes,
            reply_streams,
            payloads,
            malformed: decoded.malformed,
        })
    }

    /// Whether the pool has no state at all (no worker, node, job, pending
    /// dispatch or payload).
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
            && self.nodes.is_empty()
            && self.jobs.is_empty()
            && self.pending.is_empty()
            && self.payloads == 0
    }

    /// The ring the pool's nodes route with: registered workers without a
    /// cleanup claim and not drained. (A stale worker stays in it until a
    /// node claims its cleanup.)
    pub fn ring(&self) -> Ring {
        Ring::new(
            self.workers
                .iter()
                .filter(|w| w.cleanup.is_none() && w.drained_at_ms.is_none())
                .map(|w| w.id.clone()),
        )
    }

    /// The worker record with this id.
    pub fn worker(&self, id: &str) -> Option<&WorkerRecord> {
        self.workers.iter().find(|w| w.id == id)
    }

    /// The running job with this key.
    pub fn job(&self, key: &str) -> Option<&JobRecord> {
        self.jobs.iter().find(|j| j.key == key)
    }

    /// Events queued in every inbox together.
    pub fn queued_events(&self) -> u64 {
        self.inboxes.iter().map(|s| s.length).sum()
    }
}

/// Every worker of the snapshot's ring ranked for `key`, best first: the
/// first is the owner a node would choose now
/// ([`Ring::owner`] over [`PoolSnapshot::ring`]).
pub fn placement(snapshot: &PoolSnapshot, key: &str) -> Vec<PlacementScore> {
    let ring = snapshot.ring();
    let kh = hash64(key.as_bytes());
    let mut scores: Vec<PlacementScore> = ring
        .workers()
        .map(|w| PlacementScore {
            worker: w.to_string(),
            // The same score `Ring::owner` maximises (see routing.rs).
            score: mix(kh ^ hash64(w.as_bytes()).rotate_left(17)),
        })
        .collect();
    scores.sort_by(|a, b| b.score.cmp(&a.score).then_with(|| a.worker.cmp(&b.worker)));
    scores
}

/// Redis server time in ms (`TIME`).
///
/// # Errors
/// [`Error::Unavailable`] or [`Error::Redis`] when Redis fails.
pub async fn server_time_ms(client: &Client) -> Result<u64> {
    crate::store::call::server_time_ms(client).await
}

/// A job's stored payload and admission time; `None` when no payload is
/// stored under `key`.
///
/// # Errors
/// [`Error::Malformed`] when the stored value does not decode, Redis
/// errors.
pub async fn job_payload(client: &Client, pool: &str, key: &str) -> Result<Option<StoredPayload>> {
    crate::keys::check_name("pool name", pool)?;
    let raw: Option<Bytes> = client
        .hget(keys::payloads(pool), key)
        .await
        .map_err(from_redis)?;
    let Some(raw) = raw else {
        return Ok(None);
    };
    let (admitted, body) = codec::parse_stored(&raw)?;
    let created_at_ms = codec::stamp_ms(admitted);
    if body.key != key {
        return Err(Error::Malformed {
            what: "stored payload",
            reason: format!("stored under {key:?} but names {:?}", body.key),
        });
    }
    Ok(Some(StoredPayload {
        key: body.key,
        created_at_ms,
        payload: Bytes::from(body.payload),
    }))
}

/// Admission time and payload size of each of `keys` (in order); `None`
/// for a key without a stored payload or whose payload does not decode.
/// Reads in bounded `HMGET` chunks, keeping only the sizes.
///
/// # Errors
/// Redis errors.
pub async fn payload_summaries(
    client: &Client,
    pool: &str,
    keys: &[String],
) -> Result<Vec<Option<PayloadSummary>>> {
    crate::keys::check_name("pool name", pool)?;
    let hash = keys::payloads(pool);
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(PAYLOAD_CHUNK) {
        let values: Vec<Option<Bytes>> = client
            .hmget(hash.clone(), chunk.to_vec())
            .await
            .map_err(from_redis)?;
        out.extend(values.into_iter().map(|v| {
            let (admitted, body) = codec::parse_stored(&v?).ok()?;
            Some(PayloadSummary {
                created_at_ms: codec::stamp_ms(admitted),
                size: body.payload.len(),
            })
        }));
    }
    Ok(out)
}

/// `XLEN` of the pool stream of each owner (0 when missing).
async fn stream_lengths(
    client: &Client,
    pool: &str,
    owners: &[String],
    name: fn(&str) -> String,
) -> Result<Vec<StreamLength>> {
    let mut out = Vec::with_capacity(owners.len());
    // Issued together: fred pipelines concurrent commands on one connection.
    let lengths = futures::future::try_join_all(owners.iter().map(|owner| async move {
        let key = pool_stream_key(client, pool, &name(owner))?;
        let length: u64 = client.xlen(key.clone()).await.map_err(from_redis)?;
        Ok::<_, Error>((key, length))
    }))
    .await?;
    for (owner, (key, length)) in owners.iter().zip(lengths) {
        out.push(StreamLength {
            owner: owner.clone(),
            key,
            length,
        });
    }
    Ok(out)
}

/// The Redis key of the pool stream `name` (laid out by
/// `flotilla-streaming`; creating the handle does no I/O).
fn pool_stream_key(client: &Client, pool: &str, name: &str) -> Result<String> {
    Ok(
        Stream::new(client, name, StreamOptions::default().hash_tag(pool))?
            .key()
            .to_string(),
    )
}

/// Escapes Redis glob metacharacters so `value` matches only itself in a
/// `SCAN MATCH` pattern.
fn glob_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot_with(workers: &[&str], cleaning: &[&str]) -> PoolSnapshot {
        PoolSnapshot {
            pool: "p".into(),
            server_time_ms: 0,
            workers: workers
                .iter()
                .map(|id| WorkerRecord {
                    id: id.to_string(),
                    node: "n".into(),
                    host: "h".into(),
                    pid: 1,
                    created_at_ms: 0,
                    keepalive_ms: Some(0),
                    cleanup: cleaning.contains(id).then(|| CleanupClaim {
                        worker: id.to_string(),
                        node: "n".into(),
                        claimed_at_ms: None,
                    }),
                    // "w-e" is drained: out of the ring like a cleaning one.
                    drained_at_ms: (*id == "w-e").then_some(1),
                    jobs: 0,
                })
                .collect(),
            nodes: vec![],
            jobs: vec![],
            pending: vec![],
            cleanups: vec![],
            shutdown_requested_by: None,
            inboxes: vec![],
            reply_streams: vec![],
            payloads: 0,
            malformed: vec![],
        }
    }

    #[test]
    fn placement_ranks_like_the_ring() {
        let snap = snapshot_with(&["w-a", "w-b", "w-c", "w-d", "w-e"], &["w-c"]);
        let ring = snap.ring();
        assert_eq!(ring.len(), 3);
        for i in 0..500 {
            let key = format!("job-{i}");
            let ranked = placement(&snap, &key);
            assert_eq!(ranked.len(), 3);
            assert_eq!(Some(ranked[0].worker.as_str()), ring.owner(&key));
            assert!(ranked.windows(2).all(|w| w[0].score >= w[1].score));
            assert!(
                ranked
                    .iter()
                    .all(|s| s.worker != "w-c" && s.worker != "w-e")
            );
        }
        assert!(placement(&snapshot_with(&[], &[]), "k").is_empty());
    }

    #[test]
    fn glob_escape_quotes_metacharacters() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("plain-name"), "plain-name");
    }
}
