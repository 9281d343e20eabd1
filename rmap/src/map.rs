//! The [`Map`] handle.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;
use crate::events::{self, MapEvents};
use crate::keys::MapKeys;
use crate::lua::SCRIPTS;
use crate::options::MapOptions;
use crate::replica::{Shared, State};
use crate::snapshot::{Channel, load_snapshot};
use crate::subscriptions::{Subscribed, Subscriptions, SubscriptionsOptions};
use crate::sync::{ResyncRequest, SyncTask};

/// A Redis hash mirrored in memory, kept current over pub/sub.
///
/// Cheap to clone (an `Arc` inside); every clone is the same replica. Reads
/// are local and lock-free; every write is one Lua script that changes the
/// hash, bumps the map's revision and publishes the change. The replica's
/// background task ends on [`close`](Map::close) or when the last clone is
/// dropped.
///
/// # Examples
/// ```no_run
/// # async fn demo(client: &fred::prelude::Client) -> Result<(), flotilla_rmap::Error> {
/// use flotilla_rmap::{Map, MapOptions};
/// let map = Map::join(client, "settings", MapOptions::default()).await?;
/// map.set_and_wait("mode", "fast").await?;
/// assert_eq!(map.get("mode").as_deref(), Some("fast"));
/// map.close().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Map {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    keys: MapKeys,
    options: MapOptions,
    client: Client,
    shared: Arc<Shared>,
    requests: mpsc::Sender<ResyncRequest>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl Map {
    /// Joins map `name`: subscribes to its channel first, then loads its
    /// content and revision atomically, then starts the task that applies
    /// the changes published after that snapshot. The map has its own
    /// subscriber connection, built from `client`'s configuration and
    /// closed with the map; to share one connection among many maps, use
    /// [`join_shared`](Map::join_shared).
    ///
    /// # Errors
    /// [`Error::InvalidName`] / [`Error::InvalidOptions`] for bad input,
    /// [`Error::Redis`] when Redis cannot be reached.
    pub async fn join(client: &Client, name: &str, options: MapOptions) -> Result<Map, Error> {
        options.validate()?;
        MapKeys::new(name, options.hash_tag.as_deref())?;
        let own = Subscriptions::connect(
            client,
            SubscriptionsOptions::default().message_buffer(options.message_buffer),
        )
        .await?;
        let joined = Map::join_via(&own, true, name, options).await;
        if joined.is_err() {
            own.close().await;
        }
        joined
    }

    /// Joins map `name` as [`join`](Map::join) does, but subscribes on the
    /// shared connection `subscriptions` (and runs its commands on
    /// [`Subscriptions::client`]) instead of opening a connection of its
    /// own. Closing the map unsubscribes its channel only; closing
    /// `subscriptions` closes the map.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: &fred::prelude::Client) -> Result<(), flotilla_rmap::Error> {
    /// use flotilla_rmap::{Map, MapOptions, Subscriptions, SubscriptionsOptions};
    /// let shared = Subscriptions::connect(client, SubscriptionsOptions::default()).await?;
    /// let options = || MapOptions::default().hash_tag("app");
    /// let (a, b) = tokio::try_join!(
    ///     Map::join_shared(&shared, "a", options()),
    ///     Map::join_shared(&shared, "b", options()),
    /// )?;
    /// a.set_and_wait("k", "v").await?;
    /// shared.close().await; // closes `a` and `b` too
    /// # drop(b); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`join`](Map::join); [`Error::SubscriptionsClosed`] when
    /// `subscriptions` was closed.
    pub async fn join_shared(
        subscriptions: &Subscriptions,
        name: &str,
        options: MapOptions,
    ) -> Result<Map, Error> {
        options.validate()?;
        Map::join_via(subscriptions, false, name, options).await
    }

    async fn join_via(
        subscriptions: &Subscriptions,
        owns_subscriptions: bool,
        name: &str,
        options: MapOptions,
    ) -> Result<Map, Error> {
        let keys = MapKeys::new(name, options.hash_tag.as_deref())?;
        let client = subscriptions.client();
        let Subscribed {
            subscription,
            mut messages,
            resyncs,
        } = subscriptions
            .subscribe(
                keys.channel.as_str(),
                options.message_buffer,
                owns_subscriptions,
            )
            .await?;
        let mut backlog = std::collections::VecDeque::new();
        let channel = Channel {
            messages: &mut messages,
            backlog: &mut backlog,
        };
        let snapshot = match load_snapshot(client, &keys, options.snapshot_limits(), channel).await
        {
            Ok(snapshot) => snapshot,
            Err(error) => {
                if !owns_subscriptions {
                    subscription.close().await;
                }
                return Err(error);
            }
        };
        let shared = Arc::new(Shared::new(State {
            data: snapshot.data,
            rev: snapshot.rev,
            version: 1,
        }));
        let (requests_tx, requests) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let task = SyncTask {
            shared: shared.clone(),
            client: client.clone(),
            subscription,
            keys: keys.clone(),
            messages,
            backlog,
            resyncs,
            requests,
            cancel: cancel.clone(),
            revision_check: options.revision_check,
            snapshot_limits: options.snapshot_limits(),
            awaiting: Some(snapshot.token),
            dirty: false,
            retry_at: Instant::now(),
            resubscribe: false,
            behind: None,
            awaiting_ticks: 0,
        };
        tracker.spawn(task.run());
        tracker.close();
        Ok(Map {
            inner: Arc::new(Inner {
                name: name.to_string(),
                keys,
                options,
                client: client.clone(),
                shared,
                requests: requests_tx,
                cancel,
                tracker,
            }),
        })
    }

    /// The map's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The Redis key and channel names of this map (for scripts that use
    /// the [Lua prelude](crate::lua)).
    pub fn keys_info(&self) -> &MapKeys {
        &self.inner.keys
    }

    /// The options the map was joined with.
    pub fn options(&self) -> &MapOptions {
        &self.inner.options
    }

    /// The local value of `key`.
    pub fn get(&self, key: &str) -> Option<String> {
        self.inner
            .shared
            .load()
            .data
            .get(key)
            .map(|v| v.to_string())
    }

    /// The local value of `key` read as a list (a JSON array of strings);
    /// `None` when the key is missing or does not hold such a list.
    pub fn get_values(&self, key: &str) -> Option<Vec<String>> {
        let state = self.inner.shared.load();
        serde_json::from_str(state.data.get(key)?).ok()
    }

    /// The local keys, in no particular order.
    pub fn keys(&self) -> Vec<String> {
        self.inner
            .shared
            .load()
            .data
            .keys()
            .map(|k| k.to_string())
            .collect()
    }

    /// The number of local keys.
    pub fn len(&self) -> usize {
        self.inner.shared.load().data.len()
    }

    /// Whether the local replica has no keys.
    pub fn is_empty(&self) -> bool {
        self.inner.shared.load().data.is_empty()
    }

    /// Whether `key` is present locally.
    pub fn contains_key(&self, key: &str) -> bool {
        self.inner.shared.load().data.contains_key(key)
    }

    /// The whole local content as one consistent copy. The copy is cached
    /// until the map changes, so repeated calls between changes are cheap;
    /// the first call after a change costs O(len).
    pub fn snapshot(&self) -> Arc<HashMap<String, String>> {
        self.inner.shared.snapshot()
    }

    /// The last revision applied locally (every write bumps it by one).
    pub fn revision(&self) -> u64 {
        self.inner.shared.load().rev
    }

    async fn run<R: FromValue>(&self, script: &Script, args: Vec<String>) -> Result<R, Error> {
        if self.inner.shared.is_closed() || self.inner.cancel.is_cancelled() {
            return Err(Error::Closed);
        }
        let (mode, ms) = self.inner.options.ttl_args();
        let mut argv = Vec::with_capacity(args.len() + 3);
        argv.push(mode.to_string());
        argv.push(ms.to_string());
        // The replica's revision: a write that Redis would number at or
        // below it (Redis went back in time) starts a new sequence above it
        // (see `rmap_publish` in scripts/prelude.lua).
        argv.push(self.inner.shared.load().rev.to_string());
        argv.extend(args);
        let keys = &self.inner.keys;
        script
            .evalsha_with_reload(
                &self.inner.client,
                vec![
                    keys.hash.as_str(),
                    keys.revision.as_str(),
                    keys.channel.as_str(),
                ],
                argv,
            )
            .await
            .map_err(|error| {
                if error.details().contains("MALFORMED") {
                    Error::malformed("stored value", error.details().to_string())
                } else {
                    Error::Redis(error)
                }
            })
    }

    /// Sets `key` to `value`; returns the previous value.
    ///
    /// # Errors
    /// [`Error::Redis`], or [`Error::Closed`] after [`close`](Map::close).
    pub async fn set(&self, key: &str, value: &str) -> Result<Option<String>, Error> {
        let (_, previous) = self.set_with_revision(key, value).await?;
        Ok(previous)
    }

    async fn set_with_revision(
        &self,
        key: &str,
        value: &str,
    ) -> Result<(u64, Option<String>), Error> {
        self.run(&SCRIPTS.set, vec![key.to_string(), value.to_string()])
            .await
    }

    /// Sets `key` to `value` and returns once the local replica has applied
    /// this write (or a later revision); returns the previous value.
    /// Each caller waits on its own channel: waiting never blocks writers or
    /// other waiters.
    ///
    /// # Errors
    /// As [`set`](Map::set); [`Error::Closed`] when the map closes while
    /// waiting.
    ///
    /// # Cancel safety
    /// Dropping the future after the script ran leaves the write done.
    pub async fn set_and_wait(&self, key: &str, value: &str) -> Result<Option<String>, Error> {
        let (rev, previous) = self.set_with_revision(key, value).await?;
        self.wait_revision(rev).await?;
        Ok(previous)
    }

    /// Waits until the local replica has applied revision `rev`.
    ///
    /// When a resync finds Redis behind the replica (it lost data), every
    /// waiter wakes: a lost write's revision would never come. A waiter
    /// then asks Redis for its revision, and waits again when Redis has
    /// reached `rev` (the write is there, or was overtaken by later ones:
    /// the resync read Redis before it, and the replica follows on), so a
    /// write that Redis kept is never reported before the replica shows
    /// it. It returns when Redis is below `rev` (the write was lost).
    ///
    /// # Errors
    /// [`Error::Closed`] when the map closes first; [`Error::Redis`] when
    /// Redis cannot be asked after a regression.
    pub async fn wait_revision(&self, rev: u64) -> Result<(), Error> {
        let shared = &self.inner.shared;
        loop {
            match shared.wait_for_revision(rev) {
                Some(rx) => rx.await.map_err(|_| Error::Closed)?,
                None if shared.is_closed() => return Err(Error::Closed),
                None => return Ok(()),
            }
            if shared.load().rev >= rev {
                return Ok(());
            }
            // Woken by a regression, with the replica still below `rev`.
            let in_redis: Option<u64> = self
                .inner
                .client
                .get(self.inner.keys.revision.as_str())
                .await?;
            if in_redis.unwrap_or(0) < rev {
                return Ok(());
            }
        }
    }

    /// Sets `key` only if it does not exist; `true` when written.
    ///
    /// # Errors
    /// As [`set`](Map::set).
    pub async fn set_if_not_exists(&self, key: &str, value: &str) -> Result<bool, Error> {
        let rev: u64 = self
            .run(&SCRIPTS.set_nx, vec![key.to_string(), value.to_string()])
            .await?;
        Ok(rev > 0)
    }

    /// Sets `key` to `value` only if its current value is `expected`;
    /// `true` when written.
    ///
    /// # Errors
    /// As [`set`](Map::set).
    pub async fn test_and_set(
        &self,
        key: &str,
        expected: &str,
        value: &str,
    ) -> Result<bool, Error> {
        let rev: u64 = self
            .run(
                &SCRIPTS.test_and_set,
                vec![key.to_string(), expected.to_string(), value.to_string()],
            )
            .await?;
        Ok(rev > 0)
    }

    /// Deletes `key` only if its current value is `expected`; `true` when
    /// deleted.
    ///
    /// # Errors
    /// As [`set`](Map::set).
    pub async fn test_and_delete(&self, key: &str, expected: &str) -> Result<bool, Error> {
        let deleted: u64 = self
            .run(
                &SCRIPTS.test_and_delete,
                vec![key.to_string(), expected.to_string()],
            )
            .await?;
        Ok(deleted == 1)
    }

    /// Deletes `key`; returns the previous value (`None`: nothing deleted).
    ///
    /// # Errors
    /// As [`set`](Map::set).
    pub async fn delete(&self, key: &str) -> Result<Option<String>, Error> {
        self.run(&SCRIPTS.delete, vec![key.to_string()]).await
    }

    /// Adds `by` to the integer stored at `key` (missing counts as 0);
    /// returns the new value.
    ///
    /// # Errors
    /// [`Error::Malformed`] when the stored value is not an integer or the
    /// result would overflow; otherwise as [`set`](Map::set).
    pub async fn inc(&self, key: &str, by: i64) -> Result<i64, Error> {
        let value: String = self
            .run(&SCRIPTS.inc, vec![key.to_string(), by.to_string()])
            .await?;
        value
            .parse()
            .map_err(|_| Error::malformed("integer reply", value))
    }

    /// Appends `values` to the list at `key` (created when missing); returns
    /// the resulting list.
    ///
    /// # Errors
    /// [`Error::Malformed`] when the stored value is not a JSON array of
    /// strings; otherwise as [`set`](Map::set).
    pub async fn append_values(&self, key: &str, values: &[&str]) -> Result<Vec<String>, Error> {
        self.append(key, values, false).await
    }

    /// Appends those of `values` that the list at `key` does not hold yet
    /// (each once); returns the resulting list.
    ///
    /// # Errors
    /// As [`append_values`](Map::append_values).
    pub async fn append_unique_values(
        &self,
        key: &str,
        values: &[&str],
    ) -> Result<Vec<String>, Error> {
        self.append(key, values, true).await
    }

    async fn append(&self, key: &str, values: &[&str], unique: bool) -> Result<Vec<String>, Error> {
        let mut args = Vec::with_capacity(values.len() + 2);
        args.push(key.to_string());
        args.push(if unique { "1" } else { "0" }.to_string());
        args.extend(values.iter().map(|v| v.to_string()));
        let list: Option<String> = self.run(&SCRIPTS.append, args).await?;
        decode_list(list)
    }

    /// Removes every occurrence of `values` from the list at `key`; a list
    /// left empty deletes the key. Returns the resulting list.
    ///
    /// # Errors
    /// As [`append_values`](Map::append_values).
    pub async fn remove_values(&self, key: &str, values: &[&str]) -> Result<Vec<String>, Error> {
        let mut args = Vec::with_capacity(values.len() + 1);
        args.push(key.to_string());
        args.extend(values.iter().map(|v| v.to_string()));
        let list: Option<String> = self.run(&SCRIPTS.remove, args).await?;
        decode_list(list)
    }

    /// Deletes every key (replicated as one [`Reset`](crate::MapEventKind::Reset)).
    ///
    /// # Errors
    /// As [`set`](Map::set).
    pub async fn reset(&self) -> Result<(), Error> {
        let _rev: u64 = self.run(&SCRIPTS.reset, Vec::new()).await?;
        Ok(())
    }

    /// Deletes every key (replicas see a reset), deletes the map's Redis
    /// keys, then [closes](Map::close) this replica.
    ///
    /// # Errors
    /// As [`set`](Map::set); the map is not closed when the script failed.
    pub async fn destroy(&self) -> Result<(), Error> {
        let keys = &self.inner.keys;
        if self.inner.shared.is_closed() {
            return Err(Error::Closed);
        }
        let _rev: u64 = SCRIPTS
            .destroy
            .evalsha_with_reload(
                &self.inner.client,
                vec![
                    keys.hash.as_str(),
                    keys.revision.as_str(),
                    keys.channel.as_str(),
                ],
                Vec::<String>::new(),
            )
            .await?;
        self.close().await;
        Ok(())
    }

    /// Waits until `predicate` holds for the map, re-checking after every
    /// change the replica applies (no polling).
    ///
    /// # Errors
    /// [`Error::Timeout`] when it does not hold within `timeout`;
    /// [`Error::Closed`] when the map closes.
    pub async fn wait_for<F: Fn(&Map) -> bool>(
        &self,
        timeout: Duration,
        predicate: F,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let mut changes = self.inner.shared.watch();
        loop {
            changes.borrow_and_update();
            if predicate(self) {
                return Ok(());
            }
            if self.inner.shared.is_closed() {
                return Err(Error::Closed);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Err(_) => return Err(Error::Timeout(timeout)),
                Ok(Err(_)) => return Err(Error::Closed),
                Ok(Ok(())) => {}
            }
        }
    }

    /// Counts the resyncs that found Redis *behind* this replica: Redis lost
    /// writes this replica had seen (restarted from an older snapshot or AOF,
    /// a replica promoted with lost writes). The receiver changes after each
    /// such resync, once the replica shows Redis's (older) content. An empty
    /// restart is not counted: a re-created revision starts at server time,
    /// ahead of the replica.
    pub fn regressions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.shared.regressions()
    }

    /// Counts the change messages that began a new revision sequence while
    /// this replica held a revision: the map's revision key had vanished
    /// (the map was destroyed, or Redis lost its data without going back in
    /// time: a restart without persistence, a `FLUSHALL`), and someone
    /// wrote to the map again. The receiver changes as soon as that first
    /// write's message arrives, whoever made it, before the replica resyncs:
    /// the earliest notice a replica gets of a loss that
    /// [`regressions`](Map::regressions) does not show. A map's very first
    /// write (the replica held no revision) is not counted.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(map: &flotilla_rmap::Map) {
    /// let mut restarts = map.sequence_restarts();
    /// // Wakes when the map's revision sequence starts anew.
    /// if restarts.changed().await.is_ok() {
    ///     // Redis may have lost its data: check what it still holds.
    /// }
    /// # }
    /// ```
    pub fn sequence_restarts(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.shared.sequence_restarts()
    }

    /// The highest revision this replica has applied since it joined (or
    /// since [`reset_revision_high_water`](Map::reset_revision_high_water)).
    /// Unlike [`revision`](Map::revision) it does not go back when a resync
    /// finds Redis behind the replica, so a script given it can tell that
    /// Redis went back in time even after the replica caught up with that.
    pub fn revision_high_water(&self) -> u64 {
        self.inner.shared.high_water()
    }

    /// Lowers [`revision_high_water`](Map::revision_high_water) to the
    /// current revision: call it once the caller has dealt with Redis going
    /// back in time.
    pub fn reset_revision_high_water(&self) {
        self.inner.shared.reset_high_water();
    }

    /// A stream of change events, starting now. See [`MapEvents`].
    pub fn subscribe(&self) -> MapEvents {
        let (tx, rx) = events::channel(self.inner.options.event_buffer);
        if !self.inner.shared.is_closed() {
            self.inner.shared.subscribe(tx);
        }
        rx
    }

    /// Reloads the snapshot from Redis now.
    ///
    /// Messages already received are applied first (their events are
    /// delivered in revision order); then every subscriber gets exactly one
    /// [`Resynced`](crate::MapEventKind::Resynced) event, which covers any
    /// write whose own event it did not get (see the event contract in the
    /// crate README).
    ///
    /// # Errors
    /// [`Error::Redis`] when the snapshot could not be loaded (the replica
    /// keeps retrying by itself); [`Error::Closed`] after close.
    pub async fn resync(&self) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .requests
            .send(tx)
            .await
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Ends the background task and the subscription, and waits for them.
    /// Local reads keep returning the last content; writes fail with
    /// [`Error::Closed`]. Idempotent.
    pub async fn close(&self) {
        self.inner.cancel.cancel();
        self.inner.tracker.wait().await;
    }
}

fn decode_list(list: Option<String>) -> Result<Vec<String>, Error> {
    match list {
        None => Ok(Vec::new()),
        Some(json) => serde_json::from_str(&json).map_err(|_| Error::malformed("list reply", json)),
    }
}

impl fmt::Debug for Map {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.shared.load();
        f.debug_struct("Map")
            .field("name", &self.inner.name)
            .field("hash", &self.inner.keys.hash)
            .field("len", &state.data.len())
            .field("revision", &state.rev)
            .field("closed", &self.inner.shared.is_closed())
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
#[path = "map_wait_tests.rs"]
mod wait_tests;
