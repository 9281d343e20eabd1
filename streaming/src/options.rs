//! Options of streams, adds, readers and sinks.
//!
//! Each options struct has public fields documented with their default,
//! `impl Default` as the only place defaults live, and builder methods.

use std::time::{Duration, SystemTime};

use crate::Error;
use crate::filter::TopicFilter;

/// Options of a [`Stream`](crate::Stream).
#[derive(Debug, Clone, Default)]
pub struct StreamOptions {
    /// Hash tag of the stream's key; streams sharing a tag live in one
    /// Cluster slot and can be read together or written by one script.
    /// Default: `None` (the stream's name is its tag).
    pub hash_tag: Option<String>,
    /// Approximate maximum length (`MAXLEN ~`) applied on every add.
    /// Default: `None` (no trimming).
    pub max_len: Option<u64>,
    /// Expiry of the whole stream key. Default: `None` (never expires).
    pub ttl: Option<StreamTtl>,
}

/// Expiry of a stream key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamTtl {
    /// The key expires this long after the add that created it.
    Absolute(Duration),
    /// The key expires this long after the latest add.
    Sliding(Duration),
}

/// Options of one [`Stream::add_with`](crate::Stream::add_with).
#[derive(Debug, Clone, Default)]
pub struct AddOptions {
    /// Topic of the event, used by readers' and sinks' topic filters.
    /// Default: `None`.
    pub topic: Option<String>,
    /// Add only if the stream already exists (`NOMKSTREAM`).
    /// Default: `false`.
    pub only_if_exists: bool,
    /// Approximate maximum length for this add, overriding
    /// [`StreamOptions::max_len`]. Default: `None` (use the stream's).
    pub max_len: Option<u64>,
}

/// Where a reader (or a new sink group) starts in a stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// Only events added after the reader was created (resolved to the
    /// stream's last id at that moment). The default.
    #[default]
    Newest,
    /// Every event still in the stream.
    Oldest,
    /// Events after this id (exclusive).
    Id(String),
    /// Events created at or after this time (Redis server time, as encoded
    /// in event ids).
    Time(SystemTime),
}

/// Options of a [`Reader`](crate::Reader).
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// Where to start in each stream given to [`Reader::new`](crate::Reader::new).
    /// Default: [`StartPosition::Newest`].
    pub start: StartPosition,
    /// How long one `XREAD` blocks when nothing arrives. Default: 5 s.
    pub block: Duration,
    /// Maximum events per `XREAD` (per stream). Default: 1000.
    pub max_events: u64,
    /// Which events are delivered. Default: [`TopicFilter::All`].
    pub topic: TopicFilter,
    /// Capacity of each subscriber's channel; a full channel makes the
    /// reader wait (backpressure, no loss). Default: 1024.
    pub buffer: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            start: StartPosition::Newest,
            block: Duration::from_secs(5),
            max_events: 1000,
            topic: TopicFilter::All,
            buffer: 1024,
        }
    }
}

/// Options of a [`Sink`](crate::Sink).
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// Hash tag of the member keep-alive hash. On Cluster all streams of one
    /// sink must share one hash tag, and this should be it.
    /// Default: `None` (the first stream's tag).
    pub hash_tag: Option<String>,
    /// Where a newly created consumer group starts. Ignored when the group
    /// exists. Default: [`StartPosition::Newest`].
    pub start: StartPosition,
    /// How long one `XREADGROUP` blocks. Default: 5 s.
    pub block: Duration,
    /// Maximum events per read (per stream). Default: 1000.
    pub max_events: u64,
    /// Events delivered to a member and not acked within this time are
    /// claimed by another live member. Default: 30 s.
    pub ack_grace: Duration,
    /// A member whose keep-alive is older than this (Redis server time) is
    /// stale: its pending events are claimed and it is removed. Keep-alive
    /// is renewed every third of it. Default: 30 s.
    pub member_ttl: Duration,
    /// Which events are delivered; others are acked without delivery.
    /// Default: [`TopicFilter::All`].
    pub topic: TopicFilter,
    /// Capacity of each subscriber's channel. Default: 1024.
    pub buffer: usize,
    /// This member's consumer name. Default: `None` (a random unique id).
    pub member_id: Option<String>,
}

