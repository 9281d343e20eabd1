//! The local replica: content, revision, waiters and subscribers, shared by
//! the [`Map`](crate::Map) handles and the sync task (the only writer).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::{oneshot, watch};

use crate::events::{EventSender, MapEvent, MapEventKind};

/// One immutable version of the replica. Cloning `data` is O(1) (a
/// persistent hash map), so the sync task builds the next version without
/// copying the map, and readers never wait. Keys and values are shared
/// strings: a change copies the map's nodes on its path, and copying a
/// node then costs reference counts, not a copy of every string in it.
#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    pub(crate) data: imbl::HashMap<Arc<str>, Arc<str>>,
    /// The last revision applied.
    pub(crate) rev: u64,
    /// Local counter of stored versions (a resync may keep `rev`).
    pub(crate) version: u64,
}

/// One change, as parsed from the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Set {
        key: Arc<str>,
        value: Arc<str>,
    },
    Delete {
        key: Arc<str>,
    },
    Reset,
    /// A replica's snapshot marker (carries no revision of its own).
    Marker {
        token: String,
    },
    /// Several sets and deletes of one script, under one revision.
    Batch(Vec<Op>),
}

/// One message of the map's channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) rev: u64,
    pub(crate) op: Op,
    /// The first change of a new revision sequence: it follows revision 0.
    pub(crate) fresh: bool,
}

/// Parses `"<rev>:<op>:<keylen>:<key><value>"` (see `scripts/prelude.lua`).
pub(crate) fn parse_message(bytes: &[u8]) -> Result<Message, &'static str> {
    let (rev, rest) = split_colon(bytes).ok_or("no revision")?;
    let rev = parse_u64(rev).ok_or("bad revision")?;
    let (op, rest) = split_colon(rest).ok_or("no op")?;
    let (len, rest) = split_colon(rest).ok_or("no key length")?;
    let len =
        usize::try_from(parse_u64(len).ok_or("bad key length")?).map_err(|_| "bad key length")?;
    if rest.len() < len {
        return Err("short key");
    }
    let (key, value) = rest.split_at(len);
    let key = std::str::from_utf8(key).map_err(|_| "key is not UTF-8")?;
    let value = std::str::from_utf8(value).map_err(|_| "value is not UTF-8")?;
    let fresh = matches!(op, b"S" | b"D" | b"R" | b"M");
    let op = match op.to_ascii_lowercase().as_slice() {
        b"m" => Op::Batch(parse_batch(key, value.as_bytes())?),
        b"s" => Op::Set {
            key: key.into(),
            value: value.into(),
        },
        b"d" => Op::Delete { key: key.into() },
        b"r" => Op::Reset,
        b"y" => Op::Marker {
            token: key.to_string(),
        },
        _ => return Err("unknown op"),
    };
    Ok(Message { rev, op, fresh })
}

/// Parses the changes of a batch: `count` times
/// `"<op>:<keylen>:<key><valuelen>:<value>"`, op `s` or `d`.
fn parse_batch(count: &str, mut rest: &[u8]) -> Result<Vec<Op>, &'static str> {
    let count: usize = count.parse().map_err(|_| "bad batch count")?;
    let mut ops = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let (op, tail) = split_colon(rest).ok_or("no batch op")?;
        let (key, tail) = split_counted(tail).ok_or("bad batch key")?;
        let (value, tail) = split_counted(tail).ok_or("bad batch value")?;
        rest = tail;
        let key = std::str::from_utf8(key).map_err(|_| "key is not UTF-8")?;
        let value = std::str::from_utf8(value).map_err(|_| "value is not UTF-8")?;
        ops.push(match op {
            b"s" => Op::Set {
                key: key.into(),
                value: value.into(),
            },
            b"d" => Op::Delete { key: key.into() },
            _ => return Err("unknown batch op"),
        });
    }
    if !rest.is_empty() {
        return Err("trailing bytes after batch");
    }
    Ok(ops)
}

/// Splits `"<len>:<len bytes>..."` into the counted bytes and the rest.
fn split_counted(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = split_colon(bytes)?;
    let len = usize::try_from(parse_u64(len)?).ok()?;
    (rest.len() >= len).then(|| rest.split_at(len))
}

fn split_colon(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = bytes.iter().position(|b| *b == b':')?;
    Some((&bytes[..at], &bytes[at + 1..]))
}

