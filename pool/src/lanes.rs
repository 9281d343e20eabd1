//! Inbox lanes: a worker handles the events of one key in inbox order and
//! the events of different keys concurrently.
//!
//! Each event is parsed once when the node's reader hands it over and sent
//! to the lane its key hashes to; one task per lane handles its events one
//! at a time. A lane holds its key stripe's lock while it handles an event,
//! so that a handoff of a key (which takes the same stripe) never runs
//! during a start or stop of that key.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use flotilla_streaming::Event;

use crate::codec::{
    self, EV_KEEP, EV_MESSAGE, EV_NOTIFY, EV_START, EV_STOP, KeptJobs, KeyedRequest, StartEntry,
};
use crate::error::Error;

/// Events queued per lane before the node's reader waits (backpressure).
pub(crate) const LANE_QUEUE: usize = 512;

/// An inbox event, parsed.
#[derive(Debug)]
pub(crate) enum InboxEvent {
    /// Start a job.
    Start(StartEntry),
    /// Stop a job: the run and dispatch the stop was sent for.
    Stop(KeyedRequest, StopFor),
    /// A notification or message for a job's key.
    Keyed(KeyedRequest),
    /// What a closing worker remembered of a job, to remember here.
    Keep(KeptJobs),
    /// An entry that cannot be handled; it is dead-lettered.
    Malformed(Error),
}

/// What a stop was sent for (`"stop <token> [<dispatch>]"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StopFor {
    /// The token of the run the router found recorded, when it knew one.
    pub(crate) run: Option<u64>,
    /// For a stop of one dispatch (an undone stop asked again, an end made
    /// to stand): that dispatch's admission stamp (µs). A run of another
    /// dispatch goes on: after a rollback the router may have read an
    /// older dispatch's payload beside a newer dispatch's run.
    pub(crate) dispatch: Option<u64>,
}

impl StopFor {
    /// Parses the numbers after `"stop "` (none: an older router's stop).
    fn parse(name: &str) -> StopFor {
        let mut numbers = name
            .strip_prefix("stop ")
            .unwrap_or_default()
            .split(' ')
            .map(|n| n.parse::<u64>().ok().filter(|n| *n > 0));
        StopFor {
            run: numbers.next().flatten(),
            dispatch: numbers.next().flatten(),
        }
    }
}

/// An event and its parsed form, on its way to a lane.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub(crate) event: Event,
    pub(crate) parsed: InboxEvent,
}

impl Delivery {
    /// Parses `event`.
    pub(crate) fn parse(event: Event) -> Delivery {
        let parsed = match event.name.as_str() {
            EV_START => StartEntry::parse(&event.payload)
                .map(InboxEvent::Start)
                .unwrap_or_else(InboxEvent::Malformed),
            name if name == EV_STOP || name.starts_with("stop ") => {
                let target = StopFor::parse(name);
                codec::decode("stop request", &event.payload)
                    .map(|req| InboxEvent::Stop(req, target))
                    .unwrap_or_else(InboxEvent::Malformed)
            }
            EV_NOTIFY | EV_MESSAGE => codec::decode("keyed request", &event.payload)
                .map(InboxEvent::Keyed)
                .unwrap_or_else(InboxEvent::Malformed),
            EV_KEEP => codec::decode("keep entry", &event.payload)
                .map(InboxEvent::Keep)
                .unwrap_or_else(InboxEvent::Malformed),
            other => InboxEvent::Malformed(Error::Malformed {
                what: "inbox event",
                reason: format!("unknown event name {other:?}"),
            }),
        };
        Delivery { event, parsed }
    }

    /// The lane this event goes to, of `lanes`: its key's lane (malformed
    /// events go to lane 0).
    pub(crate) fn lane(&self, lanes: usize) -> usize {
        match &self.parsed {
            InboxEvent::Start(entry) => lane_of(&entry.body.key, lanes),
            InboxEvent::Stop(req, _) | InboxEvent::Keyed(req) => lane_of(&req.key, lanes),
            InboxEvent::Keep(kept) => kept.jobs.first().map_or(0, |j| lane_of(&j.key, lanes)),
            InboxEvent::Malformed(_) => 0,
        }
    }
}

/// The lane (and key stripe) of `key`, of `lanes`
/// ([`NodeOptions::worker_lanes`](crate::NodeOptions::worker_lanes)).
pub(crate) fn lane_of(key: &str, lanes: usize) -> usize {
    // Stable within a process, which is all a lane needs.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % lanes.max(1) as u64) as usize
}

/// Inbox entry ids being handled or handled recently, so that an entry
/// read again when a worker rewinds its inbox is not handled twice.
#[derive(Debug, Default)]
pub(crate) struct SeenEntries {
    state: Mutex<SeenState>,
}

