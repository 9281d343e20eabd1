//! The jobs list (search and keyset pages over a reading) and the job
//! detail (payload shown as hex, UTF-8 and pretty JSON, size-capped).

use flotilla_pool::inspect::{self, PayloadSummary};
use fred::prelude::Client;
use serde::{Deserialize, Serialize};

use super::cache::{JobRow, Reading};
use crate::format;

/// Rows per page unless asked otherwise.
pub(crate) const DEFAULT_LIMIT: usize = 50;
/// Most rows one page may ask for.
pub(crate) const MAX_LIMIT: usize = 500;
/// Bytes of a payload shown as hex and text; the rest is cut.
pub(crate) const PAYLOAD_SHOWN: usize = 4096;
/// Payloads larger than this are not parsed as JSON.
const JSON_PARSE_LIMIT: usize = 256 * 1024;

/// Search of the jobs list (`/jobs?…`, `/api/jobs?…`).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct JobQuery {
    /// Keys starting with this.
    pub(crate) prefix: Option<String>,
    /// Jobs owned by this worker.
    pub(crate) worker: Option<String>,
    /// `running`, `pending` or `all` (default).
    pub(crate) state: Option<String>,
    /// Keyset cursor: keys after this one.
    pub(crate) after: Option<String>,
    /// Rows per page (default 50, at most 500).
    pub(crate) limit: Option<usize>,
}

/// One page of the jobs list.
#[derive(Debug, Serialize)]
pub(crate) struct JobPage {
    pub(crate) pool: String,
    pub(crate) server_time_ms: u64,
    /// Age of the reading the page comes from, ms.
    pub(crate) reading_age_ms: u64,
    /// Jobs matching the search (all pages).
    pub(crate) matching: usize,
    pub(crate) jobs: Vec<JobListed>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub(crate) next_after: Option<String>,
}

/// A job of the list.
#[derive(Debug, Serialize)]
pub(crate) struct JobListed {
    pub(crate) key: String,
    /// `running` or `pending`.
    pub(crate) state: &'static str,
    pub(crate) owner: Option<String>,
    pub(crate) token: u64,
    pub(crate) created_at_ms: Option<u64>,
    pub(crate) age_ms: Option<u64>,
    pub(crate) payload_size: Option<usize>,
}

/// The job page's data (`/api/jobs/{key}`).
#[derive(Debug, Serialize)]
pub(crate) struct JobDetail {
    pub(crate) pool: String,
    pub(crate) key: String,
    /// `running`, `pending`, `restarting`, `failed`, `orphaned` (a payload
    /// only) or `absent`.
    pub(crate) state: &'static str,
    pub(crate) owner: Option<String>,
    pub(crate) fencing_token: Option<u64>,
    /// First admission (the job's `created_at`), server time.
    pub(crate) started_at_ms: Option<u64>,
    pub(crate) age_ms: Option<u64>,
    pub(crate) payload_size: Option<usize>,
    /// The first [`PAYLOAD_SHOWN`] bytes as a hex dump.
    pub(crate) payload_hex: Option<String>,
    /// The same bytes as text, when they are UTF-8.
    pub(crate) payload_text: Option<String>,
    /// The whole payload pretty-printed, when it is JSON.
    pub(crate) payload_json: Option<String>,
    /// Whether the hex and text were cut.
    pub(crate) payload_truncated: bool,
    /// Consecutive failures of the job (0: none since its last start
    /// after a success or a dispatch).
    pub(crate) failures: u32,
    /// The last failed run's error.
    pub(crate) last_error: Option<String>,
    /// `restarting` (waiting out its backoff) or `failed` (not
    /// restarted), when the job failed.
    pub(crate) lifecycle: Option<&'static str>,
}

impl JobQuery {
    fn wants(&self, row: &JobRow) -> bool {
        let state_ok = match self.state.as_deref() {
            None | Some("") | Some("all") => true,
            Some(s) => row.state.as_str() == s,
        };
        let worker_ok = match self.worker.as_deref() {
            None | Some("") => true,
            Some(w) => row.owner.as_deref() == Some(w),
        };
        state_ok && worker_ok
    }

    /// The rows of the reading this search can match: the key range of the
    /// prefix, found by binary search.
    fn range<'r>(&self, rows: &'r [JobRow]) -> &'r [JobRow] {
        let prefix = self.prefix.as_deref().unwrap_or_default();
        let start = rows.partition_point(|r| r.key.as_str() < prefix);
        let len = rows[start..].partition_point(|r| r.key.starts_with(prefix));
        &rows[start..start + len]
    }

    /// Validates the state filter.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self.state.as_deref() {
            None | Some("" | "all" | "running" | "pending") => Ok(()),
            Some(other) => Err(format!("unknown state {other:?} (running, pending or all)")),
        }
    }
}

