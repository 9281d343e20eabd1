//! Jobs a worker passed on and Redis alone holds for a while, remembered
//! with the job's stored payload, in case Redis loses them:
//!
//! * **Hand-offs.** A hand-off stops the job here and leaves a start entry
//!   at the new owner; if Redis then goes back in time to before it
//!   (restarted from an older snapshot, a replica promoted with lost
//!   writes) while that entry was not started yet, the job runs nowhere and
//!   Redis may not even know it any more.
//! * **A dead worker's jobs a cleanup moved.** Kept by a worker of the
//!   cleaning node: the worker they came from cannot give them back.
//! * **Orphans a re-assertion left.** A job the worker held suspended
//!   through a data loss is left to the orphan sweep while the pool
//!   recovers (`reassert.lua`): from then on its payload in Redis is the
//!   only copy, until the sweep requeues it one grace later and a worker
//!   starts it. A second loss meanwhile (another restart, a rollback)
//!   would take that copy too.
//!
//! After such a loss the worker gives each remembered job's payload back to
//! Redis unless something newer happened to the key (`handoff_stands.lua`:
//! Redis went back to before the hand-off or the orphan, and holds no
//! record or guard of the key): the job is then an orphan, which the orphan
//! sweep requeues unless its owner runs it and re-asserts it first.
//!
//! A job whose run ended since (stopped on request wherever it went next)
//! must not come back that way: the worker that stopped it and the node
//! that asked may both be gone when Redis loses the stop (a scale-down and
//! a command-line client are enough), and a loss that takes the key
//! altogether looks the same as one that took the hand-off. So each node
//! asks Redis every [`SETTLE_EVERY`], while Redis still knows, which of its
//! workers' remembered jobs ended (`handoffs_ended.lua`) and marks them
//! settled: they are no longer given back. Their tokens still refuse older
//! start entries of the key ([`Handoffs::supersede`]). The worker is then
//! a witness of that end, as of a stop it carried out: for
//! [`ENDS_REMEMBERED`] it makes it stand after a loss, in case Redis goes
//! back to a state that shows the run going on under a worker gone since.
//!
//! A job Redis shows still waiting to start (a payload, no record) is
//! remembered on, from round to round, however long its start takes: a
//! new owner slow to claim it, a guard expired and the job requeued again.
//! Remembered for a fixed time only, such jobs were lost to a loss that
//! came after it (chaos soak seed 1416: jobs requeued and refused for 30 s
//! on an overloaded worker, then a `FLUSHALL`).
//!
//! A worker that leaves passes all of it (and its own recent stops) on to
//! the workers that stay, which remember it the same way from then on
//! ([`Handoffs::take_over`], `custody.rs`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// How long a hand-off is remembered: a hand-off a rollback can lose
/// before its new owner starts the job is one made seconds before Redis
/// went down (the payloads are kept alive that long). Orphans are kept
/// longer, see [`Handoffs::record_orphan`].
pub(crate) const KEEP: Duration = Duration::from_secs(30);
/// Most jobs remembered.
const MAX: usize = 100_000;
/// How often a node asks Redis which remembered jobs ended: a stop is
/// undone by a loss within this long of it only when everyone who
/// remembers it (the stopping worker, the asking node) is gone too.
pub(crate) const SETTLE_EVERY: Duration = Duration::from_secs(1);
/// `(key, token)` pairs asked about per call of `handoffs_ended.lua`.
pub(crate) const SETTLE_BATCH: usize = 500;
/// How long an end seen in Redis is made to stand after a loss, as long
/// as a worker's own stops (a rollback loses seconds of writes, not
/// minutes).
pub(crate) const ENDS_REMEMBERED: Duration = Duration::from_secs(120);

/// One job passed on: the job key, the fencing token of the run it came
/// from or led to, and the job's creation time and body (shared with the
/// run, not copied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandedOff {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) admitted: u64,
    pub(crate) body: Bytes,
}

