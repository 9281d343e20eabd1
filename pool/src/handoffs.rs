//! Hand-offs a worker made, remembered for a while with the job's stored
//! payload. A hand-off stops the job here and leaves a start entry at the
//! new owner; if Redis then goes back in time to before it (restarted from
//! an older snapshot, a replica promoted with lost writes) while that entry
//! was not started yet, the job runs nowhere and Redis may not even know it
//! any more. After such a rollback the worker gives each recent hand-off's
//! payload back to Redis unless something newer happened to the key
//! (`handoff_stands.lua`: Redis went back to before the hand-off, and holds
//! no record or guard of the key): the job is then an orphan, which the
//! orphan sweep requeues unless the new owner runs it and re-asserts it
//! first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// How long a hand-off is remembered: a hand-off a rollback can lose
/// before its new owner starts the job is one made seconds before Redis
/// went down (the payloads are kept alive that long).
pub(crate) const KEEP: Duration = Duration::from_secs(30);
/// Most hand-offs remembered.
const MAX: usize = 100_000;

/// One hand-off: the job key, the fencing token issued for the new owner's
/// run, and the job's creation time and body (shared with the run, not
/// copied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandedOff {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) created_at_ms: u64,
    pub(crate) body: Bytes,
}

/// The recent hand-offs of one worker, oldest first, and the newest
/// token handed on per key.
#[derive(Debug, Default)]
pub(crate) struct Handoffs {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    recent: VecDeque<(Instant, HandedOff)>,
    newest: HashMap<String, (Instant, u64)>,
}

impl Handoffs {
    /// Remembers a hand-off (and forgets those past [`KEEP`]).
    pub(crate) fn record(&self, handed: HandedOff) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while inner
            .recent
            .front()
            .is_some_and(|(at, _)| inner.recent.len() >= MAX || now.duration_since(*at) >= KEEP)
        {
            if let Some((_, old)) = inner.recent.pop_front()
                && inner
                    .newest
                    .get(&old.key)
                    .is_some_and(|(_, t)| *t == old.token)
            {
                inner.newest.remove(&old.key);
            }
        }
        let newest = inner.newest.entry(handed.key.clone()).or_insert((now, 0));
        if handed.token >= newest.1 {
            *newest = (now, handed.token);
        }
        inner.recent.push_back((now, handed));
    }

    /// The hand-offs made within `within`, newest first.
    pub(crate) fn recent(&self, within: Duration) -> Vec<HandedOff> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .recent
            .iter()
            .rev()
            .take_while(|(at, _)| at.elapsed() <= within)
            .map(|(_, h)| h.clone())
            .collect()
    }

    /// Whether this worker handed `key` on, within [`KEEP`], with a token
    /// newer than `token`: a start entry of an older run, back in the
    /// inbox because Redis went back in time, is then stale (the run it
    /// led to may have been stopped since, elsewhere).
    pub(crate) fn supersede(&self, key: &str, token: u64) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .newest
            .get(key)
            .is_some_and(|(at, handed)| *handed > token && at.elapsed() < KEEP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_hand_offs_come_back_newest_first() {
        let handoffs = Handoffs::default();
        for (key, token) in [("a", 1), ("b", 2)] {
            handoffs.record(HandedOff {
                key: key.into(),
                token,
                created_at_ms: 0,
                body: Bytes::from_static(b"x"),
            });
        }
        let keys: Vec<String> = handoffs
            .recent(Duration::from_secs(60))
            .into_iter()
            .map(|h| h.key)
            .collect();
        assert_eq!(keys, ["b", "a"]);
        assert!(handoffs.recent(Duration::ZERO).len() <= 2);
    }

    #[test]
    fn a_hand_off_supersedes_only_older_starts_of_its_key() {
        let handoffs = Handoffs::default();
        let handed = |token| HandedOff {
            key: "k".into(),
            token,
            created_at_ms: 0,
            body: Bytes::from_static(b"x"),
        };
        handoffs.record(handed(10));
        handoffs.record(handed(7)); // an older token does not lower it
        assert!(handoffs.supersede("k", 9));
        assert!(!handoffs.supersede("k", 10), "the handed-on run itself");
        assert!(!handoffs.supersede("k", 11), "a newer run");
        assert!(!handoffs.supersede("other", 1));
    }
}
