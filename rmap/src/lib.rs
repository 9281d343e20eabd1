//! Replicated maps (being built).
/// Errors of the rmap crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error.
    #[error("redis error: {0}")]
    Redis(#[from] fred::error::Error),
}
