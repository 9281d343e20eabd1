//! Pool-wide sweeps, page by page from Redis (never from a replica): the
//! orphan sweep (`sweep_orphans.lua`, `requeue_orphan.lua`), the
//! stale-pending sweep (`sweep_pending.lua`) and the listing of the jobs a
//! worker owns (`owned_page.lua`). Each call is one bounded `HSCAN` page;
//! the caller keeps the cursor and calls again.

use std::time::Duration;

use fred::types::Value;

use super::PoolStore;
use super::call::{self, status_reply, string_at, u64_at};
use crate::error::{Error, Result};
use crate::keys;

/// An `HSCAN` cursor (`"0"`: at the start, or a pass just ended).
pub(crate) type Cursor = String;

/// The first cursor of a pass.
pub(crate) const START: &str = "0";

/// One step of the orphan sweep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OrphanPage {
    /// Where the next step goes on in the payloads hash.
    pub(crate) cursor: Cursor,
    /// Where the next step goes on in the marks hash.
    pub(crate) marks_cursor: Cursor,
    /// Marks this step set: keys first seen orphaned, or in a new state.
    pub(crate) marked: u64,
    /// Orphans past their grace: job key and the record the sweep saw
    /// (`"-"`: none).
    pub(crate) due: Vec<(String, String)>,
}

/// What `requeue_orphan.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OrphanRequeue {
    /// Enqueued at the target with a new token.
    Ok { token: u64 },
    /// Not the orphan the sweep saw any more, or not due: nothing done.
    Changed,
    /// The pool recovers from a data loss: orphans wait.
    Recovering,
    /// The target is no target for a job (see [`super::Handoff::NoTarget`]).
    NoTarget,
    /// The payload is gone.
    NoPayload,
    /// The orphan's dispatch is marked over (see
    /// [`super::Handoff::Ended`]): ended instead of requeued.
    Ended,
}

/// One page of a scan that lists keys: the next cursor and the keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPage {
    pub(crate) cursor: Cursor,
    pub(crate) keys: Vec<String>,
}

impl KeyPage {
    fn parse(what: &'static str, reply: Value) -> Result<Self> {
        let (cursor, rest) = status_reply(what, reply)?;
        Ok(KeyPage {
            cursor,
            keys: strings(what, rest)?,
        })
    }
}

fn strings(what: &'static str, values: Vec<Value>) -> Result<Vec<String>> {
    values
        .into_iter()
        .map(|v| {
            v.as_string().ok_or_else(|| Error::Malformed {
                what,
                reason: "expected a string".into(),
            })
        })
        .collect()
}

impl PoolStore {
    /// One step of the orphan sweep: a page of about `count` payload keys
    /// from `cursor` (and of the marks from `marks_cursor`), marking new
    /// orphans and reporting those orphaned for `grace` (server time).
    pub(crate) async fn sweep_orphans(
        &self,
        cursor: &str,
        marks_cursor: &str,
        count: usize,
        grace: Duration,
        worker_ttl: Duration,
        floor_ms: u64,
    ) -> Result<OrphanPage> {
        const WHAT: &str = "sweep_orphans reply";
        let mut keys = self.maps.base_keys();
        keys.push(keys::orphan_marks(&self.pool));
        keys.push(self.maps.keepalive_revision_key());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(cursor),
            Value::from(marks_cursor),
            Value::from(count.to_string()),
            Value::from(grace.as_millis().to_string()),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
            Value::from(floor_ms.to_string()),
        ]);
        let reply: Value = self
            .scripts
            .sweep_orphans
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let (cursor, rest) = status_reply(WHAT, reply)?;
        let marks_cursor = string_at(&rest, 0);
        let marked = rest
            .get(1)
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::Malformed {
                what: WHAT,
                reason: format!("no count of marks set: {rest:?}"),
            })?;
        let mut due = Vec::new();
        let mut items = strings(WHAT, rest.into_iter().skip(2).collect())?.into_iter();
        while let Some(key) = items.next() {
            let record = items.next().ok_or_else(|| Error::Malformed {
                what: WHAT,
                reason: format!("orphan {key:?} without its record"),
            })?;
            due.push((key, record));
        }
        Ok(OrphanPage {
            cursor,
            marks_cursor,
            marked,
            due,
        })
    }

    /// Requeues orphan `key` at `to`, if Redis still holds it orphaned as
    /// `record` (`"-"`: no record) for at least `grace`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn requeue_orphan(
        &self,
        key: &str,
        record: &str,
        to: &str,
        to_inbox: &str,
        pending_ttl: Duration,
        worker_ttl: Duration,
        grace: Duration,
        floor_ms: u64,
    ) -> Result<OrphanRequeue> {
        const WHAT: &str = "requeue_orphan reply";
        let mut keys = self.maps.base_keys();
        keys.push(to_inbox.to_string());
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(keys::orphan_marks(&self.pool));
        keys.push(self.maps.keepalive.keys_info().hash.clone());
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(record),
            Value::from(to),
            Value::from(pending_ttl.as_millis().to_string()),
            Value::from(keys::INBOX_MAXLEN.to_string()),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(grace.as_millis().to_string()),
            Value::from(floor_ms.to_string()),
        ]);
        let reply: Value = self
            .scripts
            .requeue_orphan
            .run(&self.client, keys, args, self.timeout)
            .await?;
        let (status, rest) = status_reply(WHAT, reply)?;
        Ok(match status.as_str() {
            "ok" => OrphanRequeue::Ok {
                token: u64_at(&rest, 0, WHAT)?,
            },
            "changed" => OrphanRequeue::Changed,
            "recovering" => OrphanRequeue::Recovering,
            "no_target" => OrphanRequeue::NoTarget,
            "no_payload" => OrphanRequeue::NoPayload,
            "ended" => OrphanRequeue::Ended,
            other => return Err(call::unknown_status(WHAT, other)),
        })
    }

    /// One step of the stale-pending sweep: removes the guards past their
    /// deadline (server time, held back to `floor_ms`) among about `count`
    /// from `cursor`.
    pub(crate) async fn sweep_pending(
        &self,
        cursor: &str,
        count: usize,
        floor_ms: u64,
    ) -> Result<KeyPage> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(cursor),
            Value::from(count.to_string()),
            Value::from(floor_ms.to_string()),
        ]);
        let reply: Value = self
            .scripts
            .sweep_pending
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        KeyPage::parse("sweep_pending reply", reply)
    }

    /// The keys `worker` owns among about `count` jobs from `cursor`, as
    /// Redis records them now.
    pub(crate) async fn owned_page(
        &self,
        worker: &str,
        cursor: &str,
        count: usize,
    ) -> Result<KeyPage> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(cursor),
            Value::from(count.to_string()),
            Value::from(worker),
        ]);
        let reply: Value = self
            .scripts
            .owned_page
            .run(&self.client, self.maps.base_keys(), args, self.timeout)
            .await?;
        KeyPage::parse("owned_page reply", reply)
    }
}