impl HandedOff {
    /// Job `key`, run here as `job`, passed on under `token`.
    pub(crate) fn of(key: &str, token: u64, job: &crate::worker::LocalJob) -> HandedOff {
        HandedOff {
            key: key.to_string(),
            token,
            admitted: job.admitted,
            body: job.raw_body.clone(),
        }
    }
}

/// The jobs one worker passed on lately, oldest first, and the newest
/// token passed on per key.
#[derive(Debug, Default)]
pub(crate) struct Handoffs {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each job with the instant it is forgotten.
    recent: VecDeque<Remembered>,
    newest: HashMap<String, (Instant, u64)>,
    /// Per key, the highest counter of an end remembered and until when:
    /// looked up at every start (see [`Handoffs::ended_counter`]), where a
    /// scan of `recent` would cost one step per job remembered.
    ends: HashMap<String, End>,
    /// Set by tests: [`settle`](crate::node::NodeInner::settle_handoffs)
    /// rounds skip this worker, as a round that has not come yet.
    #[cfg(test)]
    settling_held: bool,
}

/// The newest end remembered of a key.
#[derive(Debug, Clone, Copy)]
struct End {
    until: Instant,
    /// Every run of the key up to this counter is over.
    counter: u64,
    /// What the end at `counter` ended, when it ended a whole dispatch (a
    /// stop left here by a closing worker or node): the bound
    /// `stop_stands.lua` takes (see [`Handoffs::ended_dispatch`]).
    dispatch: Option<u64>,
}

impl Inner {
    fn note_end(&mut self, key: &str, until: Instant, counter: u64, dispatch: Option<u64>) {
        note_end(&mut self.ends, key, until, counter, dispatch);
    }
}

/// Raises `key`'s end in `ends` to `counter`, remembered until `until` at
/// least. Keeping a higher counter past an older entry's expiry never
/// covers a newer run: new runs get tokens above the key's counter.
/// `dispatch` goes with `counter` (a higher counter's end replaces it).
fn note_end(
    ends: &mut HashMap<String, End>,
    key: &str,
    until: Instant,
    counter: u64,
    dispatch: Option<u64>,
) {
    match ends.get_mut(key) {
        Some(end) => {
            end.until = end.until.max(until);
            if counter > end.counter {
                end.counter = counter;
                end.dispatch = dispatch;
            } else if counter == end.counter {
                end.dispatch = end.dispatch.max(dispatch);
            }
        }
        None => {
            ends.insert(
                key.to_string(),
                End {
                    until,
                    counter,
                    dispatch,
                },
            );
        }
    }
}

#[derive(Debug)]
struct Remembered {
    until: Instant,
    handed: HandedOff,
    /// The key's fencing counter when Redis showed the run ended (no
    /// payload, the counter at or above the token): never given back, and
    /// every run up to that counter is over.
    ended_at: Option<u64>,
    /// With `ended_at`, the end of a whole dispatch: its bound (see
    /// [`End::dispatch`]), passed on at a close.
    ended_dispatch: Option<u64>,
    /// Given back after a loss, asked about and passed on at a close;
    /// `false` for a run given up while yielding
    /// ([`Handoffs::record_yielded`]).
    give_back: bool,
}

impl Handoffs {
    /// Remembers a hand-off for [`KEEP`].
    pub(crate) fn record(&self, handed: HandedOff) {
        self.remember(handed, KEEP);
    }

    /// Remembers a job left to the orphan sweep for `keep`: until the sweep
    /// requeued it (one orphan grace, counted once the pool recovered) and
    /// its new owner started it.
    pub(crate) fn record_orphan(&self, orphan: HandedOff, keep: Duration) {
        self.remember(orphan, keep.max(KEEP));
    }

