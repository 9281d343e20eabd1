//! Keeping the replica current: snapshots, and the background task that
//! applies the changes its subscription (see [`crate::subscriptions`])
//! delivers.
//!
//! The task is the only writer of the replica. It applies a message whose
//! revision is exactly one more than the local one; anything else (a gap, a
//! revision that went backwards because Redis lost data or restarted
//! without persistence, a malformed message, a lagging receiver, a
//! reconnect) triggers a resync: reload the snapshot atomically, then skip
//! every message until the snapshot's own marker comes back on the channel
//! (everything before it is already in the snapshot).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand, Message as FredMessage};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::events::{MapEvent, MapEventKind};
use crate::keys::MapKeys;
use crate::lua::SCRIPTS;
use crate::replica::{Message, Op, Shared, State, apply, parse_message};
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

/// A snapshot of the map in Redis.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) rev: u64,
    pub(crate) data: imbl::HashMap<Arc<str>, Arc<str>>,
}

/// A token naming one snapshot's marker, unique across processes.
pub(crate) fn new_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// Loads revision and content atomically and publishes the marker `token`.
pub(crate) async fn load_snapshot(
    client: &Client,
    keys: &MapKeys,
    token: &str,
    timeout: Duration,
) -> Result<Snapshot, Error> {
    // The client's command timeout is for single commands; this reply is
    // the whole map. `EVALSHA` by hand: fred's script helpers take no
    // per-call options. Routed by the first key (argument 2) on Cluster.
    let with_deadline = client.with_options(&fred::types::config::Options {
        timeout: Some(timeout),
        ..Default::default()
    });
    let script = &SCRIPTS.snapshot;
    let args: Vec<Value> = vec![
        Value::from(script.sha1().clone()),
        Value::from(3),
        Value::from(keys.hash.as_str()),
        Value::from(keys.revision.as_str()),
        Value::from(keys.channel.as_str()),
        Value::from(token),
    ];
    let evalsha = || {
        with_deadline.custom::<Value, Value>(
            CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false),
            args.clone(),
        )
    };
    let reply: Value = match evalsha().await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            script.load(client).await?;
            evalsha().await?
        }
        result => result?,
    };
    let Value::Array(mut parts) = reply else {
        return Err(Error::malformed("snapshot reply", format!("{reply:?}")));
    };
    let (Some(all), Some(rev), None) = (parts.pop(), parts.pop(), parts.pop()) else {
        return Err(Error::malformed("snapshot reply", "expected 2 elements"));
    };
    let rev = rev
        .as_string()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| Error::malformed("snapshot revision", format!("{rev:?}")))?;
    let fields = match all {
        Value::Array(fields) => fields,
        Value::Null => Vec::new(),
        // RESP3 answers HGETALL with a map.
        Value::Map(map) => map
            .inner()
            .into_iter()
            .flat_map(|(k, v)| [Value::from(k), v])
            .collect(),
        other => return Err(Error::malformed("snapshot content", format!("{other:?}"))),
    };
    let mut data = imbl::HashMap::new();
    let mut fields = fields.into_iter();
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        match (k.as_str(), v.as_str()) {
            (Some(k), Some(v)) => {
                data.insert(Arc::from(&*k), Arc::from(&*v));
            }
            _ => tracing::warn!(map = %keys.hash, "skipping a field that is not UTF-8"),
        }
    }
    Ok(Snapshot { rev, data })
}

/// The background task of one map.
#[derive(Debug)]
pub(crate) struct SyncTask {
    pub(crate) shared: Arc<Shared>,
    pub(crate) client: Client,
    pub(crate) subscription: Subscription,
    pub(crate) keys: MapKeys,
    pub(crate) messages: broadcast::Receiver<FredMessage>,
    /// Changes when the subscription reconnected (or dropped messages for
    /// every map): resubscribe and resync. Closed with the connection.
    pub(crate) resyncs: watch::Receiver<u64>,
    pub(crate) requests: mpsc::Receiver<ResyncRequest>,
    pub(crate) cancel: CancellationToken,
    pub(crate) revision_check: Option<Duration>,
    /// Deadline of a snapshot read.
    pub(crate) snapshot_timeout: Duration,
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

    /// Applies `first` (if any) and the messages already received, in
    /// revision order, as one version. Stops at the first message that does
    /// not follow (the caller resyncs then).
    fn apply_buffered(&mut self, first: Option<FredMessage>) {
        let mut batch = Vec::with_capacity(16);
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
        // rest are dropped, the snapshot covers them.
        self.apply_buffered(None);
        while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = self.messages.try_recv()
        {
        }
        let token = new_token();
        let snapshot =
            load_snapshot(&self.client, &self.keys, &token, self.snapshot_timeout).await?;
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
        self.awaiting = Some(token);
        self.awaiting_ticks = 0;
        self.behind = None;
        self.dirty = false;
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
