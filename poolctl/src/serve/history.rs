//! The last hour of the pool's history (`flotilla_pool::history`), kept in
//! memory and extended incrementally: the first read fetches the hour,
//! later ones only the entries added since (`XRANGE` from the last id).

use std::collections::VecDeque;
use std::time::Duration;

use flotilla_pool::history::{self, EventCounts, HistoryEntry, WINDOW};
use fred::prelude::Client;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Width of one chart bucket.
pub(crate) const BUCKET: Duration = Duration::from_secs(10);
/// Shortest time between two reads of the stream.
const MIN_REREAD: Duration = Duration::from_secs(2);

/// The charts' data (`/api/history`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HistorySeries {
    pub(crate) pool: String,
    /// Server time (ms) of the end of the last bucket.
    pub(crate) end_ms: u64,
    pub(crate) bucket_ms: u64,
    /// One value per bucket, oldest first, for each series.
    pub(crate) series: Vec<Series>,
    /// Totals over the hour.
    pub(crate) totals: Totals,
    /// Nodes that wrote history in the hour.
    pub(crate) nodes: usize,
    /// Entries that did not decode.
    pub(crate) malformed: usize,
}

/// One chart.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Series {
    /// `dispatches_per_s`, `starts`, `stops`, `dead_workers`, `moves`.
    pub(crate) name: &'static str,
    /// Label shown on the chart.
    pub(crate) title: &'static str,
    pub(crate) values: Vec<f64>,
}

/// Totals over the window.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Totals {
    pub(crate) dispatches: u64,
    pub(crate) starts: u64,
    pub(crate) stops: u64,
    pub(crate) dead_workers: u64,
    pub(crate) moves: u64,
}

#[derive(Debug, Default)]
struct Kept {
    entries: VecDeque<HistoryEntry>,
    last_id: Option<String>,
    read_at: Option<Instant>,
    malformed: usize,
}

/// The kept hour.
#[derive(Debug)]
pub(crate) struct HistoryCache {
    client: Client,
    pool: String,
    kept: Mutex<Kept>,
}

impl HistoryCache {
    pub(crate) fn new(client: Client, pool: String) -> HistoryCache {
        HistoryCache {
            client,
            pool,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// The series ending at `now_ms` (Redis server time), after reading
    /// what was added since the last read (at most every 2 s).
    ///
    /// # Errors
    /// Redis errors.
    pub(crate) async fn series(&self, now_ms: u64) -> flotilla_pool::Result<HistorySeries> {
        let mut kept = self.kept.lock().await;
        if kept.read_at.is_none_or(|t| t.elapsed() >= MIN_REREAD) {
            let new =
                history::read(&self.client, &self.pool, kept.last_id.as_deref(), WINDOW).await?;
            kept.entries.extend(new.entries);
            kept.last_id = new.last_id;
            kept.malformed += new.malformed;
            kept.read_at = Some(Instant::now());
        }
        let oldest = now_ms.saturating_sub(WINDOW.as_millis() as u64);
        while kept.entries.front().is_some_and(|e| e.at_ms < oldest) {
            kept.entries.pop_front();
        }
        Ok(bucketize(
            &self.pool,
            kept.entries.iter(),
            now_ms,
            kept.malformed,
        ))
    }
}

fn bucketize<'e>(
    pool: &str,
    entries: impl Iterator<Item = &'e HistoryEntry>,
    end_ms: u64,
    malformed: usize,
) -> HistorySeries {
    let bucket_ms = BUCKET.as_millis() as u64;
    let n = (WINDOW.as_millis() as u64 / bucket_ms) as usize;
    let start_ms = end_ms.saturating_sub(n as u64 * bucket_ms);
    let mut buckets = vec![EventCounts::default(); n];
    let mut totals = EventCounts::default();
    let mut nodes = std::collections::HashSet::new();
    for e in entries {
        if e.at_ms < start_ms || e.at_ms >= end_ms {
            continue;
        }
        let i = ((e.at_ms - start_ms) / bucket_ms) as usize;
        buckets[i.min(n - 1)].add(&e.counts);
        totals.add(&e.counts);
        nodes.insert(e.node.as_str());
    }
    let per_bucket = |f: fn(&EventCounts) -> u64| buckets.iter().map(|b| f(b) as f64).collect();
    let secs = BUCKET.as_secs_f64();
    HistorySeries {
        pool: pool.to_string(),
        end_ms,
        bucket_ms,
        series: vec![
            Series {
                name: "dispatches_per_s",
                title: "dispatches / s",
                values: buckets.iter().map(|b| b.dispatches as f64 / secs).collect(),
            },
            Series {
                name: "starts",
                title: "starts / 10 s",
                values: per_bucket(|b| b.starts),
            },
            Series {
                name: "stops",
                title: "stops / 10 s",
                values: per_bucket(|b| b.stops),
            },
            Series {
                name: "dead_workers",
                title: "dead workers / 10 s",
                values: per_bucket(|b| b.dead_workers),
            },
            Series {
                name: "moves",
                title: "moves / 10 s",
                values: per_bucket(|b| b.moves),
            },
        ],
        totals: Totals {
            dispatches: totals.dispatches,
            starts: totals.starts,
            stops: totals.stops,
            dead_workers: totals.dead_workers,
            moves: totals.moves,
        },
        nodes: nodes.len(),
        malformed,
    }
}
