//! Streams (being built).
/// Errors of the streaming crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error.
    #[error("redis error: {0}")]
    Redis(#[from] fred::error::Error),
}
