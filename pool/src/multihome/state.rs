//! What a multi-home worker publishes in each home's pool for inspectors:
//! one JSON value per worker at `fl:{<pool>}:multihome:<worker id>`,
//! refreshed by every successful probe and expiring when probes stop.

use fred::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Result, from_redis};
use crate::keys;

/// One home as a multi-home worker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PublishedHome {
    /// The home's name.
    pub name: String,
    /// The pool served there.
    pub pool: String,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Consecutive failed operations.
    pub consecutive_failures: u32,
    /// How often its breaker opened.
    pub opens: u64,
    /// Its share of capacity (`None`: no limit).
    pub allotted: Option<usize>,
    /// Jobs it runs on this worker.
    pub running: usize,
}

/// The state a multi-home worker published in one pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PublishedState {
    /// The multi-home worker's id.
    pub worker: String,
    /// Host name of its process.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The home this value was written to.
    pub home: String,
    /// Every home of the worker, in configuration order.
    pub homes: Vec<PublishedHome>,
}

/// Reads what multi-home workers published in `pool` (one entry per live
/// worker that reaches this home), sorted by worker id. Read-only: safe
/// for an inspector.
///
/// # Errors
/// Redis errors; an entry that does not parse is skipped with a log line.
pub async fn read_published(client: &Client, pool: &str) -> Result<Vec<PublishedState>> {
    crate::keys::check_name("pool name", pool)?;
    let pattern = keys::multihome_state_pattern(pool);
    let mut cursor = "0".to_string();
    let mut out = Vec::new();
    loop {
        let (next, found): (String, Vec<String>) = client
            .scan_page(cursor.clone(), pattern.clone(), Some(500), None)
            .await
            .map_err(from_redis)?;
        for key in found {
            let raw: Option<String> = client.get(&key).await.map_err(from_redis)?;
            let Some(raw) = raw else { continue };
            match serde_json::from_str::<PublishedState>(&raw) {
                Ok(state) => out.push(state),
                Err(e) => tracing::warn!(key, error = %e, "malformed multi-home state skipped"),
            }
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    out.sort_by(|a, b| a.worker.cmp(&b.worker));
    Ok(out)
}