impl Default for SinkOptions {
    fn default() -> Self {
        SinkOptions {
            hash_tag: None,
            start: StartPosition::Newest,
            block: Duration::from_secs(5),
            max_events: 1000,
            ack_grace: Duration::from_secs(30),
            member_ttl: Duration::from_secs(30),
            topic: TopicFilter::All,
            buffer: 1024,
            member_id: None,
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $field:ident : $ty:ty) => {
        $(#[$doc])*
        pub fn $field(mut self, value: $ty) -> Self {
            self.$field = value;
            self
        }
    };
    ($(#[$doc:meta])* some $field:ident : $ty:ty) => {
        $(#[$doc])*
        pub fn $field(mut self, value: $ty) -> Self {
            self.$field = Some(value);
            self
        }
    };
    ($(#[$doc:meta])* opt $field:ident : $ty:ty) => {
        $(#[$doc])*
        pub fn $field(mut self, value: impl Into<$ty>) -> Self {
            self.$field = Some(value.into());
            self
        }
    };
}

impl StreamOptions {
    setter!(/// Sets [`StreamOptions::hash_tag`].
        opt hash_tag: String);
    setter!(/// Sets [`StreamOptions::max_len`].
        some max_len: u64);
    setter!(/// Sets [`StreamOptions::ttl`].
        some ttl: StreamTtl);

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if let Some(tag) = &self.hash_tag {
            crate::error::check_name(tag)?;
        }
        if let Some(StreamTtl::Absolute(d) | StreamTtl::Sliding(d)) = self.ttl
            && d.as_millis() == 0
        {
            return Err(Error::InvalidOption {
                option: "ttl",
                reason: "must be at least 1 ms",
            });
        }
        Ok(())
    }
}

impl AddOptions {
    setter!(/// Sets [`AddOptions::topic`].
        opt topic: String);
    setter!(/// Sets [`AddOptions::only_if_exists`].
        only_if_exists: bool);
    setter!(/// Sets [`AddOptions::max_len`].
        some max_len: u64);
}

impl ReaderOptions {
    setter!(/// Sets [`ReaderOptions::start`].
        start: StartPosition);
    setter!(/// Sets [`ReaderOptions::block`].
        block: Duration);
    setter!(/// Sets [`ReaderOptions::max_events`].
        max_events: u64);
    setter!(/// Sets [`ReaderOptions::topic`].
        topic: TopicFilter);
    setter!(/// Sets [`ReaderOptions::buffer`].
        buffer: usize);

    pub(crate) fn validate(&self) -> Result<(), Error> {
        validate_read(self.block, self.max_events, self.buffer)
    }
}

impl SinkOptions {
    setter!(/// Sets [`SinkOptions::hash_tag`].
        opt hash_tag: String);
    setter!(/// Sets [`SinkOptions::start`].
        start: StartPosition);
    setter!(/// Sets [`SinkOptions::block`].
        block: Duration);
    setter!(/// Sets [`SinkOptions::max_events`].
        max_events: u64);
    setter!(/// Sets [`SinkOptions::ack_grace`].
        ack_grace: Duration);
    setter!(/// Sets [`SinkOptions::member_ttl`].
        member_ttl: Duration);
    setter!(/// Sets [`SinkOptions::topic`].
        topic: TopicFilter);
    setter!(/// Sets [`SinkOptions::buffer`].
        buffer: usize);
    setter!(/// Sets [`SinkOptions::member_id`].
        opt member_id: String);

    pub(crate) fn validate(&self) -> Result<(), Error> {
        validate_read(self.block, self.max_events, self.buffer)?;
        if let Some(tag) = &self.hash_tag {
            crate::error::check_name(tag)?;
        }
        if let Some(id) = &self.member_id {
            crate::error::check_name(id)?;
        }
        if self.ack_grace < Duration::from_millis(10) {
            return Err(Error::InvalidOption {
                option: "ack_grace",
                reason: "must be at least 10 ms",
            });
        }
        if self.member_ttl < Duration::from_millis(30) {
            return Err(Error::InvalidOption {
                option: "member_ttl",
                reason: "must be at least 30 ms",
            });
        }
        Ok(())
    }
}

fn validate_read(block: Duration, max_events: u64, buffer: usize) -> Result<(), Error> {
    if block.as_millis() == 0 {
        return Err(Error::InvalidOption {
            option: "block",
            reason: "must be at least 1 ms",
        });
    }
    if max_events == 0 {
        return Err(Error::InvalidOption {
            option: "max_events",
            reason: "must be at least 1",
        });
    }
    if buffer == 0 {
        return Err(Error::InvalidOption {
            option: "buffer",
            reason: "must be at least 1",
        });
    }
    Ok(())
}

/// The exclusive id after which reading starts for a fixed position, or
/// `None` for [`StartPosition::Newest`] (resolved against the stream).
pub(crate) fn exclusive_start(start: &StartPosition) -> Option<String> {
    match start {
        StartPosition::Newest => None,
        StartPosition::Oldest => Some("0-0".to_string()),
        StartPosition::Id(id) => Some(id.clone()),
        StartPosition::Time(t) => {
            let ms = t
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            Some(if ms == 0 {
                "0-0".to_string()
            } else {
                format!("{}-{}", ms - 1, u64::MAX)
            })
        }
    }
}
