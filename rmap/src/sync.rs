//! Keeping the replica current: snapshots, and the background task that
//! applies the changes its subscription (see [`crate::subscriptions`])
//! delivers.
//!
//! The task is the only writer of the replica. It applies a message whose
//! revision is exactly one more than the local one; anything else (a gap, a
//! revision that went backwards because Redis lost data or restarted
//! without persistence, a malformed message, a lagging receiver, a
//! reconnect) triggers a resync: reload the snapshot (see
//! [`crate::snapshot`]), then skip every message until the snapshot's own
//! marker comes back on the channel (everything before it is already in
//! the snapshot) and apply the rest in order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::Message as FredMessage;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::events::{MapEvent, MapEventKind};
use crate::keys::MapKeys;
use crate::replica::{Message, Op, Shared, State, apply, parse_message};
use crate::snapshot::{Channel, SnapshotLimits, load_snapshot};
use crate::subscriptions::Subscription;

/// Most messages applied in one stored version.
const MAX_BATCH: usize = 1024;
/// Pause between failed resync attempts.
const RETRY_DELAY: Duration = Duration::from_millis(250);
/// Tick used to re-check a missing snapshot marker when the revision check
/// is off.
const MARKER_CHECK: Duration = Duration::from_secs(5);

/// A request to the task to reload the snapshot now.
pub(crate) type ResyncRequest = oneshot::Sender<Result<(), Error>>;

/// The background task of one map.
#[derive(Debug)]
pub(crate) struct SyncTask {
    pub(crate) shared: Arc<Shared>,
    pub(crate) client: Client,
    pub(crate) subscription: Subscription,
    pub(crate) keys: MapKeys,
    pub(crate) messages: broadcast::Receiver<FredMessage>,
    /// Messages taken off `messages` while a snapshot was read page by
    /// page, applied before any later one.
    pub(crate) backlog: VecDeque<FredMessage>,
    /// Changes when the subscription reconnected (or dropped messages for
    /// every map): resubscribe and resync. Closed with the connection.
    pub(crate) resyncs: watch::Receiver<u64>,
    pub(crate) requests: mpsc::Receiver<ResyncRequest>,
    pub(crate) cancel: CancellationToken,
    pub(crate) revision_check: Option<Duration>,
    /// How snapshots are read.
    pub(crate) snapshot_limits: SnapshotLimits,
    /// The marker token of the last snapshot, until it comes back.
    pub(crate) awaiting: Option<String>,
    /// A resync is due (at `retry_at`).
    pub(crate) dirty: bool,
    pub(crate) retry_at: Instant,
    /// Resubscribe before the next resync (after a reconnect).
    pub(crate) resubscribe: bool,
    /// Revision check: a server revision ahead of ours seen at the last tick.
    pub(crate) behind: Option<u64>,
    /// Revision check: ticks spent waiting for the marker.
    pub(crate) awaiting_ticks: u32,
}

impl SyncTask {
    /// Runs until the map is closed.
    pub(crate) async fn run(mut self) {
        // The ticker also bounds the wait for a snapshot marker, so it runs
        // even when the revision check is off.
        let period = self.revision_check.unwrap_or(MARKER_CHECK);
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // What arrived while the join read its snapshot.
        self.apply_backlog();
        loop {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => break,
                r = self.resyncs.changed() => match r {
                    Ok(()) => {
                        tracing::debug!(map = %self.keys.hash, "pub/sub reconnected: resubscribing and resyncing");
                        self.resubscribe = true;
                        self.mark_dirty(Instant::now());
                    }
                    Err(_) => break, // the connection was closed
                },
                Some(reply) = self.requests.recv() => {
                    let result = self.resync().await;
                    if let Err(error) = &result {
                        tracing::warn!(map = %self.keys.hash, %error, "requested resync failed");
                        self.mark_dirty(Instant::now() + RETRY_DELAY);
                    }
                    let _ = reply.send(result);
                }
                () = tokio::time::sleep_until(self.retry_at), if self.dirty => {
                    if let Err(error) = self.resync().await {
                        tracing::warn!(map = %self.keys.hash, %error, "resync failed, retrying");
                        self.mark_dirty(Instant::now() + RETRY_DELAY);
                    }
                }
                m = self.messages.recv() => match m {
                    Ok(first) => self.on_messages(first),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(map = %self.keys.hash, missed = n, "replica fell behind: resyncing");
                        self.mark_dirty(Instant::now());
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = ticker.tick() => self.check_revision().await,
            }
        }
        self.shutdown().await;
    }

    fn mark_dirty(&mut self, at: Instant) {
        if !self.dirty || at < self.retry_at {
            self.retry_at = at;
        }
        self.dirty = true;
    }

    /// Applies `first` and whatever else is already buffered, as one version.
    fn on_messages(&mut self, first: FredMessage) {
        self.apply_buffered(Some(first));
    }

    /// Applies the backlog of the last snapshot read, a version per
    /// `MAX_BATCH` messages.
    fn apply_backlog(&mut self) {
        while !self.backlog.is_empty() && !self.dirty {
            self.apply_buffered(None);
        }
        if self.dirty {
            self.backlog.clear();
        }
    }

