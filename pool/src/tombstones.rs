//! Stops a worker carried out, remembered for a while. After Redis went back
//! in time (restarted from an older snapshot, a replica promoted with lost
//! writes) a worker's inbox may hold again a start entry that the worker
//! already ran and then stopped on request; such an entry must not start
//! the job again. A new dispatch of the key gets a newer fencing token, so
//! it is never mistaken for the stopped run.
//!
//! A stop asked for with `stop_job` ends the whole dispatch, not only the
//! run: the dispatch's admission stamp is remembered too, and a start of
//! that dispatch with a newer token (a cleanup on the state Redis went back
//! to moved the stopped run on again) is not started either.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a stop is remembered (rollbacks lose seconds, not minutes).
const KEEP: Duration = Duration::from_secs(600);
/// Most stops remembered.
const MAX: usize = 100_000;

/// Key → fencing token of the run that was stopped.
#[derive(Debug, Default)]
pub(crate) struct StopTombstones {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    tokens: HashMap<String, u64>,
    /// Key → admission stamp (µs, see `codec::stamp_us`) of the dispatch
    /// stopped on request, and the token of the run stopped; kept as long
    /// as the key's entry in `tokens`.
    dispatches: HashMap<String, (u64, u64)>,
    order: VecDeque<(Instant, String, u64)>,
}

impl StopTombstones {
    /// Remembers that the run of `key` with `token` was stopped.
    pub(crate) fn record(&self, key: &str, token: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while let Some((at, _, _)) = inner.order.front() {
            if inner.order.len() < MAX && now.duration_since(*at) < KEEP {
                break;
            }
            if let Some((_, old, old_token)) = inner.order.pop_front()
                && inner.tokens.get(&old) == Some(&old_token)
            {
                inner.tokens.remove(&old);
                inner.dispatches.remove(&old);
            }
        }
        let entry = inner.tokens.entry(key.to_string()).or_insert(token);
        *entry = (*entry).max(token);
        let kept = *entry;
        inner.order.push_back((now, key.to_string(), kept));
    }

    /// Remembers that dispatch `admitted` (its admission stamp) of `key`
    /// is over, its run `token` with it: stopped on request, or ended for
    /// good (finished, or failed past its restarts) with Redis recording
    /// the end. A stamp written by an earlier build (ms: not unique to one
    /// dispatch) is remembered as a run's stop only.
    pub(crate) fn record_dispatch(&self, key: &str, token: u64, admitted: u64) {
        self.record(key, token);
        if crate::codec::stamp_is_exact(admitted) {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.dispatches.insert(key.to_string(), (admitted, token));
        }
    }

    /// The token of the run stopped here on request of dispatch `admitted`
    /// of `key`, when that dispatch was stopped here and remembered.
    pub(crate) fn stopped_dispatch(&self, key: &str, admitted: u64) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .dispatches
            .get(key)
            .filter(|(stamp, _)| *stamp == admitted)
            .map(|(_, token)| *token)
    }

    /// The admission stamp (µs) of the dispatch the newest stop of `key`
    /// remembered, at `token`, ended, when it ended one
    /// ([`record_dispatch`](Self::record_dispatch)). Made to stand again,
    /// the stop ends that dispatch and older ones, not a newer dispatch
    /// whose runs took tokens below `token` (see `stop_stands.lua`).
    pub(crate) fn dispatch_of(&self, key: &str, token: u64) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.tokens.get(key) != Some(&token) {
            return None;
        }
        inner
            .dispatches
            .get(key)
            .filter(|(_, t)| *t == token)
            .map(|(admitted, _)| crate::codec::stamp_us(*admitted))
    }

    /// The stops recorded within `within`, each with what it ended when it
    /// ended a whole dispatch ([`dispatch_of`](Self::dispatch_of)): what a
    /// close leaves with the workers that stay (`custody::remember_stops`).
    pub(crate) fn recent_ends(&self, within: Duration) -> Vec<(String, u64, Option<u64>)> {
        self.recent(within)
            .into_iter()
            .map(|(key, token)| {
                let dispatch = self.dispatch_of(&key, token);
                (key, token, dispatch)
            })
            .collect()
    }

    /// The stops recorded within `within` (key, newest stopped token).
    pub(crate) fn recent(&self, within: Duration) -> Vec<(String, u64)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: HashMap<&str, u64> = HashMap::new();
        for (at, key, _) in inner.order.iter().rev() {
            if at.elapsed() > within {
                break;
            }
            if let Some(token) = inner.tokens.get(key) {
                out.insert(key.as_str(), *token);
            }
        }
        out.into_iter().map(|(k, t)| (k.to_string(), t)).collect()
    }

    /// Whether a start of `key` with `token` was stopped here already.
    pub(crate) fn covers(&self, key: &str, token: u64) -> bool {
        self.newest(key).is_some_and(|t| token <= t)
    }

    /// Whether no stop is remembered.
    pub(crate) fn is_empty(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tokens
            .is_empty()
    }

    /// The token of the newest run of `key` stopped here, if remembered.
    pub(crate) fn newest(&self, key: &str) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.tokens.get(key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_run_and_older_ones_are_covered_newer_are_not() {
        let t = StopTombstones::default();
        assert!(!t.covers("k", 5));
        t.record("k", 5);
        assert!(t.covers("k", 5));
        assert!(t.covers("k", 4));
        assert!(!t.covers("k", 6), "a new dispatch has a newer token");
        t.record("k", 3);
        assert!(t.covers("k", 5), "an older stop does not shrink it");
        assert!(!t.covers("other", 1));
        assert_eq!(t.newest("k"), Some(5));
        assert_eq!(t.newest("other"), None);
        let mut recent = t.recent(Duration::from_secs(60));
        recent.sort();
        assert_eq!(recent, [("k".to_string(), 5)]);
        assert!(t.recent(Duration::ZERO).is_empty());
    }

    #[test]
    fn only_a_dispatchs_end_is_a_whole_dispatchs() {
        let t = StopTombstones::default();
        t.record("run", 5);
        assert!(t.dispatch_of("run", 5).is_none());
        let exact = 1_700_000_000_000_000;
        t.record_dispatch("over", 9, exact);
        assert!(t.dispatch_of("over", 9).is_some());
        assert!(t.dispatch_of("over", 8).is_none());
        // A newer run's stop, not of a whole dispatch, is the newest.
        t.record("over", 12);
        assert!(t.dispatch_of("over", 12).is_none());
        // A stamp in ms names no single dispatch.
        t.record_dispatch("ms", 4, 1_700_000_000_000);
        assert!(t.dispatch_of("ms", 4).is_none());
    }

    #[test]
    fn a_dispatch_stopped_on_request_is_known_by_its_stamp() {
        let t = StopTombstones::default();
        let stamp = 1_796_431_900_534_123;
        t.record_dispatch("k", stamp + 10, stamp);
        assert_eq!(t.stopped_dispatch("k", stamp), Some(stamp + 10));
        assert!(t.covers("k", stamp + 10));
        assert_eq!(
            t.stopped_dispatch("k", stamp + 11),
            None,
            "a newer dispatch"
        );
        assert_eq!(t.stopped_dispatch("other", stamp), None);
        // A stamp in ms (an earlier build's) names no single dispatch.
        t.record_dispatch("old", 5_000_000, 1_796_431_900_534);
        assert_eq!(t.stopped_dispatch("old", 1_796_431_900_534), None);
        assert!(t.covers("old", 5_000_000));
    }
}