/// A stream entry id (`<ms>-<seq>`) as its two numbers: remembering one
/// costs no allocation.
type EntryId = (u64, u64);

fn entry_id(id: &str) -> Option<EntryId> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[derive(Debug, Default)]
struct SeenState {
    in_flight: HashSet<EntryId>,
    recent: HashSet<EntryId>,
    recent_order: VecDeque<EntryId>,
}

/// How many finished entry ids a worker remembers. A rewind re-reads only
/// entries still in the inbox; an entry finished just before the rewind's
/// read can come back once, and is recognised here.
const RECENT_ENTRIES: usize = 4096;

impl SeenEntries {
    /// Marks `id` in flight; false when it is in flight or finished recently.
    /// An id that is not a stream id (Redis gives none) is not tracked.
    pub(crate) fn admit(&self, id: &str) -> bool {
        let Some(id) = entry_id(id) else { return true };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.recent.contains(&id) {
            return false;
        }
        s.in_flight.insert(id)
    }

    /// `id` was handled and removed from the inbox.
    pub(crate) fn finished(&self, id: &str) {
        let Some(id) = entry_id(id) else { return };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.in_flight.remove(&id);
        if s.recent.insert(id) {
            s.recent_order.push_back(id);
            if s.recent_order.len() > RECENT_ENTRIES
                && let Some(old) = s.recent_order.pop_front()
            {
                s.recent.remove(&old);
            }
        }
    }

    /// `id` failed and stays in the inbox: a rewind may deliver it again.
    pub(crate) fn failed(&self, id: &str) {
        let Some(id) = entry_id(id) else { return };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.in_flight.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_always_maps_to_one_lane() {
        for lanes in [1, 16, 4096] {
            for i in 0..1000 {
                let key = format!("job-{i}");
                assert_eq!(lane_of(&key, lanes), lane_of(&key, lanes));
                assert!(lane_of(&key, lanes) < lanes);
            }
        }
    }

    #[test]
    fn an_entry_is_admitted_again_only_after_it_failed() {
        let seen = SeenEntries::default();
        assert!(seen.admit("1-0"));
        assert!(!seen.admit("1-0"), "in flight");
        seen.failed("1-0");
        assert!(seen.admit("1-0"), "failed entries come back on a rewind");
        seen.finished("1-0");
        assert!(!seen.admit("1-0"), "finished recently");
    }

    #[test]
    fn entry_ids_are_read_as_numbers() {
        assert_eq!(entry_id("1700000000000-12"), Some((1_700_000_000_000, 12)));
        assert_eq!(entry_id("12"), None);
        assert_eq!(entry_id("a-1"), None);
        let seen = SeenEntries::default();
        assert!(
            seen.admit("x") && seen.admit("x"),
            "not tracked, never refused"
        );
    }

    #[test]
    fn finished_entries_are_forgotten_after_a_while() {
        let seen = SeenEntries::default();
        for i in 0..=RECENT_ENTRIES {
            assert!(seen.admit(&format!("{i}-0")));
            seen.finished(&format!("{i}-0"));
        }
        assert!(seen.admit("0-0"), "the oldest id was forgotten");
        assert!(!seen.admit(&format!("{RECENT_ENTRIES}-0")));
    }

    #[test]
    fn keys_spread_over_all_lanes() {
        let mut seen = [0usize; 16];
        for i in 0..4000 {
            seen[lane_of(&format!("job-{i}"), 16)] += 1;
        }
        // 250 expected per lane; a lane with under half of that would mean
        // a badly skewed hash.
        assert!(seen.iter().all(|n| *n > 125), "{seen:?}");
    }
}

#[cfg(test)]
mod stop_target_tests {
    use super::*;

    fn stop_event(name: &str) -> Event {
        Event {
            id: "1-1".into(),
            stream: "inbox:w".into(),
            name: name.into(),
            topic: None,
            payload: codec::encode(&KeyedRequest {
                key: "k".into(),
                payload: Vec::new(),
                reply: None,
                hops: 0,
            }),
            server: None,
        }
    }

    #[test]
    fn a_stop_names_the_run_and_dispatch_it_was_sent_for() {
        let target = |name: &str| match Delivery::parse(stop_event(name)).parsed {
            InboxEvent::Stop(_, t) => (t.run, t.dispatch),
            _ => panic!("{name} is not a stop"),
        };
        assert_eq!(target("stop"), (None, None));
        assert_eq!(
            target("stop 1795375680122012"),
            (Some(1_795_375_680_122_012), None)
        );
        assert_eq!(target("stop 0"), (None, None), "the router knew no run");
        assert_eq!(
            target("stop 1795375680122012 1795375680100000"),
            (Some(1_795_375_680_122_012), Some(1_795_375_680_100_000)),
            "a stop of one dispatch"
        );
    }
}
