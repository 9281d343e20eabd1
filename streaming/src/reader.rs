//! [`Reader`]: every reader sees every event (fan-out, `XREAD`).

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use fred::prelude::*;
use fred::types::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::conn::{self, Backoff};
use crate::event::{decode, parse_xread};
use crate::fanout::{self, Subscribers};
use crate::options::{ReaderOptions, StartPosition, exclusive_start};
use crate::{Error, Event, Stream};

/// Reads one or more streams with `XREAD` on a dedicated connection and
/// hands every event to every subscriber ([`Reader::events`]).
///
/// The reader keeps the last delivered id per stream; it survives Redis
/// restarts and errors (logs, backs off, retries from its last id). It
/// reads only while at least one subscriber exists, and a full subscriber
/// channel makes it wait (backpressure, no loss). On Redis Cluster all
/// streams of one reader must share a hash tag. Clones share one reader,
/// which stops when it is closed or the last clone is dropped.
///
/// # Examples
/// ```no_run
/// # async fn demo(client: fred::prelude::Client) -> Result<(), flotilla_streaming::Error> {
/// use futures::StreamExt;
/// use flotilla_streaming::{Reader, ReaderOptions, Stream, StreamOptions};
/// let stream = Stream::new(&client, "orders", StreamOptions::default())?;
/// let reader = Reader::new(&client, &[&stream], ReaderOptions::default()).await?;
/// let mut events = reader.events();
/// stream.add("created", "1").await?;
/// let event = events.next().await;
/// reader.close().await;
/// # let _ = event; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reader {
    shared: Arc<Shared>,
    _guard: Arc<DropGuard>,
}

/// A subscriber of a [`Reader`]: an async stream of every event the reader
/// reads after this subscriber was created. Ends when the reader closes.
#[derive(Debug)]
pub struct ReaderEvents {
    inner: fanout::Receiver,
}

struct Shared {
    client: Client,
    conn: Client,
    options: ReaderOptions,
    state: Mutex<State>,
    subscribers: Subscribers,
    changed: Notify,
    cancel: CancellationToken,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    streams: BTreeMap<String, Cursor>,
    generation: u64,
    /// Generation of the stream set used by the `XREAD` in flight.
    reading: Option<u64>,
}

struct Cursor {
    key: String,
    last_id: String,
    epoch: u64,
    /// Ids delivered lately, to resume after Redis went back in time.
    history: crate::rewind::History,
}

/// What one `XREAD` asked for: key → (name, epoch).
type Plan = Vec<(String, String, u64)>;

impl Reader {
    /// Starts a reader on `streams` at `options.start` (resolved now:
    /// [`StartPosition::Newest`] means "after the stream's current last
    /// entry", so events added after this returns are seen).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for bad options, [`Error::Redis`] when the
    /// dedicated connection cannot be opened or a start cannot be resolved.
    pub async fn new(
        client: &Client,
        streams: &[&Stream],
        options: ReaderOptions,
    ) -> Result<Reader, Error> {
        options.validate()?;
        let conn = conn::dedicated(client).await?;
        let cancel = CancellationToken::new();
        let shared = Arc::new(Shared {
            client: client.clone(),
            conn,
            subscribers: Subscribers::new(options.buffer),
            options,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            cancel: cancel.clone(),
            task: tokio::sync::Mutex::new(None),
        });
        for stream in streams {
            shared.insert(stream, None).await?;
        }
        let task = tokio::spawn(run(shared.clone()));
        *shared.task.lock().await = Some(task);
        Ok(Reader {
            shared,
            _guard: Arc::new(cancel.drop_guard()),
        })
    }

    /// A new subscriber. Every subscriber sees every event read after it
    /// was created.
    pub fn events(&self) -> ReaderEvents {
        ReaderEvents {
            inner: fanout::Receiver {
                rx: self.shared.subscribers.subscribe(),
            },
        }
    }

    /// Adds a stream (or moves an existing one to `start`); `None` uses
    /// the reader's start option and leaves an existing stream as it is.
    /// Takes effect within milliseconds: a blocked `XREAD` is interrupted.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Reader::close`]; [`Error::Redis`] when the
    /// start position cannot be resolved.
    pub async fn add_stream(
        &self,
        stream: &Stream,
        start: Option<StartPosition>,
    ) -> Result<(), Error> {
        if self.shared.cancel.is_cancelled() {
            return Err(Error::Closed);
        }
        if let Some(generation) = self.shared.insert(stream, start).await? {
            self.shared.interrupt(generation).await;
        }
        Ok(())
    }