    /// Remembers for `keep` a run given up to the promoted side's answer
    /// while this node's writes went to a primary that stalled through its
    /// failover (its suspended jobs re-assert yielding): that side may be
    /// replaced in turn by one that still records the run here (a second
    /// failover promoting a replica of the stalled branch), and releasing
    /// that record must leave the payload ([`passed_on`](Self::passed_on)).
    /// Its token is from the stalled branch and says nothing of the
    /// other's, so it is neither given back after a loss nor asked about
    /// nor passed on at a close, and refuses no start entry.
    pub(crate) fn record_yielded(&self, given_up: HandedOff, keep: Duration) {
        self.remember_as(given_up, keep.max(KEEP), None, false);
    }

    /// Remembers what a closing worker left here (see `custody.rs`) for
    /// `keep`: a job passed on, or with `ended_at`, a run Redis showed
    /// ended at that counter.
    pub(crate) fn take_over(&self, handed: HandedOff, keep: Duration, ended_at: Option<u64>) {
        self.remember_as(handed, keep, ended_at.map(|c| (c, None)), true);
    }

    /// Remembers for `keep` a stop a closing worker or node left here, of
    /// `handed.key` at `counter` (the stopped run's token, or the stop's
    /// tombstone), which ended a whole dispatch: `dispatch` is that
    /// dispatch's admission stamp (µs), or `counter` for a stop of the
    /// whole key. Made to stand here as its stopper would have (see
    /// [`ended_dispatch`](Self::ended_dispatch)).
    pub(crate) fn take_over_dispatch_end(
        &self,
        handed: HandedOff,
        keep: Duration,
        counter: u64,
        dispatch: u64,
    ) {
        self.remember_as(handed, keep, Some((counter, Some(dispatch))), true);
    }

