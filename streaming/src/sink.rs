//! [`Sink`]: a consumer group; each event goes to one member (fan-in,
//! `XREADGROUP`), at least once.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use fred::prelude::*;
use fred::types::Value;
use fred::types::streams::XID;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::conn::{self, Backoff};
use crate::event::{RawEntry, decode, parse_xread};
use crate::fanout::{self, Subscribers};
use crate::members::Members;
use crate::options::{SinkOptions, StartPosition, exclusive_start};
use crate::{Error, Event, Stream};

/// A member of a named consumer group over one or more streams.
///
/// Many processes join the same sink name; each event is delivered to
/// exactly one live member, which [`ack`](Sink::ack)s it. Events not acked
/// within [`SinkOptions::ack_grace`] are claimed by another live member;
/// members keep alive every third of [`SinkOptions::member_ttl`], and stale
/// members are removed (after their pending events were claimed) at join
/// and periodically. Delivery is at least once. On Redis Cluster all
/// streams of one sink must share a hash tag.
///
/// # Examples
/// ```no_run
/// # async fn demo(client: fred::prelude::Client) -> Result<(), flotilla_streaming::Error> {
/// use futures::StreamExt;
/// use flotilla_streaming::{Sink, SinkOptions, Stream, StreamOptions};
/// let stream = Stream::new(&client, "orders", StreamOptions::default())?;
/// let sink = Sink::join(&client, "billing", &[&stream], SinkOptions::default()).await?;
/// let mut events = sink.events();
/// while let Some(event) = events.next().await {
///     // ... handle the event, then:
///     sink.ack(&event).await?;
/// }
/// sink.close().await;
/// # Ok(()) }
/// ```
pub struct Sink {
    shared: Arc<Shared>,
    _guard: Arc<DropGuard>,
}

/// A subscriber of a [`Sink`]: each event the member receives goes to one
/// of its subscribers. Ends when the sink closes.
#[derive(Debug)]
pub struct SinkEvents {
    inner: fanout::Receiver,
}

pub(crate) struct Shared {
    pub(crate) client: Client,
    conn: Client,
    pub(crate) group: String,
    pub(crate) member_id: String,
    pub(crate) options: SinkOptions,
    pub(crate) members: Members,
    state: Mutex<State>,
    /// Events delivered to a subscriber and not acked yet: (stream, id).
    in_flight: Mutex<HashSet<(String, String)>>,
    subscribers: Subscribers,
    changed: Notify,
    pub(crate) cancel: CancellationToken,
    tasks: tokio::sync::Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    /// Streams being read: name → key.
    streams: BTreeMap<String, String>,
    /// Every stream ever added (for acks after removal): name → key.
    known: BTreeMap<String, String>,
    generation: u64,
    reading: Option<u64>,
}

impl Sink {
    /// Joins the sink `name` over `streams`: creates the consumer group
    /// where missing (at `options.start`, creating the stream), registers
    /// this member and starts reading, claiming and keeping alive.
    ///
    /// # Errors
    /// [`Error::InvalidName`] / [`Error::InvalidOption`] for bad input (a
    /// hash tag is needed when `streams` is empty), [`Error::Redis`] when
    /// Redis fails.
    pub async fn join(
        client: &Client,
        name: &str,
        streams: &[&Stream],
        options: SinkOptions,
    ) -> Result<Sink, Error> {
        crate::error::check_name(name)?;
        options.validate()?;
        let tag = match (&options.hash_tag, streams.first()) {
            (Some(tag), _) => tag.clone(),
            (None, Some(s)) => s.hash_tag().to_string(),
            (None, None) => {
                return Err(Error::InvalidOption {
                    option: "hash_tag",
                    reason: "needed when a sink starts without streams",
                });
            }
        };
        let member_id = options.member_id.clone().unwrap_or_else(random_member_id);
        let members = Members::join(client, name, &tag).await?;
        if let Err(e) = members.renew(&member_id).await {
            members.close().await;
            return Err(e);
        }
        let conn = match conn::dedicated(client).await {
            Ok(conn) => conn,
            Err(e) => {
                members.close().await;
                return Err(e);
            }
        };
        let cancel = CancellationToken::new();
        let shared = Arc::new(Shared {
            client: client.clone(),
            conn,
            group: name.to_string(),
            member_id,
            subscribers: Subscribers::new(options.buffer),
            options,
            members,
            state: Mutex::new(State::default()),
            in_flight: Mutex::new(HashSet::new()),
            changed: Notify::new(),
            cancel: cancel.clone(),
            tasks: tokio::sync::Mutex::new(Vec::new()),
        });
        for stream in streams {
            shared.add(stream).await?;
        }
        let tasks = vec![
            tokio::spawn(read_loop(shared.clone())),
            tokio::spawn(crate::claim::keepalive_loop(shared.clone())),
            tokio::spawn(crate::claim::claim_loop(shared.clone())),
        ];
        *shared.tasks.lock().await = tasks;
        Ok(Sink {
            shared,
            _guard: Arc::new(cancel.drop_guard()),
        })
    }

