//! The crate's error type.

use std::time::Duration;

/// Errors of the rmap crate.
///
/// Every variant is something a caller can match on; causes are kept as
/// sources, never flattened into strings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A map name or hash tag broke the naming rule (see [`check_name`](crate::check_name)).
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// What was named: `"map name"` or `"hash tag"`.
        what: &'static str,
        /// The refused value.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// An option had a value that cannot work (e.g. a zero TTL).
    #[error("invalid map option: {0}")]
    InvalidOptions(&'static str),
    /// Redis answered with an error or could not be reached.
    #[error("redis error: {0}")]
    Redis(#[from] fred::error::Error),
    /// The map was closed (or destroyed); no more writes or waits.
    #[error("the map is closed")]
    Closed,
    /// The shared subscriber connection ([`Subscriptions`](crate::Subscriptions))
    /// was closed: no map can join or resubscribe through it.
    #[error("the shared subscriber connection is closed")]
    SubscriptionsClosed,
    /// A wait did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Data read from Redis did not have the expected shape: a value that is
    /// not an integer for [`inc`](crate::Map::inc), not a JSON array of
    /// strings for the list operations, or an unexpected script reply.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What was malformed.
        what: &'static str,
        /// Details (the offending key or the reply).
        detail: String,
    },
}

impl Error {
    pub(crate) fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
        Error::Malformed {
            what,
            detail: detail.into(),
        }
    }
}