    /// Stops reading a stream (a no-op for an unknown name); takes effect
    /// within milliseconds (a blocked `XREAD` is interrupted) and no event of
    /// it is delivered after this returns.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Reader::close`].
    pub async fn remove_stream(&self, stream_name: &str) -> Result<(), Error> {
        if self.shared.cancel.is_cancelled() {
            return Err(Error::Closed);
        }
        let generation = {
            let mut state = lock(&self.shared.state);
            if state.streams.remove(stream_name).is_none() {
                return Ok(());
            }
            state.generation += 1;
            state.generation
        };
        self.shared.interrupt(generation).await;
        Ok(())
    }

    /// The server the reader's dedicated connection reads from now (`None`
    /// while it is not connected). Behind Sentinel it may differ for a
    /// while from the server of the client the reader was made from: each
    /// connection finds the primary again on its own after a failover.
    pub fn server(&self) -> Option<Server> {
        self.shared.conn.active_connections().into_iter().next()
    }

    /// Makes the dedicated connection reconnect now (behind Sentinel: to
    /// the server the Sentinels name the primary). An `XREAD` in flight
    /// fails and is sent again on the new connection; no event is skipped,
    /// the cursors stay where they were.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Reader::close`]; [`Error::Redis`] when the
    /// reconnection fails.
    pub async fn reconnect(&self) -> Result<(), Error> {
        if self.shared.cancel.is_cancelled() {
            return Err(Error::Closed);
        }
        self.shared.conn.force_reconnection().await?;
        Ok(())
    }

    /// The names of the streams being read.
    pub fn streams(&self) -> Vec<String> {
        lock(&self.shared.state).streams.keys().cloned().collect()
    }

    /// Stops reading, ends every subscriber's stream and closes the
    /// dedicated connection. Idempotent.
    pub async fn close(&self) {
        self.shared.cancel.cancel();
        let task = self.shared.task.lock().await.take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            tracing::warn!(error = %e, "reader task failed");
        }
    }
}

impl Shared {
    /// Inserts a stream; returns the new generation when something changed.
    async fn insert(
        &self,
        stream: &Stream,
        start: Option<StartPosition>,
    ) -> Result<Option<u64>, Error> {
        if start.is_none() && lock(&self.state).streams.contains_key(stream.name()) {
            return Ok(None);
        }
        let start = start.unwrap_or_else(|| self.options.start.clone());
        let last_id = match exclusive_start(&start) {
            Some(id) => id,
            None => stream.last_id(&self.client).await?,
        };
        let generation = {
            let mut state = lock(&self.state);
            state.generation += 1;
            let epoch = state.generation;
            state.streams.insert(
                stream.name().to_string(),
                Cursor {
                    key: stream.key().to_string(),
                    last_id,
                    epoch,
                    history: crate::rewind::History::default(),
                },
            );
            epoch
        };
        self.changed.notify_one();
        Ok(Some(generation))
    }

    /// Makes sure no `XREAD` older than `generation` keeps blocking.
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

    /// Builds the next `XREAD`'s keys and ids; marks the read in flight.
    fn plan(&self) -> Option<(Vec<String>, Vec<String>, Plan)> {
        let mut state = lock(&self.state);
        if state.streams.is_empty() {
            return None;
        }
        let mut keys = Vec::with_capacity(state.streams.len());
        let mut ids = Vec::with_capacity(state.streams.len());
        let mut plan = Vec::with_capacity(state.streams.len());
        for (name, c) in &state.streams {
            keys.push(c.key.clone());
            ids.push(c.last_id.clone());
            plan.push((c.key.clone(), name.clone(), c.epoch));
        }
        state.reading = Some(state.generation);
        Some((keys, ids, plan))
    }

    /// Whether `name` is still read with this epoch (not removed or moved).
    fn is_current(&self, name: &str, epoch: u64) -> bool {
        lock(&self.state)
            .streams
            .get(name)
            .is_some_and(|c| c.epoch == epoch)
    }