    /// A new subscriber; each event of this member goes to one subscriber.
    /// The member reads only while it has a subscriber.
    pub fn events(&self) -> SinkEvents {
        SinkEvents {
            inner: fanout::Receiver {
                rx: self.shared.subscribers.subscribe(),
            },
        }
    }

    /// Acknowledges an event (`XACK`; the entry stays in the stream, trim
    /// it with [`StreamOptions::max_len`](crate::StreamOptions::max_len) or
    /// [`Stream::remove`]).
    ///
    /// # Errors
    /// [`Error::UnknownStream`] for an event of a stream this sink never
    /// read; [`Error::Redis`] when Redis fails (the event will be
    /// redelivered after the grace period).
    pub async fn ack(&self, event: &Event) -> Result<(), Error> {
        let key = lock(&self.shared.state).known.get(&event.stream).cloned();
        let Some(key) = key else {
            return Err(Error::UnknownStream(event.stream.clone()));
        };
        self.shared
            .ack_raw(&key, std::slice::from_ref(&event.id))
            .await?;
        lock(&self.shared.in_flight).remove(&(event.stream.clone(), event.id.clone()));
        Ok(())
    }

    /// Adds a stream to the sink (creating the group on it where missing);
    /// takes effect within milliseconds.
    ///
    /// # Errors
    /// [`Error::Closed`] after close; [`Error::Redis`] when Redis fails.
    pub async fn add_stream(&self, stream: &Stream) -> Result<(), Error> {
        if self.shared.cancel.is_cancelled() {
            return Err(Error::Closed);
        }
        if let Some(generation) = self.shared.add(stream).await? {
            self.shared.interrupt(generation).await;
        }
        Ok(())
    }

    /// Stops reading a stream; takes effect within milliseconds. Events of
    /// it already read by this member are still delivered and can be acked;
    /// its pending events stay in the group and are claimed by members still
    /// reading it.
    ///
    /// # Errors
    /// [`Error::Closed`] after close.
    pub async fn remove_stream(&self, name: &str) -> Result<(), Error> {
        if self.shared.cancel.is_cancelled() {
            return Err(Error::Closed);
        }
        let generation = {
            let mut state = lock(&self.shared.state);
            if state.streams.remove(name).is_none() {
                return Ok(());
            }
            state.generation += 1;
            state.generation
        };
        self.shared.interrupt(generation).await;
        Ok(())
    }

    /// This member's consumer name in the group.
    pub fn member_id(&self) -> &str {
        &self.shared.member_id
    }

    /// The sink's name (the consumer group's name).
    pub fn name(&self) -> &str {
        &self.shared.group
    }

    /// Leaves the sink: stops reading, hands this member's pending events
    /// to another live member (or leaves them pending for the next member
    /// to claim when none is live), deletes its consumer once it has no
    /// pending entries, and ends every subscriber's stream. Idempotent.
    pub async fn close(&self) {
        self.shared.cancel.cancel();
        let tasks = std::mem::take(&mut *self.shared.tasks.lock().await);
        if tasks.is_empty() {
            return;
        }
        for task in tasks {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "sink task failed");
            }
        }
        self.shared.subscribers.close();
        crate::claim::leave(&self.shared).await;
        self.shared.members.close().await;
        if let Err(e) = conn::quit(&self.shared.client, &self.shared.conn).await {
            tracing::debug!(error = %e, "closing the sink's connection failed");
        }
    }
}

impl Shared {
    pub(crate) fn streams(&self) -> Vec<(String, String)> {
        let state = lock(&self.state);
        state
            .streams
            .iter()
            .map(|(n, k)| (n.clone(), k.clone()))
            .collect()
    }

    pub(crate) fn is_in_flight(&self, stream: &str, id: &str) -> bool {
        lock(&self.in_flight).contains(&(stream.to_string(), id.to_string()))
    }

    pub(crate) async fn ack_raw(&self, key: &str, ids: &[String]) -> Result<(), Error> {
        let _: i64 = self
            .client
            .xack(key, self.group.as_str(), ids.to_vec())
            .await?;
        Ok(())
    }