/// One page of the jobs list from `reading`; payload sizes and ages of the
/// page's jobs are read with `HMGET` (bounded chunks).
///
/// # Errors
/// Redis errors.
pub(crate) async fn page(
    client: &Client,
    reading: &Reading,
    query: &JobQuery,
) -> flotilla_pool::Result<JobPage> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let range = query.range(&reading.rows);
    let matching = if query.state.is_none() && query.worker.is_none() {
        range.len()
    } else {
        range.iter().filter(|r| query.wants(r)).count()
    };
    let from = match query.after.as_deref() {
        Some(after) => range.partition_point(|r| r.key.as_str() <= after),
        None => 0,
    };
    let mut picked: Vec<&JobRow> = range[from..]
        .iter()
        .filter(|r| query.wants(r))
        .take(limit + 1)
        .collect();
    let next_after = if picked.len() > limit {
        picked.truncate(limit);
        picked.last().map(|r| r.key.clone())
    } else {
        None
    };
    let snap = &reading.snapshot;
    let keys: Vec<String> = picked.iter().map(|r| r.key.clone()).collect();
    let summaries = inspect::payload_summaries(client, &snap.pool, &keys).await?;
    let jobs = picked
        .into_iter()
        .zip(summaries)
        .map(|(r, s): (&JobRow, Option<PayloadSummary>)| JobListed {
            key: r.key.clone(),
            state: r.state.as_str(),
            owner: r.owner.clone(),
            token: r.token,
            created_at_ms: s.map(|s| s.created_at_ms),
            age_ms: s.map(|s| snap.server_time_ms.saturating_sub(s.created_at_ms)),
            payload_size: s.map(|s| s.size),
        })
        .collect();
    Ok(JobPage {
        pool: snap.pool.clone(),
        server_time_ms: snap.server_time_ms,
        reading_age_ms: reading.age().as_millis() as u64,
        matching,
        jobs,
        next_after,
    })
}

/// The job `key`: its row in `reading` and its stored payload (read now).
///
/// # Errors
/// Redis errors, a payload that does not decode.
pub(crate) async fn detail(
    client: &Client,
    reading: &Reading,
    key: &str,
) -> flotilla_pool::Result<JobDetail> {
    let snap = &reading.snapshot;
    let stored = inspect::job_payload(client, &snap.pool, key).await?;
    let failure = inspect::job_failure(client, &snap.pool, key).await?;
    let row = reading
        .rows
        .binary_search_by(|r| r.key.as_str().cmp(key))
        .ok()
        .map(|i| &reading.rows[i]);
    // A failure record counts for the run it names, or once the job failed
    // for good (no run left).
    let failure = failure.filter(|f| match row {
        Some(r) => r.owner.is_some() && f.token == r.token,
        None => f.state == inspect::JobFailureState::Failed,
    });
    let state = match (row, &stored, &failure) {
        (Some(_), _, Some(f)) if f.state == inspect::JobFailureState::Restarting => "restarting",
        (Some(r), _, _) => r.state.as_str(),
        (None, _, Some(_)) => "failed",
        (None, Some(_), None) => "orphaned",
        (None, None, None) => "absent",
    };
    let payload = stored.as_ref().map(|p| &p.payload[..]);
    let shown = payload.map(|p| &p[..p.len().min(PAYLOAD_SHOWN)]);
    Ok(JobDetail {
        pool: snap.pool.clone(),
        key: key.to_string(),
        state,
        owner: row.and_then(|r| r.owner.clone()),
        fencing_token: row.map(|r| r.token),
        started_at_ms: stored.as_ref().map(|p| p.created_at_ms),
        age_ms: stored
            .as_ref()
            .map(|p| snap.server_time_ms.saturating_sub(p.created_at_ms)),
        payload_size: payload.map(<[u8]>::len),
        payload_hex: shown.map(format::hex_dump),
        payload_text: shown.and_then(|s| std::str::from_utf8(s).ok().map(str::to_string)),
        payload_json: payload.and_then(pretty_json),
        payload_truncated: payload.is_some_and(|p| p.len() > PAYLOAD_SHOWN),
        failures: failure.as_ref().map_or(0, |f| f.failures),
        last_error: failure.as_ref().map(|f| f.last_error.clone()),
        lifecycle: failure.as_ref().and_then(|f| match f.state {
            inspect::JobFailureState::Restarting => Some("restarting"),
            inspect::JobFailureState::Failed => Some("failed"),
            _ => None,
        }),
    })
}

/// `bytes` pretty-printed when they are a JSON object or array (a bare
/// number or string is shown as text instead).
fn pretty_json(bytes: &[u8]) -> Option<String> {
    if bytes.len() > JSON_PARSE_LIMIT {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if !(value.is_object() || value.is_array()) {
        return None;
    }
    serde_json::to_string_pretty(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::super::cache::JobState;
    use super::*;

    fn rows(keys: &[(&str, JobState, Option<&str>)]) -> Vec<JobRow> {
        let mut rows: Vec<JobRow> = keys
            .iter()
            .map(|(k, s, o)| JobRow {
                key: k.to_string(),
                state: *s,
                owner: o.map(str::to_string),
                token: 1,
            })
            .collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        rows
    }

    #[test]
    fn prefix_range_and_filters() {
        use JobState::*;
        let rows = rows(&[
            ("a-1", Running, Some("w1")),
            ("a-2", Pending, None),
            ("a-3", Running, Some("w2")),
            ("b-1", Running, Some("w1")),
        ]);
        let q = JobQuery {
            prefix: Some("a-".into()),
            ..JobQuery::default()
        };
        assert_eq!(q.range(&rows).len(), 3);
        let q = JobQuery {
            prefix: Some("a-".into()),
            worker: Some("w1".into()),
            ..JobQuery::default()
        };
        let hits: Vec<_> = q.range(&rows).iter().filter(|r| q.wants(r)).collect();
        assert_eq!(hits.len(), 1);
        let q = JobQuery {
            state: Some("pending".into()),
            ..JobQuery::default()
        };
        assert_eq!(rows.iter().filter(|r| q.wants(r)).count(), 1);
        assert!(
            JobQuery {
                state: Some("done".into()),
                ..JobQuery::default()
            }
            .check()
            .is_err()
        );
    }

    #[test]
    fn json_is_pretty_printed_only_when_structured() {
        assert_eq!(pretty_json(br#"{"a":1}"#).unwrap(), "{\n  \"a\": 1\n}");
        assert_eq!(pretty_json(b"42"), None);
        assert_eq!(pretty_json(b"\xff"), None);
    }
}
