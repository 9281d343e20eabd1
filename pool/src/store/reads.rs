//! Reads of the jobs and pending maps from Redis, for what a node must know
//! of them whether or not it mirrors them (`NodeOptions::mirror_jobs`):
//! one job's owner, every running key, which of a set of keys run or wait
//! to start. Decisions that move jobs never rest on these reads alone: the
//! scripts that act check again.

use std::collections::{BTreeSet, HashSet};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::PoolStore;
use super::call::bounded;
use super::records::job_owner;
use crate::error::{Error, Result};

/// Keys asked for per `HSCAN` page.
const SCAN_PAGE: &str = "1000";

impl PoolStore {
    /// The owner and fencing token of job `key` as Redis records it.
    ///
    /// # Errors
    /// [`Error::Malformed`] for a record that does not parse.
    pub(crate) async fn job_owner(&self, key: &str) -> Result<Option<(String, u64)>> {
        let Some(record) = self.job_record(key).await? else {
            return Ok(None);
        };
        match job_owner(&record) {
            Some((worker, token)) => Ok(Some((worker.to_string(), token))),
            None => Err(Error::Malformed {
                what: "job record",
                reason: format!("{key:?}: {record:?}"),
            }),
        }
    }

    /// The jobs-map record of `key` as Redis has it ("<worker> <token>").
    pub(crate) async fn job_record(&self, key: &str) -> Result<Option<String>> {
        bounded(
            self.timeout,
            "job record",
            self.client.hget(self.maps.jobs_keys.hash.as_str(), key),
        )
        .await
    }

    /// The records of `workers` in the workers hash as Redis has them now
    /// (a node's replica may lag after Redis went back), in order.
    pub(crate) async fn worker_registrations(
        &self,
        workers: &[String],
    ) -> Result<Vec<Option<String>>> {
        if workers.is_empty() {
            return Ok(Vec::new());
        }
        bounded(
            self.timeout,
            "worker registrations",
            self.client.hmget(
                self.maps.workers.keys_info().hash.as_str(),
                workers.to_vec(),
            ),
        )
        .await
    }

    /// Every key of the jobs map, page by page (`HSCAN`), sorted.
    pub(crate) async fn job_keys(&self) -> Result<Vec<String>> {
        const WHAT: &str = "jobs map scan";
        let hash = self.maps.jobs_keys.hash.clone();
        let mut cursor = "0".to_string();
        // HSCAN may list a key twice.
        let mut keys = BTreeSet::new();
        loop {
            let reply: Value = bounded(
                self.timeout,
                WHAT,
                self.client.custom(
                    CustomCommand::new_static("HSCAN", ClusterHash::FirstKey, false),
                    vec![hash.as_str(), cursor.as_str(), "COUNT", SCAN_PAGE],
                ),
            )
            .await?;
            let (next, fields) = scan_page(WHAT, reply)?;
            keys.extend(fields.into_iter().step_by(2));
            if next == "0" {
                return Ok(keys.into_iter().collect());
            }
            cursor = next;
        }
    }

    /// Which of `keys` have an owner record or a pending guard in Redis.
    pub(crate) async fn running_or_pending(&self, keys: &[String]) -> Result<HashSet<String>> {
        let mut found = self.present(&self.maps.jobs_keys.hash, keys).await?;
        found.extend(self.pending_among(keys).await?);
        Ok(found)
    }

    /// Which of `keys` have a pending guard in Redis.
    pub(crate) async fn pending_among(&self, keys: &[String]) -> Result<HashSet<String>> {
        self.present(&self.maps.pending_keys.hash, keys).await
    }

    /// Which of `keys` are fields of `hash` (`HMGET`, in slices so that no
    /// call is unbounded).
    async fn present(&self, hash: &str, keys: &[String]) -> Result<HashSet<String>> {
        let mut found = HashSet::new();
        for slice in keys.chunks(1000) {
            let values: Vec<Option<String>> = bounded(
                self.timeout,
                "hash fields",
                self.client.hmget(hash, slice.to_vec()),
            )
            .await?;
            found.extend(
                slice
                    .iter()
                    .zip(values)
                    .filter(|(_, v)| v.is_some())
                    .map(|(k, _)| k.clone()),
            );
        }
        Ok(found)
    }
}

/// Splits an `HSCAN` reply into the next cursor and the flat field/value list.
fn scan_page(what: &'static str, reply: Value) -> Result<(String, Vec<String>)> {
    let malformed = |reason: String| Error::Malformed { what, reason };
    let Value::Array(mut parts) = reply else {
        return Err(malformed(format!("not an array: {reply:?}")));
    };
    if parts.len() != 2 {
        return Err(malformed(format!("{} parts", parts.len())));
    }
    let fields = parts.pop().unwrap_or(Value::Null);
    let cursor = parts
        .pop()
        .and_then(|c| c.as_string())
        .ok_or_else(|| malformed("no cursor".into()))?;
    let Value::Array(fields) = fields else {
        return Err(malformed(format!("fields not an array: {fields:?}")));
    };
    let fields = fields
        .into_iter()
        .map(|v| {
            v.as_string()
                .ok_or_else(|| malformed("a field is not a string".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((cursor, fields))
}