    /// Applies the backlog, then `first` (if any) and the messages already
    /// received, in revision order, as one version. Stops at the first
    /// message that does not follow (the caller resyncs then).
    fn apply_buffered(&mut self, first: Option<FredMessage>) {
        let mut batch = Vec::with_capacity(16);
        while batch.len() < MAX_BATCH
            && let Some(m) = self.backlog.pop_front()
        {
            batch.push(m);
        }
        batch.extend(first);
        while batch.len() < MAX_BATCH {
            match self.messages.try_recv() {
                Ok(m) => batch.push(m),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    tracing::warn!(map = %self.keys.hash, missed = n, "replica fell behind: resyncing");
                    self.mark_dirty(Instant::now());
                    return;
                }
                Err(_) => break,
            }
        }
        if self.dirty {
            return; // everything will be reloaded anyway
        }
        let current = self.shared.load_full();
        let mut next = State {
            data: current.data.clone(),
            rev: current.rev,
            version: current.version + 1,
        };
        // Events only for someone to hear them (the pool's per-job maps
        // usually have no subscriber: no event per change to build).
        let mut events = self.shared.has_subscribers().then(Vec::new);
        for m in batch {
            if m.channel != self.keys.channel.as_str() {
                continue;
            }
            let parsed = match m
                .value
                .as_bytes()
                .ok_or("not a string")
                .and_then(parse_message)
            {
                Ok(parsed) => parsed,
                Err(reason) => {
                    tracing::warn!(map = %self.keys.hash, reason, "malformed change message: resyncing");
                    self.mark_dirty(Instant::now());
                    break;
                }
            };
            // A new sequence over a revision this replica holds: the map's
            // revision key vanished (Redis lost its data, or the map was
            // destroyed). Told at once, before the resync this leads to.
            if parsed.fresh && next.rev != 0 && parsed.rev != next.rev {
                self.shared.note_sequence_restart();
            }
            match parsed {
                Message {
                    op: Op::Marker { token },
                    ..
                } => {
                    if self.awaiting.as_deref() == Some(token.as_str()) {
                        self.awaiting = None;
                        self.awaiting_ticks = 0;
                    }
                }
                // Published before our snapshot was read: already in it.
                _ if self.awaiting.is_some() => {}
                Message { rev, op, fresh }
                    if (fresh && next.rev == 0) || (!fresh && rev == next.rev + 1) =>
                {
                    next.rev = rev;
                    apply(&mut next, op, &mut events);
                }
                Message { rev, .. } => {
                    tracing::debug!(map = %self.keys.hash, local = next.rev, received = rev, "revision out of sequence: resyncing");
                    self.mark_dirty(Instant::now());
                    break;
                }
            }
        }
        if next.rev != current.rev || events.as_ref().is_some_and(|e| !e.is_empty()) {
            self.shared.store(next, events.as_deref(), false);
        }
    }

    /// Reloads the snapshot and installs it.
    pub(crate) async fn resync(&mut self) -> Result<(), Error> {
        if self.resubscribe {
            // Only the map's sharded channel (the connection may be shared).
            self.subscription.resubscribe().await?;
            self.resubscribe = false;
        }
        // Messages already received predate the snapshot. Those that follow
        // the local revision are applied first, so their events reach
        // subscribers in revision order (a `resync()` right after a write
        // does not swallow the write's event when it is already here); the
        // rest are dropped, the snapshot covers them. (The backlog is empty
        // here: every read's backlog is applied right after it, and a failed
        // read's is dropped with the next read.)
        self.apply_buffered(None);
        while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = self.messages.try_recv()
        {
        }
        let channel = Channel {
            messages: &mut self.messages,
            backlog: &mut self.backlog,
        };
        let snapshot =
            load_snapshot(&self.client, &self.keys, self.snapshot_limits, channel).await?;
        let current = self.shared.load_full();
        let went_back = snapshot.rev < current.rev;
        if went_back {
            tracing::warn!(map = %self.keys.hash, local = current.rev, redis = snapshot.rev, "map revision went backwards (Redis lost data?)");
        }
        let next = State {
            data: snapshot.data,
            rev: snapshot.rev,
            version: current.version + 1,
        };
        let event = MapEvent {
            kind: MapEventKind::Resynced,
            key: None,
        };
        self.shared.store(next, Some(&[event]), went_back);
        self.awaiting = Some(snapshot.token);
        self.awaiting_ticks = 0;
        self.behind = None;
        self.dirty = false;
        // Changes made while the pages were read, in order.
        self.apply_backlog();
        Ok(())
    }

    /// Compares the local revision with Redis's: heals lost messages, lost
    /// markers and expired keys even when nobody writes.
    async fn check_revision(&mut self) {
        if self.dirty {
            return;
        }
        if self.awaiting.is_some() {
            self.awaiting_ticks += 1;
            if self.awaiting_ticks >= 2 {
                tracing::warn!(map = %self.keys.hash, "snapshot marker never arrived: resyncing");
                self.mark_dirty(Instant::now());
            }
            return;
        }
        if self.revision_check.is_none() {
            return;
        }
        let local = self.shared.load().rev;
        let server: Option<String> = match self.client.get(self.keys.revision.as_str()).await {
            Ok(v) => v,
            Err(error) => {
                tracing::debug!(map = %self.keys.hash, %error, "revision check failed");
                return;
            }
        };
        let server = server.and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        if server < local {
            tracing::warn!(map = %self.keys.hash, local, redis = server, "revision in Redis is behind the replica: resyncing");
            self.mark_dirty(Instant::now());
        } else if server > local {
            match self.behind {
                Some(seen) if local < seen => {
                    tracing::warn!(map = %self.keys.hash, local, redis = seen, "missed changes: resyncing");
                    self.mark_dirty(Instant::now());
                }
                _ => self.behind = Some(server),
            }
        } else {
            self.behind = None;
        }
    }

    async fn shutdown(self) {
        // Closed first: once the connection's close returns, no map on it
        // takes writes any more.
        self.shared.close();
        self.subscription.close().await;
    }
}
