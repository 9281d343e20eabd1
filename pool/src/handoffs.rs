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

use std::collections::VecDeque;
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

/// The recent hand-offs of one worker, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Handoffs {
    recent: Mutex<VecDeque<(Instant, HandedOff)>>,
}

impl Handoffs {
    /// Remembers a hand-off (and forgets those past [`KEEP`]).
    pub(crate) fn record(&self, handed: HandedOff) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while recent
            .front()
            .is_some_and(|(at, _)| recent.len() >= MAX || now.duration_since(*at) >= KEEP)
        {
            recent.pop_front();
        }
        recent.push_back((now, handed));
    }

    /// The hand-offs made within `within`, newest first.
    pub(crate) fn recent(&self, within: Duration) -> Vec<HandedOff> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent
            .iter()
            .rev()
            .take_while(|(at, _)| at.elapsed() <= within)
            .map(|(_, h)| h.clone())
            .collect()
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
}
