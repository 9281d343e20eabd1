//! Whether a start entry can be started *before* it is claimed in Redis.
//!
//! A worker may start a key only if no other worker runs it (I1). A start
//! entry is in exactly one inbox at a time; a copy a worker holds becomes
//! stale (its key may run elsewhere) only if
//!
//! * a cleaner moved the entry to another worker, which needs this worker
//!   to be silent for a TTL of server time, so its lease lapsed first (and
//!   a lease that comes back while the cleaner's claim stands is none to
//!   start under: the renewal names the claimed worker, which starts
//!   nothing until the claim is gone, and the doubt is raised then);
//! * its pending guard was removed: past the guard's deadline (the stale
//!   pending sweep), or with all of Redis's data.
//!
//! So an entry is *fresh* when it was appended (its stream id is the server
//! time of the append) after the node last had a reason for doubt — a lease
//! lapse or gap, a re-registration, a reconnect — while the lease holds
//! now, and when its age by server time is well within the guard's
//! lifetime. An entry appended after the doubt was necessarily read after
//! it, so copies read before a lapse never pass. An entry forwarded or
//! moved by a cleaner (one hop or more) is never fresh: its stream id is
//! the time of the move, and the entry moved may be a copy that Redis
//! brought back by going back in time, of a run stopped since (seen in a
//! soak: a rollback, a stop, then the worker killed and its inbox moved).
//! A fresh entry is started
//! first and recorded after (`record_starts.lua`: two scripts on the
//! dispatch path); any other is claimed in Redis before the handler runs
//! (`claim_start.lua`), whatever the worker's replicas say. Server time is
//! bounded with this process's monotonic clock since a reply that carried
//! it (I5: no comparison of two machines' clocks).
//!
//! A fresh start is recorded when the handler's `start` returns, which may
//! take a while: past a quarter of the guard's lifetime
//! (`dispatch_timeout + ack_grace`) it is claimed while the handler goes
//! on (`WorkerInner::start_fresh`), so the guard, which has half its life
//! left at the read, never lapses under it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The node's view of how fresh the entries it reads are.
#[derive(Debug, Default)]
pub(crate) struct Freshness {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Redis server time (ms) from a reply, and when its request was sent.
    clock: Option<(u64, Instant)>,
    /// Entries appended at or before this server time (ms) are not fresh.
    /// `u64::MAX`: a doubt arose before any server time was known; the
    /// next reply to a request sent after it sets the bound.
    fresh_after_ms: u64,
    doubt_at: Option<Instant>,
}

impl State {
    /// An upper bound of Redis server time now.
    fn server_now_at_most(&self) -> Option<u64> {
        self.clock
            .map(|(ms, sent)| ms + sent.elapsed().as_millis() as u64)
    }
}

impl Freshness {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes every entry appended until now possibly stale.
    pub(crate) fn invalidate(&self, why: &'static str) {
        let mut state = self.state();
        let bound = state.server_now_at_most().unwrap_or(u64::MAX);
        state.fresh_after_ms = state.fresh_after_ms.max(bound);
        state.doubt_at = Some(Instant::now());
        tracing::debug!(
            why,
            "entries appended so far will be claimed before starting"
        );
    }

    /// Records Redis server time `server_ms`, answered to a request sent at
    /// `sent`.
    pub(crate) fn server_time(&self, server_ms: u64, sent: Instant) {
        let mut state = self.state();
        state.clock = Some((server_ms, sent));
        if state.fresh_after_ms == u64::MAX && state.doubt_at.is_none_or(|d| sent >= d) {
            // Answered after the doubt, so this server time is past it.
            state.fresh_after_ms = server_ms;
        }
    }

    /// Whether the entry with stream id `entry_id` may be started before
    /// being claimed. `lease_since` is when the last successful renewal
    /// was sent.
    pub(crate) fn is_fresh(
        &self,
        entry_id: &str,
        lease_since: Instant,
        lease_stop_after: Duration,
        pending_ttl: Duration,
    ) -> bool {
        if lease_since.elapsed() >= lease_stop_after {
            return false;
        }
        let Some(appended_ms) = entry_id
            .split_once('-')
            .and_then(|(ms, _)| ms.parse::<u64>().ok())
        else {
            return false;
        };
        let state = self.state();
        if appended_ms <= state.fresh_after_ms {
            return false;
        }
        let Some(now_at_most) = state.server_now_at_most() else {
            return false;
        };
        let age_at_most = now_at_most.saturating_sub(appended_ms);
        u128::from(age_at_most) < pending_ttl.as_millis() / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STOP_AFTER: Duration = Duration::from_secs(20);
    const GUARD: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn fresh_only_after_the_last_doubt_under_a_lease_and_within_the_guard() {
        let f = Freshness::default();
        let lease = Instant::now();
        // No server time known yet: never fresh.
        assert!(!f.is_fresh("1000-0", lease, STOP_AFTER, GUARD));
        f.server_time(10_000, Instant::now());
        assert!(f.is_fresh("10000-0", lease, STOP_AFTER, GUARD));
        assert!(f.is_fresh("9000-3", lease, STOP_AFTER, GUARD));
        // Older than half the guard's lifetime.
        assert!(!f.is_fresh("4000-0", lease, STOP_AFTER, GUARD));
        // Malformed id.
        assert!(!f.is_fresh("x", lease, STOP_AFTER, GUARD));
        // No lease now.
        assert!(!f.is_fresh("10000-0", lease, Duration::ZERO, GUARD));
        // A doubt: what was appended until now is stale, later entries not.
        f.invalidate("test");
        assert!(!f.is_fresh("10000-0", lease, STOP_AFTER, GUARD));
        let later = 10_000 + lease.elapsed().as_millis() as u64 + 1;
        assert!(f.is_fresh(&format!("{later}-0"), lease, STOP_AFTER, GUARD));
    }

    #[tokio::test]
    async fn a_doubt_before_any_server_time_waits_for_a_later_reply() {
        let f = Freshness::default();
        let lease = Instant::now();
        let before = Instant::now();
        f.invalidate("test");
        // A reply to a request sent before the doubt does not clear it.
        f.server_time(10_000, before);
        assert!(!f.is_fresh("10001-0", lease, STOP_AFTER, GUARD));
        // One sent after it does.
        f.server_time(10_050, Instant::now());
        assert!(!f.is_fresh("10050-0", lease, STOP_AFTER, GUARD));
        assert!(f.is_fresh("10051-0", lease, STOP_AFTER, GUARD));
    }
}
