//! The per-home circuit breaker: a pure state machine, fed with the outcome
//! of each Redis operation and the current monotonic time.
//!
//! ```text
//!   Closed ──N consecutive failures──▶ Open ──reset period over──▶ HalfOpen
//!     ▲                                 ▲                             │
//!     └──────── probe succeeds ─────────┼──────── probe fails ────────┘
//! ```

use std::time::Duration;

use tokio::time::Instant;

/// The state of a home's circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// The home is healthy: it gets capacity and is probed every
    /// probe interval.
    Closed,
    /// The home failed `failure_threshold` times in a row: it is skipped
    /// (no capacity, no probe) until the reset period is over.
    Open,
    /// The reset period is over: one probe decides between closed and open.
    HalfOpen,
}

impl BreakerState {
    /// Lower-case name, as written to Redis and logged.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// Value of the `flotilla_multihome_breaker_state` gauge.
    pub(crate) fn gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::HalfOpen => 1.0,
            BreakerState::Open => 2.0,
        }
    }
}

impl std::fmt::Display for BreakerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state change, for the caller to log, count and act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) from: BreakerState,
    pub(crate) to: BreakerState,
}

/// The breaker of one home.
#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    reset_after: Duration,
    state: BreakerState,
    consecutive_failures: u32,
    opened_at: Option<Instant>,
    opens: u64,
}

impl Breaker {
    /// A closed breaker that opens after `threshold` consecutive failures
    /// and half-opens `reset_after` later.
    pub(crate) fn new(threshold: u32, reset_after: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            reset_after,
            state: BreakerState::Closed,
            consecutive_failures: 0,
            opened_at: None,
            opens: 0,
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.state
    }

    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// How many times the breaker opened.
    pub(crate) fn opens(&self) -> u64 {
        self.opens
    }

    /// How long until an open breaker may probe (zero when it may now or
    /// is not open).
    pub(crate) fn wait(&self, now: Instant) -> Duration {
        match (self.state, self.opened_at) {
            (BreakerState::Open, Some(at)) => {
                (at + self.reset_after).saturating_duration_since(now)
            }
            _ => Duration::ZERO,
        }
    }

    /// Asks to run an operation now. Closed and half-open say yes; open
    /// says no until the reset period is over, then moves to half-open and
    /// says yes (the one probe).
    pub(crate) fn try_begin(&mut self, now: Instant) -> (bool, Option<Transition>) {
        match self.state {
            BreakerState::Closed | BreakerState::HalfOpen => (true, None),
            BreakerState::Open if self.wait(now).is_zero() => {
                (true, self.move_to(BreakerState::HalfOpen, now))
            }
            BreakerState::Open => (false, None),
        }
    }

    /// Records a successful operation.
    pub(crate) fn on_success(&mut self, now: Instant) -> Option<Transition> {
        self.consecutive_failures = 0;
        self.move_to(BreakerState::Closed, now)
    }

    /// Records a failed operation.
    pub(crate) fn on_failure(&mut self, now: Instant) -> Option<Transition> {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        match self.state {
            BreakerState::HalfOpen => self.move_to(BreakerState::Open, now),
            BreakerState::Closed if self.consecutive_failures >= self.threshold => {
                self.move_to(BreakerState::Open, now)
            }
            _ => None,
        }
    }

    fn move_to(&mut self, to: BreakerState, now: Instant) -> Option<Transition> {
        let from = self.state;
        if from == to {
            return None;
        }
        self.state = to;
        if to == BreakerState::Open {
            self.opened_at = Some(now);
            self.opens += 1;
        }
        Some(Transition { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESET: Duration = Duration::from_secs(30);

    #[test]
    fn opens_after_threshold_consecutive_failures_only() {
        let t = Instant::now();
        let mut b = Breaker::new(3, RESET);
        assert_eq!(b.on_failure(t), None);
        assert_eq!(b.on_failure(t), None);
        b.on_success(t); // a success resets the count
        assert_eq!(b.on_failure(t), None);
        assert_eq!(b.on_failure(t), None);
        let tr = b.on_failure(t).unwrap();
        assert_eq!((tr.from, tr.to), (BreakerState::Closed, BreakerState::Open));
        assert_eq!(b.opens(), 1);
    }

    #[test]
    fn open_skips_until_reset_then_allows_one_probe() {
        let t = Instant::now();
        let mut b = Breaker::new(1, RESET);
        b.on_failure(t);
        assert_eq!(b.try_begin(t + Duration::from_secs(29)), (false, None));
        assert_eq!(b.wait(t + Duration::from_secs(20)), Duration::from_secs(10));
        let (allowed, tr) = b.try_begin(t + RESET);
        assert!(allowed);
        assert_eq!(tr.unwrap().to, BreakerState::HalfOpen);
    }

    #[test]
    fn half_open_probe_decides() {
        let t = Instant::now();
        let mut b = Breaker::new(3, RESET);
        for _ in 0..3 {
            b.on_failure(t);
        }
        b.try_begin(t + RESET);
        // A failed probe re-opens at once (no three strikes) for a new period.
        let tr = b.on_failure(t + RESET).unwrap();
        assert_eq!(
            (tr.from, tr.to),
            (BreakerState::HalfOpen, BreakerState::Open)
        );
        assert!(!b.try_begin(t + RESET + Duration::from_secs(1)).0);
        b.try_begin(t + RESET * 2);
        let tr = b.on_success(t + RESET * 2).unwrap();
        assert_eq!(
            (tr.from, tr.to),
            (BreakerState::HalfOpen, BreakerState::Closed)
        );
        assert_eq!(b.consecutive_failures(), 0);
        assert_eq!(b.opens(), 2);
    }
}
