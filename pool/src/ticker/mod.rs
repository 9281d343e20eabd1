//! A distributed ticker: one tick per interval across every process that
//! runs a [`Ticker`] of the same name.
//!
//! Time is cut into slots of `interval` on the **Redis server clock**
//! (`slot = floor(server_ms / interval)`). At every slot boundary each
//! ticker runs one script that moves the ticker's "last slot" forward if it
//! is behind; only the caller that moved it gets the tick. So a slot is
//! ticked at most once pool-wide, without a leader: when a process dies or
//! closes, the others keep ticking, and there is no hand-over during which
//! two processes could both tick. A slot in which no ticker ran (all down,
//! or all of their consumers busy) is skipped, not caught up.
//!
//! All tickers of one name must use the same interval.
//!
//! # Examples
//! ```no_run
//! use std::time::Duration;
//! use flotilla_pool::{Ticker, TickerOptions};
//!
//! # async fn demo(client: fred::prelude::Client) -> flotilla_pool::Result<()> {
//! let mut ticker = Ticker::start(&client, "hourly-report", Duration::from_secs(3600), TickerOptions::default()).await?;
//! while let Some(tick) = ticker.next().await {
//!     println!("this process owns tick {} (scheduled at {} ms)", tick.slot, tick.scheduled_at_ms);
//! }
//! # Ok(()) }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use fred::prelude::Client;
use fred::types::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use std::sync::LazyLock;

use fred::types::scripts::Script;

use crate::error::{Error, Result};
use crate::keys::{self, check_name};
use crate::store::call::{self, u64_at};

/// Claims a ticker slot (`advance.lua`).
static ADVANCE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(include_str!("advance.lua")));

/// Options of a [`Ticker`].
///
/// # Examples
/// ```
/// use flotilla_pool::TickerOptions;
///
/// let options = TickerOptions::default().hash_tag("my-pool");
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct TickerOptions {
    /// Hash tag of the ticker's key (e.g. the pool's name).
    ///
    /// Default: `None` (the ticker gets its own tag).
    pub hash_tag: Option<String>,
    /// Upper bound of every Redis round trip; a tick whose claim does not
    /// answer in time is left to the other tickers.
    ///
    /// Default: 2 s.
    pub op_timeout: Duration,
    /// How many claimed ticks may wait for the consumer. While the buffer
    /// is full this process claims no ticks, so other processes take them.
    ///
    /// Default: 1.
    pub buffer: usize,
}

impl Default for TickerOptions {
    fn default() -> Self {
        Self {
            hash_tag: None,
            op_timeout: Duration::from_secs(2),
            buffer: 1,
        }
    }
}

impl TickerOptions {
    /// Sets [`hash_tag`](Self::hash_tag).
    #[must_use]
    pub fn hash_tag(mut self, tag: impl Into<String>) -> Self {
        self.hash_tag = Some(tag.into());
        self
    }

    /// Sets [`op_timeout`](Self::op_timeout).
    #[must_use]
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// Sets [`buffer`](Self::buffer).
    #[must_use]
    pub fn buffer(mut self, buffer: usize) -> Self {
        self.buffer = buffer;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when `op_timeout` or `buffer` is zero;
    /// [`Error::InvalidName`] for a bad `hash_tag`.
    pub fn validate(&self) -> Result<()> {
        if self.op_timeout.is_zero() {
            return Err(invalid("op_timeout", "must be greater than zero"));
        }
        if self.buffer == 0 {
            return Err(invalid("buffer", "must be at least 1"));
        }
        if let Some(tag) = &self.hash_tag {
            check_name("hash tag", tag)?;
        }
        Ok(())
    }
}

/// One tick, owned by this process alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// The slot number: `floor(server_ms / interval)`. Slots ticked by the
    /// pool strictly increase.
    pub slot: u64,
    /// Start of the slot, server time in ms since the epoch.
    pub scheduled_at_ms: u64,
    /// When the tick was claimed, server time in ms since the epoch.
    pub fired_at_ms: u64,
}

