//! [`Subscriptions`]: one pub/sub connection shared by many maps.
//!
//! A router task reads every message of the shared subscriber connection
//! and hands it to the maps subscribed to its channel, each through its own
//! bounded queue (a map that falls behind loses messages from its queue
//! only, notices, and resyncs; it never slows the others). A reconnect of
//! the connection, or the router itself falling behind, bumps one counter
//! that every map watches: each then resubscribes its channel and reloads
//! its snapshot, exactly as a map with a connection of its own does.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message as FredMessage;
use tokio::sync::{Mutex, broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::error::Error;

/// Bound on an unsubscribe or the quit at close, so a dead server cannot
/// hang a close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// One pub/sub connection shared by many [`Map`](crate::Map)s.
///
/// Every map joined with [`Map::join_shared`](crate::Map::join_shared)
/// subscribes its sharded channel on this one connection instead of opening
/// its own, so a process holds one subscriber connection however many maps
/// it mirrors. The guarantees are those of a map with its own connection:
/// when the shared connection reconnects (or the router falls behind and
/// drops messages), *every* map on it resubscribes and reloads its snapshot,
/// so no change is silently lost.
///
/// Cheap to clone; every clone is the same connection. Closing one map
/// unsubscribes its channel only (other maps on the same channel keep it);
/// [`close`](Subscriptions::close) ends the connection and closes every map
/// still joined through it. The connection also ends when the last clone
/// and the last map joined through it are dropped.
///
/// On Redis Cluster the subscriber is a clustered client (one connection
/// per primary, as every fred cluster client): each channel is subscribed
/// on the node that owns its slot, so maps in different slots share it
/// too. A reconnect of any of those connections resyncs every map.
///
/// # Examples
/// ```no_run
/// # async fn demo(client: &fred::prelude::Client) -> Result<(), flotilla_rmap::Error> {
/// use flotilla_rmap::{Map, MapOptions, Subscriptions, SubscriptionsOptions};
/// let subscriptions = Subscriptions::connect(client, SubscriptionsOptions::default()).await?;
/// let users = Map::join_shared(&subscriptions, "users", MapOptions::default()).await?;
/// let roles = Map::join_shared(&subscriptions, "roles", MapOptions::default()).await?;
/// roles.close().await; // unsubscribes `roles` only; `users` keeps going
/// subscriptions.close().await; // ends the connection and closes `users`
/// # drop(users); Ok(()) }
/// ```
#[derive(Clone)]
pub struct Subscriptions {
    inner: Arc<Inner>,
}

/// Options of [`Subscriptions::connect`]. Every field documents its default;
/// [`Default`] is the only place defaults live.
///
/// # Examples
/// ```
/// use flotilla_rmap::SubscriptionsOptions;
/// let options = SubscriptionsOptions::default().message_buffer(16_384);
/// assert_eq!(options.message_buffer, 16_384);
/// ```
#[derive(Debug, Clone)]
pub struct SubscriptionsOptions {
    /// Messages the shared connection buffers before its router falls
    /// behind; then every map resyncs. Each map also has its own queue of
    /// [`MapOptions::message_buffer`](crate::MapOptions::message_buffer)
    /// messages behind the router. Default: `8192`.
    pub message_buffer: usize,
}

impl Default for SubscriptionsOptions {
    fn default() -> Self {
        SubscriptionsOptions {
            message_buffer: 8192,
        }
    }
}

impl SubscriptionsOptions {
    /// Sets [`message_buffer`](SubscriptionsOptions::message_buffer).
    pub fn message_buffer(mut self, messages: usize) -> Self {
        self.message_buffer = messages;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a buffer under 16 messages.
    pub fn validate(&self) -> Result<(), Error> {
        if self.message_buffer < 16 {
            return Err(Error::InvalidOptions("message_buffer must be at least 16"));
        }
        Ok(())
    }
}

/// A channel's receivers, by subscription id.
type Routes = HashMap<String, Vec<(u64, broadcast::Sender<FredMessage>)>>;

struct Inner {
    /// The client maps run their commands on (not the subscriber).
    client: Client,
    subscriber: SubscriberClient,
    routes: Arc<ArcSwap<Routes>>,
    /// Held across a route change and its (S)SUBSCRIBE/SUNSUBSCRIBE, so the
    /// commands reach Redis in the order the routes changed.
    changes: Mutex<()>,
    /// Bumped when every map must resubscribe and resync; closed when the
    /// router ends.
    resyncs: watch::Receiver<u64>,
    next_id: AtomicU64,
    cancel: CancellationToken,
    /// Tracks the router and, through each [`Subscription`]'s token, every
    /// map joined here: [`Subscriptions::close`] returns once all ended.
    tracker: TaskTracker,
}

/// What a map gets when it subscribes: its handle on the channel, its
/// queue of messages, and the signal to resubscribe and resync.
pub(crate) struct Subscribed {
    pub(crate) subscription: Subscription,
    pub(crate) messages: broadcast::Receiver<FredMessage>,
    /// Changes when the connection reconnected (or the router dropped
    /// messages); closed when the connection ends.
    pub(crate) resyncs: watch::Receiver<u64>,
}

/// One map's subscription to its channel on a [`Subscriptions`].
pub(crate) struct Subscription {
    id: u64,
    channel: String,
    hub: Subscriptions,
    /// Keeps [`Subscriptions::close`] waiting until the map has closed.
    token: Option<TaskTrackerToken>,
    /// The map owns the connection (a map joined with its own): closing
    /// the map closes it.
    owns_hub: bool,
}

impl Subscriptions {
    /// Opens the shared subscriber connection with `client`'s settings (a
    /// client without a reconnect policy gets one: a replica that never
    /// reconnects would go stale silently) and starts its router task.
    /// Maps joined through it run their commands on `client`.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for bad options, [`Error::Redis`] when the
    /// connection cannot be opened.
    pub async fn connect(
        client: &Client,
        options: SubscriptionsOptions,
    ) -> Result<Subscriptions, Error> {
        options.validate()?;
        let mut builder = Builder::from_config(client.client_config());
        builder.set_connection_config(client.connection_config().clone());
        let mut perf = client.perf_config();
        perf.broadcast_channel_capacity = options.message_buffer;
        builder.set_performance_config(perf);
        builder.set_policy(
            client
                .client_reconnect_policy()
                .unwrap_or_else(|| ReconnectPolicy::new_exponential(0, 50, 2_000, 2)),
        );
        let subscriber = builder.build_subscriber_client()?;
        subscriber.init().await?;
        // After `init`, whose first connection is not a reconnect; before
        // any channel is subscribed, so no message is missed.
        let messages = subscriber.message_rx();
        let reconnects = subscriber.reconnect_rx();
        let routes = Arc::new(ArcSwap::from_pointee(Routes::new()));
        let (resyncs_tx, resyncs) = watch::channel(0);
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(
            Router {
                subscriber: subscriber.clone(),
                routes: routes.clone(),
                messages,
                reconnects,
                resyncs: resyncs_tx,
                cancel: cancel.clone(),
            }
            .run(),
        );
        tracker.close();
        Ok(Subscriptions {
            inner: Arc::new(Inner {
                client: client.clone(),
                subscriber,
                routes,
                changes: Mutex::new(()),
                resyncs,
                next_id: AtomicU64::new(1),
                cancel,
                tracker,
            }),
        })
    }

    /// The client that maps joined through this connection run their
    /// commands on.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The channels subscribed on the connection now, sorted.
    pub fn channels(&self) -> Vec<String> {
        let mut channels: Vec<String> = self.inner.routes.load().keys().cloned().collect();
        channels.sort();
        channels
    }

    /// Whether [`close`](Subscriptions::close) ran (or the router ended).
    pub fn is_closed(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Ends the router and the connection, and waits for them and for
    /// every map still joined through it to close (their local reads keep
    /// the last content; writes fail with [`Error::Closed`]). Idempotent.
    pub async fn close(&self) {
        self.inner.cancel.cancel();
        self.inner.tracker.wait().await;
    }

    /// Subscribes to `channel` for one map: routes it first, then sends
    /// `SSUBSCRIBE`, so nothing published once this returns is missed.
    /// `buffer` bounds the map's queue.
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        buffer: usize,
        owns_hub: bool,
    ) -> Result<Subscribed, Error> {
        let inner = &self.inner;
        let _order = inner.changes.lock().await;
        if self.is_closed() {
            return Err(Error::SubscriptionsClosed);
        }
        // A resync signal from now on concerns this map too.
        let mut resyncs = inner.resyncs.clone();
        resyncs.borrow_and_update();
        let (tx, messages) = broadcast::channel(buffer);
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        inner.routes.rcu(|routes| {
            let mut routes = Routes::clone(routes);
            routes
                .entry(channel.to_string())
                .or_default()
                .push((id, tx.clone()));
            routes
        });
        let subscription = Subscription {
            id,
            channel: channel.to_string(),
            hub: self.clone(),
            token: Some(inner.tracker.token()),
            owns_hub,
        };
        if let Err(error) = inner.subscriber.ssubscribe(channel).await {
            self.remove_route(id, channel);
            return Err(error.into());
        }
        Ok(Subscribed {
            subscription,
            messages,
            resyncs,
        })
    }

    /// Removes one route; `true` when nobody else listens on `channel`.
    fn remove_route(&self, id: u64, channel: &str) -> bool {
        let mut last = false;
        self.inner.routes.rcu(|routes| {
            let mut routes = Routes::clone(routes);
            if let Some(receivers) = routes.get_mut(channel) {
                receivers.retain(|(other, _)| *other != id);
                last = receivers.is_empty();
                if last {
                    routes.remove(channel);
                }
            }
            routes
        });
        last
    }
}

impl Subscription {
    /// Sends `SSUBSCRIBE` for the map's channel again (after a reconnect;
    /// a channel already subscribed stays subscribed).
    pub(crate) async fn resubscribe(&self) -> Result<(), Error> {
        let inner = &self.hub.inner;
        let _order = inner.changes.lock().await;
        if self.hub.is_closed() {
            return Err(Error::SubscriptionsClosed);
        }
        inner.subscriber.ssubscribe(self.channel.as_str()).await?;
        Ok(())
    }

    /// Leaves the channel: `SUNSUBSCRIBE` once no other map on this
    /// connection listens to it; closes the connection when the map owns it.
    pub(crate) async fn close(mut self) {
        // Its own close must not wait for it.
        drop(self.token.take());
        if self.owns_hub {
            self.hub.close().await;
            return;
        }
        let inner = &self.hub.inner;
        let leave = async {
            let _order = inner.changes.lock().await;
            if self.hub.remove_route(self.id, &self.channel) && !self.hub.is_closed() {
                let _ = inner.subscriber.sunsubscribe(self.channel.as_str()).await;
            }
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, leave).await.is_err() {
            // The route is gone either way; a stale subscription only costs
            // messages the router drops.
            self.hub.remove_route(self.id, &self.channel);
            tracing::debug!(channel = %self.channel, "unsubscribe did not finish in time");
        }
    }
}

/// The task that hands each message to the maps of its channel.
struct Router {
    subscriber: SubscriberClient,
    routes: Arc<ArcSwap<Routes>>,
    messages: broadcast::Receiver<FredMessage>,
    reconnects: broadcast::Receiver<Server>,
    resyncs: watch::Sender<u64>,
    cancel: CancellationToken,
}

impl Router {
    async fn run(mut self) {
        loop {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => break,
                r = self.reconnects.recv() => match r {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        tracing::debug!("shared pub/sub reconnected: every map resubscribes and resyncs");
                        self.resyncs.send_modify(|n| *n += 1);
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                m = self.messages.recv() => match m {
                    Ok(message) => self.route(message),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "shared pub/sub fell behind: every map resyncs");
                        self.resyncs.send_modify(|n| *n += 1);
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        self.cancel.cancel();
        // Dropping the senders ends every map's task.
        self.routes.store(Arc::new(Routes::new()));
        let quit = async {
            let _ = self.subscriber.unsubscribe_all().await;
            let _ = self.subscriber.quit().await;
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, quit).await.is_err() {
            tracing::debug!("shared subscriber did not quit in time");
        }
    }

    /// Hands `message` to every map of its channel. Never waits: a full
    /// queue drops its oldest message and that map resyncs.
    fn route(&self, message: FredMessage) {
        let routes = self.routes.load();
        match routes.get(&*message.channel) {
            Some(receivers) => {
                for (_, tx) in receivers {
                    let _ = tx.send(message.clone());
                }
            }
            None => {
                tracing::trace!(channel = %message.channel, "message for no map (left already)")
            }
        }
    }
}

impl fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriptions")
            .field("channels", &self.inner.routes.load().len())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .field("owns_hub", &self.owns_hub)
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
