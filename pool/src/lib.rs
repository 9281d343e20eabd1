//! A dedicated worker pool on Redis (being built).
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod error;
mod keys;
pub mod leader;
pub mod lock;

pub use error::{Error, Result};
pub use leader::{LeaderLease, LeaderOptions};
pub use lock::{ClusterLock, LockGuard, LockInfo, LockOptions};