/// A distributed ticker; yields the ticks this process won. Implements
/// [`futures::Stream`] as well as [`Ticker::next`].
///
/// The background task is owned by the ticker: [`close`](Self::close)
/// stops it and waits for it; dropping the ticker stops it too.
#[derive(Debug)]
pub struct Ticker {
    name: String,
    interval: Duration,
    ticks: mpsc::Receiver<Tick>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Starts ticking `name` every `interval`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name; [`Error::InvalidOptions`] for
    /// bad options or an interval under 10 ms or over 30 days.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn start(
        client: &Client,
        name: &str,
        interval: Duration,
        options: TickerOptions,
    ) -> Result<Self> {
        check_name("ticker name", name)?;
        options.validate()?;
        if interval < Duration::from_millis(10) || interval > Duration::from_secs(30 * 86_400) {
            return Err(invalid("interval", "must be between 10 ms and 30 days"));
        }
        let (tx, rx) = mpsc::channel(options.buffer);
        let cancel = CancellationToken::new();
        let key = keys::ticker(options.hash_tag.as_deref(), name);
        let task = tokio::spawn(run(
            client.clone(),
            name.to_string(),
            key,
            interval,
            options.op_timeout,
            tx,
            cancel.clone(),
        ));
        Ok(Self {
            name: name.to_string(),
            interval,
            ticks: rx,
            cancel,
            task: Some(task),
        })
    }

    /// The ticker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interval between ticks, pool-wide.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The next tick this process owns; `None` once the ticker is closed.
    ///
    /// # Cancel safety
    /// Cancel safe: a tick is never lost by cancelling this call.
    pub async fn next(&mut self) -> Option<Tick> {
        self.ticks.recv().await
    }

    /// Stops ticking and waits for the background task to end.
    pub async fn close(mut self) {
        self.cancel.cancel();
        self.ticks.close();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl futures::Stream for Ticker {
    type Item = Tick;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Tick>> {
        self.ticks.poll_recv(cx)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The ticker's background task: claim at every slot boundary.
async fn run(
    client: Client,
    name: String,
    key: String,
    interval: Duration,
    op_timeout: Duration,
    ticks: mpsc::Sender<Tick>,
    cancel: CancellationToken,
) {
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let mut failing = false;
    loop {
        let wait = match claim(&client, &key, interval_ms, op_timeout).await {
            Ok((won, slot, now_ms)) => {
                failing = false;
                if won {
                    let tick = Tick {
                        slot,
                        scheduled_at_ms: slot * interval_ms,
                        fired_at_ms: now_ms,
                    };
                    metrics::counter!("flotilla_ticker_ticks_total", "ticker" => name.clone())
                        .increment(1);
                    tracing::debug!(ticker = %name, slot, "tick");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        sent = ticks.send(tick) => if sent.is_err() { return },
                    }
                }
                // Wake just after the next boundary, by the server's clock.
                let next_ms = (slot + 1) * interval_ms;
                Duration::from_millis(next_ms.saturating_sub(now_ms) + 1)
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(ticker = %name, %error, "ticker cannot reach redis; retrying");
                }
                failing = true;
                (interval / 4).max(Duration::from_millis(10))
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        if ticks.is_closed() {
            return;
        }
    }
}

/// One claim: (won, slot, server now ms).
async fn claim(
    client: &Client,
    key: &str,
    interval_ms: u64,
    op_timeout: Duration,
) -> Result<(bool, u64, u64)> {
    let reply: Vec<Value> = call::script(
        client,
        &ADVANCE,
        "ticker advance",
        vec![key.to_string()],
        vec![interval_ms.to_string()],
        op_timeout,
    )
    .await?;
    const WHAT: &str = "ticker reply";
    Ok((
        u64_at(&reply, 0, WHAT)? == 1,
        u64_at(&reply, 1, WHAT)?,
        u64_at(&reply, 2, WHAT)?,
    ))
}

fn invalid(option: &'static str, reason: &str) -> Error {
    Error::InvalidOptions {
        option,
        reason: reason.to_string(),
    }
}
