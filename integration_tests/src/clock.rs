//! Clocks for ledger timestamps.
//!
//! Every ledger line carries two times:
//! * `mono_ns`: the host's `CLOCK_MONOTONIC`, shared by every process on one
//!   Linux host (and still advancing while a process is `SIGSTOP`ped), so
//!   processes of one host compare exactly;
//! * `server_us`: an estimate of Redis server time (`TIME`), for ledgers
//!   written on different hosts. Each process samples `TIME` periodically,
//!   keeps the sample with the smallest round trip, and extrapolates it on its
//!   own monotonic clock; the error is at most half that round trip, and the
//!   estimate keeps working while Redis is unreachable. Handlers never wait on
//!   Redis to timestamp an event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use tokio_util::sync::CancellationToken;

/// Nanoseconds of the host's `CLOCK_MONOTONIC`.
pub fn mono_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => (ts.tv_sec() as u64) * 1_000_000_000 + ts.tv_nsec() as u64,
        Err(_) => 0,
    }
}

/// An estimate of Redis server time, shared by a process's tasks.
#[derive(Debug, Clone, Default)]
pub struct ServerClock {
    inner: Arc<Sample>,
}

#[derive(Debug, Default)]
struct Sample {
    /// Server time minus local monotonic time, in µs, offset by 2^62 so it
    /// fits an unsigned atomic; 0 = no sample yet.
    offset: AtomicU64,
    /// Round trip of the sample in µs (its error bound is half of it).
    rtt_us: AtomicU64,
}

const BIAS: i64 = 1 << 62;

impl ServerClock {
    /// A clock with no sample yet (estimates are 0 until the first one).
    pub fn new() -> ServerClock {
        ServerClock::default()
    }

    /// The estimated Redis server time in µs, or 0 before the first sample.
    pub fn now_us(&self) -> u64 {
        let off = self.inner.offset.load(Ordering::Acquire);
        if off == 0 {
            return 0;
        }
        let local = (mono_ns() / 1_000) as i64;
        (local + (off as i64 - BIAS)).max(0) as u64
    }

    /// Half the round trip of the sample in use: the estimate's error bound.
    pub fn error_us(&self) -> u64 {
        self.inner.rtt_us.load(Ordering::Acquire) / 2
    }

    /// Takes one `TIME` sample; keeps it if it is tighter than the current
    /// one (or the current one is older than the drift horizon, see
    /// [`ServerClock::run`]).
    ///
    /// # Errors
    /// The Redis error when `TIME` fails.
    pub async fn sample(&self, client: &Client, replace: bool) -> Result<(), fred::error::Error> {
        let before = mono_ns() / 1_000;
        let (secs, micros): (String, String) = client
            .custom(fred::cmd!("TIME"), Vec::<Value>::new())
            .await?;
        let after = mono_ns() / 1_000;
        let server: i64 =
            secs.parse::<i64>().unwrap_or(0) * 1_000_000 + micros.parse::<i64>().unwrap_or(0);
        let rtt = after.saturating_sub(before);
        let mid = (before + rtt / 2) as i64;
        let current_rtt = self.inner.rtt_us.load(Ordering::Acquire);
        if replace || self.inner.offset.load(Ordering::Acquire) == 0 || rtt <= current_rtt {
            self.inner.rtt_us.store(rtt, Ordering::Release);
            self.inner
                .offset
                .store((server - mid + BIAS) as u64, Ordering::Release);
        }
        Ok(())
    }

    /// Samples every `period` until `cancel`; every 20th sample replaces the
    /// current one even if looser, so the estimate follows a restarted
    /// server's clock.
    pub async fn run(self, client: Client, period: Duration, cancel: CancellationToken) {
        let mut n: u64 = 0;
        loop {
            let replace = n % 20 == 19;
            let _ = tokio::time::timeout(period, self.sample(&client, replace)).await;
            n += 1;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
        }
    }
}
