//! Options of [`Map::join`](crate::Map::join).

use std::time::Duration;

use crate::error::Error;

/// Expiry of a map's Redis keys (hash and revision).
///
/// Replicas do not see an expiry as it happens: they notice at the next
/// write (the revision starts again) or the next revision check, then resync.
/// Use a TTL to garbage-collect abandoned maps, not as a cache timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapTtl {
    /// The keys expire this long after they were created; later writes do
    /// not extend it (the expiry is set only when the key has none).
    Absolute(Duration),
    /// Every write pushes the expiry this far into the future.
    Sliding(Duration),
}

/// Options of a replicated map. Every field documents its default;
/// [`Default`] is the only place defaults live.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use flotilla_rmap::{MapOptions, MapTtl};
/// let options = MapOptions::default()
///     .hash_tag("pool1")
///     .ttl(MapTtl::Sliding(Duration::from_secs(3600)));
/// assert_eq!(options.hash_tag.as_deref(), Some("pool1"));
/// ```
#[derive(Debug, Clone)]
pub struct MapOptions {
    /// Hash tag of the map's keys; maps sharing a tag live in one cluster
    /// slot so one script can change them together. Default: `None` (the
    /// map's name is the tag).
    pub hash_tag: Option<String>,
    /// Expiry of the map's Redis keys. Default: `None` (never expire).
    pub ttl: Option<MapTtl>,
    /// Events buffered per [`subscribe`](crate::Map::subscribe) stream
    /// before it drops events and later yields one coalesced
    /// [`Resynced`](crate::MapEventKind::Resynced). Default: `1024`.
    pub event_buffer: usize,
    /// Pub/sub messages queued for the map before its replica falls behind
    /// and resyncs (with [`Map::join`](crate::Map::join), also the buffer of
    /// its own subscriber connection). Default: `4096`.
    pub message_buffer: usize,
    /// How often the replica compares its revision with Redis's, to heal
    /// from lost messages or expired keys even when nobody writes.
    /// Default: `Some(5 s)`.
    pub revision_check: Option<Duration>,
    /// Deadline of each call of a snapshot read (when the replica joins or
    /// resyncs), in place of the client's command timeout: a page waits
    /// behind whatever Redis is busy with. Default: 60 s.
    pub snapshot_timeout: Duration,
    /// Fields per page of a snapshot read (`HSCAN`'s `COUNT`). A map of up
    /// to this many fields is read in one atomic step; a larger one in
    /// pages, so that no call holds Redis for the whole map (the changes
    /// made meanwhile follow on the map's channel and are applied on top).
    /// Default: `10_000`.
    pub snapshot_page: usize,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            hash_tag: None,
            ttl: None,
            event_buffer: 1024,
            message_buffer: 4096,
            revision_check: Some(Duration::from_secs(5)),
            snapshot_timeout: Duration::from_secs(60),
            snapshot_page: 10_000,
        }
    }
}

impl MapOptions {
    /// Sets [`hash_tag`](MapOptions::hash_tag).
    pub fn hash_tag(mut self, tag: impl Into<String>) -> Self {
        self.hash_tag = Some(tag.into());
        self
    }

    /// Sets [`snapshot_timeout`](MapOptions::snapshot_timeout).
    pub fn snapshot_timeout(mut self, timeout: Duration) -> Self {
        self.snapshot_timeout = timeout;
        self
    }

    /// Sets [`snapshot_page`](MapOptions::snapshot_page).
    pub fn snapshot_page(mut self, fields: usize) -> Self {
        self.snapshot_page = fields;
        self
    }

    /// Sets [`ttl`](MapOptions::ttl).
    pub fn ttl(mut self, ttl: MapTtl) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets [`event_buffer`](MapOptions::event_buffer).
    pub fn event_buffer(mut self, events: usize) -> Self {
        self.event_buffer = events;
        self
    }

    /// Sets [`message_buffer`](MapOptions::message_buffer).
    pub fn message_buffer(mut self, messages: usize) -> Self {
        self.message_buffer = messages;
        self
    }

    /// Sets [`revision_check`](MapOptions::revision_check).
    pub fn revision_check(mut self, every: Option<Duration>) -> Self {
        self.revision_check = every;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero TTL, buffer or check interval.
    pub fn validate(&self) -> Result<(), Error> {
        match self.ttl {
            Some(MapTtl::Absolute(d) | MapTtl::Sliding(d)) if d.as_millis() == 0 => {
                return Err(Error::InvalidOptions("ttl must be at least 1 ms"));
            }
            _ => {}
        }
        if self.event_buffer == 0 {
            return Err(Error::InvalidOptions("event_buffer must be at least 1"));
        }
        if self.message_buffer < 16 {
            return Err(Error::InvalidOptions("message_buffer must be at least 16"));
        }
        if self.snapshot_page == 0 {
            return Err(Error::InvalidOptions("snapshot_page must be at least 1"));
        }
        if self.revision_check.is_some_and(|d| d.is_zero()) {
            return Err(Error::InvalidOptions("revision_check must not be zero"));
        }
        Ok(())
    }

    /// How the replica reads snapshots.
    pub(crate) fn snapshot_limits(&self) -> crate::snapshot::SnapshotLimits {
        crate::snapshot::SnapshotLimits {
            timeout: self.snapshot_timeout,
            page: self.snapshot_page,
        }
    }

    /// The TTL as the two script arguments `(mode, milliseconds)`.
    pub(crate) fn ttl_args(&self) -> (&'static str, u64) {
        match self.ttl {
            None => ("", 0),
            Some(MapTtl::Absolute(d)) => ("a", millis(d)),
            Some(MapTtl::Sliding(d)) => ("s", millis(d)),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
