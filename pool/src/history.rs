//! A pool's recent history: per-node event counts, flushed once a second
//! into a capped Redis stream, for dashboards such as `poolctl serve`.
//!
//! Every node counts the events it takes part in — dispatches that returned
//! `Ok`, handler starts and stops, dead workers it cleaned up, jobs it moved
//! (rebalance handoffs and requeues of a dead worker's jobs) — with relaxed
//! atomic adds: nothing on the dispatch path talks to Redis. A background
//! task of the node flushes the counts once a second with one `XADD` to
//! `fl:{pool}:history`, and sends nothing in a second with no event, so an
//! idle pool costs nothing. The stream is trimmed with `MINID ~` to the last
//! hour; entry ids are Redis server time, so the window never depends on a
//! machine's clock (I5), and the stream holds at most 3,600 entries per
//! node.
//!
//! A failed flush gives its counts back to the counters, so they go out
//! with the next one; counts are approximate by design (a node killed
//! between two flushes loses up to a second of them) and are never used to
//! decide anything.
//!
//! # Examples
//! ```no_run
//! use std::time::Duration;
//! use flotilla_pool::history;
//!
//! # async fn demo(client: fred::prelude::Client) -> flotilla_pool::Result<()> {
//! let hour = history::read(&client, "billing", None, Duration::from_secs(3600)).await?;
//! let dispatches: u64 = hour.entries.iter().map(|e| e.counts.dispatches).sum();
//! println!("{dispatches} dispatches in the last hour");
//! // Later: only what was added since.
//! let newer = history::read(&client, "billing", hour.last_id.as_deref(), Duration::ZERO).await?;
//! # let _ = newer;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use fred::types::streams::{XCap, XCapKind, XCapTrim};

use crate::error::{Error, Result, from_redis};
use crate::keys;

/// How often a node flushes its counts.
const FLUSH_PERIOD: Duration = Duration::from_secs(1);
/// How far back the stream keeps entries.
pub const WINDOW: Duration = Duration::from_secs(3600);
/// Entries fetched per `XRANGE` page by [`read`].
const PAGE: u64 = 1000;
/// Most entries one [`read`] returns (an hour of 100 busy nodes).
const MAX_ENTRIES: usize = 360_000;

/// Events counted per node and flushed to the history stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolEvent {
    /// A dispatch returned `Ok`.
    Dispatch = 0,
    /// A handler's `start` succeeded.
    Start = 1,
    /// A job stopped (handler `stop`, or a pending job stopped before it ran).
    Stop = 2,
    /// This node found a worker dead and cleaned it up.
    DeadWorker = 3,
    /// A job moved: a rebalance handoff or a requeue of a dead worker's job.
    Move = 4,
}

/// Field names of a stream entry, in [`PoolEvent`] order.
const FIELDS: [&str; 5] = ["d", "s", "p", "x", "m"];

/// Counts of one flush (or of a sum of flushes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventCounts {
    /// Dispatches that returned `Ok`.
    pub dispatches: u64,
    /// Handler starts.
    pub starts: u64,
    /// Jobs stopped.
    pub stops: u64,
    /// Dead workers cleaned up.
    pub dead_workers: u64,
    /// Jobs moved to another worker (handoffs and requeues).
    pub moves: u64,
}

/// One flush of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HistoryEntry {
    /// The stream entry id (`<server ms>-<seq>`).
    pub id: String,
    /// Redis server time of the flush, ms since the epoch.
    pub at_ms: u64,
    /// The node that flushed.
    pub node: String,
    /// What happened on that node in the second before.
    pub counts: EventCounts,
}

/// The result of [`read`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct History {
    /// Entries, oldest first.
    pub entries: Vec<HistoryEntry>,
    /// Id of the newest entry read (pass it to the next [`read`]), or the
    /// one passed in when nothing newer was found.
    pub last_id: Option<String>,
    /// Entries that did not decode (logged, left out).
    pub malformed: usize,
}

/// A node's event counters (relaxed atomics: a count is a statistic).
#[derive(Debug, Default)]
pub(crate) struct Counters([AtomicU64; 5]);

