//! A lower bound of Redis server time that a forward step of the server's
//! wall clock cannot raise, for judging workers and nodes dead.
//!
//! Liveness is decided on server time (I5): a worker is dead once its last
//! keep-alive is more than a TTL older than `TIME`. But `TIME` is the
//! server host's wall clock, which an NTP step or a resumed virtual machine
//! moves at once (a soak saw it jump 33.7 s ahead of the monotonic clock).
//! After a forward step every keep-alive looks a step old until its
//! worker's next renewal, and a cleanup judging then moves the jobs of
//! workers that run them.
//!
//! So a node also bounds server time on its own monotonic clock. A reply
//! carrying server time `t`, heard at `h`, gives the offset `t - h`, which
//! is at most the true offset (the server read its clock before the reply
//! was heard), so `now + (t - h)` is at most server time now, unless the
//! clock stepped forward since. The floor uses the largest offset of the
//! samples of the last [`window`](ServerClockFloor::new) (latency only
//! lowers a sample) up to the first one that jumps above all before it by
//! more than a tolerance: a forward step. One sample older than the window
//! is kept, so that the floor predates a step that a keep-alive a TTL old
//! may have crossed. Cleanup judges by the smaller of `TIME` and the floor:
//! a worker is dead only if silent for a TTL on both clocks. A backward
//! step lowers `TIME` itself. After a forward step, the failover of a
//! worker that really died waits up to the window longer; nothing live is
//! judged dead. A step smaller than the tolerance (a twentieth of the
//! TTL) passes, within the margin between a lease's stop (five sixths of a
//! TTL) and a claim (a TTL).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Samples of server time, heard on this process's monotonic clock.
#[derive(Debug)]
pub(crate) struct ServerClockFloor {
    window: Duration,
    /// An offset rising more than this above all earlier ones is a step.
    tolerance_ms: i128,
    /// Where this process's clock is read from, in ms.
    base: Instant,
    /// (server ms minus local ms at hearing, when heard), oldest first.
    samples: Mutex<VecDeque<(i128, Instant)>>,
}

impl ServerClockFloor {
    /// Keeps the samples heard within `window` (and the newest one before);
    /// an offset that rises above all earlier ones by over `tolerance` is
    /// a forward step.
    pub(crate) fn new(window: Duration, tolerance: Duration) -> Self {
        Self {
            window,
            tolerance_ms: tolerance.as_millis() as i128,
            base: Instant::now(),
            samples: Mutex::new(VecDeque::new()),
        }
    }

    fn local_ms(&self, at: Instant) -> i128 {
        if at >= self.base {
            at.duration_since(self.base).as_millis() as i128
        } else {
            -(self.base.duration_since(at).as_millis() as i128)
        }
    }

    /// Records server time `server_ms` from a reply heard at `heard` (after
    /// the reply arrived: the server read its clock before that, so the
    /// sample errs low by the reply's latency, never high).
    pub(crate) fn record(&self, server_ms: u64, heard: Instant) {
        self.record_at(server_ms, heard, Instant::now());
    }

    fn record_at(&self, server_ms: u64, heard: Instant, now: Instant) {
        let offset = server_ms as i128 - self.local_ms(heard);
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.back().is_some_and(|(_, last)| *last > heard) {
            return; // a late reply: a newer one is in already
        }
        samples.push_back((offset, heard));
        while samples.len() > 1 && now.saturating_duration_since(samples[1].1) >= self.window {
            samples.pop_front();
        }
    }

    /// The least server time (ms) now can be, unless the server's clock
    /// stepped forward within the window by less than the tolerance;
    /// `None` before any sample.
    pub(crate) fn now_at_least(&self) -> Option<u64> {
        self.now_at_least_at(Instant::now())
    }

    fn now_at_least_at(&self, now: Instant) -> Option<u64> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let mut best: Option<i128> = None;
        for (offset, _) in samples.iter() {
            match best {
                Some(b) if *offset > b + self.tolerance_ms => break, // a step
                Some(b) => best = Some(b.max(*offset)),
                None => best = Some(*offset),
            }
        }
        best.map(|b| (self.local_ms(now) + b).max(0) as u64)
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

    fn floor() -> (ServerClockFloor, Instant) {
        let floor = ServerClockFloor::new(Duration::from_secs(2), ms(50));
        let t0 = floor.base;
        (floor, t0)
    }

    #[test]
    fn a_forward_step_counts_only_once_it_has_left_the_window() {
        let (floor, t0) = floor();
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
    fn a_slow_reply_does_not_hold_the_floor_back() {
        let (floor, t0) = floor();
        floor.record_at(10_000, t0, t0);
        // Stamped at 10,100, heard 400 ms late.
        floor.record_at(10_100, t0 + ms(500), t0 + ms(500));
        assert_eq!(floor.now_at_least_at(t0 + ms(600)), Some(10_600));
        // A step smaller than the tolerance passes; a larger one does not.
        floor.record_at(10_740, t0 + ms(700), t0 + ms(700));
        assert_eq!(floor.now_at_least_at(t0 + ms(700)), Some(10_740));
        floor.record_at(10_900, t0 + ms(800), t0 + ms(800));
        assert_eq!(floor.now_at_least_at(t0 + ms(800)), Some(10_840));
    }

    #[test]
    fn a_backward_step_is_judged_by_time_itself() {
        let (floor, t0) = floor();
        floor.record_at(40_000, t0, t0);
        floor.record_at(10_300, t0 + ms(300), t0 + ms(300));
        assert_eq!(floor.now_at_least_at(t0 + ms(300)), Some(40_300));
        // `judged_now` takes the smaller: the server's own time.
        assert!(floor.judged_now(10_300) <= 10_300);
        // A reply heard before the newest one adds nothing.
        floor.record_at(5_000, t0 + ms(200), t0 + ms(300));
        assert_eq!(floor.now_at_least_at(t0 + ms(300)), Some(40_300));
    }
}