    /// Holds this worker's settle rounds (see `Inner::settling_held`).
    #[cfg(test)]
    pub(crate) fn hold_settling(&self, held: bool) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .settling_held = held;
    }

    /// Whether a test holds this worker's settle rounds.
    #[cfg(test)]
    pub(crate) fn settling_held(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .settling_held
    }

    /// Everything remembered, to leave with a worker that stays when this
    /// one closes: each job, how much longer it is remembered, the counter
    /// of its end where Redis showed one, and what that end ended when it
    /// ended a whole dispatch.
    pub(crate) fn everything(&self) -> Vec<(HandedOff, Duration, Option<u64>, Option<u64>)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner
            .recent
            .iter()
            .filter(|r| r.until > now && r.give_back)
            .map(|r| {
                (
                    r.handed.clone(),
                    r.until - now,
                    r.ended_at,
                    r.ended_dispatch,
                )
            })
            .collect()
    }

    fn remember(&self, handed: HandedOff, keep: Duration) {
        self.remember_as(handed, keep, None, true);
    }

    fn remember_as(
        &self,
        handed: HandedOff,
        keep: Duration,
        ended: Option<(u64, Option<u64>)>,
        give_back: bool,
    ) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Oldest first; an orphan kept longer holds back the pruning of
        // the entries behind it until it goes (they are skipped when read).
        while inner
            .recent
            .front()
            .is_some_and(|r| inner.recent.len() >= MAX || r.until <= now)
        {
            let Some(Remembered { handed: old, .. }) = inner.recent.pop_front() else {
                break;
            };
            if inner
                .newest
                .get(&old.key)
                .is_some_and(|(_, t)| *t == old.token)
            {
                inner.newest.remove(&old.key);
            }
            if inner.ends.get(&old.key).is_some_and(|end| end.until <= now) {
                inner.ends.remove(&old.key);
            }
        }
        // Ends of entries dropped early (over `MAX`), rarely: a whole pass
        // only when the index outgrows what is remembered.
        if inner.ends.len() > inner.recent.len() {
            inner.ends.retain(|_, end| end.until > now);
        }
        let until = now + keep;
        if give_back {
            let newest = inner.newest.entry(handed.key.clone()).or_insert((until, 0));
            if handed.token >= newest.1 {
                *newest = (until.max(newest.0), handed.token);
            }
        }
        if let Some((counter, dispatch)) = ended {
            inner.note_end(&handed.key, until, counter, dispatch);
        }
        inner.recent.push_back(Remembered {
            until,
            handed,
            ended_at: ended.map(|(counter, _)| counter),
            ended_dispatch: ended.and_then(|(_, dispatch)| dispatch),
            give_back,
        });
    }

    /// The jobs still remembered whose run may not have ended, newest
    /// first: those to give back after a loss.
    pub(crate) fn remembered(&self) -> Vec<HandedOff> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner
            .recent
            .iter()
            .rev()
            .filter(|r| r.until > now && r.ended_at.is_none() && r.give_back)
            .map(|r| r.handed.clone())
            .collect()
    }

    /// The `(key, token, admission stamp µs)` of each job
    /// [`remembered`](Self::remembered) gives, to ask Redis whether its run
    /// ended.
    pub(crate) fn unsettled(&self) -> Vec<(String, u64, u64)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner
            .recent
            .iter()
            .filter(|r| r.until > now && r.ended_at.is_none() && r.give_back)
            .map(|r| {
                let handed = &r.handed;
                let admitted = crate::codec::stamp_us(handed.admitted);
                (handed.key.clone(), handed.token, admitted)
            })
            .collect()
    }

    /// Marks the jobs Redis showed ended, each `(key, token, counter)`
    /// with `(key, token)` as [`unsettled`](Self::unsettled) gave it and
    /// the key's counter then: entries of the key up to that token are not
    /// given back any more, and [`ended`](Self::ended) names them for
    /// [`ENDS_REMEMBERED`].
    pub(crate) fn settle(&self, ended: &[(String, u64, u64)]) {
        if ended.is_empty() {
            return;
        }
        let mut by_key: HashMap<&str, (u64, u64)> = HashMap::new();
        for (key, token, counter) in ended {
            let top = by_key.entry(key.as_str()).or_insert((*token, *counter));
            *top = (top.0.max(*token), top.1.max(*counter));
        }
        let until = Instant::now() + ENDS_REMEMBERED;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { recent, ends, .. } = &mut *inner;
        for r in recent.iter_mut() {
            if let Some((token, counter)) = by_key.get(r.handed.key.as_str())
                && r.handed.token <= *token
            {
                let ended_at = r.ended_at.unwrap_or(0).max(*counter);
                r.ended_at = Some(ended_at);
                r.until = r.until.max(until);
                note_end(ends, &r.handed.key, r.until, ended_at, None);
            }
        }
    }

    /// Keeps remembering, for [`KEEP`] from now at least, each of `jobs`
    /// (`(key, token)` as [`unsettled`](Self::unsettled) gave it, and the
    /// admission stamp of the payload Redis holds, in µs) that Redis showed still
    /// waiting to start: it holds the only copy until a worker starts it,
    /// however long that takes. Only where that payload is of the admission
    /// remembered: a newer one means the remembered run ended.
    pub(crate) fn keep_waiting(&self, jobs: &[(String, u64, u64)]) {
        if jobs.is_empty() {
            return;
        }
        let waiting: std::collections::HashSet<(&str, u64, u64)> = jobs
            .iter()
            .map(|(key, token, admitted_us)| (key.as_str(), *token, *admitted_us))
            .collect();
        let until = Instant::now() + KEEP;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { recent, newest, .. } = &mut *inner;
        for r in recent.iter_mut() {
            let handed = &r.handed;
            if r.ended_at.is_none()
                && waiting.contains(&(
                    handed.key.as_str(),
                    handed.token,
                    crate::codec::stamp_us(handed.admitted),
                ))
            {
                r.until = r.until.max(until);
                if let Some(newest) = newest.get_mut(&handed.key)
                    && newest.1 == handed.token
                {
                    newest.0 = newest.0.max(until);
                }
            }
        }
    }

    /// `(key, counter)` of each job whose end Redis showed in the last
    /// [`ENDS_REMEMBERED`]: every run of the key up to the counter is over.
    pub(crate) fn ended(&self) -> Vec<(String, u64)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner
            .ends
            .iter()
            .filter(|(_, end)| end.until > now)
            .map(|(key, end)| (key.clone(), end.counter))
            .collect()
    }

    /// What the end of `key` that [`ended`](Self::ended) names at
    /// `counter` ended, when it ended a whole dispatch (a stop a closing
    /// worker or node left here): the admission stamp of that dispatch, or
    /// the stop's tombstone for a stop of the whole key. Made to stand as
    /// such ([`StopKind::Dispatch`](crate::store::StopKind::Dispatch)), the
    /// stop records that end in Redis as its stopper would have: a stop
    /// made to stand as a run's only raises the counter, and a hand-off of
    /// that dispatch given back after a loss would take it for an end of
    /// an older dispatch only (CI seed 7, `stop-leave`: the stopped job ran
    /// again).
    pub(crate) fn ended_dispatch(&self, key: &str, counter: u64) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner
            .ends
            .get(key)
            .filter(|end| end.until > now && end.counter == counter)
            .and_then(|end| end.dispatch)
    }

    /// The counter Redis showed when a run of `key` this worker passed on
    /// ended, within [`ENDS_REMEMBERED`] (see [`ended`](Self::ended)).
    pub(crate) fn ended_counter(&self, key: &str) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner
            .ends
            .get(key)
            .filter(|end| end.until > now)
            .map(|end| end.counter)
    }

    /// Whether this worker passed `key` on with token `token` or a newer
    /// one, and Redis has not shown that run ended: after Redis went back
    /// to before the hand-off, the key's payload may be the job's only copy
    /// (see `release_stale.lua`). The same token is a run left to the
    /// orphan sweep (a hand-off's token names the new owner, never this
    /// worker): a record of that very run, which Redis went back to, is
    /// not a run that ended here (chaos soak seed 1562: a failed job left
    /// to the sweep during one recovery was released with its payload in
    /// the next, and admitted again as new).
    pub(crate) fn passed_on(&self, key: &str, token: u64) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner.recent.iter().any(|r| {
            r.handed.key == key && r.handed.token >= token && r.until > now && r.ended_at.is_none()
        })
    }

    /// Whether this worker passed `key` on, and still remembers it, with a
    /// token newer than `token`: a start entry of an older run, back in
    /// the inbox because Redis went back in time, is then stale (the run
    /// it led to may have been stopped since, elsewhere).
    pub(crate) fn supersede(&self, key: &str, token: u64) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .newest
            .get(key)
            .is_some_and(|(until, handed)| *handed > token && *until > Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_jobs_come_back_newest_first() {
        let handoffs = Handoffs::default();
        for (key, token) in [("a", 1), ("b", 2)] {
            handoffs.record(HandedOff {
                key: key.into(),
                token,
                admitted: 0,
                body: Bytes::from_static(b"x"),
            });
        }
        handoffs.record_orphan(
            HandedOff {
                key: "c".into(),
                token: 3,
                admitted: 0,
                body: Bytes::from_static(b"x"),
            },
            Duration::ZERO, // kept for KEEP at least
        );
        let keys: Vec<String> = handoffs.remembered().into_iter().map(|h| h.key).collect();
        assert_eq!(keys, ["c", "b", "a"]);
    }

    /// A run given up while yielding keeps its payload on a release, and
    /// nothing else: its token is the stalled branch's.
    #[test]
    fn a_run_given_up_while_yielding_is_only_passed_on() {
        let handoffs = Handoffs::default();
        handoffs.record_yielded(
            HandedOff {
                key: "y".into(),
                token: 8,
                admitted: 0,
                body: Bytes::from_static(b"x"),
            },
            Duration::ZERO, // kept for KEEP at least
        );
        assert!(handoffs.passed_on("y", 7));
        assert!(handoffs.passed_on("y", 8));
        assert!(!handoffs.passed_on("y", 9));
        assert!(handoffs.remembered().is_empty(), "not given back");
        assert!(handoffs.unsettled().is_empty(), "not asked about");
        assert!(handoffs.everything().is_empty(), "not passed on at a close");
        assert!(!handoffs.supersede("y", 1), "refuses no start entry");
    }

    #[test]
    fn a_settled_job_is_not_given_back_but_still_supersedes() {
        let handoffs = Handoffs::default();
        let handed = |key: &str, token| HandedOff {
            key: key.into(),
            token,
            admitted: 0,
            body: Bytes::from_static(b"x"),
        };
        handoffs.record(handed("a", 5));
        handoffs.record(handed("b", 6));
        handoffs.record(handed("c", 9));
        assert_eq!(handoffs.unsettled().len(), 3);
        // Ended at or past the remembered token: settled; "c" ended only
        // in an older run (a lower token): not.
        handoffs.settle(&[("a".into(), 5, 7), ("c".into(), 8, 8)]);
        let keys: Vec<String> = handoffs.remembered().into_iter().map(|h| h.key).collect();
        assert_eq!(keys, ["c", "b"]);
        assert_eq!(
            handoffs.unsettled(),
            [("b".to_string(), 6, 0), ("c".to_string(), 9, 0)]
        );
        assert!(
            handoffs.supersede("a", 4),
            "older starts of a still refused"
        );
        assert_eq!(handoffs.ended(), [("a".to_string(), 7)]);
        assert_eq!(handoffs.ended_counter("a"), Some(7));
        assert_eq!(handoffs.ended_counter("b"), None, "not ended");
        assert_eq!(handoffs.ended_counter("c"), None, "an older run ended");
    }

    /// A job Redis shows still waiting to start is remembered past its
    /// time, however long the start takes; one that started elsewhere (or
    /// is not named) goes when its time is up.
    #[test]
    fn a_job_still_waiting_to_start_is_remembered_on() {
        let handoffs = Handoffs::default();
        let handed = |key: &str, token| HandedOff {
            key: key.into(),
            token,
            admitted: 0,
            body: Bytes::from_static(b"x"),
        };
        let short = Duration::from_millis(20);
        handoffs.take_over(handed("waits", 5), short, None);
        handoffs.take_over(handed("started", 6), short, None);
        // Another run of the key is not the one Redis named.
        handoffs.take_over(handed("waits", 4), short, None);
        // Redis holds a newer admission's payload: the run remembered ended.
        handoffs.take_over(handed("newer", 7), short, None);
        handoffs.keep_waiting(&[("waits".to_string(), 5, 0), ("newer".to_string(), 7, 1)]);
        std::thread::sleep(short * 3);
        let left: Vec<(String, u64)> = handoffs
            .remembered()
            .into_iter()
            .map(|h| (h.key, h.token))
            .collect();
        assert_eq!(left, [("waits".to_string(), 5)]);
        assert!(handoffs.supersede("waits", 3), "still refuses older starts");
    }

    #[test]
    fn ends_taken_over_are_found_by_key_until_they_expire() {
        let handoffs = Handoffs::default();
        let end = |key: &str, token| HandedOff {
            key: key.into(),
            token,
            admitted: 0,
            body: Bytes::new(),
        };
        handoffs.take_over(end("gone", 2), Duration::ZERO, Some(2));
        handoffs.take_over(end("a", 3), ENDS_REMEMBERED, Some(3));
        handoffs.take_over(end("a", 5), ENDS_REMEMBERED, Some(6));
        handoffs.take_over(end("a", 4), ENDS_REMEMBERED, Some(4));
        assert_eq!(handoffs.ended_counter("a"), Some(6), "the highest end");
        assert_eq!(handoffs.ended_counter("gone"), None, "expired");
        assert_eq!(handoffs.ended(), [("a".to_string(), 6)]);
        // The expired entry, oldest, went with the next one remembered,
        // and its end with it.
        assert!(!handoffs.inner.lock().unwrap().ends.contains_key("gone"));
    }

    #[test]
    fn a_hand_off_supersedes_only_older_starts_of_its_key() {
        let handoffs = Handoffs::default();
        let handed = |token| HandedOff {
            key: "k".into(),
            token,
            admitted: 0,
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