    async fn create_group(&self, key: &str, start: &StartPosition) -> Result<(), Error> {
        let id = match exclusive_start(start) {
            None => XID::Max,
            Some(id) => XID::Manual(id.into()),
        };
        match self
            .client
            .xgroup_create::<Value, _, _, _>(key, self.group.as_str(), id, true)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.details().starts_with("BUSYGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn add(&self, stream: &Stream) -> Result<Option<u64>, Error> {
        if lock(&self.state).streams.contains_key(stream.name()) {
            return Ok(None);
        }
        self.create_group(stream.key(), &self.options.start).await?;
        let generation = {
            let mut state = lock(&self.state);
            state.generation += 1;
            let name = stream.name().to_string();
            state.streams.insert(name.clone(), stream.key().to_string());
            state.known.insert(name, stream.key().to_string());
            state.generation
        };
        self.changed.notify_one();
        Ok(Some(generation))
    }

    async fn interrupt(&self, generation: u64) {
        let deadline = tokio::time::Instant::now() + self.options.block + Duration::from_secs(1);
        loop {
            match lock(&self.state).reading {
                Some(g) if g < generation => {}
                _ => return,
            }
            if self.cancel.is_cancelled() || tokio::time::Instant::now() > deadline {
                return;
            }
            conn::unblock(&self.client, &self.conn).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Hands entries read or claimed by this member to a subscriber;
    /// malformed, deleted and filtered-out entries are acked. Returns
    /// `false` when the sink is closing.
    pub(crate) async fn deliver(&self, name: &str, key: &str, entries: Vec<RawEntry>) -> bool {
        let mut to_ack = Vec::new();
        let mut ok = true;
        for (id, fields) in entries {
            let event = match fields.map(|f| decode(name, id.clone(), f)) {
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    tracing::warn!(stream = %name, id = %id, error = %e, "acking malformed stream entry");
                    to_ack.push(id);
                    continue;
                }
                None => {
                    to_ack.push(id);
                    continue;
                }
            };
            if !self.options.topic.matches(event.topic.as_deref()) {
                to_ack.push(id);
                continue;
            }
            lock(&self.in_flight).insert((name.to_string(), id));
            if !self.send(event).await {
                ok = false;
                break;
            }
        }
        if !to_ack.is_empty()
            && let Err(e) = self.ack_raw(key, &to_ack).await
        {
            tracing::warn!(stream = %name, error = %e, "acking skipped entries failed; they will be claimed again");
        }
        ok
    }

    async fn send(&self, mut event: Event) -> bool {
        loop {
            let sent = tokio::select! {
                _ = self.cancel.cancelled() => return false,
                r = self.subscribers.send_one(event) => r,
            };
            match sent {
                Ok(()) => return true,
                Err(back) => {
                    event = back;
                    tokio::select! {
                        _ = self.cancel.cancelled() => return false,
                        _ = self.subscribers.wait_any() => {}
                    }
                }
            }
        }
    }

    pub(crate) async fn wait_subscriber(&self) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = self.subscribers.wait_any() => true,
        }
    }

    async fn recreate_groups(&self) {
        for (_, key) in self.streams() {
            if let Err(e) = self.create_group(&key, &StartPosition::Oldest).await {
                tracing::warn!(key = %key, error = %e, "recreating the consumer group failed");
            }
        }
    }
}

async fn read_loop(shared: Arc<Shared>) {
    let mut backoff = Backoff::new();
    let options = conn::blocking_options(shared.options.block);
    let block_ms = shared.options.block.as_millis() as u64;
    loop {
        if !shared.wait_subscriber().await {
            break;
        }
        let plan = {
            let mut state = lock(&shared.state);
            if state.streams.is_empty() {
                None
            } else {
                state.reading = Some(state.generation);
                Some(
                    state
                        .streams
                        .iter()
                        .map(|(n, k)| (n.clone(), k.clone()))
                        .collect::<Vec<_>>(),
                )
            }
        };
        let Some(plan) = plan else {
            tokio::select! {
                _ = shared.cancel.cancelled() => break,
                _ = shared.changed.notified() => continue,
            }
        };
        let keys: Vec<String> = plan.iter().map(|(_, k)| k.clone()).collect();
        let ids: Vec<XID> = plan.iter().map(|_| XID::NewInGroup).collect();
        let conn = shared.conn.with_options(&options);
        let read = conn.xreadgroup::<Value, _, _, _, _>(
            shared.group.as_str(),
            shared.member_id.as_str(),
            Some(shared.options.max_events),
            Some(block_ms),
            false,
            keys,
            ids,
        );
        let result = tokio::select! {
            _ = shared.cancel.cancelled() => break,
            r = read => r,
        };
        lock(&shared.state).reading = None;
        match result {
            Ok(reply) => {
                backoff.reset();
                for (key, entries) in parse_xread(reply) {
                    let Some((name, _)) = plan.iter().find(|(_, k)| *k == key) else {
                        continue;
                    };
                    if !shared.deliver(name, &key, entries).await {
                        break;
                    }
                }
            }
            Err(e) => {
                if e.details().starts_with("NOGROUP") {
                    tracing::warn!(group = %shared.group, "consumer group missing (stream deleted or Redis data lost); recreating");
                    shared.recreate_groups().await;
                    continue;
                }
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "XREADGROUP failed; retrying");
                tokio::select! {
                    _ = shared.cancel.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    lock(&shared.state).reading = None;
}

fn random_member_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("m-{}-{:016x}", std::process::id(), h.finish())
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl futures::Stream for SinkEvents {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl fmt::Debug for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sink")
            .field("name", &self.shared.group)
            .field("member_id", &self.shared.member_id)
            .field("streams", &self.shared.streams())
            .finish_non_exhaustive()
    }
}