fn parse_u64(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

type Waiters = BTreeMap<u64, Vec<oneshot::Sender<()>>>;

/// Everything the handles and the sync task share.
#[derive(Debug)]
pub(crate) struct Shared {
    state: ArcSwap<State>,
    snapshot: ArcSwapOption<(u64, Arc<HashMap<String, String>>)>,
    waiters: Mutex<Waiters>,
    subscribers: Mutex<Vec<EventSender>>,
    changed: watch::Sender<u64>,
    /// Resyncs that found Redis behind the replica.
    regressions: watch::Sender<u64>,
    /// Change messages that began a new revision sequence while the
    /// replica held a revision (the revision key had vanished).
    sequence_restarts: watch::Sender<u64>,
    /// The highest revision stored (it does not go back with a resync).
    high_water: std::sync::atomic::AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn new(state: State) -> Self {
        Shared {
            changed: watch::Sender::new(state.version),
            regressions: watch::Sender::new(0),
            sequence_restarts: watch::Sender::new(0),
            high_water: std::sync::atomic::AtomicU64::new(state.rev),
            state: ArcSwap::from_pointee(state),
            snapshot: ArcSwapOption::empty(),
            waiters: Mutex::new(BTreeMap::new()),
            subscribers: Mutex::new(Vec::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The current version (lock-free).
    pub(crate) fn load(&self) -> arc_swap::Guard<Arc<State>> {
        self.state.load()
    }

    pub(crate) fn load_full(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// A std `HashMap` copy of the current version, cached until it changes.
    pub(crate) fn snapshot(&self) -> Arc<HashMap<String, String>> {
        let state = self.state.load_full();
        if let Some(cached) = self.snapshot.load().as_ref()
            && cached.0 == state.version
        {
            return cached.1.clone();
        }
        let map: Arc<HashMap<String, String>> = Arc::new(
            state
                .data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self.snapshot
            .store(Some(Arc::new((state.version, map.clone()))));
        map
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A receiver that changes whenever a new version is stored (or the map
    /// closes).
    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A receiver that changes whenever a resync found Redis's revision
    /// behind the replica's (Redis lost data or went back in time).
    pub(crate) fn regressions(&self) -> watch::Receiver<u64> {
        self.regressions.subscribe()
    }

    /// A receiver that changes whenever a change message began a new
    /// revision sequence while the replica held a revision.
    pub(crate) fn sequence_restarts(&self) -> watch::Receiver<u64> {
        self.sequence_restarts.subscribe()
    }

    /// Counts a change message that began a new revision sequence while
    /// the replica held a revision.
    pub(crate) fn note_sequence_restart(&self) {
        self.sequence_restarts.send_modify(|n| *n += 1);
    }

    /// The highest revision stored since the last reset.
    pub(crate) fn high_water(&self) -> u64 {
        self.high_water.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Lowers the high-water mark to the current revision.
    pub(crate) fn reset_high_water(&self) {
        let rev = self.state.load().rev;
        self.high_water
            .store(rev, std::sync::atomic::Ordering::Release);
    }

    /// Registers a waiter for `rev`; `None` when it is already applied.
    pub(crate) fn wait_for_revision(&self, rev: u64) -> Option<oneshot::Receiver<()>> {
        let mut waiters = lock(&self.waiters);
        if self.is_closed() || self.state.load().rev >= rev {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        waiters.entry(rev).or_default().push(tx);
        Some(rx)
    }

    /// Waiters registered and not woken yet (tests wait for one to be).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        lock(&self.waiters).values().map(Vec::len).sum()
    }

    pub(crate) fn subscribe(&self, sender: EventSender) {
        lock(&self.subscribers).push(sender);
    }

    /// Whether anyone listens for events: the sync task builds them only
    /// then (see [`store`](Self::store) for one who subscribes meanwhile).
    pub(crate) fn has_subscribers(&self) -> bool {
        !lock(&self.subscribers).is_empty()
    }

    /// Stores the next version, then wakes waiters and subscribers.
    /// `release_all` also wakes waiters above the new revision (after a
    /// resync showed the revision went backwards: Redis lost data).
    /// `events` is `None` when they were not built because nobody listened;
    /// a subscriber that came meanwhile gets a `Resynced` instead.
    pub(crate) fn store(&self, state: State, events: Option<&[MapEvent]>, release_all: bool) {
        let rev = state.rev;
        let version = state.version;
        self.state.store(Arc::new(state));
        self.high_water
            .fetch_max(rev, std::sync::atomic::Ordering::AcqRel);
        let fired = {
            let mut waiters = lock(&self.waiters);
            let later = if release_all {
                BTreeMap::new()
            } else {
                waiters.split_off(&(rev.saturating_add(1)))
            };
            std::mem::replace(&mut *waiters, later)
        };
        for tx in fired.into_values().flatten() {
            let _ = tx.send(());
        }
        match events {
            Some(events) if !events.is_empty() => {
                lock(&self.subscribers).retain(|s| events.iter().all(|e| s.send(e)));
            }
            Some(_) => {}
            None => {
                let resynced = MapEvent {
                    kind: MapEventKind::Resynced,
                    key: None,
                };
                lock(&self.subscribers).retain(|s| s.send(&resynced));
            }
        }
        self.changed.send_replace(version);
        if release_all {
            self.regressions.send_modify(|n| *n += 1);
        }
    }

    /// Marks the map closed: waiters and subscriber streams end.
    pub(crate) fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        lock(&self.waiters).clear();
        lock(&self.subscribers).clear();
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// Applies one message to `next`, adding its events (none for a marker)
/// to `events` when they are wanted (`None`: nobody listens).
pub(crate) fn apply(next: &mut State, op: Op, events: &mut Option<Vec<MapEvent>>) {
    let mut event = |kind, key: Option<&Arc<str>>| {
        if let Some(events) = events.as_mut() {
            events.push(MapEvent {
                kind,
                key: key.map(|k| k.to_string()),
            });
        }
    };
    match op {
        Op::Set { key, value } => {
            event(MapEventKind::Set, Some(&key));
            next.data.insert(key, value);
        }
        Op::Delete { key } => {
            next.data.remove(&*key);
            event(MapEventKind::Delete, Some(&key));
        }
        Op::Reset => {
            next.data.clear();
            event(MapEventKind::Reset, None);
        }
        Op::Marker { .. } => {}
        Op::Batch(ops) => {
            for op in ops {
                apply(next, op, events);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_messages() {
        assert_eq!(
            parse_message(b"12:s:3:a:bv:a:l").unwrap(),
            Message {
                rev: 12,
                op: Op::Set {
                    key: "a:b".into(),
                    value: "v:a:l".into()
                },
                fresh: false,
            }
        );
        assert_eq!(
            parse_message(b"3:d:1:k").unwrap(),
            Message {
                rev: 3,
                op: Op::Delete { key: "k".into() },
                fresh: false,
            }
        );
        assert!(parse_message(b"1700000000000000:S:1:kv").unwrap().fresh);
        assert_eq!(parse_message(b"4:r:0:").unwrap().op, Op::Reset);
        assert_eq!(
            parse_message(b"4:y:2:tk").unwrap().op,
            Op::Marker { token: "tk".into() }
        );
        assert_eq!(
            parse_message(b"9:m:1:2s:1:a2:v1d:2:bb0:").unwrap(),
            Message {
                rev: 9,
                op: Op::Batch(vec![
                    Op::Set {
                        key: "a".into(),
                        value: "v1".into(),
                    },
                    Op::Delete { key: "bb".into() },
                ]),
                fresh: false,
            }
        );
        assert!(parse_message(b"9:M:1:0").unwrap().fresh);
        assert!(
            parse_message(b"9:m:1:2s:1:a2:v1").is_err(),
            "one change short"
        );
        assert!(
            parse_message(b"9:m:1:1s:1:a2:v1x").is_err(),
            "trailing bytes"
        );
        assert!(parse_message(b"9:m:1:1s:1:a5:v").is_err(), "short value");
        assert!(
            parse_message(b"9:m:1:1r:0:0:").is_err(),
            "no reset in a batch"
        );
        assert!(parse_message(b"x:s:1:k").is_err());
        assert!(parse_message(b"1:s:5:k").is_err());
        assert!(parse_message(b"1:q:1:k").is_err());
        assert!(parse_message(b"1:s:1:\xff").is_err());
    }

    /// Events are built only while someone listens; one who subscribed
    /// after that check learns of the change as a resync.
    #[tokio::test]
    async fn a_change_stored_without_events_reaches_a_new_subscriber_as_a_resync() {
        use futures::StreamExt;
        let shared = Shared::new(State::default());
        assert!(!shared.has_subscribers());
        let (tx, mut rx) = crate::events::channel(8);
        shared.subscribe(tx);
        assert!(shared.has_subscribers());
        let mut next = State {
            rev: 1,
            version: 1,
            ..State::default()
        };
        let mut events = None;
        apply(
            &mut next,
            Op::Set {
                key: "k".into(),
                value: "v".into(),
            },
            &mut events,
        );
        assert!(events.is_none(), "no events built");
        shared.store(next, events.as_deref(), false);
        assert_eq!(shared.load().data.get("k").map(|v| &**v), Some("v"));
        assert_eq!(
            rx.next().await.map(|e| e.kind),
            Some(MapEventKind::Resynced)
        );
    }

    #[tokio::test]
    async fn waiters_fire_at_their_revision() {
        let shared = Shared::new(State::default());
        let w1 = shared.wait_for_revision(1).unwrap();
        let w3 = shared.wait_for_revision(3).unwrap();
        let next = State {
            rev: 2,
            version: 1,
            ..State::default()
        };
        shared.store(next, Some(&[]), false);
        assert!(w1.await.is_ok());
        assert!(shared.wait_for_revision(2).is_none());
        let mut w3 = w3;
        assert!(matches!(
            w3.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        shared.store(
            State {
                rev: 3,
                version: 2,
                ..State::default()
            },
            Some(&[]),
            false,
        );
        assert!(w3.await.is_ok());
        let w4 = shared.wait_for_revision(4).unwrap();
        shared.close();
        assert!(w4.await.is_err(), "closing drops waiters");
    }
}