    /// Moves every cursor that is past its stream's newest entry back to
    /// it (see [`crate::rewind`]); `false` when Redis could not be asked.
    async fn rewind_cursors(&self) -> bool {
        let cursors: Vec<(String, String, String, u64)> = lock(&self.state)
            .streams
            .iter()
            .map(|(name, c)| (name.clone(), c.key.clone(), c.last_id.clone(), c.epoch))
            .collect();
        for (name, key, cursor, epoch) in cursors {
            let newest = match crate::rewind::newest_id(&self.conn, &key).await {
                Ok(id) => id,
                Err(e) => {
                    tracing::debug!(stream = %name, error = %e, "reading the newest id failed");
                    return false;
                }
            };
            if !crate::rewind::is_before(&newest, &cursor) {
                continue;
            }
            let ids = match crate::rewind::ids_up_to(&self.conn, &key, &cursor).await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::debug!(stream = %name, error = %e, "reading the stream's ids failed");
                    return false;
                }
            };
            let mut state = lock(&self.state);
            if let Some(c) = state.streams.get_mut(&name)
                && c.epoch == epoch
                && c.last_id == cursor
            {
                let from = c
                    .history
                    .resume_from(&ids, ids.len() < crate::rewind::History::KEEP);
                tracing::warn!(stream = %name, cursor = %cursor, newest = %newest, resume_after = %from,
                    "the stream went back (entries lost by a failover or restart): reading on after the newest entry delivered that still exists");
                c.last_id = from;
            }
        }
        true
    }

    /// Moves the cursor past `done`, the ids just delivered or skipped.
    fn advance(&self, name: &str, epoch: u64, done: Vec<String>) {
        let mut state = lock(&self.state);
        if let Some(c) = state.streams.get_mut(name)
            && c.epoch == epoch
            && let Some(last) = done.last()
        {
            c.last_id = last.clone();
            for id in done {
                c.history.push(id);
            }
        }
    }

    /// Delivers one read's events; `false` when the reader must stop.
    async fn deliver(&self, reply: Value, plan: &Plan) -> bool {
        // The server that answered: the one the dedicated connection is on
        // now, just after its reply (a reconnect in between is a new
        // connection, which answered nothing yet).
        let server = self.conn.active_connections().into_iter().next();
        for (key, entries) in parse_xread(reply) {
            let Some((_, name, epoch)) = plan.iter().find(|(k, _, _)| *k == key) else {
                continue;
            };
            if !self.is_current(name, *epoch) {
                continue;
            }
            let mut done = Vec::new();
            for (id, fields) in entries {
                let event = match fields.map(|f| decode(name, id.clone(), f)) {
                    Some(Ok(mut event)) => {
                        event.server.clone_from(&server);
                        event
                    }
                    Some(Err(e)) => {
                        tracing::warn!(stream = %name, id = %id, error = %e, "skipping malformed stream entry");
                        done.push(id);
                        continue;
                    }
                    None => {
                        done.push(id);
                        continue;
                    }
                };
                if self.options.topic.matches(event.topic.as_deref()) {
                    let sent = tokio::select! {
                        _ = self.cancel.cancelled() => None,
                        sent = self.subscribers.broadcast(event) => Some(sent),
                    };
                    match sent {
                        Some(true) => {}
                        Some(false) => break,
                        None => {
                            self.advance(name, *epoch, done);
                            return false;
                        }
                    }
                }
                done.push(id);
            }
            self.advance(name, *epoch, done);
        }
        true
    }
}

async fn run(shared: Arc<Shared>) {
    let mut backoff = Backoff::new();
    let options = conn::blocking_options(shared.options.block);
    let block_ms = shared.options.block.as_millis() as u64;
    let mut reconnects = shared.conn.reconnect_rx();
    let mut check_cursors = false;
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => break,
            _ = shared.subscribers.wait_any() => {}
        }
        while let Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) =
            reconnects.try_recv()
        {
            check_cursors = true;
        }
        if check_cursors {
            check_cursors = !shared.rewind_cursors().await;
        }
        let Some((keys, ids, plan)) = shared.plan() else {
            tokio::select! {
                _ = shared.cancel.cancelled() => break,
                _ = shared.changed.notified() => continue,
            }
        };
        let conn = shared.conn.with_options(&options);
        let read =
            conn.xread::<Value, _, _>(Some(shared.options.max_events), Some(block_ms), keys, ids);
        let result = tokio::select! {
            _ = shared.cancel.cancelled() => break,
            r = read => r,
        };
        lock(&shared.state).reading = None;
        match result {
            Ok(reply) => {
                backoff.reset();
                if !reply.is_null() && !shared.deliver(reply, &plan).await {
                    break;
                }
            }
            Err(e) => {
                check_cursors = true;
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "XREAD failed; retrying");
                tokio::select! {
                    _ = shared.cancel.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    lock(&shared.state).reading = None;
    shared.subscribers.close();
    if let Err(e) = conn::quit(&shared.client, &shared.conn).await {
        tracing::debug!(error = %e, "closing the reader's connection failed");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl futures::Stream for ReaderEvents {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader")
            .field("streams", &self.streams())
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}