impl EventCounts {
    /// Whether every count is zero.
    pub fn is_empty(&self) -> bool {
        *self == EventCounts::default()
    }

    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &EventCounts) {
        self.dispatches += other.dispatches;
        self.starts += other.starts;
        self.stops += other.stops;
        self.dead_workers += other.dead_workers;
        self.moves += other.moves;
    }

    fn as_array(&self) -> [u64; 5] {
        [
            self.dispatches,
            self.starts,
            self.stops,
            self.dead_workers,
            self.moves,
        ]
    }

    fn from_array(a: [u64; 5]) -> EventCounts {
        EventCounts {
            dispatches: a[0],
            starts: a[1],
            stops: a[2],
            dead_workers: a[3],
            moves: a[4],
        }
    }
}

impl Counters {
    /// Counts one event.
    pub(crate) fn count(&self, event: PoolEvent) {
        self.0[event as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a dispatch when it returned `Ok`.
    pub(crate) fn dispatched(&self, ok: bool) {
        if ok {
            self.count(PoolEvent::Dispatch);
        }
    }

    /// Takes the counts, leaving zeros.
    fn take(&self) -> EventCounts {
        EventCounts::from_array(std::array::from_fn(|i| {
            self.0[i].swap(0, Ordering::Relaxed)
        }))
    }

    /// Gives back counts a failed flush could not write.
    fn give_back(&self, counts: &EventCounts) {
        for (slot, n) in self.0.iter().zip(counts.as_array()) {
            slot.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Starts the node's flush task (owned by the node's task tracker, ended by
/// its cancellation token).
pub(crate) fn spawn_flusher(
    tasks: &tokio_util::task::TaskTracker,
    cancel: tokio_util::sync::CancellationToken,
    store: crate::store::PoolStore,
    node_id: String,
    counters: Arc<Counters>,
) {
    tasks.spawn(flush_loop(Flusher {
        store,
        node_id,
        counters,
        cancel,
    }));
}

/// What the flush task needs of its node.
struct Flusher {
    store: crate::store::PoolStore,
    node_id: String,
    counters: Arc<Counters>,
    cancel: tokio_util::sync::CancellationToken,
}

async fn flush_loop(f: Flusher) {
    let key = keys::history(&f.store.pool);
    let mut ticks = tokio::time::interval(FLUSH_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Server time of the last entry written: the trim threshold follows it,
    // so no local clock is involved.
    let mut last_ms = 0u64;
    loop {
        tokio::select! {
            _ = f.cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let counts = f.counters.take();
        if counts.is_empty() {
            continue;
        }
        match flush(&f, &key, last_ms, &counts).await {
            Ok(at_ms) => last_ms = at_ms,
            Err(e) => {
                tracing::debug!(pool = %f.store.pool, error = %e, "history flush failed; counts kept for the next one");
                f.counters.give_back(&counts);
            }
        }
    }
}

async fn flush(f: &Flusher, key: &str, last_ms: u64, counts: &EventCounts) -> Result<u64> {
    let min_id = last_ms.saturating_sub(WINDOW.as_millis() as u64);
    let cap = XCap::try_from((XCapKind::MinID, XCapTrim::AlmostExact, min_id.to_string()))
        .map_err(from_redis)?;
    let mut fields: Vec<(&str, String)> = vec![("n", f.node_id.clone())];
    fields.extend(
        FIELDS
            .iter()
            .zip(counts.as_array())
            .map(|(f, n)| (*f, n.to_string())),
    );
    let id: String = crate::store::call::bounded(
        f.store.timeout,
        "history flush",
        f.store.client.xadd(key, false, cap, "*", fields),
    )
    .await?;
    entry_ms(&id).ok_or_else(|| Error::Malformed {
        what: "history entry id",
        reason: format!("{id:?}"),
    })
}

/// Reads `pool`'s history: the entries after `after` (an id from a
/// previous read), or, without one, those of the last `window` of Redis
/// server time. Paged with `XRANGE … COUNT`; at most a few hundred thousand
/// entries per call. Read-only.
///
/// # Errors
/// [`Error::InvalidName`] for a bad pool name, Redis errors.
pub async fn read(
    client: &Client,
    pool: &str,
    after: Option<&str>,
    window: Duration,
) -> Result<History> {
    crate::keys::check_name("pool name", pool)?;
    let key = keys::history(pool);
    let mut start = match after {
        Some(id) => format!("({id}"),
        None => {
            let now = crate::inspect::server_time_ms(client).await?;
            now.saturating_sub(window.as_millis() as u64).to_string()
        }
    };
    let mut out = History {
        last_id: after.map(str::to_string),
        ..History::default()
    };
    loop {
        let page: Vec<(String, HashMap<String, String>)> = client
            .xrange(&key, start.as_str(), "+", Some(PAGE))
            .await
            .map_err(from_redis)?;
        let full = page.len() as u64 == PAGE;
        for (id, fields) in page {
            start = format!("({id}");
            match decode(&id, &fields) {
                Some(entry) => out.entries.push(entry),
                None => {
                    tracing::warn!(pool, id, "history entry does not decode; left out");
                    out.malformed += 1;
                }
            }
            out.last_id = Some(id);
        }
        if !full || out.entries.len() >= MAX_ENTRIES {
            return Ok(out);
        }
    }
}

fn decode(id: &str, fields: &HashMap<String, String>) -> Option<HistoryEntry> {
    let mut counts = [0u64; 5];
    for (slot, name) in counts.iter_mut().zip(FIELDS) {
        *slot = match fields.get(name) {
            Some(v) => v.parse().ok()?,
            None => 0,
        };
    }
    Some(HistoryEntry {
        id: id.to_string(),
        at_ms: entry_ms(id)?,
        node: fields.get("n")?.clone(),
        counts: EventCounts::from_array(counts),
    })
}

/// The server time part of a stream id.
fn entry_ms(id: &str) -> Option<u64> {
    id.split_once('-').map_or(id, |(ms, _)| ms).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_and_give_back() {
        let c = Counters::default();
        c.count(PoolEvent::Dispatch);
        c.count(PoolEvent::Dispatch);
        c.count(PoolEvent::Move);
        let taken = c.take();
        assert_eq!((taken.dispatches, taken.moves, taken.starts), (2, 1, 0));
        assert!(c.take().is_empty());
        c.give_back(&taken);
        c.count(PoolEvent::Stop);
        let again = c.take();
        assert_eq!((again.dispatches, again.moves, again.stops), (2, 1, 1));
    }

    #[tokio::test]
    async fn a_node_flushes_its_counts_once_a_second_and_nothing_when_idle() {
        use fred::prelude::StreamsInterface;
        let server = flotilla_testkit::RedisServer::start()
            .expect("redis-server must be installed (apt-get install redis-server)");
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        let pool = flotilla_testkit::unique_name("history");
        let node = crate::Node::join(&client, &pool, crate::NodeOptions::default())
            .await
            .unwrap();
        let _worker = crate::Worker::new(
            &node,
            crate::TaskHandler::new(|_job, cancel| async move {
                cancel.cancelled().await;
                Ok(())
            }),
        )
        .await
        .unwrap();
        for key in ["a", "b", "c"] {
            node.dispatch_job(key, &b""[..]).await.unwrap();
        }
        node.stop_job("b").await.unwrap();
        // Read incrementally (after the last id) until every event is in.
        let mut total = EventCounts::default();
        let mut last: Option<String> = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while (total.dispatches, total.starts, total.stops) != (3, 3, 1) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "counts not flushed within 10 s: {total:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            let h = read(&client, &pool, last.as_deref(), WINDOW).await.unwrap();
            assert_eq!(h.malformed, 0);
            for e in &h.entries {
                assert_eq!(e.node, node.id());
                total.add(&e.counts);
            }
            last = h.last_id;
        }
        // Idle: no new entry over two flush periods.
        let before: u64 = client.xlen(keys::history(&pool)).await.unwrap();
        tokio::time::sleep(FLUSH_PERIOD * 2 + Duration::from_millis(200)).await;
        let after: u64 = client.xlen(keys::history(&pool)).await.unwrap();
        assert_eq!(before, after, "an idle node wrote history");
        let newer = read(&client, &pool, last.as_deref(), Duration::ZERO)
            .await
            .unwrap();
        assert!(newer.entries.is_empty());
        node.close().await.unwrap();
    }

    #[test]
    fn entries_decode_or_are_refused() {
        let mut fields: HashMap<String, String> = [("n", "n-1"), ("d", "7"), ("x", "1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let e = decode("1700000000123-4", &fields).unwrap();
        assert_eq!(e.at_ms, 1_700_000_000_123);
        assert_eq!((e.counts.dispatches, e.counts.dead_workers), (7, 1));
        fields.insert("s".into(), "many".into());
        assert!(decode("1-0", &fields).is_none());
        fields.remove("s");
        fields.remove("n");
        assert!(decode("1-0", &fields).is_none());
        assert_eq!(entry_ms("oops"), None);
    }
}
