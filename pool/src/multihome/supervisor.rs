//! The per-home supervisor of a multi-home worker (two or more homes only):
//! probes the home, drives its breaker, re-splits capacity on every state
//! change and publishes the breaker states into the home's pool.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{Expiration, SetOptions};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::breaker::{BreakerState, Transition};
use super::capacity;
use super::home::Home;
use super::options::MultiHomeOptions;
use super::state::{PublishedHome, PublishedState};
use crate::error::{Error, Result, from_redis};
use crate::handler::Handler;

/// What the homes of one multi-home worker share.
pub(crate) struct Shared {
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) options: MultiHomeOptions,
    pub(crate) homes: Vec<Home>,
    pub(crate) handler: Arc<dyn Handler>,
    /// Serialises re-splits so two homes changing at once cannot
    /// interleave their allotments.
    resplit: std::sync::Mutex<()>,
}

impl Shared {
    pub(crate) fn new(
        id: String,
        options: MultiHomeOptions,
        homes: Vec<Home>,
        handler: Arc<dyn Handler>,
    ) -> Self {
        Shared {
            id,
            host: hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown".into()),
            options,
            homes,
            handler,
            resplit: std::sync::Mutex::new(()),
        }
    }

    /// Key of this worker's published state in `home`'s pool.
    pub(crate) fn state_key(&self, home: &Home) -> String {
        crate::keys::multihome_state(&home.pool, &self.id)
    }

    /// Splits the capacity over the healthy homes (closed and joined).
    pub(crate) fn resplit(&self) {
        let Some(total) = self.options.max_concurrent_jobs else {
            return;
        };
        let _guard = self.resplit.lock().unwrap_or_else(|p| p.into_inner());
        let healthy: Vec<bool> = self.homes.iter().map(Home::is_healthy).collect();
        let shares = capacity::split(total, &healthy);
        for (home, share) in self.homes.iter().zip(shares) {
            if home.shared.slots.allotted() != Some(share) {
                tracing::info!(home = %home.name(), allotted = share, total, "capacity re-split");
            }
            home.shared.slots.set_allotted(Some(share));
            metrics::gauge!("flotilla_multihome_capacity", "home" => home.name().to_string())
                .set(share as f64);
        }
    }

    /// The state published into `home`'s pool.
    fn published(&self, home: &Home) -> PublishedState {
        PublishedState {
            worker: self.id.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            home: home.name().to_string(),
            homes: self
                .homes
                .iter()
                .map(|h| {
                    let b = h.breaker();
                    PublishedHome {
                        name: h.name().to_string(),
                        pool: h.pool.clone(),
                        state: b.state().as_str().to_string(),
                        consecutive_failures: b.consecutive_failures(),
                        opens: b.opens(),
                        allotted: h.shared.slots.allotted(),
                        running: h.shared.slots.running(),
                    }
                })
                .collect(),
        }
    }

    /// Logs, counts and acts on a breaker state change of `home`.
    pub(crate) fn on_transition(&self, home: &Home, t: Transition) {
        let failures = home.breaker().consecutive_failures();
        match t.to {
            BreakerState::Open => tracing::warn!(
                home = %home.name(), url = %home.url, from = %t.from, failures,
                retry_in = ?self.options.reset_after, "home breaker opened: home skipped"
            ),
            _ => {
                tracing::info!(home = %home.name(), url = %home.url, from = %t.from, to = %t.to, "home breaker state changed")
            }
        }
        metrics::counter!("flotilla_multihome_breaker_transitions_total",
            "home" => home.name().to_string(), "to" => t.to.as_str())
        .increment(1);
        metrics::gauge!("flotilla_multihome_breaker_state", "home" => home.name().to_string())
            .set(t.to.gauge());
        home.state.send_replace(t.to);
        self.resplit();
    }

    /// One operation against `home` within the poll timeout: a join when
    /// the home has no node yet, otherwise a `SET` of the published state
    /// (a write, so that a read-only or out-of-memory home counts as down).
    async fn probe(&self, home: &Home) -> Result<()> {
        let joined = home.joined.load_full();
        let Some(joined) = joined else {
            home.join(&self.handler, &self.options).await?;
            return Ok(());
        };
        let timeout = self.options.poll_timeout;
        let ttl = self.options.probe_interval * 3 + timeout;
        let value = serde_json::to_string(&self.published(home)).map_err(|e| Error::Malformed {
            what: "multi-home state",
            reason: e.to_string(),
        })?;
        let options = Options {
            timeout: Some(timeout),
            // Not connected: fail now rather than wait for a reconnect.
            fail_fast: true,
            ..Options::default()
        };
        let client = joined.client.with_options(&options);
        let set = client.set::<(), _, _>(
            self.state_key(home),
            value,
            Some(Expiration::PX(ttl.as_millis() as i64)),
            None::<SetOptions>,
            false,
        );
        match tokio::time::timeout(timeout, set).await {
            Ok(r) => r.map_err(from_redis),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }

    /// Runs `home`'s supervisor until `cancel`.
    pub(crate) async fn supervise(self: Arc<Self>, index: usize, cancel: CancellationToken) {
        let home = &self.homes[index];
        loop {
            let wait = home.breaker().wait(Instant::now());
            if !wait.is_zero() && !sleep_or_cancel(wait, &cancel).await {
                return;
            }
            let (allowed, t) = home.breaker().try_begin(Instant::now());
            if let Some(t) = t {
                self.on_transition(home, t);
            }
            if !allowed {
                continue;
            }
            let was_joined = home.joined.load().is_some();
            let result = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.probe(home) => r,
            };
            let t = match &result {
                Ok(()) => home.breaker().on_success(Instant::now()),
                Err(e) => {
                    metrics::counter!("flotilla_multihome_probe_failures_total", "home" => home.name().to_string())
                        .increment(1);
                    tracing::debug!(home = %home.name(), error = %e, "home probe failed");
                    home.breaker().on_failure(Instant::now())
                }
            };
            match t {
                Some(t) => self.on_transition(home, t),
                // Joined without a state change: give it its share now.
                None if !was_joined && result.is_ok() => self.resplit(),
                None => {}
            }
            if !sleep_or_cancel(self.options.probe_interval, &cancel).await {
                return;
            }
        }
    }
}

/// Sleeps `d`; `false` when cancelled first.
async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}
