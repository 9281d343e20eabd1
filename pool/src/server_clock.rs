//! A lower bound of Redis server time that a step of the server's wall
//! clock cannot raise, for judging workers and nodes dead.
//!
//! Liveness is decided on server time (I5): a worker is dead once its last
//! keep-alive is more than a TTL older than `TIME`. But `TIME` is the
//! server host's wall clock, which an NTP step or a resumed virtual machine
//! moves at once (a soak saw it jump 33.7 s ahead of the monotonic clock).
//! After a forward step every keep-alive looks a step old until its
//! worker's next renewal, and a cleanup judging then moves the jobs of
//! workers that run them.
//!
//! So a node also bounds server time on its own monotonic clock: each
//! reply that carried server time `t`, heard at `h`, says that server time
//! now is at least `t + (now - h)`, unless the server's clock stepped
//! forward since. The floor is the smallest of those bounds over the
//! samples of the last [`window`](ServerClockFloor::new) (one older sample
//! is kept, so that the oldest bound predates any keep-alive a TTL old). A
//! forward step within the window therefore moves the floor only once it
//! has left the window; a backward step moves it back at once (the newest
//! sample is lowest). Cleanup judges by the smaller of `TIME` and the
//! floor, so a worker is dead only if it was silent for a TTL on both
//! clocks: after a forward step, the failover of a worker that really died
//! waits up to the window longer; nothing live is judged dead.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Samples of server time, heard on this process's monotonic clock.
#[derive(Debug)]
pub(crate) struct ServerClockFloor {
    window: Duration,
    /// (server ms, when the reply was heard), oldest first.
    samples: Mutex<VecDeque<(u64, Instant)>>,
}

impl ServerClockFloor {
    /// Keeps the samples heard within `window`, and the newest one before.
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            samples: Mutex::new(VecDeque::new()),
        }
    }

    /// Records server time `server_ms` from a reply heard at `heard` (after
    /// the reply arrived: the server read its clock before that, so the
    /// bound errs low by the reply's latency, never high).
    pub(crate) fn record(&self, server_ms: u64, heard: Instant) {
        self.record_at(server_ms, heard, Instant::now());
    }

    fn record_at(&self, server_ms: u64, heard: Instant, now: Instant) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.back().is_some_and(|(_, last)| *last > heard) {
            return; // a late reply: a newer one is in already
        }
        samples.push_back((server_ms, heard));
        while samples.len() > 1 && now.saturating_duration_since(samples[1].1) >= self.window {
            samples.pop_front();
        }
    }

    /// The least server time (ms) now can be, unless the server's clock
    /// stepped forward within the window; `None` before any sample.
    pub(crate) fn now_at_least(&self) -> Option<u64> {
        self.now_at_least_at(Instant::now())
    }

    fn now_at_least_at(&self, now: Instant) -> Option<u64> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .map(|(ms, heard)| {
                ms.saturating_add(now.saturating_duration_since(*heard).as_millis() as u64)
            })
            .min()
    }

    /// Server time `server_now_ms` (`TIME`, just read), held back to the
    /// floor: the time to judge liveness by.
    pub(crate) fn judged_now(&self, server_now_ms: u64) -> u64 {
        self.now_at_least()
            .map_or(server_now_ms, |floor| floor.min(server_now_ms))
    }
}

impl crate::node::NodeInner {
    /// The least server time (ms) now can be by this process's clock, read
    /// from Redis when no reply has told it yet.
    pub(crate) async fn server_time_floor(&self) -> crate::error::Result<u64> {
        if let Some(floor) = self.server_clock.now_at_least() {
            return Ok(floor);
        }
        let now = self.store.server_time_ms().await?;
        self.server_clock.record(now, Instant::now());
        Ok(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_forward_step_counts_only_once_it_has_left_the_window() {
        let floor = ServerClockFloor::new(Duration::from_secs(2));
        let t0 = Instant::now();
        assert_eq!(floor.now_at_least_at(t0), None);
        assert_eq!(floor.judged_now(5_000), 5_000);
        floor.record_at(10_000, t0, t0);
        assert_eq!(floor.now_at_least_at(t0 + ms(500)), Some(10_500));
        // The server's clock jumps 30 s ahead.
        floor.record_at(40_500, t0 + ms(500), t0 + ms(500));
        assert_eq!(floor.now_at_least_at(t0 + ms(500)), Some(10_500));
        floor.record_at(41_500, t0 + ms(1_500), t0 + ms(1_500));
        assert_eq!(floor.now_at_least_at(t0 + ms(1_500)), Some(11_500));
        // The pre-step sample goes once the step's first sample is 2 s old.
        floor.record_at(42_400, t0 + ms(2_400), t0 + ms(2_400));
        assert_eq!(floor.now_at_least_at(t0 + ms(2_400)), Some(12_400));
        floor.record_at(42_500, t0 + ms(2_500), t0 + ms(2_500));
        assert_eq!(floor.now_at_least_at(t0 + ms(2_500)), Some(42_500));
    }

    #[test]
    fn a_backward_step_counts_at_once() {
        let floor = ServerClockFloor::new(Duration::from_secs(2));
        let t0 = Instant::now();
        floor.record_at(40_000, t0, t0);
        floor.record_at(10_300, t0 + ms(300), t0 + ms(300));
        assert_eq!(floor.now_at_least_at(t0 + ms(300)), Some(10_300));
        // A reply heard before the newest one adds nothing.
        floor.record_at(5_000, t0 + ms(200), t0 + ms(300));
        assert_eq!(floor.now_at_least_at(t0 + ms(300)), Some(10_300));
    }
}
