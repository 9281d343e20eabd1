//! The crate's error type.

/// Errors of the streaming crate.
///
/// Variants are matchable; the Redis cause is kept as the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A stream or sink name (or hash tag) breaks the naming rule: non-empty,
    /// at most 128 bytes, no `{`, `}` or control characters.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name that was refused.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// An option value is out of range (e.g. a zero block duration).
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// The option's field name.
        option: &'static str,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Redis answered with an error or could not be reached.
    #[error("redis error: {0}")]
    Redis(#[from] fred::error::Error),
    /// The reader or sink was closed.
    #[error("the reader or sink is closed")]
    Closed,
    /// A stream entry does not have this crate's entry format.
    #[error("malformed stream entry {id}: {reason}")]
    Malformed {
        /// The entry's id.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The sink's member registry (a replicated map) failed.
    #[error("member registry error: {0}")]
    Map(#[from] flotilla_rmap::Error),
    /// The event names a stream this sink does not know.
    #[error("unknown stream {0:?}")]
    UnknownStream(String),
}

/// Validates a name with the shared rule (`flotilla_rmap::check_name`:
/// non-empty, at most 128 bytes, no `{`, `}` or control characters).
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    flotilla_rmap::check_name(name).map_err(|reason| Error::InvalidName {
        name: name.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("inbox:w-1").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a{b").is_err());
        assert!(check_name("a}b").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"x".repeat(129)).is_err());
        assert!(check_name(&"x".repeat(128)).is_ok());
    }
}
